"""The checks every operator call makes on the user's tensors (ops/matmul.py, ops/bound.py)."""
from __future__ import annotations

import math

import torch

from ..plan import ArgSpec
from ..quantization.quantize import TORCH_DTYPES

__all__ = ["check_tensor", "why_not", "base_align"]


def why_not(name: str) -> str:
    return {"scale": "with_scaling=False", "zeros": "with_zeros=False", "bias": "with_bias=False",
            "a_scale": "with_act_scaling=False", "global_scale": "only nvfp4 takes a global scale",
            "a_global_scale": "only A_dtype='nvfp4' takes an activation global scale"}.get(name, "")


_HALF_FLOATS = (torch.float16, torch.bfloat16)


def base_align(name: str, dtype: torch.dtype) -> int:
    """Bytes the CUDA kernels need the base of tensor argument ``name`` (of ``dtype``) aligned to:
    16 for A and W (the GEMV's 16-byte vector loads, TMA bases), 2 for 1-byte scales (a weight
    vector's two float8 block scales in one 2-byte load, schedule/gemv/emit.py's
    block_scale_helpers), else 1 (any view of its elements). The call paths realign a view off
    that boundary by a copy (ops/matmul.py; ops/bound.py at bind)."""
    if name in ("A", "W"):
        return 16
    return 2 if name == "scale" and dtype.itemsize == 1 else 1


def check_tensor(name: str, t, spec: ArgSpec, rows: int, device, lead=None) -> torch.Tensor:
    """Check one user tensor against its ArgSpec; return the view the kernel takes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    want = TORCH_DTYPES[spec.user_dtype]
    if want is torch.float32 and spec.name == "scale" and t.dtype in _HALF_FLOATS:
        t = t.to(want)       # float16 / bfloat16 scales where the kernel takes float32 (int8, W4A8): exact
    if t.dtype != want and not (spec.dtype == "int8" and t.dtype == torch.int8):
        raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
    if t.device != torch.device(device) and not (t.device.type == device.type and device.type == "cpu"):
        raise ValueError(f"{name} is on {t.device} but A is on {device}; put all tensors on one device")
    # the caller's rows: a kernel symbolic in them, static in them, or taking them at run time (GEMV)
    shape = [rows, *spec.shape[1:]] if spec.per_row else list(spec.shape)
    if lead is not None and spec.per_row:
        expect = list(lead) + shape[1:]
    else:
        expect = shape
    got = list(t.shape)
    if got != expect:
        # per-channel scales / zeros may come as [N], activation scales as [M] for any leading dims
        if not (math.prod(got) == math.prod(shape) and len(shape) == 2 and shape[1] == 1 and got == shape[:1]) and \
                not (lead is not None and len(spec.shape) == 1 and got == [rows]):
            raise ValueError(f"{name}: expected shape {expect}, got {got}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous; call .contiguous() first")
    if t.dtype != torch.int8 and spec.dtype == "int8":
        t = t.view(torch.int8)
    return t.reshape(shape)
