"""Schedules: turn the TensorIR of a plan into a scheduled module, steered by a hint."""
import dataclasses

from .cpu import CPUHint, schedule_cpu
from .cpu_gemv import CPUGemvHint, cpu_gemv_unsupported, schedule_cpu_gemv
from .gemv import (GEMVHint, GEMVKSplitHint, GEMVMmaHint, GEMVRowsHint, GEMVWgmmaHint, gemv_unsupported,
                   schedule_cuda_gemv)
from .cuda_mma import MMAHint, ir_options as _mma_ir_options, schedule_cuda_mma
from .cuda_simple import SimpleCUDAHint, schedule_cuda_simple
from .cuda_wgmma import WGMMAHint, schedule_cuda_wgmma, wgmma_unsupported
from .fused_wgmma import FusedWgmmaHint, schedule_fused_wgmma
from .nvfp4 import NVFP4CPUHint, NVFP4GemvHint

__all__ = ["CPUHint", "CPUGemvHint", "SimpleCUDAHint", "MMAHint", "GEMVHint", "GEMVRowsHint", "GEMVKSplitHint",
           "GEMVMmaHint", "GEMVWgmmaHint", "WGMMAHint", "schedule_cpu",
           "schedule_cpu_gemv", "cpu_gemv_unsupported", "schedule_cuda_simple",
           "schedule_cuda_mma", "schedule_cuda_gemv", "schedule_cuda_wgmma", "gemv_unsupported", "wgmma_unsupported",
           "schedule_fused_wgmma", "FusedWgmmaHint",
           "HINTS", "hint_to_dict", "hint_from_dict", "ir_options", "NVFP4GemvHint",
           "NVFP4CPUHint"]

# "GEMVHint": the one hint the GEMV kernels had before; its fields map to the hint of the kernel they
# selected (gemv/hints.py, from_legacy), so a dict or spelling of it gives that kernel
HINTS = {cls.__name__: cls for cls in (CPUHint, CPUGemvHint, SimpleCUDAHint, MMAHint, GEMVRowsHint, GEMVKSplitHint,
                                       GEMVMmaHint, GEMVWgmmaHint, GEMVHint, WGMMAHint, NVFP4GemvHint, NVFP4CPUHint,
                                       FusedWgmmaHint)}


def hint_to_dict(hint) -> dict:
    """A hint as plain data ({"class": ..., field: value}): cache keys, worker processes, JSON."""
    return {"class": type(hint).__name__, **dataclasses.asdict(hint)}


def hint_from_dict(d: dict):
    d = dict(d)
    return HINTS[d.pop("class")](**d)


def ir_options(plan, hint) -> dict:
    """Keyword arguments of ``emit_matmul`` for the IR form the hint's template schedules."""
    return _mma_ir_options(plan, hint)
