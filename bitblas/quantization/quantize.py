"""Quantize float weights and activations to any registered format, and dequantize back.

``quantize(weight, config)`` returns exactly the tensors a ``Matmul(config)`` takes (packed W,
scale, zeros, global scale); ``quantize_weight`` gives the unpacked codes; ``dequantize`` is the
exact inverse rule the kernels and the torch reference apply.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ..config import MatmulConfig
from ..formats import FORMATS, Format, code_storage, get_format
from ..plan import make_plan
from .search import METHODS, Grid, search
from .utils import pack_codes, unpack_codes

logger = logging.getLogger(__name__)

__all__ = ["LossyQuantizationWarning", "QuantizedWeight", "quantize_weight", "quantize", "pack_weight", "dequantize",
           "pack_zeros", "unpack_zeros", "decode_values", "quantize_activation", "dequantize_activation",
           "TORCH_DTYPES", "torch_dtype", "nvfp4_decode", "e2m1_codes"]

TORCH_DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "uint8": torch.uint8,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "float8_e4m3": torch.float8_e4m3fn,
}


class LossyQuantizationWarning(UserWarning):
    """Quantization clamped weights the format cannot represent (beyond rounding)."""


def _warn_clamp(msg: str):
    warnings.warn(msg, LossyQuantizationWarning, stacklevel=3)


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


@dataclass
class QuantizedWeight:
    """Unpacked result of :func:`quantize_weight`.

    codes: int16 [N, K] integer codes / table indices (float formats: the tensor in that dtype);
    scale: [N, groups] or None; zeros: [N, groups] (float, or int16 codes for zeros_mode
    "quantized") or None; global_scale: float32 [1] or None.
    """

    codes: torch.Tensor
    scale: Optional[torch.Tensor] = None
    zeros: Optional[torch.Tensor] = None
    global_scale: Optional[torch.Tensor] = None


def _table(fmt: Format, device) -> torch.Tensor:
    return torch.tensor(fmt.table, dtype=torch.float32, device=device)


def nearest_code(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Index of the table entry nearest to each element (finite entries only)."""
    t = torch.tensor(fmt.table, dtype=torch.float64)
    codes = torch.arange(len(fmt.table))
    keep = torch.isfinite(t)
    t, codes = t[keep], codes[keep]
    order = torch.argsort(t, stable=True)
    t, codes = t[order], codes[order]
    mid = (t[1:] + t[:-1]) / 2
    idx = torch.bucketize(x.to(torch.float64).contiguous(), mid.to(x.device))
    return codes.to(x.device)[idx].to(torch.int16)


def safe_scale(s: torch.Tensor) -> torch.Tensor:
    """``s`` with zero scales replaced by 1 (an all-zero group: any scale decodes it exactly)."""
    return torch.where(s == 0, torch.ones_like(s), s)


