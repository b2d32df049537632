"""GPTQ and AWQ packed checkpoints -> unpacked codes, scales and zero points in bitblas's layout.

GPTQ (AutoGPTQ / GPTQ-for-LLaMa): ``qweight`` int32 [K * bits / 32, N], codes packed along K (word
``r`` holds rows ``r * 32/bits ..``, code ``i`` at bit ``i * bits``); ``qzeros`` int32
[groups, N * bits / 32] packed along N the same way; ``scales`` [groups, N]; optional ``g_idx`` int
[K] (act-order: the group of each input row). Checkpoints in the original format
(``checkpoint_format="gptq"``, what GPTQModel, optimum and transformers export) store the zero
points minus 1 *per 32-bit word*: GPTQModel writes v1 as the v2 word minus 0x11111111 (4-bit;
0x55555555 for 2-bit, 0x01010101 for 8-bit) as one 32-bit subtraction, so a zero point of 0 borrows
from the next slot; reading adds the same constant back to the whole word (GPTQModel's
``convert_gptq_v1_to_v2_format_module``), bit for bit. ``"gptq_v2"`` stores the zero itself.
Dequantized weight: ``w[k, n] = (q[k, n] - z[g, n]) * s[g, n]`` with ``g = g_idx[k]``.

compressed-tensors ``pack-quantized`` (llm-compressor): see :func:`from_compressed_tensors`.

AWQ (AutoAWQ GEMM): ``qweight`` int32 [K, N * bits / 32] packed along N, code slot ``i`` of a word
holding column ``AWQ_ORDER[i]`` of its 8; ``qzeros`` int32 [groups, N * bits / 32] packed the same
way (no offset); ``scales`` [groups, N]; ``w = (q - z) * s``.

Act-order (a ``g_idx`` that is not ``k // group_size``) is handled by permuting K so that every
group is contiguous: the layer then reorders its input by ``perm`` before the matmul.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = ["ImportedWeight", "AWQ_ORDER", "from_gptq", "from_awq", "from_compressed_tensors", "unpack_int32",
           "gptq_v1_to_v2_qzeros"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass
class ImportedWeight:
    """A checkpoint's weight in bitblas's layout: ``codes`` int16 [N, K] (unsigned, in kernel K order),
    ``scale`` [N, groups], ``zeros`` float32 [N, groups] (integer values, ``(q - z) * s``), ``perm``
    int64 [K] or None (the input reordering: kernel column j reads input column ``perm[j]``)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zeros: torch.Tensor
    perm: Optional[torch.Tensor]
    bits: int
    group_size: int          # K / groups (K itself for one group)

    @property
    def groups(self) -> int:
        return self.scale.shape[1]


def _check_bits(bits, allowed: Sequence[int], what: str):
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise ValueError(f"bits={bits!r} is invalid; accepted: {', '.join(map(str, allowed))}")
    if bits not in allowed:
        if bits in (3, 5, 6, 7):
            raise NotImplementedError(f"bits={bits}: {what} checkpoints with {bits}-bit codes (codes straddle "
                                      f"32-bit words) are not supported; supported bits: "
                                      f"{', '.join(map(str, allowed))}")
        raise ValueError(f"bits={bits!r} is invalid; accepted: {', '.join(map(str, allowed))}")


