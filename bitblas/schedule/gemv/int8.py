"""Integer decoders of the GEMV template (bitblas/schedule/gemv/) for int8 activations.

int/uint weight codes of 1, 2, 4 or 8 bits are turned into bytes, four per 32-bit word, and
multiplied with the int8 activations by ``dp4a`` (int32 accumulation, exact). Packed codes sit
little-endian along K (code k at bit ``(k % per_byte) * bits`` of byte ``k // per_byte``), so field
``p`` of every byte of a 32-bit word (one shift, one ``lop3`` mask) holds the codes
``p, p + F, p + 2F, p + 3F`` of the word (``F`` codes per byte): the activations are gathered
into the same order once per vector and activation row (``prmt``; shared by all the weight rows
of a warp):

* 8-bit: the words as they are;
* 4-bit: one ``prmt`` per word (bytes 0, 2 of two adjacent words, or 1, 3);
* 2-bit: a 4 x 4 byte transpose of 4 words (8 ``prmt``);
* 1-bit: two 4 x 4 transposes of the even and odd words of 8 (16 ``prmt``).

Signed sub-byte codes are stored offset-binary (BitBLAS's layout, bitblas.formats): the masked
field is ``u = q + 2**(bits-1)`` in 0 .. 2**bits - 1, and ``dp4a.u32.s32`` (unsigned weight bytes x
signed activation bytes) accumulates ``sum(u * a) = sum(q * a) + 2**(bits-1) * sum(a)``; the
chain starts at ``-2**(bits-1) * sum(a)`` (``dp4a`` of the activation words with 0x01010101, once
per vector and row), so the sum is exact (no byte-wise sign extension, which has no SIMD form
without borrows: ~6 instructions per word). Two's complement sub-byte codes (not stored by any
plan today) would take the same path with the ``lop3`` also XOR-ing ``2**(bits-1)`` into each
field. 3 instructions per 8 4-bit codes, 7 per 16 2-bit codes, 15 per 32 1-bit codes; int8
weights take ``dp4a.s32.s32`` on the raw words, uint8 ones ``dp4a.u32.s32``.

The CPU tests (testing/test_gemv_decode.py) run the generated helper source itself through a
small interpreter (``prmt`` / ``lop3`` / ``dp4a`` on Python ints, :func:`_emu_prmt` /
:func:`_emu_lop3`) and compare every byte value of every position with the format's decode.

measurements: docs/performance.md
"""
from __future__ import annotations

import re

from ...code_order import slot_codes
from .decode import lop3_lut

__all__ = ["word_codes", "byte_gather"]

_LUT_AND_XOR = lop3_lut(lambda a, b, c: (a & b) ^ c)          # (a & b) ^ c
_ONES = 0x01010101


def i8_consts(bits: int, storage: str):
    """Decode of one 32-bit word of ``bits``-bit codes stored as ``storage`` ("offset", "twos",
    "plain": bitblas.formats.code_storage): for each field p (``F = 8 // bits`` of them) the right
    shift ``bits * p``; the field mask and the XOR (``2**(bits-1)`` per byte for two's complement
    sub-byte codes, none for offset-binary ones, stored so) of the ``lop3``; ``off``, the value each
    decoded byte exceeds its code by (the dp4a chain starts at ``-off * sum(a)``); ``wtype``, the
    dp4a type of the weight bytes."""
    if storage not in ("offset", "twos", "plain"):
        raise ValueError(f"storage={storage!r}: expected 'offset', 'twos' or 'plain'")
    F = 8 // bits
    if bits == 8:
        if storage == "offset":
            raise ValueError("8-bit codes are stored two's complement or plain")
        return dict(F=1, shifts=(0,), mask=0xFFFFFFFF, xor=0, lut=_LUT_AND_XOR, off=0,
                    wtype="s32" if storage == "twos" else "u32")
    off = 0 if storage == "plain" else 1 << (bits - 1)
    xor = off * _ONES if storage == "twos" else 0
    return dict(F=F, shifts=tuple(bits * p for p in range(F)), mask=((1 << bits) - 1) * _ONES, xor=xor,
                lut=_LUT_AND_XOR, off=off, wtype="u32")