def quantize_weight(weight: torch.Tensor, W_dtype: str, group_size: int = -1, with_scaling: bool = True,
                    with_zeros: bool = False, zeros_mode: str = "original", scale_dtype=torch.float16,
                    global_scale: Optional[bool] = None, method: str = "mse") -> QuantizedWeight:
    """Quantize ``weight`` [N, K] to ``W_dtype``, per output channel (group_size=-1) or per
    ``group_size`` consecutive K elements.

    ``method="rtn"``: round-to-nearest with symmetric (absmax) scales without zeros, asymmetric
    (min/max) with zeros. ``method="mse"`` (default): RTN's parameters and, per group, clipped and
    least-squares-refitted scales (and zero points), keeping whichever gives the group the smallest
    squared error as the kernel decodes it (never more than RTN's; see ``bitblas.quantization.search``).
    nvfp4 always uses 16-element groups with float8_e4m3 scales and, unless ``global_scale=False``,
    a float32 global scale (chosen as RTN's in both methods). Without scales (and for float16 /
    bfloat16 W_dtype) both methods are the same.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid; accepted: {', '.join(map(repr, METHODS))}")
    fmt = get_format(W_dtype, "W")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError("weight: expected a float tensor [N, K]")
    n, k = weight.shape
    w = weight.detach().to(torch.float32).contiguous()   # the search views its scratch buffers
    if fmt.kind == "float":
        return QuantizedWeight(w.to(TORCH_DTYPES[fmt.torch_dtype]))
    if fmt.group_size is not None:
        group_size = fmt.group_size
    gs = k if group_size in (-1, None) else group_size
    if k % gs:
        raise ValueError(f"group_size={group_size} must divide K={k}")
    wg = w.reshape(n, k // gs, gs)

    if fmt.name == "nvfp4":
        amax = wg.abs().amax(-1)
        gscale = None
        if global_scale is not False:
            gscale = safe_scale(w.abs().amax().reshape(1) / (FORMATS["float8_e4m3"].max_abs * fmt.max_abs))
            sb = (amax / fmt.max_abs / gscale).clamp(max=FORMATS["float8_e4m3"].max_abs).to(torch.float8_e4m3fn)
            denom = sb.to(torch.float32) * gscale
        else:
            sb = (amax / fmt.max_abs).clamp(max=FORMATS["float8_e4m3"].max_abs).to(torch.float8_e4m3fn)
            denom = sb.to(torch.float32)
        codes = nearest_code(wg / safe_scale(denom).unsqueeze(-1), fmt)
        if method == "mse":
            e4m3 = FORMATS["float8_e4m3"].max_abs
            grid = Grid(fmt, None, lambda t: t.clamp(max=e4m3).to(torch.float8_e4m3fn).to(torch.float32), None,
                        gscale)
            s, _, c = search(grid, wg, sb.to(torch.float32), None, codes.to(torch.float32))
            sb, codes = s.to(torch.float8_e4m3fn), c.to(torch.int16)
        return QuantizedWeight(codes.reshape(n, k), sb, None, gscale)

    if not with_scaling:
        if with_zeros:
            raise ValueError("with_zeros=True needs with_scaling=True")
        if fmt.kind == "table":
            lim = fmt.max_abs
            if bool((w.abs() > lim).any()):
                _warn_clamp(f"quantize_weight: W_dtype={fmt.name!r} without scales represents |w| <= {lim:g}; "
                            f"weights up to {float(w.abs().max()):g} are clamped (use with_scaling=True)")
            if fmt.torch_dtype:
                return QuantizedWeight(w.clamp(-lim, lim).to(TORCH_DTYPES[fmt.torch_dtype]))
            return QuantizedWeight(nearest_code(w, fmt))
        lo, hi = fmt.code_range
        r = w.round()
        if bool(((r < lo) | (r > hi)).any()):
            _warn_clamp(f"quantize_weight: W_dtype={fmt.name!r} without scales holds integers in [{lo}, {hi}]; "
                        f"weights in [{float(w.min()):g}, {float(w.max()):g}] are clamped (use with_scaling=True)")
        return QuantizedWeight(r.clamp(lo, hi).to(torch.int16))

    def rounded(s):  # scales and zeros as the kernel will see them
        return s.to(scale_dtype).to(torch.float32)

    if fmt.kind == "table":
        s = rounded(wg.abs().amax(-1) / fmt.max_abs)
        x = wg / safe_scale(s).unsqueeze(-1)
        cast = TORCH_DTYPES[fmt.torch_dtype] if fmt.torch_dtype else None
        if cast is not None:
            lim = fmt.max_abs
            codes = x.clamp(-lim, lim).to(cast)
        else:
            codes = nearest_code(x, fmt)
        if method == "mse":
            s, _, c = search(Grid(fmt, None, rounded, None, cast=cast), wg, s, None,
                             codes.to(torch.float32))
            codes = c.to(cast if cast is not None else torch.int16)
        return QuantizedWeight(codes.reshape(n, k), s.to(scale_dtype))

    lo, hi = fmt.code_range
    if not with_zeros:
        if fmt.kind == "int":
            s = wg.abs().amax(-1) / max(hi, 1)
        else:
            neg = wg < 0
            if bool(neg.any()):
                _warn_clamp(f"quantize_weight: W_dtype={fmt.name!r} with scales but no zero points cannot represent "
                            f"negative weights; {int(neg.sum())} of {neg.numel()} weights are clamped to 0 (use "
                            "with_zeros=True" + (f" or a signed format such as {'int' + str(fmt.bits)!r})"
                                                 if fmt.bits > 1 else ")"))
            s = wg.clamp(min=0).amax(-1) / hi
        s = safe_scale(rounded(s))
        q = (wg / s.unsqueeze(-1)).round().clamp(lo, hi)
        if method == "mse":
            s, _, q = search(Grid(fmt, None, lambda t: safe_scale(rounded(t)), None), wg, s, None, q)
        return QuantizedWeight(q.reshape(n, k).to(torch.int16), s.to(scale_dtype))

    wmin = wg.amin(-1).clamp(max=0)
    wmax = wg.amax(-1).clamp(min=0)
    s = safe_scale(rounded((wmax - wmin) / (hi - lo)))
    if zeros_mode == "rescale":
        z = rounded(lo * s - wmin)
        q = ((wg + z.unsqueeze(-1)) / s.unsqueeze(-1)).round().clamp(lo, hi)
    elif zeros_mode in ("original", "quantized"):
        z = lo - wmin / s
        z = z.round().clamp(lo, hi) if zeros_mode == "quantized" else rounded(z)
        q = (wg / s.unsqueeze(-1) + z.unsqueeze(-1)).round().clamp(lo, hi)
    else:
        raise ValueError(f"zeros_mode={zeros_mode!r} is invalid; accepted: original, rescale, quantized")
    if method == "mse":
        grid = Grid(fmt, zeros_mode, lambda t: safe_scale(rounded(t)),
                    (lambda t: t) if zeros_mode == "quantized" else rounded)
        s, z, q = search(grid, wg, s, z, q)
    zeros = z.to(torch.int16) if zeros_mode == "quantized" else z.to(scale_dtype)
    return QuantizedWeight(q.reshape(n, k).to(torch.int16), s.to(scale_dtype), zeros)


def integer_codes(t: torch.Tensor, name: str, lo: int, hi: int, what: str, bit_patterns: bool = False) -> torch.Tensor:
    """``t`` as int32 codes, checked: integers (an integer tensor, or a float tensor holding whole
    numbers) in [lo, hi]; else ValueError naming ``name``, the range and ``what`` they are codes of.
    ``bit_patterns``: an int8 tensor carries codes 0..255 as its bytes (uint8 / float8 codes)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of integer codes, got {type(t).__name__}")
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected integer codes in [{lo}, {hi}] for {what}, got a {t.dtype} tensor")
    if t.dtype.is_floating_point:
        f = t.detach().to(torch.float64)
        bad = ~torch.isfinite(f) | (f != f.round())
        if bool(bad.any()):
            v = f[bad][0].item()
            raise ValueError(f"{name}: codes must be integers in [{lo}, {hi}] for {what}, got {v:g} "
                             f"at index {tuple(int(i) for i in bad.nonzero()[0])}")
        if f.numel() and (float(f.min()) < lo or float(f.max()) > hi):
            raise ValueError(f"{name}: codes must lie in [{lo}, {hi}] for {what}, got values in "
                             f"[{float(f.min()):g}, {float(f.max()):g}]")
        return f.to(torch.int32)
    q = t.to(torch.int64)
    if bit_patterns and t.dtype == torch.int8:
        q = q & 0xFF
    if q.numel() and (int(q.min()) < lo or int(q.max()) > hi):
        raise ValueError(f"{name}: codes must lie in [{lo}, {hi}] for {what}, got values in "
                         f"[{int(q.min())}, {int(q.max())}]")
    return q.to(torch.int32)


