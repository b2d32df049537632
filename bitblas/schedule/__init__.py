"""Schedules: turn the TensorIR of a plan into a scheduled module, steered by a hint."""
import dataclasses

from .cpu import CPUHint, schedule_cpu
from .cpu_gemv import CPUGemvHint, cpu_gemv_unsupported, schedule_cpu_gemv
from .gemv import GEMVHint, gemv_default_takes, gemv_unsupported, schedule_cuda_gemv
from .cuda_mma import MMAHint, ir_options as _mma_ir_options, schedule_cuda_mma
from .cuda_simple import SimpleCUDAHint, schedule_cuda_simple
from .cuda_wgmma import WGMMAHint, schedule_cuda_wgmma, wgmma_unsupported
from .fused_wgmma import FusedWgmmaHint, schedule_fused_wgmma
from .nvfp4 import NVFP4CPUHint, NVFP4GemvHint

__all__ = ["CPUHint", "CPUGemvHint", "SimpleCUDAHint", "MMAHint", "GEMVHint", "WGMMAHint", "schedule_cpu",
           "schedule_cpu_gemv", "cpu_gemv_unsupported", "schedule_cuda_simple",
           "schedule_cuda_mma", "schedule_cuda_gemv", "schedule_cuda_wgmma", "gemv_unsupported", "wgmma_unsupported",
           "schedule_fused_wgmma", "FusedWgmmaHint",
           "schedule", "default_hint", "HINTS", "hint_to_dict", "hint_from_dict", "ir_options", "NVFP4GemvHint",
           "NVFP4CPUHint"]

HINTS = {cls.__name__: cls for cls in (CPUHint, CPUGemvHint, SimpleCUDAHint, MMAHint, GEMVHint, WGMMAHint,
                                       NVFP4GemvHint, NVFP4CPUHint, FusedWgmmaHint)}


def hint_to_dict(hint) -> dict:
    """A hint as plain data ({"class": ..., field: value}): cache keys, worker processes, JSON."""
    return {"class": type(hint).__name__, **dataclasses.asdict(hint)}


def hint_from_dict(d: dict):
    d = dict(d)
    return HINTS[d.pop("class")](**d)


def default_hint(plan, target=None):
    """The default hint of a plan (``target``: the CUDA Target it is built for, when known)."""
    if plan.nvfp4_acts:                      # NVFP4 x NVFP4: the hand-written kernels of nvfp4.py
        return NVFP4CPUHint.default(plan) if plan.target_kind == "cpu" else NVFP4GemvHint.default(plan, target)
    if plan.target_kind == "cpu":
        # float activations x nt weights: decode in SIMD registers (schedule/cpu_gemv.py); the rest
        # (integer activations, [K, N] weights): the tile schedule
        if cpu_gemv_unsupported(plan, None) is None:
            return CPUGemvHint.default(plan, target)
        return CPUHint.default(plan)
    if gemv_default_takes(plan, target):     # static rows 1..64: float16/bfloat16 x int/uint/table, int8 x int/uint
        # int8 x int8 included: from 7 rows the m16n8k32 GEMV beats the 64 x 64 wgmma tile on the
        # H200 (per-channel and group-scaled, N=8192 and 28672)
        return GEMVHint.default(plan, target)
    # Hopper: wgmma for weights that need no decode, at every row count the GEMV does not take
    # (on the H200 several times faster than the mma.sync kernel from 32 rows up)
    hint = WGMMAHint.default(plan, target)
    if hint is not None:
        return hint
    # tensor cores with more rows (or symbolic M): float16/bfloat16, int8 and (sm_89+) float8
    # activations, see cuda_mma.mma_reason; None: n/a
    return MMAHint.default(plan, target) or SimpleCUDAHint.default(plan)


def ir_options(plan, hint) -> dict:
    """Keyword arguments of ``emit_matmul`` for the IR form the hint's template schedules."""
    return _mma_ir_options(plan, hint)


def schedule(func, plan, hint=None, target=None):
    """Scheduled IRModule of ``func`` (from ``emit_matmul(plan, **ir_options(plan, hint))``) for the
    plan's target kind."""
    hint = hint or default_hint(plan, target)
    if plan.target_kind == "cpu":
        if isinstance(hint, CPUGemvHint):
            return schedule_cpu_gemv(func, plan, hint, target)
        return schedule_cpu(func, plan, hint)
    if isinstance(hint, MMAHint):
        return schedule_cuda_mma(func, plan, hint, target)
    if isinstance(hint, GEMVHint):
        return schedule_cuda_gemv(func, plan, hint, target)
    if isinstance(hint, WGMMAHint):
        return schedule_cuda_wgmma(func, plan, hint, target)
    if isinstance(hint, FusedWgmmaHint):     # never a default (yet): a tuned / forced hint's kernel
        return schedule_fused_wgmma(func, plan, hint, target)
    return schedule_cuda_simple(func, plan, hint)
