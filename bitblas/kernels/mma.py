"""Template "mma": tensor cores through mma.sync (schedule/cuda_mma.py), fp16/bf16 x every weight
format, int8 x int, float8 x float8; sm_80+ (float8: sm_89+)."""
from __future__ import annotations

import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule import cuda_mma
from ..schedule.cuda_mma import MMAHint, ir_options, mma_reason, schedule_cuda_mma
from ._common import need_spec, not_nvfp4, spec_of
from .base import Candidate
from .costmodel import mma_cost

_MAX_WARP_TILE = 64 * 64          # largest warp tile (accumulator registers: WM * WN / 32 floats per thread)


def mma_rows(config) -> Optional[int]:
    """Plan rows of the tensor-core kernels of a config: static for an int M > 16, else symbolic."""
    M = config.M
    return M if isinstance(M, int) and M > cuda_mma.MIN_ROWS else None


class MMA:
    name = "mma"
    kind = "cuda"
    Hint = MMAHint
    needs_tir = True
    tune_order = 1
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        why = not_nvfp4(plan, "cuda")
        if why:
            return why
        if arch is not None and not arch.mma:
            return f"mma.sync needs sm_80+ (target: {arch.name()})"
        return mma_reason(plan, arch)

    def default(self, plan, arch, rows=None):
        if plan.nvfp4_acts:
            return None
        return MMAHint.default(plan, arch)

    def space(self, plan, rows, arch) -> List[Candidate]:
        spec = spec_of(arch)
        m = mma_rows(plan.config)
        plan = make_plan(plan.config, "cuda", m)
        if mma_reason(plan, spec.cc if spec is not None else None) is not None:
            return []                         # fp16/bf16, int8 or (sm_89+) float8 activations only
        if arch is not None and not arch.mma:
            return []
        smem_limit = spec.smem_per_block if spec is not None else 49152
        quantized = plan.w.kind != "float"
        out = []
        for BM, BN, WM, WN, BK, stages in itertools.product((16, 32, 64, 128, 256), (32, 64, 128, 256),
                                                            (16, 32, 64), (16, 32, 64), (32, 64, 128), (2, 3, 4, 5)):
            if WM > BM or WN > BN or BM % WM or BN % WN or WM * WN > _MAX_WARP_TILE:
                continue
            if (BM // WM) * (BN // WN) not in (1, 2, 4, 8):
                continue
            if plan.w.kind == "float" and stages < 3 and BK // 16 > 1:
                continue                      # the float-weight inner pipeline wants >= 3 stages
            for vec in ((8, 4) if quantized else (8,)):
                hint = MMAHint(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, stages=stages, vec_decode=vec)
                try:
                    hint.check()
                except ValueError:
                    continue
                if cuda_mma.copy_plan(plan, hint) is None or hint.smem_bytes(plan) > smem_limit:
                    continue
                out.append(Candidate(m, hint))
        return out

    def shape_key(self, hint):
        return ("mma", hint.BM, hint.BN, hint.BK, hint.WM, hint.WN)

    def cost(self, plan, hint, rows, arch) -> float:
        return mma_cost(plan, hint, rows, need_spec(arch))

    def ir_options(self, plan, hint) -> dict:
        return ir_options(plan, hint)

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_mma(func, plan, hint, arch)


TEMPLATE = MMA()