def pack_weight(config: MatmulConfig, codes: torch.Tensor, scale=None, zeros=None,
                global_scale=None, *, _weight_arg: str = "codes") -> Dict[str, torch.Tensor]:
    """Turn unpacked codes (and scales, zeros) into exactly the tensors ``Matmul(config)`` takes.

    Integer codes (and the zero-point codes of zeros_mode "quantized") may come as integer tensors
    or as float tensors of whole numbers; values outside the format's code range or not integers
    raise ValueError naming the argument and the range."""
    plan = make_plan(config)
    w = plan.w
    out: Dict[str, torch.Tensor] = {}
    name = _weight_arg
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(codes).__name__}")
    c = config
    want = (c.K, c.N) if c.layout == "nn" else (c.N, c.K)
    if tuple(codes.shape) != want:
        raise ValueError(f"{name}: expected shape {list(want)} for layout={c.layout!r}, got {list(codes.shape)}")
    if w.kind == "float" or (w.torch_dtype and codes.dtype == TORCH_DTYPES[w.torch_dtype]):
        wanted = TORCH_DTYPES[w.torch_dtype]
        if codes.dtype != wanted:
            if w.kind != "float" or not codes.dtype.is_floating_point:
                raise TypeError(f"{name}: expected {wanted} for W_dtype={w.name!r}, got {codes.dtype}")
            codes = codes.to(wanted)
        out["W"] = codes.contiguous()
    else:
        lo, hi = w.code_range
        # int8 tensors carry uint8 / float8 codes as bit patterns
        q = integer_codes(codes, name, lo, hi, f"W_dtype={w.name!r}", bit_patterns=w.kind != "int")
        packed = pack_codes(q, w, plan.w_storage, plan.w_order)
        if w.torch_dtype:
            packed = packed.view(TORCH_DTYPES[w.torch_dtype])
        out["W"] = packed.contiguous()
    for name, t in (("scale", scale), ("zeros", zeros)):
        spec = plan.arg(name)
        if t is None:
            continue
        if spec is None:
            raise ValueError(f"{name} given, but the config has with_{'scaling' if name == 'scale' else 'zeros'}=False")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        t = t.reshape(c.N, -1) if t.dim() == 1 and spec.shape[1] == 1 else t
        if name == "zeros" and c.zeros_mode == "quantized":
            out[name] = pack_zeros(config, t)
            continue
        if tuple(t.shape) != tuple(spec.shape):
            raise ValueError(f"{name}: expected shape {list(spec.shape)}, got {list(t.shape)}")
        out[name] = t.to(TORCH_DTYPES[spec.user_dtype]).contiguous()
    if global_scale is not None:
        if plan.arg("global_scale") is None:
            raise ValueError(f"global_scale given, but W_dtype={w.name!r} takes none")
        out["global_scale"] = torch.as_tensor(global_scale, dtype=torch.float32).reshape(1)
    return out


