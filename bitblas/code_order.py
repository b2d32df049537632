"""The order of the codes inside each 32-bit word of a packed weight.

Microsoft BitBLAS's ``transform_weight`` lop3-interleaves the codes of each 32-bit word of int /
uint 1-, 2- and 4-bit weights where its ``fast_decoding`` resolves True (the config's value, else
its rule: :func:`bitblas_fast_decoding`), so that a decoder turns a word into values with a few bit
operations. The operator reads the same bytes: :func:`weight_order` is the order a plan's kernels
read (``Plan.w_order``), BitBLAS's order for the config, and every packer and reader of a weight
for a config (``quantization.pack_weight`` / ``dequantize``, ``Matmul.transform_weight``,
``bitblas.Linear``) follows it. An order is ``pos``: code ``j`` of a word (natural K order) sits in
slot ``pos[j]`` (bits ``pos[j] * bits``..). Pure Python: the plan imports it.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .formats import FORMATS

__all__ = ["bitblas_fast_decoding", "bitblas_weight_order", "weight_order", "interleave_positions", "slot_codes",
           "order_bits"]


# bits per decoded lane of each decode target BitBLAS's LOP3Permutate takes (its ``datatype``, the
# activation dtype: ``DataType(datatype).bits``), under BitBLAS's and our spellings
_TARGET_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "int8": 8, "uint8": 8, "int4": 4, "uint4": 4,
                "float8_e4m3": 8, "float8_e5m2": 8, "e4m3_float8": 8, "e5m2_float8": 8}
# BitBLAS's further moves of whole 4-code units after the lane order, per (bits, target): 2-bit codes
# for float16 swap bytes 1 and 2, 1-bit codes for int8 swap nibbles 1 <-> 4 and 3 <-> 6
_UNIT_SWAPS = {(2, "float16"): {1: 2, 2: 1}, (1, "int8"): {1: 4, 4: 1, 3: 6, 6: 3}}


def interleave_positions(nbits: int, target_dtype: str):
    """Where each code of one 32-bit word moves in BitBLAS's fast-decoding order: code j goes to
    lane ``j % lanes``, slot ``j // lanes`` of that lane's bits (a lane: the bits of one decoded
    ``target_dtype`` value), then the unit swaps above. 1-bit codes for float16: BitBLAS's numpy
    ``interleave_weight`` computes a further move and returns the word without it, so the lane order
    stands here (its LOP3Permutate applies a move that writes two nibbles to one place:
    :func:`bitblas_weight_order` refuses that case)."""
    if target_dtype not in _TARGET_BITS:
        raise ValueError(f"target_dtype={target_dtype!r} is invalid; accepted: {', '.join(_TARGET_BITS)}")
    if nbits not in (1, 2, 4):
        raise ValueError(f"nbits={nbits} is invalid; accepted: 1, 2, 4")
    stride = _TARGET_BITS[target_dtype]
    lanes = 32 // stride
    base = [((j % lanes) * stride + (j // lanes) * nbits) // nbits for j in range(32 // nbits)]
    swap = _UNIT_SWAPS.get((nbits, target_dtype))
    if swap is None:
        return base
    return [swap.get(p // 4, p // 4) * 4 + p % 4 for p in base]


def bitblas_fast_decoding(config) -> bool:
    """Microsoft BitBLAS's ``fast_decoding`` for ``config`` (a MatmulConfig): the config's value
    when given, else its rule: True for int / uint weights other than the activation dtype, except
    8-bit weights, 4-bit weights with int8 activations and bfloat16 activations."""
    if config.fast_decoding is not None:
        return bool(config.fast_decoding)
    w = FORMATS[config.W_dtype]
    return (w.kind in ("int", "uint") and w.bits < 8 and config.W_dtype != config.A_dtype
            and config.A_dtype != "bfloat16" and not (w.bits == 4 and config.A_dtype == "int8"))


def bitblas_weight_order(config):
    """The code order of Microsoft BitBLAS's packed weight for ``config``, relative to the natural
    order (``pack_codes``'s): None where the bytes are the same (no fast decoding, or no interleave
    for the format / shape), else the slot of each code of a 32-bit word (:func:`interleave_positions`
    for the activation dtype, as BitBLAS's ``Matmul.transform_weight`` runs its LOP3Permutate).
    NotImplementedError where BitBLAS's bytes lose codes (1-bit weights with float16 activations:
    its LOP3Permutate moves two nibbles of each word to one place)."""
    w = FORMATS[config.W_dtype]
    if not bitblas_fast_decoding(config) or w.kind not in ("int", "uint") or w.bits not in (1, 2, 4) \
            or config.A_dtype not in _TARGET_BITS or (config.K * w.bits // 8) % 4:
        return None                 # (BitBLAS views each row as 32-bit words: K * bits / 8 bytes, a multiple of 4)
    if w.bits == 1 and config.A_dtype == "float16":
        raise NotImplementedError(
            f"W_dtype={config.W_dtype!r} with A_dtype='float16' and fast decoding: Microsoft BitBLAS's packed weight "
            "loses codes (its LOP3Permutate writes two 4-code groups of each word to one place), so its bytes "
            "cannot be read back; build the layer with fast_decoding=False")
    pos = interleave_positions(w.bits, config.A_dtype)
    return None if pos == list(range(len(pos))) else pos


def weight_order(config) -> Optional[Tuple[int, ...]]:
    """The code order (``pos``, see the module) of the weight the operator of ``config`` reads:
    BitBLAS's (:func:`bitblas_weight_order`), None where it is the plain order. Where BitBLAS's
    bytes lose codes (1-bit weights with float16 activations and fast decoding) the operator reads
    the plain order: no BitBLAS bytes can be read back there."""
    try:
        pos = bitblas_weight_order(config)
    except NotImplementedError:
        return None
    return None if pos is None else tuple(pos)


def slot_codes(order) -> Tuple[int, ...]:
    """The inverse of ``order``: the code (index in natural order) each slot of a word holds."""
    code = [0] * len(order)
    for j, slot in enumerate(order):
        code[slot] = j
    return tuple(code)


def order_bits(order) -> Tuple[int, ...]:
    """``img`` with ``order[j] = sum(2**img[i] for each bit i set in j)``: every order here (BitBLAS's
    lanes and its unit swaps) permutes the bits of the code index, so its TIR / TVMScript form is
    a sum of shifted bits (and its inverse, :func:`slot_codes`, is one too). ValueError otherwise."""
    n = len(order)
    nb = n.bit_length() - 1
    img = tuple(order[1 << i].bit_length() - 1 for i in range(nb))
    if n != 1 << nb or any(order[j] != sum(1 << img[i] for i in range(nb) if j >> i & 1) for j in range(n)):
        raise ValueError(f"order={tuple(order)}: not a permutation of the bits of the code index")
    return img