def _check_int32(name: str, t, dims: int = 2) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.uint32):
        raise TypeError(f"{name}: expected int32 packed words, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions, got shape {list(t.shape)}")
    return t.view(torch.int32)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, order: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Unsigned codes (int16) from int32 words packed along ``dim`` (0 or 1) of a 2-D tensor.

    Word ``w`` holds codes ``w * 32/bits + j``; code slot ``i`` (bits ``i*bits ..``) holds code
    ``j = order[i]`` (default ``j = i``).
    """
    per = 32 // bits
    p = packed.view(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32, device=p.device) * bits
    mask = (1 << bits) - 1
    if dim == 0:
        vals = (p.unsqueeze(1) >> shifts.view(1, per, 1)) & mask            # [rows, slot, cols]
        if order is not None:
            vals = vals[:, _inverse(order, p.device)]
        return vals.reshape(p.shape[0] * per, p.shape[1]).to(torch.int16)
    vals = (p.unsqueeze(-1) >> shifts) & mask                                # [rows, cols, slot]
    if order is not None:
        vals = vals[..., _inverse(order, p.device)]
    return vals.reshape(p.shape[0], p.shape[1] * per).to(torch.int16)


def _inverse(order: Sequence[int], device) -> torch.Tensor:
    """Index that reads slots in code order: code j sits in slot inv[j]."""
    inv = [0] * len(order)
    for slot, j in enumerate(order):
        inv[j] = slot
    return torch.tensor(inv, dtype=torch.long, device=device)


def _check_float(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point or t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D float tensor [groups, N], got {t.dtype} {list(t.shape)}")
    return t


def groups_check(K: int, groups: int, group_size: Optional[int], what: str) -> int:
    if groups < 1 or K % groups:
        raise ValueError(f"{what}: {groups} groups do not divide in_features={K}")
    gs = K // groups
    if group_size is not None:
        want = 1 if group_size in (-1, None) or group_size == K else (K // group_size if K % group_size == 0 else -1)
        if want != groups:
            raise ValueError(f"group_size={group_size} does not match the checkpoint: scales have {groups} groups "
                             f"for in_features={K}, i.e. group_size={gs if groups > 1 else -1}")
    return gs


def _sizes(K, N, in_features, out_features, bits, qname, shape, implied_bits):
    if in_features is not None and K != in_features:
        hint = f" (with in_features={in_features} that is bits={implied_bits:g})" if implied_bits else ""
        raise ValueError(f"{qname} of shape {shape} holds in_features={K} at bits={bits}, but the layer has "
                         f"in_features={in_features}{hint}")
    if out_features is not None and N != out_features:
        raise ValueError(f"{qname} of shape {shape} holds out_features={N}, but the layer has "
                         f"out_features={out_features}")


def from_gptq(qweight, qzeros, scales, g_idx=None, *, bits: int = 4, in_features: Optional[int] = None,
              out_features: Optional[int] = None, group_size: Optional[int] = None,
              checkpoint_format: str = "gptq") -> ImportedWeight:
    """A GPTQ layer (see the module docstring) as bitblas codes [N, K], scales and zero points [N, groups]."""
    _check_bits(bits, (2, 4, 8), "GPTQ")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"checkpoint_format={checkpoint_format!r} is invalid; accepted: 'gptq' (zeros stored "
                         "minus 1), 'gptq_v2'")
    qweight = _check_int32("qweight", qweight)
    qzeros = _check_int32("qzeros", qzeros)
    scales = _check_float("scales", scales)
    per = 32 // bits
    K, N = qweight.shape[0] * per, qweight.shape[1]
    _sizes(K, N, in_features, out_features, bits, "qweight", list(qweight.shape),
           qweight.shape[0] * 32 / in_features if in_features else None)
    G = scales.shape[0]
    if scales.shape[1] != N:
        raise ValueError(f"scales: expected shape [groups, {N}], got {list(scales.shape)}")
    gs = groups_check(K, G, group_size, "scales")
    if N % per or list(qzeros.shape) != [G, N // per]:
        raise ValueError(f"qzeros: expected shape {[G, N // per]} (groups, out_features * bits / 32 at bits={bits}), "
                         f"got {list(qzeros.shape)}")
    codes_kn = unpack_int32(qweight, bits, 0)                     # [K, N]
    if checkpoint_format == "gptq":
        qzeros = gptq_v1_to_v2_qzeros(qzeros, bits)
    z = unpack_int32(qzeros, bits, 1).to(torch.float32)           # [G, N]
    perm = _act_order("g_idx", g_idx, K, G, gs, qweight.device)
    if perm is not None:
        codes_kn = codes_kn[perm]
    return ImportedWeight(codes_kn.T.contiguous(), scales.T.contiguous(), z.T.contiguous(), perm, bits,
                          gs)


def _act_order(name: str, g_idx, K: int, G: int, gs: int, device) -> Optional[torch.Tensor]:
    """The input permutation that makes every group of ``g_idx`` [K] contiguous (None: natural order)."""
    if g_idx is None:
        return None
    if not isinstance(g_idx, torch.Tensor) or g_idx.dtype.is_floating_point or list(g_idx.shape) != [K]:
        raise ValueError(f"{name}: expected an integer tensor of shape [{K}], got "
                         f"{getattr(g_idx, 'dtype', type(g_idx).__name__)} {list(getattr(g_idx, 'shape', []))}")
    g = g_idx.to(torch.long).cpu()
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= G):
        raise ValueError(f"{name}: values must lie in [0, {G - 1}] ({G} groups), "
                         f"got [{int(g.min())}, {int(g.max())}]")
    natural = torch.arange(K) // gs
    if torch.equal(g, natural):
        return None
    order = torch.argsort(g, stable=True)
    if not torch.equal(g[order], natural):
        raise NotImplementedError(f"{name} assigns groups of unequal sizes; only act-order checkpoints whose "
                                  f"groups each hold group_size={gs} rows are supported")
    return order.to(device)


def gptq_v1_to_v2_qzeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQ v1 ``qzeros`` words (zero points minus 1, subtracted from the whole 32-bit word) -> v2 words:
    each word plus 1 in every slot (0x11111111 at 4 bits), modulo 2**32, as GPTQModel converts them."""
    per = 32 // bits
    one_per_slot = sum(1 << (bits * i) for i in range(per))
    w = (qzeros.view(torch.int32).to(torch.int64) + one_per_slot) & 0xFFFFFFFF
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32)


