"""Template "fused-wgmma": the fused mixed-input wgmma GEMM (schedule/fused_wgmma.py, hand-written
TIRx, no TensorIR) for rows past the GEMV on sm_90a. Never a plan's default hint: the selector
takes it (``for_rows``) where decode-then-GEMM would otherwise serve. Not tuned yet."""
from __future__ import annotations

from typing import List, Optional

from ..schedule.fused_wgmma import FusedWgmmaHint, fused_default, fused_wgmma_unsupported, schedule_fused_wgmma
from ._common import cuda_reason


class FusedWgmma:
    name = "fused-wgmma"
    kind = "cuda"
    Hint = FusedWgmmaHint
    needs_tir = False
    tune_order = 5
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return cuda_reason(plan, arch, "wgmma", "wgmma needs sm_90", _unsupported)

    def default(self, plan, arch, rows=None):
        return None                   # never a plan's default (see for_rows)

    def for_rows(self, plan, rows: int) -> Optional[FusedWgmmaHint]:
        """Its tile for ``rows`` rows of ``plan``, which decode-then-GEMM would serve (the selector
        checks that), or None where decode-then-GEMM stays the default."""
        return fused_default(plan, rows)

    def space(self, plan, rows, arch) -> List:
        return []

    def cost(self, plan, hint, rows, arch) -> float:
        raise TypeError("estimate: no cost model for FusedWgmmaHint (the fused GEMM is not tuned yet)")

    def build(self, plan, hint, arch, func=None):
        return schedule_fused_wgmma(None, plan, hint, arch)


def _unsupported(plan, arch) -> Optional[str]:
    """Why the fused GEMM's default tile cannot take ``plan`` (the arch is checked before)."""
    return fused_wgmma_unsupported(plan, FusedWgmmaHint.default(plan))


TEMPLATE = FusedWgmma()
