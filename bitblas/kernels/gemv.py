"""Template "gemv": the small-M CUDA kernels (schedule/gemv/, hand-written
TIRx, no TensorIR): 1..16 rows per row count, the tensor-core GEMVs per class of rows up to 64."""
from __future__ import annotations

import dataclasses
import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule import gemv as gemv_schedule
from ..schedule.gemv import GEMVHint, gemv_default_takes, gemv_unsupported, schedule_cuda_gemv
from ._common import need_spec, not_nvfp4, spec_of
from .base import Candidate
from .costmodel import gemv_cost


class GEMV:
    name = "gemv"
    kind = "cuda"
    Hint = GEMVHint
    needs_tir = False
    tune_order = 0
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cuda") or gemv_unsupported(plan)

    def default(self, plan, arch, rows=None):
        """The default GEMV hint where an untuned operator runs the plan (static rows) on the GEMV."""
        if plan.m is None or not gemv_default_takes(plan, arch):
            return None
        return GEMVHint.default(plan, arch)

    def space(self, plan, rows, arch) -> List[Candidate]:
        spec = spec_of(arch)
        out = _shapes(plan.config, rows, spec, arch)
        if arch is not None and arch.pdl:     # programmatic dependent launch, as the default kernels
            out = [dataclasses.replace(c, hint=dataclasses.replace(c.hint, pdl=True)) for c in out]
        return out

    # -- rows: the rows kernel per row count, the tensor-core GEMVs per class of rows -------------
    def serves_untuned(self, config, rows: int, arch) -> bool:
        """Whether an untuned operator runs ``rows`` (static) rows on this template."""
        return 1 <= rows <= gemv_schedule.GEMV_MMA_MAX_ROWS and gemv_default_takes(make_plan(config, "cuda", rows), arch)

    def hint_takes(self, config, rows: int, hint) -> bool:
        """Whether the kernel with ``hint`` builds for ``rows`` rows (e.g. above 16 rows only
        tensor-core hints)."""
        plan = make_plan(config, "cuda", rows)
        return gemv_unsupported(plan) is None and gemv_schedule.gemv_hint_unsupported(plan, hint) is None

    def kernel_rows(self, config, rows: int, hint) -> int:
        """Rows of the kernel with ``hint`` that serves ``rows``: the tensor-core kernels take their
        row count at run time, so the one built for the top of the class (``gemv.row_class``:
        8, 16, 32, 48, 64) serves every row count of it; the wgmma GEMV's B operand is 8 rows wide
        per step, so its classes are 8 rows wide (``gemv.wgmma_rows``: a kernel built for more rows
        runs every step at its full width, so a wider class costs the smaller row counts in it); the
        rows kernel is built per row count."""
        from ..schedule.gemv import row_class, wgmma_rows
        if not hint.mma:
            return rows
        top = wgmma_rows(rows) if hint.wgmma else row_class(rows)
        return top if top == rows or self.hint_takes(config, top, hint) else rows

    def tuned_rows(self, config, kind, rows: int, bucket: int, hint):
        """(whether a bucket's tuned ``hint`` serves ``rows``, the rows of its kernel)."""
        if rows <= bucket and self.hint_takes(config, rows, hint):
            return True, self.kernel_rows(config, rows, hint)
        return False, None

    def shape_key(self, hint):
        return ("gemv", hint.mma, hint.wgmma, hint.act_smem, hint.rows_per_warp, hint.warps, hint.k_warps)

    def cost(self, plan, hint, rows, arch) -> float:
        return gemv_cost(plan, hint, rows, need_spec(arch))

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_gemv(None, plan, hint, arch)