def quantize(weight: torch.Tensor, config: MatmulConfig, method: str = "mse") -> Dict[str, torch.Tensor]:
    """Quantize a float weight ([N, K], or [K, N] for layout "nn") for ``Matmul(config)``
    (``method``: as :func:`quantize_weight`'s).

    Returns {"W": ..., "scale": ..., "zeros": ..., "global_scale": ...}, only the keys the
    operator takes; pass them as keyword arguments: ``op(A, **quantize(w, config))``.
    """
    plan = make_plan(config)
    sd = TORCH_DTYPES["float32" if plan.scale_dtype in (None, "float8_e4m3") else plan.scale_dtype]
    q = quantize_weight(weight, config.W_dtype, config.group_size, config.with_scaling, config.with_zeros,
                        config.zeros_mode, scale_dtype=sd, method=method)
    return pack_weight(config, q.codes, q.scale, q.zeros, q.global_scale)


def decode_values(codes: torch.Tensor, fmt) -> torch.Tensor:
    """Values (float64) the codes of ``fmt`` stand for, before scales and zeros."""
    f = FORMATS[fmt] if isinstance(fmt, str) else fmt
    if f.kind == "table":
        t = torch.tensor(f.table, dtype=torch.float64, device=codes.device)
        return t[codes.to(torch.long)]
    return codes.to(torch.float64)


def pack_zeros(config: MatmulConfig, zeros: torch.Tensor) -> torch.Tensor:
    """Zero-point codes [N, groups] of zeros_mode "quantized" (integers in the weight format's code
    range, else ValueError naming ``zeros``) -> the operator's ``zeros`` [groups, N * bits / 8],
    packed along N (GPTQ's qzeros layout, as BitBLAS takes it), N padded to whole bytes."""
    plan = make_plan(config)
    w, c = plan.w, config
    if not isinstance(zeros, torch.Tensor):
        raise TypeError(f"zeros: expected a torch.Tensor, got {type(zeros).__name__}")
    t = zeros.reshape(c.N, -1) if zeros.dim() == 1 and plan.groups == 1 else zeros
    if tuple(t.shape) != (c.N, plan.groups):
        raise ValueError(f"zeros: expected codes of shape {[c.N, plan.groups]}, got {list(zeros.shape)}")
    lo, hi = w.code_range
    z = integer_codes(t, "zeros", lo, hi, f"the zero points of W_dtype={w.name!r} (zeros_mode='quantized')",
                      bit_patterns=True)
    z = torch.nn.functional.pad(z.T, (0, (-c.N) % w.codes_per_byte))
    return pack_codes(z, w, plan.w_storage).contiguous()


