"""``nvfp4_gemv(a, b, sfa, sfb, c)``: the batched-GEMV workload's entry point (its five tensors in
their own layouts), served by a cached NVFP4 x NVFP4 ``Matmul`` per shape and device (ops/nvfp4.py).
"""
from __future__ import annotations

import threading
from typing import Dict

import torch

from ..config import MatmulConfig
from .matmul import Matmul
from .nvfp4 import CODE_DTYPES, INT32_MAX, check_cuda_layout, dtype_names, max_offset

__all__ = ["nvfp4_gemv"]


# ------------------------------------------------------------------------------------------------
# the batched-GEMV entry point
# ------------------------------------------------------------------------------------------------
_OPS: Dict[tuple, "object"] = {}
_OPS_LOCK = threading.Lock()


def _gemv_op(N: int, K: int, out_dtype: str, device: torch.device):
    key = (N, K, out_dtype, device.type, device.index if device.type == "cuda" else None)
    with _OPS_LOCK:
        op = _OPS.get(key)
    if op is None:
        cfg = MatmulConfig(M=1, N=N, K=K, A_dtype="nvfp4", W_dtype="nvfp4", group_size=16, with_scaling=True,
                           with_act_scaling=True, out_dtype=out_dtype)
        target = None if device.type == "cpu" else _device_target(device)
        op = Matmul(cfg, target="llvm" if device.type == "cpu" else target)
        with _OPS_LOCK:
            op = _OPS.setdefault(key, op)
    return op


def _device_target(device: torch.device):
    from ..utils import auto_detect_nvidia_target
    return auto_detect_nvidia_target(device.index or 0)


def _gemv_arg(name, t, dtypes, kind):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected {kind} ({dtype_names(dtypes)}), got {t.dtype}")
    if t.dim() != 3:
        raise ValueError(f"{name}: expected a 3-D tensor [rows, K/{2 if 'codes' in kind else 16}, L], got shape "
                         f"{list(t.shape)}")


def nvfp4_gemv(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Batched NVFP4 x NVFP4 GEMV: ``c[:, 0, l] = decode(a[:, :, l]) @ decode(b[0, :, l])`` for every l.

    a: [M, K/2, L] e2m1 codes two per byte along K (float4_e2m1fn_x2, uint8 or int8; the even
    code in the low nibble), K contiguous (stride 1 in dimension 1), any strides over M and L
    (the usual layout: a [L, M, K/2] tensor permuted, strides (K/2, 1, M*K/2)); b: [R, K/2, L]
    the same, R >= 1 (padded to 128 rows; only row 0 is read); sfa: [M, K/16, L] and sfb:
    [R, K/16, L] float8_e4m3fn block scales, K contiguous; c: [M, 1, L] float16 (bfloat16 and
    float32 also accepted), any strides. K must be a multiple of 32. Writes c and returns it.
    Nothing is copied or repacked: the kernel reads every stride (bitblas/schedule/nvfp4.py).
    """
    _gemv_arg("a", a, CODE_DTYPES, "e2m1 codes")
    _gemv_arg("b", b, CODE_DTYPES, "e2m1 codes")
    _gemv_arg("sfa", sfa, (torch.float8_e4m3fn,), "float8_e4m3fn block scales")
    _gemv_arg("sfb", sfb, (torch.float8_e4m3fn,), "float8_e4m3fn block scales")
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"c: expected a torch.Tensor, got {type(c).__name__}")
    M, K2, L = a.shape
    K = 2 * K2
    if K % 32 or K == 0:
        raise ValueError(f"a: K = 2 * a.shape[1] = {K} must be a positive multiple of 32 (16-byte vectors of codes, "
                         "two scale blocks each)")
    for name, t in (("a", a), ("b", b), ("sfa", sfa), ("sfb", sfb)):
        if t.stride(1) != 1:
            raise ValueError(f"{name} must be K-contiguous (stride 1 in dimension 1), got strides {list(t.stride())}; "
                             "pass the permuted view of a tensor whose last dimension is K")
    if b.shape[0] < 1:
        raise ValueError(f"b: expected at least 1 row (row 0 is the vector), got shape {list(b.shape)}")
    if tuple(b.shape[1:]) != (K2, L):
        raise ValueError(f"b: expected shape [rows >= 1, {K2}, {L}] (a is {list(a.shape)}), got {list(b.shape)}")
    if tuple(sfa.shape) != (M, K // 16, L):
        raise ValueError(f"sfa: expected shape [{M}, {K // 16}, {L}] (one scale per 16 K elements), got "
                         f"{list(sfa.shape)}")
    if sfb.shape[0] < 1 or tuple(sfb.shape[1:]) != (K // 16, L):
        raise ValueError(f"sfb: expected shape [rows >= 1, {K // 16}, {L}], got {list(sfb.shape)}")
    out_dtypes = (torch.float16, torch.bfloat16, torch.float32)
    if c.dtype not in out_dtypes:
        raise TypeError(f"c: expected dtype float16 (or bfloat16, float32), got {c.dtype}")
    if tuple(c.shape) != (M, 1, L):
        raise ValueError(f"c: expected shape [{M}, 1, {L}], got {list(c.shape)}")
    dev = a.device
    for name, t in (("b", b), ("sfa", sfa), ("sfb", sfb), ("c", c)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but a is on {dev}; put all tensors on one device")
    if M == 0 or L == 0:
        return c
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[c.dtype]
    op = _gemv_op(M, K, name, dev)
    nv = op._nv
    W3 = a.view(torch.int8).permute(2, 0, 1)               # [L, M, K/2]
    A3 = b.view(torch.int8).permute(2, 0, 1)[:, :1]        # [L, 1, K/2], batch stride as given (128 rows)
    S3 = sfa.view(torch.int8).permute(2, 0, 1)
    B3 = sfb.view(torch.int8).permute(2, 0, 1)[:, :1]
    O3 = c.permute(2, 1, 0)                                # [L, 1, M]
    for nm, v in (("a", W3), ("b", A3), ("sfa", S3), ("sfb", B3), ("c", O3)):
        if max_offset(v) > INT32_MAX:
            raise NotImplementedError(f"{nm}: offsets beyond 2**31 elements are not supported")
    if dev.type == "cuda":
        check_cuda_layout((("a", W3, 16), ("b", A3, 16), ("sfa", S3, 2), ("sfb", B3, 2)))
    nv.launch(A3, W3, S3, B3, None, None, O3)
    return c
