"""Register decoders of the GEMV template (bitblas/schedule/gemv/) for table formats.

For each rule, a function gives the constants (shifts, masks, ``lop3`` truth tables, ``prmt``
selectors, table registers) that both the CUDA generator (:func:`table_dec`) and the CPU tests
(testing/test_gemv_decode.py, through :func:`_emu_lop3` / :func:`_emu_prmt`) use, so the tests
check the very program the kernels run. Why each rule looks as it does: emit.py's and template.py's
docstrings.

measurements: docs/performance.md
"""
from __future__ import annotations

from typing import Optional

from ...code_order import slot_codes
from ...formats import E2M1_TABLE, E4M3_TABLE, E5M2_TABLE

# activation dtype -> (C type, C pair type, magic number bits, mantissa bits, magic number)
ACT = {"float16": ("half", "__half2", 0x6400, 10, 1024.0),
        "bfloat16": ("nv_bfloat16", "__nv_bfloat162", 0x4300, 7, 128.0)}


def lop3_lut(fn) -> int:
    """The ``lop3`` truth table of the bitwise function ``fn(a, b, c)``."""
    a, b, c = 0xF0, 0xCC, 0xAA
    return fn(a, b, c) & 0xFF


def decoder(w) -> Optional[str]:
    """How the template decodes weight format ``w``: "int" (int/uint codes, magic numbers),
    "e2m1" (4-bit e2m1 codes: bit placement), "lut4" (any other 16-entry table: prmt lookup),
    "e5m2" / "e4m3" (float8 bit patterns), None (not taken)."""
    if w.kind in ("int", "uint"):
        return "int"
    if w.kind != "table":
        return None
    if w.bits == 4:
        return "e2m1" if w.table == E2M1_TABLE else "lut4"
    if w.bits == 8 and w.table == E5M2_TABLE:
        return "e5m2"
    if w.bits == 8 and w.table == E4M3_TABLE:
        return "e4m3"
    return None