def unpack_zeros(config: MatmulConfig, zeros: torch.Tensor) -> torch.Tensor:
    """The zero-point codes [N, groups] (int16) of zeros_mode "quantized" from the operator's packed
    ``zeros`` [groups, N * bits / 8] (packed along N: GPTQ's qzeros layout, as BitBLAS takes it)."""
    plan = make_plan(config)
    g = plan.groups
    if not isinstance(zeros, torch.Tensor) or zeros.dim() != 2 or zeros.shape[0] != g or zeros.dtype.itemsize != 1:
        raise ValueError(f"zeros: expected packed codes int8 {list(plan.arg('zeros').shape)}, got "
                         f"{getattr(zeros, 'dtype', type(zeros).__name__)} {list(getattr(zeros, 'shape', []))}")
    return unpack_codes(zeros, plan.w, plan.w_storage)[:, :config.N].T.contiguous()


def dequantize(config: MatmulConfig, W: torch.Tensor, scale=None, zeros=None, global_scale=None) -> torch.Tensor:
    """float64 [N, K] (or [K, N] for layout "nn") weight that ``Matmul(config)`` multiplies by."""
    plan = make_plan(config)
    w, c = plan.w, config
    if w.kind == "float":
        return W.to(torch.float64)
    v = decode_values(unpack_codes(W.view(torch.int8), w, plan.w_storage, plan.w_order), w)
    if not c.with_scaling:
        return v
    gs = c.K if plan.groups == 1 else c.group_size

    def expand(t):  # [N, groups] (per-channel: also [N], as the operator takes it) -> [N, K]
        return t.reshape(c.N, -1).repeat_interleave(gs, dim=1)

    s = expand(scale.to(torch.float64))
    if not c.with_zeros:
        out = v * s
    elif c.zeros_mode == "quantized":
        z = unpack_zeros(config, zeros).to(torch.float64)
        out = (v - expand(z)) * s
    elif c.zeros_mode == "rescale":
        out = v * s - expand(zeros.to(torch.float64))
    else:
        out = (v - expand(zeros.to(torch.float64))) * s
    if w.global_scale and global_scale is not None:
        out = out * global_scale.to(torch.float64).reshape(())
    return out


_ACT_QMAX = {"int8": 127.0, "int4": 7.0}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)    # e2m1 magnitudes, codes 0..7 (8..15: negated)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (int16, 0..15: sign bit 3, magnitude index 0..7) of ``y``, rounded to nearest with
    ties to even (the code with mantissa bit 0), saturating at +-6; negative values that round
    to zero keep their sign (code 8), as ``cvt.rn.satfinite.e2m1x2.f32`` does."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=y.device)
    a = y.to(torch.float32).abs().clamp(max=6.0).contiguous()
    lo = (torch.bucketize(a, grid, right=True) - 1).clamp(0, 7)      # largest magnitude <= a
    hi = (lo + 1).clamp(max=7)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo % 2 == 1) & (hi != lo))
    mag = torch.where(up, hi, lo)
    return (mag + 8 * torch.signbit(y).to(mag.dtype)).to(torch.int16)


