"""Template "cpu-gemv": the CPU default for float activations x [N, K] weights (schedule/cpu_gemv.py,
hand-written TIRx: decode in SIMD registers)."""
from __future__ import annotations

import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule.cpu_gemv import CPUGemvHint, cpu_gemv_unsupported, schedule_cpu_gemv
from ._common import not_nvfp4
from .base import Candidate
from .costmodel import cpu_gemv_cost


class CPUGemv:
    name = "cpu-gemv"
    kind = "cpu"
    Hint = CPUGemvHint
    needs_tir = False
    tune_order = 0
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cpu") or cpu_gemv_unsupported(plan, None)

    def default(self, plan, arch, rows=None):
        if self.reason(plan, arch) is not None:
            return None
        return CPUGemvHint.default(plan, None if arch is None else arch.target)

    def space(self, plan, rows, arch) -> List[Candidate]:
        config = plan.config
        m = config.M if isinstance(config.M, int) else None
        plan = make_plan(config, "cpu", m)
        if cpu_gemv_unsupported(plan) is not None:
            return []
        out = []
        for block, ch, (r, rc), unroll, pf in itertools.product((8, 16, 32), (2, 4, 8),
                                                               ((4, 2), (2, 4), (6, 2), (8, 1)), (1, 4), (0, 16384)):
            hint = CPUGemvHint(block=block, channels=ch, rows=r, row_channels=rc, unroll=unroll, prefetch=pf)
            if hint.check(plan) is None:
                out.append(Candidate(m, hint))
        return out

    def cost(self, plan, hint, rows, arch) -> float:
        return cpu_gemv_cost(plan, hint, rows, arch.cores)

    def build(self, plan, hint, arch, func=None):
        return schedule_cpu_gemv(None, plan, hint, None if arch is None else arch.target)


TEMPLATE = CPUGemv()
