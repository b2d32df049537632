"""Packing of integer codes into int8 storage, and BitBLAS's packing helpers by their names."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..code_order import bitblas_fast_decoding, bitblas_weight_order, interleave_positions, slot_codes
from ..formats import FORMATS, STORAGES, Format

__all__ = ["pack_codes", "unpack_codes", "unpack_fields", "general_compress", "interleave_weight",
           "deinterleave_weight", "lop3_permute", "bitblas_fast_decoding", "bitblas_weight_order", "from_bitblas_weight",
           "to_bitblas_weight", "reorder_codes"]


def _fmt(fmt) -> Format:
    if isinstance(fmt, Format):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"format={fmt!r} is not supported; accepted: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def _storage(f: Format, storage: Optional[str]) -> str:
    if storage is None:
        return f.storage
    if storage not in STORAGES:
        raise ValueError(f"storage={storage!r} is invalid; accepted: {', '.join(STORAGES)} or None")
    return storage


def _word_codes(t: torch.Tensor, n: int, index) -> torch.Tensor:
    """``t`` [..., K] with each run of ``n`` codes (one 32-bit word) reordered: ``out[.., w*n + i]
    = t[.., w*n + index[i]]``."""
    k = t.shape[-1]
    if k % n:
        raise ValueError(f"codes: last dimension {k} must be a multiple of {n} (the codes of a 32-bit word) "
                         "for a weight in fast-decoding order")
    idx = torch.as_tensor(list(index), dtype=torch.long, device=t.device)
    return t.reshape(*t.shape[:-1], k // n, n).index_select(-1, idx).reshape(t.shape)


def pack_codes(codes: torch.Tensor, fmt, storage: Optional[str] = None, order=None) -> torch.Tensor:
    """Pack integer codes [..., K] into int8 [..., K * bits / 8], little-endian inside each byte.

    Codes must lie in the format's code range (for uint8, int8 bit patterns are taken as is).
    ``storage`` (:func:`bitblas.formats.code_storage`): how signed codes are stored, "offset"
    (``q + 2**(bits-1)``) or "twos"; None: the format's weight storage (``fmt.storage``:
    offset-binary for int1/int2/int4, two's complement for int8). Activations: "twos".
    ``order`` (``Plan.w_order``, :mod:`bitblas.code_order`): code j of each 32-bit word goes to
    slot ``order[j]`` (Microsoft BitBLAS's fast-decoding interleave); None: natural order.
    """
    f = _fmt(fmt)
    st = _storage(f, storage)
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"codes: expected an integer tensor, got {codes.dtype}")
    if order is not None:
        codes = _word_codes(codes, len(order), slot_codes(order))
    q = codes.to(torch.int32)
    if st == "offset":
        q = q + (1 << (f.bits - 1))
    if not f.packed:
        return q.bitwise_and(0xFF).to(torch.uint8).view(torch.int8)
    cpb, bits = f.codes_per_byte, f.bits
    k = codes.shape[-1]
    if k % cpb:
        raise ValueError(f"codes: last dimension {k} must be a multiple of {cpb} for {f.name}")
    u = q.bitwise_and((1 << bits) - 1).reshape(*codes.shape[:-1], k // cpb, cpb)
    shifts = torch.arange(cpb, dtype=torch.int32, device=codes.device) * bits
    return (u << shifts).sum(-1).to(torch.uint8).view(torch.int8)


def unpack_fields(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The stored ``bits``-bit fields (0 .. 2**bits - 1, int32) of int8 storage [..., n] -> [..., n * 8 / bits]."""
    b = packed.view(torch.uint8).to(torch.int32)
    if bits < 8:
        shifts = torch.arange(8 // bits, dtype=torch.int32, device=packed.device) * bits
        b = ((b.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(*packed.shape[:-1], -1)
    return b


def unpack_codes(packed: torch.Tensor, fmt, storage: Optional[str] = None, order=None) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: int16 codes [..., K] (signed for int formats, else unsigned).

    Also takes a float8 tensor (returns its bit patterns as codes 0..255).
    """
    f = _fmt(fmt)
    st = _storage(f, storage)
    if packed.dtype.itemsize != 1:
        raise TypeError(f"packed: expected a 1-byte tensor (int8 storage), got {packed.dtype}")
    b = unpack_fields(packed, f.bits if f.packed else 8)
    if order is not None:
        b = _word_codes(b, len(order), order)
    if f.kind == "int":
        half = 1 << (f.bits - 1)
        b = b - half if st == "offset" else (b ^ half) - half
    return b.to(torch.int16)


def general_compress(lowprecision_weight, source_bits: int = 4, storage_dtype=np.int8):
    """BitBLAS's name: pack ``source_bits``-bit codes (numpy, last axis) little-endian into bytes,
    ``[..., n]`` -> ``[..., n * source_bits / 8]`` (code j at bit ``(j % per_byte) * source_bits``).

    The codes are the stored fields, 0 .. 2**source_bits - 1 (for signed weights BitBLAS's
    offset-binary ``q + 2**(bits-1)``; 8 bits: any byte, -128 .. 255); float arrays must hold
    whole numbers (BitBLAS casts float16 to int8). Anything else raises ValueError."""
    if source_bits not in (1, 2, 4, 8):
        raise ValueError(f"source_bits={source_bits} is invalid; accepted: 1, 2, 4, 8")
    if np.dtype(storage_dtype).itemsize != 1:
        raise ValueError(f"storage_dtype={storage_dtype} is invalid; accepted: a 1-byte dtype (np.int8, np.uint8)")
    w = lowprecision_weight
    if isinstance(w, torch.Tensor):
        w = w.detach().cpu().numpy()
    w = np.asarray(w)
    if w.ndim < 1 or w.dtype.kind not in "iuf":
        raise ValueError(f"lowprecision_weight: expected an integer (or whole-number float) array of codes, "
                         f"got {w.dtype} of shape {list(w.shape)}")
    lo, hi = (-128, 255) if source_bits == 8 else (0, (1 << source_bits) - 1)
    per = 8 // source_bits
    if w.shape[-1] % per:
        raise ValueError(f"lowprecision_weight: last dimension {w.shape[-1]} must be a multiple of {per} "
                         f"for source_bits={source_bits}")
    if w.dtype.kind == "f" and w.size and not (np.isfinite(w).all() and (w == np.round(w)).all()):
        raise ValueError(f"lowprecision_weight: codes must be integers in [{lo}, {hi}] for source_bits={source_bits}")
    if w.size and (w.min() < lo or w.max() > hi):
        raise ValueError(f"lowprecision_weight: codes must lie in [{lo}, {hi}] for source_bits={source_bits}, got "
                         f"values in [{w.min():g}, {w.max():g}]")
    packed = pack_codes(torch.from_numpy(w.astype(np.int64) & 0xFF), f"uint{source_bits}")
    return packed.numpy().view(np.dtype(storage_dtype))


def _move_codes(qweight, nbits: int, pos, inverse: bool):
    """Move each code of every 32-bit word to its slot ``pos[j]`` (or back, ``inverse``)."""
    is_torch = isinstance(qweight, torch.Tensor)
    w = qweight.detach().cpu().numpy() if is_torch else np.asarray(qweight)
    if w.dtype.itemsize != 1 or w.ndim < 1 or w.shape[-1] % 4:
        raise ValueError("qweight: expected 1-byte storage whose last axis is a multiple of 4")
    words = np.ascontiguousarray(w).view(np.uint32)
    mask = np.uint32((1 << nbits) - 1)
    out = np.zeros_like(words)
    for j, p in enumerate(pos):
        src, dst = (p, j) if inverse else (j, p)
        out |= ((words >> np.uint32(src * nbits)) & mask) << np.uint32(dst * nbits)
    res = out.view(w.dtype)
    return torch.from_numpy(res.copy()).to(qweight.device) if is_torch else res


def interleave_weight(qweight, nbits: int = 4, target_dtype: str = "float16"):
    """Reorder the codes inside each 32-bit word so that code j lands in decoder lane j % lanes.

    With fp16 targets the two 16-bit halves of a word then hold codes (0, 2, 4, 6) and (1, 3, 5, 7)
    (for 4 bits), which lets a decoder turn a word into fp16 pairs with a few bit operations.
    Takes and returns int8 numpy arrays or torch tensors whose last axis is a multiple of 4 bytes.
    """
    _check_numpy_target(target_dtype)
    return _move_codes(qweight, nbits, interleave_positions(nbits, target_dtype), inverse=False)


def deinterleave_weight(qweight, nbits: int = 4, target_dtype: str = "float16"):
    """Inverse of :func:`interleave_weight`."""
    _check_numpy_target(target_dtype)
    return _move_codes(qweight, nbits, interleave_positions(nbits, target_dtype), inverse=True)


def lop3_permute(qweight, nbits: int, target_dtype: str, inverse: bool = False):
    """The interleave of BitBLAS's LOP3Permutate for any decode target it takes (its ``datatype``:
    float16, bfloat16, int8, int4, ... ; bfloat16 and the others without float16's / int8's unit
    swaps), on 1-byte storage whose last axis is a multiple of 4; ``inverse`` undoes it."""
    return _move_codes(qweight, nbits, interleave_positions(nbits, target_dtype), inverse)


def _check_numpy_target(target_dtype):
    if target_dtype not in ("float16", "int8"):      # BitBLAS's numpy function takes these two
        raise ValueError(f"target_dtype={target_dtype!r} is invalid; accepted: 'float16', 'int8'")



def reorder_codes(qweight, nbits: int, order, inverse: bool = False):
    """Packed codes in natural order -> ``order`` (code j of each 32-bit word to slot ``order[j]``,
    ``Plan.w_order``), or back (``inverse``); torch tensors stay on their device."""
    return _move_codes(qweight, nbits, list(order), inverse)


def from_bitblas_weight(config, qweight):
    """Microsoft BitBLAS's packed weight for ``config`` (what its ``Matmul.transform_weight`` /
    ``weight_transform`` return and its ``Linear`` saves) -> the packed weight the operator of
    ``config`` reads: the same bytes (the kernels read BitBLAS's fast-decoding order,
    ``Plan.w_order``), returned as they are. NotImplementedError where BitBLAS's bytes lose codes
    (1-bit weights with float16 activations and fast decoding)."""
    bitblas_weight_order(config)
    return qweight


def to_bitblas_weight(config, qweight):
    """Inverse of :func:`from_bitblas_weight` (the same bytes)."""
    bitblas_weight_order(config)
    return qweight
