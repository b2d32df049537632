"""The torch reference for every config, and the one tolerance table the tests use.

The reference dequantizes with :func:`bitblas.quantization.dequantize` (float64), multiplies in
float64 and applies the epilogue; it shares nothing with the TensorIR emitter but the format table.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .config import MatmulConfig
from .formats import FORMATS
from .quantization.quantize import TORCH_DTYPES, dequantize, dequantize_activation, nvfp4_decode

__all__ = ["reference_matmul", "reference_nvfp4_gemv", "tolerance", "relative_error", "TOLERANCES"]

# Largest accepted max|out - ref| / max|ref|, by the dtype that rounds: the activation dtype (the
# GPU decodes weights to it before the tensor-core multiply) and the output dtype. Integer
# activations with int32 output are exact.
TOLERANCES = {
    "float16": 4e-3,
    "bfloat16": 2.5e-2,
    "float32": 1e-4,
    "int8": 1e-4,
    "int4": 1e-4,
    "uint4": 1e-4,
    # exact float8 products, but the float8 tensor cores of Ada / Hopper keep 13 mantissa bits in their
    # sums (testing/kernel_helpers.fp8_mma_tolerance); the fused GEMM promotes every slab of 4 (4-bit
    # codes) or 8 (2-bit) k32 instructions into float32: 4 * 2**-13, over the 1.1e-4 measured with 8
    # (H100, W2A-fp8 g256, K=1536, float32 output)
    "float8_e4m3": 5e-4,
    "float8_e5m2": 1e-4,
    "nvfp4": 1e-4,      # NVFP4 x NVFP4: exact products, float32 sums (the output dtype rounds)
    "int32": 0.0,
}


def tolerance(config: MatmulConfig) -> float:
    if config.out_dtype == "int32":
        return 0.0
    return max(TOLERANCES[config.A_dtype], TOLERANCES[config.out_dtype])


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref| in float64 (NaN anywhere in ``out`` gives inf); ``ref`` may be on
    another device than ``out`` (compared on ``out``'s)."""
    o, r = out.to(torch.float64), ref.to(out.device, torch.float64)
    if torch.isnan(o).any() or torch.isinf(o).any():
        return float("inf")
    denom = max(float(r.abs().max()) if r.numel() else 0.0, 1e-30)
    return float((o - r).abs().max()) / denom if r.numel() else 0.0