def _shapes(config, bucket, spec, arch) -> List[Candidate]:
    if bucket > gemv_schedule.GEMV_MMA_MAX_ROWS:
        return []
    plan = make_plan(config, "cuda", bucket)
    if gemv_unsupported(plan) is not None:
        return []
    out = []
    if bucket > gemv_schedule.GEMV_MAX_ROWS:      # 17..64 rows: only the tensor-core kernels (chunks of 16 rows)
        return _mma_shapes(plan, bucket, arch)
    vbs = [vb for vb in (16, 8, 4) if gemv_schedule.vec_bytes(plan, vb) is not None]
    for R, warps, unroll, vb in itertools.product((1, 2, 4), (2, 4, 8), (1, 2, 4, 8), vbs):
        out.append(Candidate(bucket, GEMVHint(rows_per_warp=R, warps=warps, unroll=unroll, vec_bytes=vb)))
    # launch bounds of 8 blocks per SM (more registers for loads in flight), next step in flight
    for R, warps in itertools.product((2, 4, 8), (1, 2)):
        out.append(Candidate(bucket, GEMVHint(rows_per_warp=R, warps=warps, unroll=4, stages=2, min_blocks=8)))
    if bucket == 1:                           # the activation row staged in shared memory, 4 blocks per SM
        for R, warps, stages in itertools.product((2, 4, 8), (4, 8), (2, 3, 4)):
            hint = GEMVHint(rows_per_warp=R, warps=warps, unroll=1, stages=stages, min_blocks=4, act_smem=True)
            if gemv_schedule.gemv_hint_unsupported(plan, hint) is None:
                out.append(Candidate(bucket, hint))
    if plan.float_acts:                       # the k-split variant (float activations only): k_warps warps
        sms = spec.sm_count if spec is not None else 108     # share K, persistent grid of a few blocks per SM
        for R, kw, per_sm, vb in itertools.product((1, 2, 4, 8), (2, 4, 8), (2, 4, 8), vbs):
            if R * bucket > 32 * kw:
                continue
            out.append(Candidate(bucket, GEMVHint(rows_per_warp=R, k_warps=kw, grid=per_sm * sms, vec_bytes=vb)))
    return out + _mma_shapes(plan, bucket, arch)


def _mma_shapes(plan, bucket, arch) -> List[Candidate]:
    """The tensor-core GEMV kernels (m16n8k16 for float activations, m16n8k32 for int8 ones; sm_80+):
    16-channel mma tiles, k_warps warps splitting K; the ones the plan's format or group size
    refuses left out. Each with the next step in flight or not, and under launch bounds of 2 blocks
    per SM or none (the default tiles are such variants: GEMVHint._float_mma_tile / _int8_mma_tile
    / _chunk_tile)."""
    out = []
    if arch is not None and not arch.mma:
        return out
    for R, kw, unroll, stages, mb in itertools.product((16, 32, 64), (1, 2, 4, 8), (2, 4), (2, 1), (0, 2)):
        hint = GEMVHint(rows_per_warp=R, k_warps=kw, unroll=unroll, stages=stages, mma=True, min_blocks=mb)
        if gemv_schedule.gemv_hint_unsupported(plan, hint) is None:
            out.append(Candidate(bucket, hint))
    if bucket >= gemv_schedule.WGMMA_GEMV_MIN_ROWS and arch is not None and arch.wgmma:
        # the wgmma GEMV (gemv_wgmma): 64 or 128 channels per warpgroup, 1 / 2 / 4 warpgroups splitting K
        for R, kw, stages in itertools.product((16, 32), (1, 2, 4), (2, 4)):
            hint = GEMVHint(rows_per_warp=R, k_warps=kw, unroll=1, stages=stages, mma=True, wgmma=True)
            if gemv_schedule.gemv_hint_unsupported(plan, hint) is None:
                out.append(Candidate(bucket, hint))
    if bucket > gemv_schedule.GEMV_MAX_ROWS:      # the chunk loop: weights decoded once for every 16-row chunk
        # float activations also with vectors whose activations span 32 bytes (GEMVHint._chunk_tile),
        # as many of them per step as of the default vectors
        span = gemv_schedule.span_vectors(plan)
        vbs = [(0, 1)] + ([span] if span else [])
        for R, kw, unroll, stages, (vb, f) in itertools.product((16, 32, 64), (2, 4), (1, 2), (1, 2), vbs):
            hint = GEMVHint(rows_per_warp=R, k_warps=kw, unroll=unroll * f, stages=stages, vec_bytes=vb, mma=True,
                            min_blocks=1, chunk_loop=True)
            if gemv_schedule.gemv_hint_unsupported(plan, hint) is None:
                out.append(Candidate(bucket, hint))
    return out


TEMPLATE = GEMV()