def _quantize_nvfp4(x: torch.Tensor, global_scale: bool):
    """(codes int8 [..., K/2], block scales float8_e4m3fn [..., K/16], float32 global scale [1] or
    None): block scale = amax(block) / 6 (divided by the global scale amax(x) / (448 * 6) when
    there is one) rounded to e4m3, codes = e2m1(x / (block scale * global scale)), nearest-even."""
    k = x.shape[-1]
    if k % 16:
        raise ValueError(f"x: the last dimension (K={k}) must be a multiple of 16 for nvfp4 (one scale per 16 "
                         "elements)")
    e4m3_max, e2m1_max = FORMATS["float8_e4m3"].max_abs, FORMATS["nvfp4"].max_abs
    xf = x.detach().to(torch.float32)
    xb = xf.reshape(*xf.shape[:-1], k // 16, 16)
    amax = xb.abs().amax(-1)
    gs = safe_scale(xf.abs().amax().reshape(1) / (e4m3_max * e2m1_max)) if global_scale else None
    sb = (amax / e2m1_max / (gs if gs is not None else 1.0)).clamp(max=e4m3_max).to(torch.float8_e4m3fn)
    denom = sb.to(torch.float32) * (gs if gs is not None else 1.0)
    codes = e2m1_codes(xb / safe_scale(denom).unsqueeze(-1)).reshape(xf.shape)
    return pack_codes(codes, FORMATS["nvfp4"], "plain"), sb, gs


_NVFP4_TABLES: dict = {}


def _nvfp4_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The e2m1 value table on ``device``, made once per (dtype, device): no host-to-device copy per
    call, so :func:`nvfp4_decode` can be captured in a CUDA graph after its first call."""
    key = (dtype, device)
    t = _NVFP4_TABLES.get(key)
    if t is None:
        t = _NVFP4_TABLES[key] = torch.tensor(FORMATS["nvfp4"].table, dtype=dtype, device=device)
    return t


def nvfp4_decode(codes: torch.Tensor, scales: torch.Tensor, global_scale: Optional[torch.Tensor] = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values [..., K] of NVFP4 data along its last dimension: codes [..., K/2] (two e2m1 codes per
    byte, the even one in the low nibble; int8, uint8 or float4_e2m1fn_x2) times the float8_e4m3
    block scales [..., K/16] times ``global_scale`` (float32 [1]) if given, computed in ``dtype``.
    The decoded values are exact in float16, bfloat16 and wider (an e2m1 x e4m3 product has at most
    6 significant bits and lies within 2**-10 .. 2688); a global scale rounds once in ``dtype``."""
    t = _nvfp4_table(dtype, codes.device)
    b = codes.view(torch.uint8).to(torch.int64)
    v = torch.stack((t[b & 15], t[b >> 4]), dim=-1).flatten(-2)
    s = scales.view(torch.float8_e4m3fn) if scales.dtype.itemsize == 1 else scales
    v = v * s.to(dtype).repeat_interleave(16, dim=-1)
    return v if global_scale is None else v * global_scale.to(dtype).reshape(())


def quantize_activation(x: torch.Tensor, dtype: str = "int8", global_scale: Optional[bool] = None):
    """Per-token symmetric quantization of activations [..., K].

    Returns (q, scale): q in the operator's input form (int8; int4 packed two per byte along K;
    float8 tensors) and float32 scale [...] with x ~= decode(q) * scale[..., None].

    ``dtype="nvfp4"`` returns (codes, block_scales, global_scale): e2m1 codes two per byte along K
    (int8 [..., K/2]), float8_e4m3fn block scales [..., K/16] (amax / 6 per 16 elements) and,
    unless ``global_scale=False``, a float32 global scale [1] (amax(x) / (448 * 6), else None),
    with x ~= e2m1(codes) * block_scale * global_scale (:func:`dequantize_activation`).
    """
    fmt = get_format(dtype, "A", "dtype")
    if fmt.name == "nvfp4":
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.dim() < 1:
            raise ValueError("x: expected a float tensor [..., K]")
        return _quantize_nvfp4(x, global_scale is not False)
    if global_scale is not None:
        raise ValueError(f"global_scale={global_scale!r}: only dtype='nvfp4' takes a global scale")
    if fmt.kind in ("float", "uint"):
        raise ValueError(f"dtype={dtype!r}: per-token quantization targets int8, int4, float8_e4m3, float8_e5m2 or "
                         "nvfp4 (unsigned activations are passed as codes)")
    xf = x.detach().to(torch.float32)
    qmax = _ACT_QMAX.get(dtype, fmt.max_abs)
    s = safe_scale(xf.abs().amax(-1) / qmax)
    y = xf / s.unsqueeze(-1)
    if fmt.kind == "table":
        return y.clamp(-qmax, qmax).to(TORCH_DTYPES[fmt.torch_dtype]), s
    q = y.round().clamp(*fmt.code_range).to(torch.int32)
    return (pack_codes(q, fmt, code_storage(fmt, "A")) if fmt.packed else q.to(torch.int8)), s


def dequantize_activation(q: torch.Tensor, dtype: str, scale: Optional[torch.Tensor] = None,
                          global_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float64 values of activations ``q`` of format ``dtype`` (times ``scale[..., None]`` if given).

    nvfp4: ``q`` codes [..., K/2] (int8, uint8 or float4_e2m1fn_x2), ``scale`` the float8_e4m3
    block scales [..., K/16] (required), ``global_scale`` an optional float32 [1]."""
    fmt = get_format(dtype, "A", "dtype")
    if fmt.name == "nvfp4":
        if scale is None:
            raise ValueError("scale: nvfp4 activations need their block scales [..., K/16]")
        return nvfp4_decode(q, scale, global_scale, torch.float64)
    if global_scale is not None:
        raise ValueError(f"global_scale: only dtype='nvfp4' takes a global scale, not {dtype!r}")
    if fmt.kind in ("float", "table"):
        v = q.to(torch.float64)
    else:
        v = unpack_codes(q.view(torch.int8), fmt, code_storage(fmt, "A")).to(torch.float64)
    return v if scale is None else v * scale.to(torch.float64).unsqueeze(-1)
