"""Template "simple": one thread per output element (schedule/cuda_simple.py); takes every CUDA plan,
the last resort of the registry and of a default kernel that fails to build."""
from __future__ import annotations

from typing import List, Optional

from ..schedule.cuda_simple import SimpleCUDAHint, schedule_cuda_simple
from ._common import need_spec, not_nvfp4
from .base import Candidate
from .costmodel import LAUNCH_S


class Simple:
    name = "simple"
    kind = "cuda"
    Hint = SimpleCUDAHint
    needs_tir = True
    tune_order = 3
    tune_fallback = True          # candidates only where no other CUDA template has any
    last_resort = True            # a default kernel that fails to build is built with this one

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cuda")

    def default(self, plan, arch, rows=None):
        return SimpleCUDAHint.default(plan) if self.reason(plan, arch) is None else None

    def space(self, plan, rows, arch) -> List[Candidate]:
        M = plan.config.M
        m = M if isinstance(M, int) else None
        return [Candidate(m, SimpleCUDAHint(threads=t)) for t in (64, 128, 256, 512)]

    def cost(self, plan, hint, rows, arch) -> float:
        return simple_cost(plan, hint, rows, need_spec(arch))

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_simple(func, plan, hint)


def simple_cost(plan, hint: SimpleCUDAHint, m: int, spec) -> float:
    c = plan.config
    work = 2.0 * m * c.N * c.K
    occupancy = min(1.0, spec.max_threads_per_sm / hint.threads / spec.max_blocks_per_sm * 4)
    return work / (spec.sm_count * spec.clock_hz * 64 * occupancy) + LAUNCH_S


TEMPLATE = Simple()