def reference_matmul(config: MatmulConfig, A: torch.Tensor, W: torch.Tensor, scale=None, zeros=None,
                     bias=None, a_scale=None, global_scale: Optional[torch.Tensor] = None,
                     cast: bool = True, device=None, a_global_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out [..., N] for ``Matmul(config)``; ``cast=False`` returns the product before the output cast.

    Dequantization is float64 on the CPU; the product is float64 on the CPU, or float32 on
    ``device`` when one is given (e.g. "cuda": the tuner's check of large problems).
    NVFP4 activations (:func:`_reference_nvfp4`): both operands decoded, the product in float32.
    """
    c = config
    if c.A_dtype == "nvfp4":
        return _reference_nvfp4(c, A, W, scale, a_scale, global_scale, a_global_scale, cast, device)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    dt = torch.float64 if dev.type == "cpu" else torch.float32
    wf = dequantize(c, W.cpu(), None if scale is None else scale.cpu(), None if zeros is None else zeros.cpu(),
                    None if global_scale is None else global_scale.cpu())
    if c.layout == "nn":
        wf = wf.T
    wf = wf.to(dev, dt)
    af = dequantize_activation(A.cpu(), c.A_dtype).to(dev, dt)
    out = af @ wf.T
    if a_scale is not None:
        out = out * a_scale.to(dev, dt).unsqueeze(-1)
    if bias is not None:
        out = out + bias.to(dev, dt)
    if not cast:
        return out
    if c.out_dtype == "int32":
        return out.round().to(torch.int32)
    return out.to(TORCH_DTYPES[c.out_dtype])


def _reference_nvfp4(c: MatmulConfig, A, W, scale, a_scale, global_scale, a_global_scale, cast, device):
    """NVFP4 x NVFP4: decode both operands (exact in float32), matmul in float32 (on ``device`` or
    A's device), global scales on the product; batched configs [L, ., .] as torch.bmm."""
    dev = torch.device(device) if device is not None else A.device
    af = nvfp4_decode(A.to(dev), a_scale.to(dev))
    wf = nvfp4_decode(W.to(dev), scale.to(dev))
    out = af @ wf.transpose(-1, -2)
    for g in (global_scale, a_global_scale):
        if g is not None:
            out = out * g.to(dev, torch.float32).reshape(())
    return out.to(TORCH_DTYPES[c.out_dtype]) if cast else out


def reference_nvfp4_gemv(a: torch.Tensor, b: torch.Tensor, sfa: torch.Tensor, sfb: torch.Tensor,
                         device=None) -> torch.Tensor:
    """float32 [M, 1, L] of ``bitblas.ops.nvfp4_gemv``'s inputs (the issue's layouts: a [M, K/2, L],
    b [>=1, K/2, L] (row 0 used), sfa [M, K/16, L], sfb [>=1, K/16, L]): c[:, 0, l] =
    decode(a[:, :, l]) @ decode(b[0, :, l]), decoded in float32, multiplied in float32."""
    dev = torch.device(device) if device is not None else a.device
    af = nvfp4_decode(a.to(dev).permute(2, 0, 1), sfa.to(dev).permute(2, 0, 1))        # [L, M, K]
    bf = nvfp4_decode(b[:1].to(dev).permute(2, 0, 1), sfb[:1].to(dev).permute(2, 0, 1))  # [L, 1, K]
    return torch.bmm(af, bf.transpose(1, 2)).permute(1, 2, 0)                         # [M, 1, L]


def random_inputs(config: MatmulConfig, m: int, device="cpu", seed: Optional[int] = None,
                  lead: Optional[tuple] = None) -> dict:
    """Fresh random operator inputs: a random float weight quantized with
    :func:`bitblas.quantization.quantize` (method "rtn"), random activations (quantized per token for
    integer activations, and for float8 ones with with_act_scaling), bias. Keys: A, W and whichever of
    scale, zeros, bias, a_scale, global_scale the config takes."""
    from .quantization.quantize import quantize, quantize_activation
    g = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    c = config
    if c.A_dtype == "nvfp4":
        return _random_nvfp4(c, m, device, g, lead)
    wshape = (c.K, c.N) if c.layout == "nn" else (c.N, c.K)
    weight = torch.randn(wshape, generator=g) * 0.05
    if FORMATS[c.W_dtype].kind == "uint" and c.with_scaling and not c.with_zeros:
        weight = weight.abs()       # unsigned codes without zero points hold no negative weights
    # test data: the operator is checked against the same tensors, so the cheaper plain RTN serves
    out = {k: v.to(device) for k, v in quantize(weight, c, method="rtn").items()}
    lead = tuple(lead) if lead is not None else (m,)
    x = torch.randn(*lead, c.K, generator=g)
    a = FORMATS[c.A_dtype]
    if a.kind == "float" or (a.kind == "table" and not c.with_act_scaling):
        # float8 without a per-token scale: taken as is (quantizing per token would stretch x to
        # the format's range, 57344 for e5m2, and overflow a float16 output)
        out["A"] = x.to(TORCH_DTYPES[a.torch_dtype]).to(device)
    elif a.kind == "uint":          # unsigned activation codes (uint4): random codes, unit scales
        from .quantization.utils import pack_codes
        q = torch.randint(0, 1 << a.bits, (*lead, c.K), generator=g, dtype=torch.int32)
        out["A"] = pack_codes(q, a).to(device)
        if c.with_act_scaling:
            out["a_scale"] = torch.ones(lead, dtype=torch.float32).to(device)
    else:
        q, s = quantize_activation(x, c.A_dtype)
        out["A"] = q.to(device)
        if c.with_act_scaling:
            out["a_scale"] = s.to(device)
    if c.with_bias:
        if c.out_dtype == "int32":
            out["bias"] = torch.randint(-1000, 1000, (c.N,), generator=g, dtype=torch.int32).to(device)
        else:
            out["bias"] = (torch.randn(c.N, generator=g) * 0.1).to(TORCH_DTYPES[c.out_dtype]).to(device)
    return out


def _random_nvfp4(c: MatmulConfig, m: int, device, g, lead) -> dict:
    """NVFP4 x NVFP4 inputs: random float weights and activations quantized with
    ``quantize_activation(., "nvfp4")`` (one global scale per tensor, over the whole batch)."""
    from .quantization.quantize import quantize_activation
    bl = () if c.batch is None else (c.batch,)
    lead = tuple(lead) if lead is not None else (*bl, m)
    W, scale, gw = quantize_activation(torch.randn(*bl, c.N, c.K, generator=g) * 0.05, "nvfp4")
    A, a_scale, ga = quantize_activation(torch.randn(*lead, c.K, generator=g), "nvfp4")
    out = dict(A=A, W=W, scale=scale, a_scale=a_scale, global_scale=gw, a_global_scale=ga)
    return {k: v.to(device) for k, v in out.items()}
