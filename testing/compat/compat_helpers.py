"""Shared pieces of the Microsoft BitBLAS compatibility suite, written here.

The tests of this folder make the calls Microsoft BitBLAS's own tests make (public names, config
arguments and the order of calls are the contract being checked), over their parameter sets and
with their assertions and tolerances. What the tests need besides those calls lives here: config
tables, random inputs drawn as BitBLAS's tests draw them, the tensors its operator takes for scales
and zero points, and one float32 reference (dequantize, then matmul).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

# short names used in the case tables -> BitBLAS dtype strings
_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i8": "int8", "i4": "int4",
       "i2": "int2", "u4": "uint4", "u2": "uint2", "nf4": "nf4", "e4m3": "e4m3_float8", "e5m2": "e5m2_float8"}

TORCH_DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
            "int8": torch.int8, "e4m3_float8": torch.float8_e4m3fn, "e5m2_float8": torch.float8_e5m2}

# BitBLAS's tests spell "nothing of this" two ways: explicit off values, or None everywhere
PLAIN = dict(layout="nt", with_bias=False, group_size=-1, with_scaling=False, with_zeros=False, zeros_mode=None)
UNSET = dict(layout="nt", with_bias=None, group_size=None, with_scaling=None, with_zeros=None, zeros_mode=None)


def mm(M, N, K, dtypes: str, **fields) -> dict:
    """MatmulConfig keyword arguments: ``dtypes`` is "A W accum out" in the short names above."""
    a, w, acc, out = (_DT.get(t, t) for t in dtypes.split())
    return dict(M=M, N=N, K=K, A_dtype=a, W_dtype=w, accum_dtype=acc, out_dtype=out, **fields)


_SHORT = {"with_bias": "bias", "with_scaling": "scale", "with_zeros": "zeros", "zeros_mode": "zeros", "group_size": "g",
          "propagate_a": "propa", "propagate_b": "propb", "fast_decoding": "fastdec"}


def mm_id(spec: dict) -> str:
    """A test id naming the case: shape, dtypes, then every non-default field."""
    m = "_".join(map(str, spec["M"])) if isinstance(spec["M"], (list, tuple)) else spec["M"]
    parts = [f"m{m}n{spec['N']}k{spec['K']}", f"{spec['A_dtype']}x{spec['W_dtype']}",
             f"{spec.get('accum_dtype')}to{spec.get('out_dtype')}"]
    for key, val in spec.items():
        if key in ("M", "N", "K", "A_dtype", "W_dtype", "accum_dtype", "out_dtype") or val is None:
            continue
        if (key, val) in (("layout", "nt"), ("group_size", -1)) or val is False:
            continue
        short = _SHORT.get(key, key)
        parts.append(short if val is True else f"{short}{val}" if key == "group_size" else f"{short}={val}")
    return "-".join(parts)


def tuning_table(M_values=(1, 768), N=768, K=768) -> List[dict]:
    """BitBLAS's twelve-case codegen / finetune table (ops_backend, ops_backend_tir, ops_backend_tl):
    dense float16 and int8 at each M, then uint4 weights plain, with bias, with a scale and with
    scale + 'original' zero points at each M."""
    dense = [mm(M, N, K, t, **PLAIN) for t in ("f16 f16 f16 f16", "i8 i8 i32 i8") for M in M_values]
    extras = [{}, dict(with_bias=True), dict(with_scaling=True),
              dict(with_scaling=True, with_zeros=True, zeros_mode="original")]
    quant = [mm(M, N, K, "f16 u4 f16 f16", **{**PLAIN, **e}) for M in M_values for e in extras]
    return dense + quant


def finetune_cases(specs: List[dict]) -> list:
    """The tuning cases of ``specs`` as parametrize values: CI's CPU tunes the one-row, epilogue-free
    float16 / uint4 ones; the rest run on the GPU host only."""
    from compat_marks import gpu_only

    def cheap(s):
        return s["M"] == 1 and s["W_dtype"] in ("float16", "uint4") and not (s["with_bias"] or s["with_scaling"])
    return [s if cheap(s) else gpu_only(s, reason="tuning this shape on CPU costs ~20 s", id=mm_id(s)) for s in specs]


def weight_values(kind: str, bits: int, shape, device):
    """Random weight values as BitBLAS's tests draw them for a format of ``kind`` ("uint", "int",
    "nf") and ``bits``: uint / nf values from [0, 2**(bits-1)), int ones from [-2**(bits-1), 2**(bits-1)).

    Returns (values on ``device``, the CPU int8 codes BitBLAS's ``weight_transform`` takes (int:
    offset binary, value + 2**(bits-1)))."""
    half = 1 << (bits - 1)
    if kind not in ("uint", "int", "nf"):
        raise NotImplementedError(f"no integer codes for {kind}{bits}")
    values = torch.randint(-half if kind == "int" else 0, half, tuple(shape), dtype=torch.int8)
    codes = values + half if kind == "int" else values
    return values.to(device), codes


def scale_tensor(kind: str, N: int, groups: int, dtype, device) -> torch.Tensor:
    """Per-group scales [N, groups] as a BitBLAS test makes them: 'ones', 'rand' or 'randn'."""
    if kind == "ones":
        return torch.ones(N, groups, dtype=dtype, device=device)
    return getattr(torch, kind)(N, groups, dtype=dtype).to(device)


def zero_points(mode: str, z: int, scale: torch.Tensor, bits: int):
    """(the tensor BitBLAS's operator takes, the [N, groups] tensor the reference uses) for a constant
    zero point ``z``: 'original' z per group; 'rescale' z * scale (the reference subtracts it after
    scaling); 'quantized' z packed by ``general_compress`` along N, [groups, N * bits / 8] int8."""
    from bitblas.quantization import general_compress
    per_group = torch.full_like(scale, z)
    if mode == "original":
        return per_group, per_group
    if mode == "rescale":
        rescaled = per_group * scale
        return rescaled, rescaled
    if mode == "quantized":
        N, groups = scale.shape
        packed = general_compress(np.full((groups, N), z, dtype=np.int8), source_bits=bits, storage_dtype=np.int8)
        return torch.from_numpy(packed).to(scale.device), per_group
    raise ValueError(f"zeros_mode {mode!r}")


def dequantized(values, group_size: int, scale=None, zeros=None, zeros_mode: Optional[str] = None):
    """float32 [N, K] weight from integer values [N, K] and per-group scale / zero point [N, K / group_size]:
    v, v * s, (v - z) * s ('original', 'quantized'), v * s - z ('rescale'); no scale: s = 1."""
    w = values.float()
    cols = torch.arange(w.shape[1], device=w.device) // group_size
    s = 1.0 if scale is None else scale.float()[:, cols]
    if zeros is None:
        return w * s
    z = zeros.float()[:, cols]
    return w * s - z if zeros_mode == "rescale" else (w - z) * s


def reference(A, W_ref, bias=None, out_dtype=None) -> torch.Tensor:
    """A @ W_ref.T (+ bias) in float32 (float64 for integer inputs), cast to ``out_dtype``."""
    wide = torch.float64 if not A.is_floating_point() else torch.float32
    out = A.to(wide) @ W_ref.to(wide).T
    if bias is not None:
        out = out + bias.to(wide)
    return out.to(out_dtype) if out_dtype is not None else out


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An output buffer that fails any check where the kernel leaves it unwritten."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).min, dtype=dtype, device=device)


def mean_rows(M) -> int:
    """BitBLAS's tests run a dynamic-M operator (``M`` a list) at the mean of its buckets."""
    return M if isinstance(M, int) else sum(M) // len(M)


@dataclass
class QuantProblem:
    """One weight-only-dequantize call: the positional tensors BitBLAS's operator takes
    (A, W[, scale][, zeros][, bias]) and the float32 reference output."""
    args: list
    expected: torch.Tensor


def quant_problem(op, spec: dict, device, *, scales="ones", act_dtype=torch.float16, bias_dtype=torch.float16,
                  rows: Optional[int] = None) -> QuantProblem:
    """The inputs BitBLAS's weight-dequantize tests feed ``op`` (built from ``spec``): activations
    ``rand - 0.5``, weight values from :func:`weight_values` through ``op.weight_transform``, scales
    per ``scales`` ('ones' / 'rand' / 'randn', in ``act_dtype``), the zero point 2**(bits-1) in the
    config's zeros_mode, a ``rand`` bias; plus the dequantize-then-matmul reference."""
    M, N, K = mean_rows(spec["M"]) if rows is None else rows, spec["N"], spec["K"]
    A = (torch.rand(M, K, dtype=act_dtype) - 0.5).to(device)
    kind, bits = op.BITBLAS_TRICK_DTYPE_MAP[spec["W_dtype"]]
    values, codes = weight_values(kind, bits, (N, K), device)
    W = op.weight_transform(codes.cpu()).to(device) if op.weight_transform is not None else codes.to(device)
    args, scale, ref_zeros = [A, W], None, None
    group_size = spec.get("group_size") or -1
    group_size = K if group_size == -1 else group_size
    if spec.get("with_scaling"):
        scale = scale_tensor(scales, N, K // group_size, act_dtype, device)
        args.append(scale)
    if spec.get("with_zeros"):
        given, ref_zeros = zero_points(spec["zeros_mode"], 1 << (bits - 1), scale, bits)
        args.append(given)
    bias = None
    if spec.get("with_bias"):
        bias = torch.rand(N, dtype=bias_dtype).to(device)
        args.append(bias)
    W_ref = dequantized(values, group_size, scale, ref_zeros, spec.get("zeros_mode"))
    return QuantProblem(args, reference(A, W_ref, bias))


def pack_fields(values: torch.Tensor, bits: int) -> torch.Tensor:
    """int8 bytes holding 8 // bits two's-complement fields each along the last axis, the first
    value in the lowest bits."""
    per = 8 // bits
    fields = (values.to(torch.int32) & ((1 << bits) - 1)).reshape(*values.shape[:-1], -1, per)
    shifts = torch.arange(per, dtype=torch.int32, device=values.device) * bits
    byte = (fields << shifts).sum(-1)
    return torch.where(byte > 127, byte - 256, byte).to(torch.int8)


def check_transform_weight(op, spec: dict, device) -> None:
    """BitBLAS's transform_weight path: weight values from [0, 2**(bits-1)) (for int formats too),
    ``op.transform_weight`` on them, the operator called without ``output=``; checked as BitBLAS's
    test does (assert_close, rtol=1e2, atol=1e0)."""
    _, bits = op.BITBLAS_TRICK_DTYPE_MAP[spec["W_dtype"]]
    M, N, K = spec["M"], spec["N"], spec["K"]
    A = torch.rand(M, K, dtype=torch.float16).to(device)
    values = torch.randint(0, 1 << (bits - 1), (N, K), dtype=torch.int8).to(device)
    bias = torch.rand(N, dtype=torch.float16).to(device) if spec["with_bias"] else None
    out = op(A, op.transform_weight(values), *([bias] if bias is not None else []))
    torch.testing.assert_close(out, reference(A, values, bias, torch.float16), rtol=1e2, atol=1e0)