def _transpose(x, y):
    """``prmt`` program of a 4 x 4 byte transpose: outputs ``y[p]`` = byte p of ``x[0..3]``."""
    t = [f"{y[0]}_t{i}" for i in range(4)]
    return [(t[0], x[0], x[1], 0x5140), (t[1], x[0], x[1], 0x7362),
            (t[2], x[2], x[3], 0x5140), (t[3], x[2], x[3], 0x7362),
            (y[0], t[0], t[2], 0x5410), (y[1], t[0], t[2], 0x7632),
            (y[2], t[1], t[3], 0x5410), (y[3], t[1], t[3], 0x7632)]


def _i8_gather(bits: int, nw: int, order=None, slots=None):
    """The activation gather of one vector of ``nw`` weight words: ``prmt`` steps ``(dst, a, b,
    selector)`` over names ``a{j}`` (activation words in K order), ``p{q}`` (gathered word q,
    matching decoded weight word q) and temporaries. 8-bit codes need none (``p{j}`` = ``a{j}``).
    ``order`` (``Plan.w_order``): the weight words hold code ``j`` in slot ``order[j]``, so byte
    ``t`` of decoded word ``j * F + p`` is code ``c`` with ``order[c] = t * F + p``
    (:func:`_order_gather`). ``slots``: a decoder that puts other slots in each byte
    (:func:`word_codes`; the e4m3 code decoder's)."""
    if order is not None or slots is not None:
        return _order_gather(bits, nw, order, slots)
    prog = []
    if bits == 4:
        for j in range(nw):
            prog += [(f"p{2 * j}", f"a{2 * j}", f"a{2 * j + 1}", 0x6420),
                     (f"p{2 * j + 1}", f"a{2 * j}", f"a{2 * j + 1}", 0x7531)]
    elif bits == 2:
        for j in range(nw):
            prog += _transpose([f"a{4 * j + t}" for t in range(4)], [f"p{4 * j + p}" for p in range(4)])
    elif bits == 1:
        for j in range(nw):
            for h in range(2):
                prog += _transpose([f"a{8 * j + 2 * t + h}" for t in range(4)],
                                   [f"p{8 * j + 4 * h + p}" for p in range(4)])
    return prog


def word_codes(bits: int, nw: int, order=None, slots=None):
    """The natural K position (within a vector of ``nw`` weight words) of byte ``t`` of decoded
    word ``j * F + p`` of a decoder that puts slot ``slots[p][t]`` of weight word ``j`` there
    (default: field ``p`` of byte ``t``, the int8 decoders; ``F`` codes per byte), for weights in
    code order ``order`` (None: natural): ``out[j * F + p][t]``."""
    F, n = 8 // bits, 32 // bits
    code = slot_codes(order) if order is not None else tuple(range(n))
    if slots is None:
        slots = [[t * F + p for t in range(4)] for p in range(F)]
    return [[j * n + code[slots[p][t]] for t in range(4)] for j in range(nw) for p in range(F)]


