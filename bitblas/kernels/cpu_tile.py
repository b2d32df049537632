"""Template "cpu": the LLVM tile schedule (schedule/cpu.py) for every CPU plan the SIMD GEMV does
not take (integer activations, [K, N] weights)."""
from __future__ import annotations

import math
from typing import List, Optional

from ..schedule.cpu import CPUHint, schedule_cpu
from ._common import not_nvfp4
from .base import Candidate


class CPUTile:
    name = "cpu"
    kind = "cpu"
    Hint = CPUHint
    needs_tir = True
    tune_order = 1
    tune_fallback = True          # candidates only where the SIMD GEMV has none

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cpu")

    def default(self, plan, arch, rows=None):
        return CPUHint.default(plan) if self.reason(plan, arch) is None else None

    def space(self, plan, rows, arch) -> List[Candidate]:
        config = plan.config
        m = config.M if isinstance(config.M, int) else None
        ks = [k for k in (1, 4, 8, 16, 32, 64) if config.K % k == 0]
        return [Candidate(m, CPUHint(n_tile=n, k_vec=k)) for n in (4, 8, 16, 32, 64, 128) for k in ks]

    def cost(self, plan, hint, rows, arch) -> float:
        return cpu_cost(plan, hint, rows, arch.cores)

    def build(self, plan, hint, arch, func=None):
        return schedule_cpu(func, plan, hint)


def cpu_cost(plan, hint: CPUHint, m: int, cores: int) -> float:
    c = plan.config
    tiles = math.ceil(c.N / hint.n_tile)
    waves = math.ceil(tiles / cores)
    par_eff = tiles / (waves * cores)
    simd_eff = min(hint.k_vec, 16) / 16.0
    cache_pen = 1.0 + max(0.0, hint.n_tile * c.K * 4 / (1 << 20) - 1.0)   # decoded tile beyond ~1 MB
    decode = c.N * c.K * 4.0
    flops = 2.0 * m * c.N * c.K
    return (flops / simd_eff + decode) * cache_pen / (par_eff * cores * 8e9)


TEMPLATE = CPUTile()
