"""Templates "nvfp4-gemv" and "nvfp4-cpu": NVFP4 x NVFP4 (schedule/nvfp4.py, hand-written, no
TensorIR). Not tuned: no space, no cost."""
from __future__ import annotations

from typing import List, Optional

from ..schedule.nvfp4 import NVFP4CPUHint, NVFP4GemvHint, schedule_nvfp4


def _only_nvfp4(plan, kind) -> Optional[str]:
    if plan.target_kind != kind:
        return f"not a {kind.upper()} plan"
    return None if plan.nvfp4_acts else "not nvfp4 activations"


class _NVFP4:
    needs_tir = False
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return _only_nvfp4(plan, self.kind)

    def space(self, plan, rows, arch) -> List:
        return []

    def cost(self, plan, hint, rows, arch) -> float:
        raise TypeError(f"estimate: no cost model for {type(hint).__name__} (NVFP4 kernels are not tuned)")

    def build(self, plan, hint, arch, func=None):
        return schedule_nvfp4(plan, hint, arch if self.kind == "cuda" else None)


class NVFP4Gemv(_NVFP4):
    name = "nvfp4-gemv"
    kind = "cuda"
    Hint = NVFP4GemvHint
    tune_order = 4

    def default(self, plan, arch, rows=None):
        return NVFP4GemvHint.default(plan, arch) if self.reason(plan, arch) is None else None


class NVFP4CPU(_NVFP4):
    name = "nvfp4-cpu"
    kind = "cpu"
    Hint = NVFP4CPUHint
    tune_order = 2

    def default(self, plan, arch, rows=None):
        return NVFP4CPUHint.default(plan) if self.reason(plan, arch) is None else None


GEMV = NVFP4Gemv()
CPU = NVFP4CPU()