def byte_gather(dst: str, src):
    """``prmt`` steps ``(dst, a, b, selector)`` that make word ``dst`` from the bytes ``src`` (4 of
    ``(word name, byte)``): a copy where they are one word as it is, one ``prmt`` where they come
    from at most two words, else two and one to merge."""
    words = sorted({w for w, _ in src}, key=lambda w: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", w)])
    if len(words) == 1 and [b for _, b in src] == [0, 1, 2, 3]:
        return [(dst, words[0], words[0], 0x3210)]
    if len(words) <= 2:
        x, y = words[0], words[-1]
        return [(dst, x, y, sum(((b if w == x else 4 + b) << (4 * t)) for t, (w, b) in enumerate(src)))]
    lo, hi = (words[0], words[1]), (words[2], words[-1])
    prog = []
    for h, (x, y) in enumerate((lo, hi)):
        sel = sum(((b if w == x else 4 + b) << (4 * t)) for t, (w, b) in enumerate(src) if w in (x, y))
        prog.append((f"{dst}_g{h}", x, y, sel))
    sel = sum(((t if w in lo else 4 + t) << (4 * t)) for t, (w, _) in enumerate(src))
    return prog + [(dst, f"{dst}_g0", f"{dst}_g1", sel)]


def _order_gather(bits: int, nw: int, order, slots=None):
    """The gather for weights in code order ``order`` (decoded into ``slots``): each gathered word
    from the activation bytes its decoded word's codes need (:func:`word_codes`, :func:`byte_gather`)."""
    prog = []
    for q, codes in enumerate(word_codes(bits, nw, order, slots)):
        prog += byte_gather(f"p{q}", [(f"a{w}", b) for w, b in (divmod(k, 4) for k in codes)])
    return prog


def _cname(nm: str) -> str:
    """C expression of a gather-program name: ``a3`` -> ``a[3]``, ``p5`` -> ``ap[5]``, temporaries as is."""
    if nm[1:].isdigit():
        return f"{'a' if nm[0] == 'a' else 'ap'}[{nm[1:]}]"
    return nm


def gather_lines(bits: int, nw: int, order=None, slots=None):
    """CUDA lines: activation words ``a`` gathered into the decode's K order, into ``ap`` (the
    ``prmt`` program of :func:`_i8_gather`; 8-bit codes: the words as they are)."""
    prog = _i8_gather(bits, nw, order, slots)
    if not prog:
        return [f"  ap[{q}] = a[{q}];" for q in range(nw * i8_consts(bits, "plain")["F"])]
    out = []
    for dst, x, y, sel in prog:
        lhs = _cname(dst) if dst[1:].isdigit() else f"const unsigned {dst}"
        if x == y and sel == 0x3210:
            out.append(f"  {lhs} = {_cname(x)};")
            continue
        out.append(f"  {lhs} = __byte_perm({_cname(x)}, {_cname(y)}, 0x{sel:x});")
    return out


def i8_helpers(tag: str, bits: int, storage: str, nw: int, order=None):
    """CUDA source of ``bb_prep_{tag}`` (gather the activation words, return the dp4a chain's
    start), ``bb_dec_{tag}`` (weight words -> bytes) and ``bb_dot_{tag}`` (dp4a over one vector)
    for ``nw`` weight words of ``bits``-bit codes stored as ``storage`` (in code order ``order``)."""
    k = i8_consts(bits, storage)
    F = k["F"]
    na = nw * F                                   # activation words per vector (= decoded words)
    src = {}
    lines = [f"__device__ __forceinline__ int bb_prep_{tag}(const unsigned* a, unsigned* ap) {{"]
    lines += gather_lines(bits, nw, order)
    if k["off"]:
        lines.append("  int s = 0;")
        lines += [f"  s = __dp4a((int)a[{q}], 0x{_ONES:08x}, s);" for q in range(na)]
        lines.append(f"  return -{k['off']} * s;")
    else:
        lines.append("  return 0;")
    lines.append("}")
    src[f"bb_prep_{tag}"] = "\n" + "\n".join(lines) + "\n"

    lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, unsigned* d) {{"]
    for j in range(nw):
        if bits == 8:
            lines.append(f"  d[{j}] = w[{j}];")
            continue
        for p, s in enumerate(k["shifts"]):
            x = f"w[{j}] >> {s}" if s else f"w[{j}]"
            lines.append(f"  asm(\"lop3.b32 %0, %1, 0x{k['mask']:08x}, 0x{k['xor']:08x}, 0x{k['lut']:02x};\" "
                         f": \"=r\"(d[{j * F + p}]) : \"r\"({x}));")
    lines.append("}")
    src[f"bb_dec_{tag}"] = "\n" + "\n".join(lines) + "\n"

    lines = [f"__device__ __forceinline__ int bb_dot_{tag}(const unsigned* d, const unsigned* ap, int c) {{",
             "  int s0 = c, s1 = 0;"]
    for q in range(na):
        lines.append(f"  asm(\"dp4a.{k['wtype']}.s32 %0, %1, %2, %0;\" "
                     f": \"+r\"(s{q % 2}) : \"r\"(d[{q}]), \"r\"(ap[{q}]));")
    lines += ["  return s0 + s1;", "}"]
    src[f"bb_dot_{tag}"] = "\n" + "\n".join(lines) + "\n"
    return src