def from_awq(qweight, qzeros, scales, *, bits: int = 4, in_features: Optional[int] = None,
             out_features: Optional[int] = None, group_size: Optional[int] = None) -> ImportedWeight:
    """An AWQ GEMM layer (see the module docstring) as bitblas codes [N, K], scales and zeros [N, groups]."""
    _check_bits(bits, (4,), "AWQ")
    qweight = _check_int32("qweight", qweight)
    qzeros = _check_int32("qzeros", qzeros)
    scales = _check_float("scales", scales)
    per = 32 // bits
    K, N = qweight.shape[0], qweight.shape[1] * per
    _sizes(K, N, in_features, out_features, bits, "qweight", list(qweight.shape), None)
    if out_features is not None and qweight.shape[1] * 32 != out_features * bits:
        raise ValueError(f"qweight of shape {list(qweight.shape)}: expected [in_features, out_features * bits / 32]")
    G = scales.shape[0]
    if scales.shape[1] != N:
        raise ValueError(f"scales: expected shape [groups, {N}], got {list(scales.shape)}")
    gs = groups_check(K, G, group_size, "scales")
    if list(qzeros.shape) != [G, N // per]:
        raise ValueError(f"qzeros: expected shape {[G, N // per]}, got {list(qzeros.shape)}")
    codes_kn = unpack_int32(qweight, bits, 1, AWQ_ORDER)         # [K, N]
    z = unpack_int32(qzeros, bits, 1, AWQ_ORDER).to(torch.float32)
    return ImportedWeight(codes_kn.T.contiguous(), scales.T.contiguous(), z.T.contiguous(), None, bits, gs)


def from_compressed_tensors(weight_packed, weight_scale, weight_shape=None, weight_zero_point=None,
                            weight_g_idx=None, *, bits: int = 4, in_features: Optional[int] = None,
                            out_features: Optional[int] = None, group_size: Optional[int] = None) -> ImportedWeight:
    """A compressed-tensors ``pack-quantized`` layer (llm-compressor's W4A16 / W8A16 int schemes, what
    vLLM loads) as bitblas codes [N, K], scales and zero points [N, groups].

    ``weight_packed`` int32 [N, ceil(K * bits / 32)]: signed ``bits``-bit values ``v`` stored as
    ``v + 2**(bits-1)``, packed densely along K (element ``k`` at bit ``k * bits``); ``weight_scale``
    [N, groups] (group or channel strategy; a single value for the tensor strategy);
    ``weight_shape`` [2] = (N, K); ``weight_zero_point`` (asymmetric schemes only) int32
    [ceil(N * bits / 32), groups], the signed zero points packed the same way along N; ``weight_g_idx``
    [K] (activation ordering). Dequantized weight: ``(v - zp) * s``. The codes returned are the stored
    unsigned values ``u = v + 2**(bits-1)`` and the zero points ``zp + 2**(bits-1)`` (``2**(bits-1)``
    for symmetric schemes), so ``(u - z) * s`` is the same weight.
    """
    _check_bits(bits, (1, 2, 4, 8), "compressed-tensors")
    packed = _check_int32("weight_packed", weight_packed)
    per = 32 // bits
    N = packed.shape[0]
    if weight_shape is not None:
        if not isinstance(weight_shape, (torch.Tensor, list, tuple)) or len(weight_shape) != 2:
            raise ValueError(f"weight_shape: expected (out_features, in_features), got {weight_shape!r}")
        n, K = (int(v) for v in weight_shape)
        if n != N:
            raise ValueError(f"weight_shape {[n, K]} does not match weight_packed of shape {list(packed.shape)}")
    else:
        K = in_features if in_features is not None else packed.shape[1] * per
    if packed.shape[1] != -(-K * bits // 32):
        raise ValueError(f"weight_packed of shape {list(packed.shape)} does not hold in_features={K} at bits={bits} "
                         f"(expected [{N}, {-(-K * bits // 32)}])")
    _sizes(K, N, in_features, out_features, bits, "weight_packed", list(packed.shape), None)
    if not isinstance(weight_scale, torch.Tensor) or not weight_scale.dtype.is_floating_point:
        raise TypeError(f"weight_scale: expected a float tensor, got {type(weight_scale).__name__}"
                        f"{'' if not isinstance(weight_scale, torch.Tensor) else ' ' + str(weight_scale.dtype)}")
    scale = weight_scale
    if scale.numel() == 1:
        scale = scale.reshape(1, 1).expand(N, 1)                   # tensor strategy
    if scale.dim() != 2 or scale.shape[0] != N:
        raise ValueError(f"weight_scale: expected shape [{N}, groups], got {list(weight_scale.shape)}")
    G = scale.shape[1]
    gs = groups_check(K, G, group_size, "weight_scale")
    offset = 1 << (bits - 1)
    codes = unpack_int32(packed, bits, 1)[:, :K]                  # unsigned u = v + offset, [N, K]
    if weight_zero_point is None:
        z = torch.full((N, G), float(offset), dtype=torch.float32, device=packed.device)
    else:
        zp = _check_int32("weight_zero_point", weight_zero_point)
        if list(zp.shape) != [-(-N * bits // 32), G]:
            raise ValueError(f"weight_zero_point: expected packed shape {[-(-N * bits // 32), G]} "
                             f"(ceil(out_features * bits / 32), groups), got {list(zp.shape)}")
        z = unpack_int32(zp.T.contiguous(), bits, 1)[:, :N].T.to(torch.float32)     # zp + offset, [N, G]
    perm = _act_order("weight_g_idx", weight_g_idx, K, G, gs, packed.device)
    if perm is not None:
        codes = codes[:, perm]
    return ImportedWeight(codes.contiguous(), scale.contiguous(), z.contiguous(), perm, bits, gs)
