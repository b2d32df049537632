"""Template "wgmma": Hopper TMA + mbarrier ring + wgmma (schedule/cuda_wgmma.py) for plans whose
weights need no decode; the kernel is written directly (no TensorIR)."""
from __future__ import annotations

import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule.cuda_wgmma import WGMMAHint, schedule_cuda_wgmma, wgmma_unsupported
from ._common import need_spec, not_nvfp4, spec_of
from .base import Candidate
from .costmodel import wgmma_cost
from .mma import mma_rows


class WGMMA:
    name = "wgmma"
    kind = "cuda"
    Hint = WGMMAHint
    needs_tir = False
    tune_order = 2
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cuda") or wgmma_unsupported(plan, arch)

    def default(self, plan, arch, rows=None):
        """The tile class of ``rows`` (a symbolic plan serves each row count with the tiles that fill
        the SMs), or of the plan's rows."""
        if plan.nvfp4_acts:
            return None
        return WGMMAHint.default(plan, arch, rows)

    def space(self, plan, rows, arch) -> List[Candidate]:
        spec = spec_of(arch)
        if spec is None:
            return []                         # the arch decides: not assumed
        m = mma_rows(plan.config)
        plan = make_plan(plan.config, "cuda", m)
        if wgmma_unsupported(plan, arch) is not None:
            return []
        out = []
        for BN, consumers, stages, persistent in itertools.product((64, 128, 192, 256), (1, 2), range(2, 9),
                                                                   (True, False)):
            hint = WGMMAHint(BN=BN, stages=stages, consumers=consumers, persistent=persistent, group_m=8)
            if hint.smem_bytes(plan) > spec.smem_per_block:
                continue
            try:
                hint.check(plan)              # int8: BN in the s8 wgmma table; the ring within sm_90's limit
            except ValueError:
                continue
            out.append(Candidate(m, hint))
        return out

    def shape_key(self, hint):
        return ("wgmma", hint.BM, hint.BN)

    def cost(self, plan, hint, rows, arch) -> float:
        return wgmma_cost(plan, hint, rows, need_spec(arch))

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_wgmma(None, plan, hint, arch)


TEMPLATE = WGMMA()