def pair_codes(dec: str, bits: int, nw: int, order=None):
    """(lo, hi) positions in its vector of ``nw`` words of the two codes that decoded word ``i`` of
    the half-pair decoders (the tensor-core kernels' ``bb_dec``) holds in its low / high half:
    "int", "e2m1" and the float8 pairs (:func:`f8_pair_dec`) pair the fields in slots ``p`` and
    ``p + n/2`` of a word's ``n`` slots; "lut4" pairs adjacent codes (its ``prmt`` interleave). The
    mma GEMV's ``bb_prep`` pairs the activations the same way; the wgmma kernels' slab permutation
    follows it (testing/test_gemv_wgmma.py traces each generated decoder against it). ``order``
    (``Plan.w_order``, int codes only): slot ``order[j]`` of a word holds code ``j`` (BitBLAS's
    fast-decoding interleave), so a slot's field is the code ``j`` with ``order[j]`` = slot."""
    n = 32 // bits
    if dec == "lut4":
        pairs = [(2 * i, 2 * i + 1) for i in range(nw * n // 2)]
    elif dec not in ("int", "e2m1", "e4m3", "e5m2"):
        raise ValueError(f"dec={dec!r}: no half-pair decoder (accepted: int, e2m1, lut4, e4m3, e5m2)")
    else:
        P = n // 2
        pairs = [(j * n + p, j * n + p + P) for j in range(nw) for p in range(P)]
    if order is None:
        return pairs
    if dec != "int" or len(order) != n:
        raise ValueError(f"order={order}: only int / uint codes of {bits} bits take a code order of {n} slots")
    code = slot_codes(order)
    return [tuple(x - x % n + code[x % n] for x in pr) for pr in pairs]


def _act_bits(v: float, act: str) -> int:
    """16-bit pattern of ``v`` rounded as the TensorIR does (float64 -> float32 -> act, nearest even)."""
    import struct
    f = struct.unpack("<I", struct.pack("<f", v))[0]
    if act == "bfloat16":
        return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16) & 0xFFFF
    return struct.unpack("<H", struct.pack("<e", struct.unpack("<f", struct.pack("<I", f))[0]))[0]


_LUT_AND = lop3_lut(lambda a, b, c: a & b)                       # a & b
_LUT_AND_OR = lop3_lut(lambda a, b, c: (a & b) | c)              # (a & b) | c
_LUT_SEL = lop3_lut(lambda a, b, c: (c & b) | (~c & a))          # c ? b : a, bitwise
# a 16-entry prmt lookup (lut4, e4m3 codes): selectors of codes & 7, the sign-mode prmt selectors
# (on the word and the word << 4) that make each code's bit 3 a 0x00 / 0xff byte mask, the pick
_LUT16 = dict(sel_mask=0x77777777, msel=(0x9D8C, 0xBFAE), lut_sel=_LUT_SEL)


def _e2m1_consts(act: str):
    """e2m1 -> half/bfloat16 by bit placement. Pair p of a word takes nibble p (low half) and
    nibble p + 4 (high half), as the int path. For each pair: (left shift of the word that puts
    the sign bits at 15 / 31, left shift that puts the 3 magnitude bits (e1 e0 m) at the lowest
    exponent bits and the top mantissa bit); negative = right shift. The result is the e2m1 value
    times 2**-(bias - 1) (an e2m1 subnormal, e = 0, becomes a subnormal half), so one multiply by
    ``mul`` makes it exact."""
    mant = ACT[act][3]
    bias = 15 if act == "float16" else 127
    shifts = [(12 - 4 * p, (mant - 1) - 4 * p) for p in range(4)]
    return dict(shifts=shifts, mag_mask=(7 << (mant - 1)) * 0x10001, sign_mask=0x80008000,
                mul=2.0 ** (bias - 1), lut_mag=_LUT_AND, lut_sign=_LUT_AND_OR)


def _e2m1_lut_consts():
    """e2m1 -> half by table (``table_dec(..., e2m1_table=True)``, float16 activations): every e2m1
    value is a half whose low byte is 0, so the 8 magnitudes' high bytes fit one 8-byte ``prmt``
    table (``tab``). Per word: one ``prmt`` looks up the magnitudes of codes 0..3 (selector
    nibbles: the codes & 7, ``mag_mask``), one those of codes 4..7 (the masked word >> 16); pair p
    (codes p and p + 4, as the bit placement) is one ``prmt`` of the two (``spread[p]``: magnitude
    bytes p and 4 + p into the high bytes of the two halves, each low byte in sign mode on the same
    half's byte, below 0x80, i.e. 0), then the signs (bit 3 of each nibble; a left shift of the word
    by ``sign_shift[p]`` puts them at bits 15 / 31) merged by one ``lop3``. Exact values, no
    multiply: per word 12 ``lop3`` / ``prmt`` / ``shf`` and 3 shifts that ptxas issues as ``imad``,
    against the bit placement's ~13 of the first kind and ~6 ``imad`` / ``hmul2``.

    Where it runs: the rows kernel (rows.py), where it measured faster on the H200
    (``benchmark.matmul --no-baselines --m 1``, both decoders in turn, twice each, in one run,
    float16 activations; bit placement -> table, µs):

    ======================  ==============  ============
    layer (N x K)           nvfp4           fp4_e2m1 g128
    ======================  ==============  ============
    8192 x 8192             12.2 -> 12.55   11.5 -> 11.4
    28672 x 8192            37.4 -> 37.8    36.7 -> 34.5
    6144 x 4096             7.44 -> 6.83    6.45 -> 6.32
    4096 x 4096             5.90 -> 5.48    5.10 -> 4.89
    28672 x 4096            21.7 -> 20.1    19.3 -> 19.35
    4096 x 14336            15.2 -> 14.6    14.0 -> 14.0
    ======================  ==============  ============

    The static instructions of the 8192^2 nvfp4 kernel drop 9% (1871 -> 1695), yet that shape
    got slower: ncu (bit placement) has it neither issue- nor ALU-bound (63% of the issue slots,
    57% of the ALU pipe; the stalls split between memory waits and math-pipe throttle / not
    selected). In the tensor-core GEMV (16 rows) it measured 4% slower (one sample), so the
    tensor-core kernels keep the bit placement.

    Later (H200, the generated kernel with hand edits timed in one call): its time follows the
    instruction count, not the ALU pipe's load. ptxas splits ``q & mag_mask`` into a low and a
    high mask (2 ``lop3`` + 1 ``shf`` per word); taking the high selector by ``__umulhi(q, 65536)``
    (``imad.hi``) cut the ALU ops by 7% at the same count and was 1.6% slower, while the block
    dots' 5% fewer instructions (emit.py, ``block_dot_helpers``) gave 6%. Yet the tile moves it as
    much at the same instructions per weight: 64-channel blocks of 32 warps, one per SM and one
    wave, took 8192^2 from 11.59 to 10.45-10.59 µs (template.py ``_nvfp4_wave_tile``): 512
    blocks of 16 channels each stage the whole activation row and start their own loads, 128
    blocks of 64 channels a quarter as often.

    With those tiles (H200, ncu, one launch at 8192^2 beside W4A16 g128's rows kernel at 1.05x
    its read-only floor): 6.5 M instructions against W4A16's 4.4 M; 67% of the issue slots; the
    largest stall is math-pipe throttle (3.3 of 11.6 cycles per instruction; W4A16's: memory,
    7.3 of 13.3). Per word of 8 codes the kernel runs 6.3 ``lop3``, 6.1 ``prmt`` and 1 ``shf``
    on the ALU pipe (2 masks, 2 lookups, 4 pair ``prmt``, 4 sign ``lop3``) and 3.1 ``imad`` (the
    sign shifts); the W4A16 kernel ~5.4 ALU ops per word. A sign inside the lookup needs a third
    op per 4 codes (a ``prmt`` in sign mode yields 0x00 / 0xff, not the table byte with its top
    bit set), so this is the fewest for a table decoder. Timed with it in one call: 10.54 /
    10.54 µs. L2 prefetches of the step 2, 4 or 6 steps ahead of each load (no registers;
    emit.py ``l2_prefetch`` inside the loop) made it 12.1 / 11.55 / 11.6 (W4A16 9.34 -> 11.38):
    here more instructions cost more than DRAM waits."""
    hb = [_act_bits(float(v), "float16") for v in E2M1_TABLE[:8]]
    assert all(h & 0xFF == 0 and h < 0x8000 for h in hb)
    tab = tuple(sum((hb[4 * r + i] >> 8) << (8 * i) for i in range(4)) for r in range(2))
    spread = [((4 + p) << 12) | ((12 + p) << 8) | (p << 4) | (8 + p) for p in range(4)]
    return dict(tab=tab, mag_mask=0x77777777, spread=spread, sign_shift=[12 - 4 * p for p in range(4)],
                sign_mask=0x80008000, lut_sign=_LUT_AND_OR)


def _lut4_consts(table, act: str):
    """A 16-entry table in eight registers: low and high bytes of the half (bfloat16) patterns of
    entries 0..7 and 8..15 (little-endian, 4 entries per register). A ``prmt`` whose selector
    nibbles are codes & 7 reads 4 bytes at once from one 8-byte table; a second ``prmt`` in sign
    mode on the code word itself (selector nibble 8 | byte index) makes a 0x00 / 0xff byte mask
    from bit 3 of each code; ``lop3`` picks the 0..7 or 8..15 byte; two ``prmt`` interleave low
    and high bytes into two half2 of adjacent codes."""
    hb = [_act_bits(float(v), act) for v in table]

    def pack(vals):
        return sum((v & 0xFF) << (8 * i) for i, v in enumerate(vals))
    lo, hi = [h & 0xFF for h in hb], [h >> 8 for h in hb]
    return dict(tl0=(pack(lo[0:4]), pack(lo[4:8])), tl1=(pack(lo[8:12]), pack(lo[12:16])),
                th0=(pack(hi[0:4]), pack(hi[4:8])), th1=(pack(hi[8:12]), pack(hi[12:16])),
                ilv=(0x5140, 0x7362), **_LUT16)


def e4m3_consts():
    """e4m3 -> half without the 2**8 factor (folded into the float32 scale): the magnitude bits
    (byte & 0x7f) placed at bits 7..13 of a half (a byte moved into the high byte by ``prmt``, then
    shifted right by one), the sign at bit 15 from the word (pairs (byte 0, byte 2) and (byte 1,
    byte 3) have their signs 8 and 0 bits below 15 / 31). e = 0 gives a subnormal half, exact."""
    return dict(mag_mask=0x7F7F7F7F, pairs=((0x2404, 8, (0, 2)), (0x3414, 0, (1, 3))),
                sign_mask=0x80008000, lut_sign=_LUT_AND_OR, factor=256.0)


E5M2_PRMT = (0x1404, 0x3424)      # bytes (0, 1) and (2, 3) into the high bytes of two halves


def _emu_lop3(a, b, c, lut):
    """lop3.b32 on Python ints / numpy uint32 arrays (the tests run the decoders through it)."""
    r = 0
    for i in range(8):
        x = (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
        if lut >> i & 1:
            r = r | x
    return r & 0xFFFFFFFF


def _emu_prmt(a, b, sel):
    """prmt.b32 (default mode: selector nibbles, bit 3 replicates the selected byte's sign) on
    Python ints."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        v = src[n & 7]
        if n & 8:
            v = 0xFF if v & 0x80 else 0
        out |= v << (8 * i)
    return out


def _e4m3_byte(v: int) -> int:
    """The float8_e4m3 bit pattern of a whole number |v| < 16 (exact)."""
    return E4M3_TABLE.index(float(v)) if v >= 0 else 0x80 | E4M3_TABLE.index(float(-v))


def e4m3_code_consts(bits: int, storage: str):
    """Integer weight codes -> float8_e4m3 bytes (float8 activations, the fused wgmma GEMM: every
    2- and 4-bit value is exact in e4m3). The value of field ``u`` is ``u - 2**(bits-1)`` (storage
    "offset") or ``u`` ("plain"); a table of those bytes sits in registers and ``prmt`` looks 4
    codes up at once. 4-bit: the 16 bytes in four registers (``t0``: entries 0..7, ``t1``: 8..15);
    the selector is a half of the word masked to 3-bit indices (``sel_mask``), a ``prmt`` of each
    8-byte table, and ``lop3`` picks by bit 3 of each code (``msel``: the sign-mode ``prmt`` of the
    word and the word << 4 that makes the 0x00 / 0xff byte mask, as the lut4 decoder); output word
    ``h`` of a weight word holds slots ``4h .. 4h + 3``. 2-bit: the 4 bytes in one register, the
    selector a half of the word (or of the word >> 2) masked to 2-bit indices; output word
    ``2h + e`` holds slots ``8h + 2t + e`` (t = 0..3). :func:`e4m3_code_slots` lists them."""
    if bits not in (2, 4) or storage not in ("offset", "plain"):
        raise ValueError(f"bits={bits}, storage={storage!r}: e4m3 codes of 2- or 4-bit offset / plain fields")
    off = (1 << (bits - 1)) if storage == "offset" else 0
    t = [_e4m3_byte(u - off) for u in range(1 << bits)]

    def pack(vals):
        return sum(v << (8 * i) for i, v in enumerate(vals))
    if bits == 2:
        return dict(table=pack(t), sel_mask=0x33333333)
    return dict(t0=(pack(t[0:4]), pack(t[4:8])), t1=(pack(t[8:12]), pack(t[12:16])), **_LUT16)


def e4m3_code_slots(bits: int):
    """``slots[p][t]``: the slot (field of the weight word) whose e4m3 byte lands in byte ``t`` of
    output word ``p`` of :func:`e4m3_code_dec` (``8 // bits`` output words per weight word)."""
    if bits == 4:
        return [[4 * p + t for t in range(4)] for p in range(2)]
    return [[8 * (p // 2) + 2 * t + p % 2 for t in range(4)] for p in range(4)]


def _table_regs(lines, k, names):
    """The table registers ``{name}a``, ``{name}b`` of 16-entry ``prmt`` lookups (``k[name]``: a pair)."""
    for nm in names:
        a, b = k[nm]
        lines.append(f"  const unsigned {nm}a = 0x{a:08x}u, {nm}b = 0x{b:08x}u;")


def _lut16_selectors(lines, j: int, k):
    """Opens word ``j``'s block of a 16-entry ``prmt`` lookup: the selectors of its two halves (codes
    & 7, ``s0`` / ``s1``) and the byte masks of bit 3 of each code (``m0`` / ``m1``, ``k['msel']``)."""
    lines.append(f"  {{ const unsigned q = w[{j}], s0 = q & 0x{k['sel_mask']:08x}u, s1 = s0 >> 16, q4 = q << 4;")
    lines.append("    unsigned m0, m1;")
    for i in range(2):
        lines.append(f"    asm(\"prmt.b32 %0, %1, %2, 0x{k['msel'][i]:x};\" : \"=r\"(m{i}) : \"r\"(q), \"r\"(q4));")


def e4m3_code_dec(tag: str, bits: int, storage: str, nw: int, name: Optional[str] = None) -> str:
    """``bb_fdec_{tag}(w, d)`` (or ``name``): ``nw`` weight words of 2- or 4-bit integer codes to
    ``nw * 8 / bits`` words of float8_e4m3 bytes (:func:`e4m3_code_consts`, slots :func:`e4m3_code_slots`)."""
    k = e4m3_code_consts(bits, storage)
    F = 8 // bits
    prmt = 'asm("prmt.b32 %0, %1, %2, %3;" : "=r"({}) : "r"({}), "r"({}), "r"({}));'
    lines = [f"__device__ __forceinline__ void {name or f'bb_fdec_{tag}'}(const unsigned* w, unsigned* d) {{"]
    if bits == 2:
        lines.append(f"  const unsigned tb = 0x{k['table']:08x}u;")
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}];")
            for h in range(2):
                for e in range(2):
                    sh = 16 * h + 2 * e
                    x = f"(q >> {sh})" if sh else "q"
                    lines.append(f"    {{ const unsigned s = {x} & 0x{k['sel_mask']:08x}u; "
                                 + prmt.format(f"d[{F * j + 2 * h + e}]", "tb", "0u", "s") + " }")
            lines.append("  }")
    else:
        _table_regs(lines, k, ("t0", "t1"))
        for j in range(nw):
            _lut16_selectors(lines, j, k)
            for h, (sv, mv) in enumerate((("s0", "m0"), ("s1", "m1"))):
                lines.append("    { unsigned x, y;")
                lines.append("      " + prmt.format("x", "t0a", "t0b", sv))
                lines.append("      " + prmt.format("y", "t1a", "t1b", sv))
                lines.append(f"      asm(\"lop3.b32 %0, %1, %2, %3, 0x{k['lut_sel']:02x};\" : \"=r\"(d[{F * j + h}]) "
                             f": \"r\"(x), \"r\"(y), \"r\"({mv})); }}")
            lines.append("  }")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def e4m3_scale_helper():
    """float8_e4m3 scale byte -> float32, exact (normal: exponent rebiased in the bit pattern;
    subnormal: m * 2**-9). 0x7f / 0xff (NaN in e4m3fn) decode to +-480; quantizers never write them."""
    return r"""
__device__ __forceinline__ float bb_e4m3f(int b) {
  const unsigned mg = (unsigned)b & 0x7Fu;
  const float v = mg >= 8u ? __uint_as_float((mg + 960u) << 20) : (float)mg * 0.001953125f;
  return (b & 0x80) ? -v : v;
}
"""


def f8_pair_dec(tag: str, act: str, nw: int, dec: str) -> str:
    """``bb_dec_{tag}`` for float8 weights in the tensor-core GEMV: exact half pairs (bytes p and
    p + 2 of each word, the int decoders' pairing) as the mma operand, in the activation dtype.
    e5m2: the byte is the high byte of a half. e4m3: magnitude at bits 7..13, sign merged by
    ``lop3`` (as in the float32 path), times 2**8 (the bias difference; exact, |v| <= 448 fits a
    half, so the scale is applied unchanged). bfloat16: the halves through float32 (exact)."""
    k = e4m3_consts()
    sels = [sel for sel, _, _ in k["pairs"]]          # (bytes 0, 2), (bytes 1, 3)
    lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, unsigned* d) {{"]
    if dec == "e4m3":
        lines.append("  const __half2 f8k = __float2half2_rn(256.f);")
    for j in range(nw):
        lines.append(f"  {{ const unsigned q = w[{j}], qm = q & 0x{k['mag_mask']:08x}u;")
        for p, (sel, sh, _) in enumerate(k["pairs"]):
            lines.append("    { unsigned x;")
            if dec == "e5m2":
                lines.append(f"      x = __byte_perm(q, 0u, 0x{sels[p]:x});")
            else:
                sgn = f"q << {sh}" if sh else "q"
                lines.append(f"      const unsigned t = __byte_perm(qm, 0u, 0x{sel:x}) >> 1;")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['sign_mask']:08x}, %2, 0x{k['lut_sign']:02x};\" "
                             f": \"=r\"(x) : \"r\"({sgn}), \"r\"(t));")
                lines.append("      { __half2 h = __hmul2(*reinterpret_cast<const __half2*>(&x), f8k); "
                             "x = *reinterpret_cast<unsigned*>(&h); }")
            if act == "bfloat16":
                lines.append("      { __nv_bfloat162 v = __float22bfloat162_rn(__half22float2("
                             "*reinterpret_cast<const __half2*>(&x))); x = *reinterpret_cast<unsigned*>(&v); }")
            lines.append(f"      d[{2 * j + p}] = x; }}")
        lines.append("  }")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def table_dec(tag: str, act: str, nw: int, dec: str, table, e2m1_table: bool = False):
    """``bb_dec_{tag}`` for the table decoders (the signature of the int decoders). ``e2m1_table``:
    e2m1 codes with float16 activations by table lookup (:func:`_e2m1_lut_consts`) instead of bit
    placement; the same pairs and values."""
    ctype, t2, magic, mant, magic_f = ACT[act]
    h2 = "half2" if act == "float16" else "bfloat162"
    if dec == "e5m2":
        lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, float* d) {{"]
        for j in range(nw):
            for t, sel in enumerate(E5M2_PRMT):
                lines.append(f"  {{ unsigned x = __byte_perm(w[{j}], 0u, 0x{sel:x});")
                lines.append("    float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));")
                lines.append(f"    d[{4 * j + 2 * t}] = f.x; d[{4 * j + 2 * t + 1}] = f.y; }}")
        lines.append("}")
        return "\n" + "\n".join(lines) + "\n"
    if dec == "e4m3":
        k = e4m3_consts()
        lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, float* d) {{"]
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}], qm = q & 0x{k['mag_mask']:08x}u;")
            for sel, sh, (b0, b1) in k["pairs"]:
                sgn = f"q << {sh}" if sh else "q"
                lines.append(f"    {{ unsigned x; const unsigned t = __byte_perm(qm, 0u, 0x{sel:x}) >> 1;")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['sign_mask']:08x}, %2, 0x{k['lut_sign']:02x};\" "
                             f": \"=r\"(x) : \"r\"({sgn}), \"r\"(t));")
                lines.append("      float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));")
                lines.append(f"      d[{4 * j + b0}] = f.x; d[{4 * j + b1}] = f.y; }}")
            lines.append("  }")
        lines.append("}")
        return "\n" + "\n".join(lines) + "\n"
    lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, unsigned* d) {{"]
    if e2m1_table:
        if dec != "e2m1" or act != "float16":
            raise ValueError(f"e2m1_table: e2m1 codes with float16 activations only, not dec={dec!r}, act={act!r}")
        k = _e2m1_lut_consts()
        # t0 = (w[0] & 0) | table word 0, opaque to ptxas: a constant would sit in a uniform
        # register, copied to an ordinary one (imad) before every prmt (two per word)
        lines.append(f"  unsigned t0; asm(\"lop3.b32 %0, %1, 0, 0x{k['tab'][0]:08x}, 0x{_LUT_AND_OR:02x};\" "
                     f": \"=r\"(t0) : \"r\"(w[0]));")
        lines.append(f"  const unsigned t1 = 0x{k['tab'][1]:08x}u;")
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}], qm = q & 0x{k['mag_mask']:08x}u;")
            lines.append("    const unsigned l0 = __byte_perm(t0, t1, qm), l1 = __byte_perm(t0, t1, qm >> 16);")
            for p, (sel, ss) in enumerate(zip(k["spread"], k["sign_shift"])):
                sgn = f"q << {ss}" if ss else "q"
                lines.append(f"    {{ unsigned x; asm(\"prmt.b32 %0, %1, %2, 0x{sel:04x};\" : \"=r\"(x) : \"r\"(l0), \"r\"(l1));")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['sign_mask']:08x}, %2, 0x{k['lut_sign']:02x};\" "
                             f": \"=r\"(x) : \"r\"({sgn}), \"r\"(x)); d[{4 * j + p}] = x; }}")
            lines.append("  }")
    elif dec == "e2m1":
        k = _e2m1_consts(act)
        lines.append(f"  const {t2} k = __float2{h2}_rn({k['mul']!r}f);")
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}];")
            for p, (ss, ms) in enumerate(k["shifts"]):
                sgn = f"q << {ss}" if ss > 0 else (f"q >> {-ss}" if ss < 0 else "q")
                mag = f"q << {ms}" if ms > 0 else (f"q >> {-ms}" if ms < 0 else "q")
                lines.append("    { unsigned mg, x;")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['mag_mask']:08x}, 0, 0x{k['lut_mag']:02x};\" "
                             f": \"=r\"(mg) : \"r\"({mag}));")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['sign_mask']:08x}, %2, 0x{k['lut_sign']:02x};\" "
                             f": \"=r\"(x) : \"r\"({sgn}), \"r\"(mg));")
                lines.append(f"      {t2} v = __hmul2(*reinterpret_cast<{t2}*>(&x), k);")
                lines.append(f"      d[{4 * j + p}] = *reinterpret_cast<unsigned*>(&v); }}")
            lines.append("  }")
    else:                                   # lut4
        k = _lut4_consts(table, act)
        _table_regs(lines, k, ("tl0", "tl1", "th0", "th1"))
        for j in range(nw):
            _lut16_selectors(lines, j, k)
            for h, (sv, mv) in enumerate((("s0", "m0"), ("s1", "m1"))):
                lines.append("    { unsigned x0, x1, y0, y1, lo, hi;")
                for out, tb in (("x0", "tl0"), ("x1", "tl1"), ("y0", "th0"), ("y1", "th1")):
                    lines.append(f"      asm(\"prmt.b32 %0, %1, %2, %3;\" : \"=r\"({out}) : \"r\"({tb}a), \"r\"({tb}b), \"r\"({sv}));")
                lines.append(f"      asm(\"lop3.b32 %0, %1, %2, %3, 0x{k['lut_sel']:02x};\" : \"=r\"(lo) : \"r\"(x0), \"r\"(x1), \"r\"({mv}));")
                lines.append(f"      asm(\"lop3.b32 %0, %1, %2, %3, 0x{k['lut_sel']:02x};\" : \"=r\"(hi) : \"r\"(y0), \"r\"(y1), \"r\"({mv}));")
                lines.append(f"      d[{4 * j + 2 * h}] = __byte_perm(lo, hi, 0x{k['ilv'][0]:x});")
                lines.append(f"      d[{4 * j + 2 * h + 1}] = __byte_perm(lo, hi, 0x{k['ilv'][1]:x}); }}")
            lines.append("  }")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def prep_adjacent(tag: str, act: str, nw: int) -> str:
    """``bb_prep_{tag}`` for decoders whose pairs are adjacent codes (k, k+1): the activation words
    as they are, and their sum."""
    ctype, t2, magic, mant, magic_f = ACT[act]
    cvt2 = "__half22float2" if act == "float16" else "__bfloat1622float2"
    na = nw * 4
    lines = [f"__device__ __forceinline__ float bb_prep_{tag}(const unsigned* a, unsigned* ap) {{"]
    for i in range(na):
        lines.append(f"  ap[{i}] = a[{i}];")
    lines.append("  float s = 0.f;")
    for g in range(0, na, 4):
        terms = [f"*reinterpret_cast<const {t2}*>(&a[{g + t}])" for t in range(min(4, na - g))]
        expr = terms[0]
        for t in terms[1:]:
            expr = f"__hadd2({expr}, {t})"
        lines.append(f"  {{ float2 f = {cvt2}({expr}); s += f.x + f.y; }}")
    lines += ["  return s;", "}"]
    return "\n" + "\n".join(lines) + "\n"
