"""What the four GEMV templates share (gemv_rows.py, gemv_ksplit.py, gemv_mma.py, gemv_wgmma.py):
the plans the GEMV kernels take, the default GEMV kernel (one decision, schedule/gemv/template.py's
``default_gemv_hint``, whose hint class names the template), the rows a kernel is built for, and
the build, and what the GEMV cost estimates start from (:func:`cost_inputs`). Each template adds its
hint class, its space and its cost."""
from __future__ import annotations

import dataclasses
from typing import List, NamedTuple, Optional

from ..plan import make_plan
from ..schedule import gemv as gemv_schedule
from ..schedule.gemv import gemv_default_takes, gemv_unsupported, schedule_cuda_gemv
from ._common import need_spec, not_nvfp4
from .costmodel import gemv_prelude

__all__ = ["CostInputs", "GEMVTemplate", "cost_inputs", "serves_untuned", "space_plan"]


def serves_untuned(config, rows: int, arch) -> bool:
    """Whether an untuned operator runs ``rows`` (static) rows on a GEMV kernel."""
    return 1 <= rows <= gemv_schedule.GEMV_MMA_MAX_ROWS and gemv_default_takes(make_plan(config, "cuda", rows), arch)


def space_plan(config, bucket: int):
    """The plan a GEMV template's candidates for ``bucket`` rows are built for, or None where no
    GEMV kernel takes it (more than 64 rows, or a plan the GEMV refuses)."""
    if bucket > gemv_schedule.GEMV_MMA_MAX_ROWS:
        return None
    plan = make_plan(config, "cuda", bucket)
    return plan if gemv_unsupported(plan) is None else None


class CostInputs(NamedTuple):
    """What every GEMV ``cost`` starts from (:func:`cost_inputs`)."""
    spec: object        # the DeviceSpec
    vb: int             # weight vector bytes
    vals: int           # codes per weight vector
    vectors: int        # weight vectors per channel (K / vals, rounded up)
    N: int
    K: int


def cost_inputs(plan, hint, arch) -> Optional[CostInputs]:
    """The arch's DeviceSpec (ValueError without one), the weight vectors of ``hint`` on ``plan``
    (costmodel's :func:`gemv_prelude`) and N, K; None where the kernel does not take ``hint``
    (the cost is infinite)."""
    spec = need_spec(arch)
    pre = gemv_prelude(plan, hint)
    if pre is None:
        return None
    return CostInputs(spec, *pre, plan.config.N, plan.config.K)


class GEMVTemplate:
    """Base of the GEMV templates (``Hint``, ``name``, ``space`` and ``cost`` are each one's own)."""
    kind = "cuda"
    needs_tir = False
    tune_order = 0
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return (not_nvfp4(plan, "cuda") or gemv_unsupported(plan)
                or (gemv_schedule.gemv_arch_unsupported(plan, arch) if arch is not None else None))

    def default(self, plan, arch, rows=None):
        """The default GEMV hint where an untuned operator runs the plan (static rows) on the GEMV
        and the default kernel is this template's."""
        if plan.m is None or not gemv_default_takes(plan, arch):
            return None
        hint = gemv_schedule.default_gemv_hint(plan, arch)
        return hint if type(hint) is self.Hint else None

    def with_pdl(self, cands, arch) -> List:
        """``cands`` with programmatic dependent launch where the arch has it (as the defaults)."""
        if arch is not None and arch.pdl:
            return [dataclasses.replace(c, hint=dataclasses.replace(c.hint, pdl=True)) for c in cands]
        return cands

    # -- rows: the rows and k-split kernels per row count, the tensor-core GEMVs per class of rows --
    def hint_takes(self, config, rows: int, hint) -> bool:
        """Whether the kernel with ``hint`` builds for ``rows`` rows (e.g. above 16 rows only the
        tensor-core kernels)."""
        plan = make_plan(config, "cuda", rows)
        return gemv_unsupported(plan) is None and gemv_schedule.gemv_hint_unsupported(plan, hint) is None

    def kernel_rows(self, config, rows: int, hint) -> int:
        """Rows of the kernel with ``hint`` that serves ``rows``: the row count itself (the rows and
        k-split kernels are built per row count; the tensor-core templates override this)."""
        return rows

    def class_rows(self, config, rows: int, hint, top: int) -> int:
        """``top`` (the top of the class of ``rows``) where the kernel with ``hint`` builds for it,
        else ``rows``: a tensor-core GEMV takes its row count at run time, so the kernel built for
        the top of the class serves every row count of it."""
        return top if top == rows or self.hint_takes(config, top, hint) else rows

    def tuned_rows(self, config, kind, rows: int, bucket: int, hint):
        """(whether a bucket's tuned ``hint`` serves ``rows``, the rows of its kernel)."""
        if rows <= bucket and self.hint_takes(config, rows, hint):
            return True, self.kernel_rows(config, rows, hint)
        return False, None

    def tune_family(self, hint) -> str:
        """The tuner's family of ``hint`` (select_topk keeps a share of each): the GEMV kernels are
        one family, but for the wgmma GEMV and the staged activation row (their own templates'
        overrides)."""
        return "gemv"

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_gemv(None, plan, hint, arch)
