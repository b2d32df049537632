"""Shared emit helpers of the GEMV kernels (the leaf of bitblas/schedule/gemv/).

What every kernel body needs and none owns: facts of a plan the kernels share (the weight
vector, the float32 path of 8-bit codes, the staged activation row's size), the CUDA device
helpers of a (activation dtype, weight format, vector) (load, decode, dot product; the table and
int8 decoders come from :mod:`.decode` and :mod:`.int8`) and the TVMScript lines of the kernel
entry, the step loop and the K-warp reduction. Imports no kernel body and not the template.

Decode: two values at a time into half2/bfloat162 with the magic-number trick: one ``lop3``
places a b-bit field (signed codes: offset-binary, ``q + 2**(b-1)``, as they are stored; int8 ones
XOR-ed to it) in the low mantissa bits of 1024.0 (128.0 for bfloat16), one ``hsub2``/``hfma2``
removes the magic and an integer offset exactly, one
``hfma2`` multiplies with the activation pair (activations are paired with ``prmt`` to match).
8-bit weights decode to float32 (``prmt`` into 2**23) and use float32 FMAs. The dot product over
one vector accumulates in half2 (float16: 2, bfloat16: 4 independent accumulators), then in
float32 with the group scale. The integer offset centres the codes (2**(b-1) for signed codes, the
zero-point code, the rounded float zero point); the float remainder of a zero point is applied
through the sum of the activations of the vector: ``s * sum(a * (q - z)) = s * dot + s * (o - z) * sum(a)``.

Table formats (:func:`decoder` picks the rule from the format's table, not its name); the group
scale stays a float32 multiply after the dot product, as for int codes:

* e2m1 (fp4_e2m1, nvfp4): per pair, one shifted copy of the word gives the magnitude bits
  (e1 e0 m) at the lowest exponent bits and the top mantissa bit (``lop3`` masks them), another
  gives the sign bit at bit 15 (``lop3`` merges it); the half is then the e2m1 value times
  2**-14 (bfloat16: 2**-126), e = 0 landing on a subnormal, and one ``hmul2`` by 2**14 (2**126)
  makes it exact. ~2.4 instructions per weight (7 shifts, 8 lop3, 4 hmul2 per 8 codes);
* nf4 and any other 4-bit table: the 16 half (bfloat16) patterns live in eight registers (low and
  high bytes of entries 0..7 and 8..15); ``prmt`` with the codes & 7 as selector nibbles looks up
  four bytes at once, ``prmt`` in sign mode on the code word makes the bit-3 byte mask, ``lop3``
  selects, two ``prmt`` interleave low / high bytes into half2 of adjacent codes: 21 instructions
  per 8 codes (~2.6 per weight), all ALU. The alternative, a 256-entry half2 table in shared
  memory indexed by a whole byte, needs ~1.5 instructions per weight but one LDS per 2 weights:
  shared-memory loads issue at a quarter of the ALU rate and random bytes conflict on the banks
  (~3.5 wavefronts per warp load): by that estimate (not measured) several times slower than
  the registers, at a rate the 4-bit GEMV needs to keep up with DRAM;
* float8 weights take the float32 path of 8-bit codes (their values reach 448 / 57344, beyond a
  half2 dot product): e5m2 is the high byte of a half (one ``prmt`` per 2 weights, inf / NaN
  included); e4m3 places the magnitude at bits 7..13 (``prmt`` into the high byte, shift right
  by one, the sign merged by ``lop3``), a subnormal half for e = 0, and the 2**8 of the bias
  difference is folded into the float32 scale; the halves are converted to float32 (exact, also
  for bfloat16 activations), one FFMA each. ~1.5 (e5m2) and ~3 (e4m3) instructions per weight
  including the conversion. e4m3fn's NaN codes 0x7f / 0xff decode to +-480 (the quantizers
  never write them); ``cvt.rn.f16x2.e4m3x2`` (sm_89+) would be one instruction per 2 weights.
  The tensor-core kernel (2..16 rows) takes float8 and int/uint 8-bit codes as half pairs
  instead (fp32 accumulation in the mma): float8 as above with the 2**8 applied to the pair,
  8-bit ints through the 1024 magic (float16) or through float32 (bfloat16);
* nvfp4: e2m1 codes, 8-byte vectors (16 codes, one float8_e4m3 scale each); the scale byte is
  decoded to float32 exactly (``bb_e4m3f``), the optional float32 global scale multiplies the
  result before the bias. The wgmma kernels stream 16-byte vectors (two blocks): both scale bytes
  in one register, applied per decoded pair (:func:`block_scale_helpers`).

measurements: docs/performance.md
"""
from __future__ import annotations

from typing import Optional

from .decode import ACT, decoder, e4m3_scale_helper, f8_pair_dec, lop3_lut, pair_codes, prep_adjacent, table_dec
from .int8 import i8_helpers

__all__ = ["vec_bytes", "vec_blocks", "block_scale_helpers", "block_dot_helpers", "dot_helper", "e4m3x2_lines",
           "span_vectors", "decode_ops_per_weight", "f8_scales", "e4m3_acts", "half_acts", "f8_half_prep",
           "F8_HALF_SHIFT", "LUT_FIELD", "mma_decodable", "uses_f32_path",
           "prep_words", "keeps_act_sum", "act_smem_bytes", "format_helpers", "load_helpers", "DOT_FMAS_PER_ASM",
           "fmt_float", "LDS4", "STS4", "device_entry", "pdl_trigger", "reduce_k_warps", "split_steps", "step_loop"]


def f8_scales(plan) -> bool:
    """Float activations with float8_e4m3 scale bytes (nvfp4), decoded per vector."""
    return plan.float_acts and plan.config.with_scaling and plan.scale_dtype == "float8_e4m3"


def e4m3_acts(plan) -> bool:
    """float8_e4m3 activations: multiplied on float8 tensor cores (the m16n8k32 ``.e4m3`` GEMV, the
    fused GEMM's k32 ``.e4m3`` wgmma) with the codes decoded to e4m3 bytes, or converted to float16
    pairs (:func:`half_acts`)."""
    return plan.config.A_dtype == "float8_e4m3"


def half_acts(plan, hint) -> bool:
    """Whether ``hint``'s kernel multiplies the activations as float16 / bfloat16 pairs: float
    activations, and float8_e4m3 ones in a kernel that converts them to float16 pairs as it pairs
    them (``hint.f8_halves``: the rows kernel; exact, :func:`f8_half_prep`)."""
    return plan.float_acts or (e4m3_acts(plan) and hint.f8_halves)


def vec_bytes(plan, want: int = 0, group_vectors: int = 1, blocks: int = 1) -> Optional[int]:
    """Weight bytes per lane vector (``want``, or the largest of 16 / 8 / 4 that fits): at least
    one 16-byte activation load of values, K a multiple of the values, <= 64 values unless asked,
    and with group scales ``group_vectors`` vectors inside one group (the int8 tensor-core GEMV: 4,
    one mma k-step of a lane quad), or (``blocks`` > 1, :func:`vec_blocks`) up to ``blocks`` whole
    groups in one vector."""
    c, b = plan.config, plan.w.bits
    vmin = 8 if plan.float_acts else 16      # values per 16-byte activation load
    for vb in ((want,) if want else (16, 8, 4)):
        v = vb * 8 // b
        if v < vmin or c.K % v or (not want and v > 64):   # <= 64 values per vector: registers
            continue
        if plan.groups > 1 and c.group_size % (group_vectors * v) and not (
                group_vectors == 1 and v % c.group_size == 0 and v // c.group_size <= blocks):
            continue
        return vb
    return None


def vec_blocks(plan, hint) -> int:
    """Scale groups one weight vector of ``hint``'s kernel may hold: 2 for float8 block scales
    (nvfp4: one per 16 codes) in a kernel that applies them per decoded pair (``hint.block_scales``,
    the wgmma kernels: 32 codes per 16-byte vector, :func:`block_scale_helpers`) or per block's dot
    product (``hint.block_dots``, the rows kernel, :func:`block_dot_helpers`), else 1."""
    return 2 if (hint.block_scales or hint.block_dots) and f8_scales(plan) else 1


def block_scale_helpers(tag: str, act: str, pairs, V: int, G: int) -> dict:
    """``bb_ldsb_{tag}(p)``: the two float8_e4m3 block scales of a vector of ``V`` = 2 ``G`` codes
    (adjacent bytes of the scale row, the first in the low byte); ``bb_sclb_{tag}(d, s)``: the decoded pairs
    ``d`` (word ``i`` holds codes ``pairs[i]`` of the vector, :func:`~.decode.pair_codes`) times
    their blocks' scales, ``cvt.rn.f16x2.e4m3x2`` (sm_89+: exact, the low byte in the low half;
    bfloat16 through float32, exact) and one ``hmul2`` per pair with the half2 of the scales of its
    two codes' blocks. Exact: an e2m1 value times an e4m3 scale has at most 6 significant bits and
    lies within 2**-10 .. 2688. NaN scale bytes (0x7f / 0xff, never written by the quantizers)
    give NaN."""
    t2 = ACT[act][1]
    lines = [f"__device__ __forceinline__ void bb_sclb_{tag}(unsigned* d, unsigned s) {{",
             "  unsigned h;",
             "  asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(h) : \"h\"((unsigned short)(s & 0xFFFFu)));"]
    if act == "bfloat16":
        lines.append("  { __nv_bfloat162 b = __float22bfloat162_rn(__half22float2("
                     "*reinterpret_cast<const __half2*>(&h))); h = *reinterpret_cast<unsigned*>(&b); }")
    lines.append(f"  const {t2} s01 = *reinterpret_cast<const {t2}*>(&h);")
    names = {(0, 0): "s00", (1, 1): "s11", (0, 1): "s01", (1, 0): "s10"}
    used = sorted({(lo // G, hi // G) for lo, hi in pairs})
    assert all(max(k) < 2 for k in used), (pairs, G)
    low, high = ("__low2half2", "__high2half2") if act == "float16" else ("__low2bfloat162", "__high2bfloat162")
    make = {(0, 0): f"{low}(s01)", (1, 1): f"{high}(s01)", (1, 0): "__lowhigh2highlow(s01)"}
    for k in used:
        if k != (0, 1):
            lines.append(f"  const {t2} {names[k]} = {make[k]};")
    for i, (lo, hi) in enumerate(pairs):
        lines.append(f"  {{ {t2} v = __hmul2(*reinterpret_cast<{t2}*>(&d[{i}]), {names[(lo // G, hi // G)]}); "
                     f"d[{i}] = *reinterpret_cast<unsigned*>(&v); }}")
    lines.append("}")
    # one 2-byte load (two byte loads cost a load and a merge more per vector: the float16 nvfp4 rows
    # kernel 3% slower on the H200): the pair starts at an even offset of the scale row (V == 2 G and
    # the vector divides K, so a row holds an even number of scales), and the call paths realign a
    # scale view whose base is off a 2-byte boundary (ops/checks.py: base_align)
    ld = [f"__device__ __forceinline__ unsigned bb_ldsb_{tag}(const void* p) {{",
          "  return (unsigned)__ldg(reinterpret_cast<const unsigned short*>(p));", "}"]
    assert V == 2 * G
    return {f"bb_sclb_{tag}": "\n" + "\n".join(lines) + "\n", f"bb_ldsb_{tag}": "\n" + "\n".join(ld) + "\n"}


def span_vectors(plan) -> Optional[tuple]:
    """``(vec_bytes, n)`` for float activations whose default weight vector (:func:`vec_bytes`)
    holds more than 16 codes: the smallest vector the plan takes of at least 16 codes (2 bytes
    per bit of code width), so that a lane's activations span 32 bytes and the four lanes of a
    token row in the tensor-core GEMV load one 128-byte line per load, and ``n`` of them cover one
    default vector. None otherwise."""
    vb0 = vec_bytes(plan)
    if not plan.float_acts or vb0 is None:
        return None
    for vb in (4, 8, 16):
        if vb >= 2 * plan.w.bits and vec_bytes(plan, vb) is not None:
            return (vb, vb0 // vb) if vb < vb0 else None
    return None


def decode_ops_per_weight(plan, hint=None) -> float:
    """Rough ALU instructions per weight of the decode (the tuner's cost model) in ``hint``'s
    kernel (None: one that does not convert byte activations to float16 pairs)."""
    if not (plan.float_acts or (hint is not None and half_acts(plan, hint))):
        return 0.5                           # int8 / float8 bytes: lop3 / shift per 4 codes, prmt shared
    return {"int": 1.5, "e2m1": 2.4, "lut4": 2.6, "e5m2": 1.5, "e4m3": 3.0}.get(decoder(plan.w), 1.5)


def mma_decodable(w) -> bool:
    """Weights whose decoder yields float16/bfloat16 pairs (what the mma consumes): 8-bit codes
    through the float16 magic number (10-bit mantissa) or, for bfloat16, through float32."""
    dec = decoder(w)
    if w.bits == 8:
        return dec in ("int", "e4m3", "e5m2")
    return w.bits <= 4 and dec in ("int", "e2m1", "lut4")


def uses_f32_path(plan, hint) -> bool:
    """8-bit codes with float activations on the rows / k-split kernels: decoded to float32, the
    activations converted to float32 (the tensor-core kernel takes 8-bit codes as half pairs)."""
    return plan.w.bits == 8 and plan.float_acts and not hint.tensor_cores


def prep_words(plan, hint, V: int) -> int:
    """4-byte words of prepared (paired) activations per weight vector of ``V`` values: one
    float32 per value on the float32 path, else two float16 / bfloat16 or four int8 values."""
    if uses_f32_path(plan, hint):
        return V
    return V // 2 if half_acts(plan, hint) else V // 4


def keeps_act_sum(plan) -> bool:
    """Whether the rows kernel uses each vector's activation sum from the prep (float zero points;
    int8 activations: the dp4a chain's start; float8 ones take no zero points), so that a staged
    row keeps it too."""
    c = plan.config
    if c.A_dtype == "int8":
        return True
    return plan.float_acts and c.with_zeros and c.zeros_mode != "quantized"


def act_smem_bytes(plan, hint) -> Optional[int]:
    """Shared memory of the rows kernel's staged activation row (``hint.act_smem``): the prepared
    activations of every vector position (:func:`prep_words`) and, where the kernel uses them
    (:func:`keeps_act_sum`), one 4-byte sum per position; None if the hint's vector does not fit."""
    vb = vec_bytes(plan, hint.vec_bytes)
    if vb is None:
        return None
    V = vb * 8 // plan.w.bits
    return -(-(plan.config.K // V) // 32) * 32 * 4 * (prep_words(plan, hint, V) + keeps_act_sum(plan))



# 16 bytes between a local quad of words and shared memory (vector accesses; ``p`` 16-byte aligned)
LDS4 = r"""
__device__ __forceinline__ void bb_lds4(const void* p, void* d) {
  *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(p);
}
"""


STS4 = r"""
__device__ __forceinline__ void bb_sts4(void* p, const void* s) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(s);
}
"""



# --------------------------------------------------------------------------------------------
# CUDA helpers (device functions, inlined by nvcc), generated per format
# --------------------------------------------------------------------------------------------
# lop3 LUT of f(a, b, c) = b ? (a ^ c) : c  (b = field mask, c = sign bit inside the field, magic outside)
LUT_FIELD = lop3_lut(lambda a, b, c: (b & (a ^ c)) | (~b & c))


def _field_plan(bits: int, mant: int):
    """For each pair p of a 32-bit word (field p of the low and the high 16-bit half): the right
    shift applied to the word and the bit position of the field afterwards (<= mant - bits, so
    magic + field * 2**pos stays exact)."""
    out, shift = [], None
    for p in range(16 // bits):
        off = p * bits
        if shift is None or off - shift > mant - bits:
            shift = off
        out.append((shift, off - shift))
    return out


def format_helpers(tag: str, act: str, bits: int, storage: str, nw: int, dec: str = "int", table=None,
                   half_pairs: bool = False, order=None, e2m1_table: bool = False):
    """CUDA source of the helpers for one (activation dtype, weight format, vector size);
    ``storage``: how the codes are stored (``plan.w_storage``: "offset", "twos", "plain"); ``dec``
    and ``table`` from :func:`decoder`: table decoders reuse the int path's activation and dot
    helpers and replace the decoder (and, for adjacent pairs, the activation pairing); int8
    activations take the dp4a helpers of int8. ``order``: the code order inside each weight word
    (``Plan.w_order``; the activations are paired / gathered to match it). ``e2m1_table``: e2m1
    codes with float16 activations decoded by table lookup (decode.table_dec; the rows kernel)."""
    if act == "int8":
        return {**load_helpers(nw), **i8_helpers(tag, bits, storage, nw, order)}
    if act == "float8_e4m3":          # the fused wgmma GEMM's float8 path: its own decoder (decode.e4m3_code_dec)
        return load_helpers(nw)
    src = _int_helpers(tag, act, bits, storage == "twos", nw, half_pairs, order)
    if dec in ("e4m3", "e5m2") and half_pairs:
        src[f"bb_dec_{tag}"] = f8_pair_dec(tag, act, nw, dec)
    elif dec != "int":
        src[f"bb_dec_{tag}"] = table_dec(tag, act, nw, dec, table, e2m1_table)
        if dec == "lut4":
            src[f"bb_prep_{tag}"] = prep_adjacent(tag, act, nw)
        src["bb_e4m3f"] = e4m3_scale_helper()
    return src


def load_helpers(nw: int):
    """The load helpers every kernel uses: ``nw`` words of packed weights (L1 not allocated),
    16 bytes of activations, the cp.async ring's copy / commit / wait and its shared-memory read."""
    src = {}
    src[f"bb_ldw{nw}"] = {
        4: r"""
__device__ __forceinline__ void bb_ldw4(const void* p, unsigned* d) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "l"(p));
}
""", 2: r"""
__device__ __forceinline__ void bb_ldw2(const void* p, unsigned* d) {
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(d[0]), "=r"(d[1]) : "l"(p));
}
""", 1: r"""
__device__ __forceinline__ void bb_ldw1(const void* p, unsigned* d) {
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(d[0]) : "l"(p));
}
"""}[nw]
    src["bb_lda"] = r"""
__device__ __forceinline__ void bb_lda(const void* p, unsigned* d) {
  uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}
"""
    return src


def _byte_floats(j: int, twos: bool, dst, decl: str = ""):
    """CUDA lines opening a block: the four bytes of word ``w[j]`` (``twos``, two's complement:
    XOR-ed to offset-binary ``q + 128``) as exact float32 values minus ``c`` = 2**23 + off (``prmt``
    into 2**23's mantissa), into ``dst(t)``."""
    x = f"(w[{j}] ^ 0x80808080u)" if twos else f"w[{j}]"
    return [f"  {{ unsigned x = {x};" + (f" {decl}" if decl else "")] + [
        f"    {dst(t)} = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x{0x7540 | t:x})) - c;" for t in range(4)]


def _int_helpers(tag: str, act: str, bits: int, twos: bool, nw: int, half_pairs: bool = False, order=None):
    """``twos``: the codes are stored in two's complement (int8): the decoder XORs each field's
    sign bit, giving the offset-binary field ``q + 2**(bits-1)`` that offset-binary codes (signed
    1/2/4-bit weights) are stored as, and unsigned codes are taken as they are; the decode gives
    ``field - off``. ``half_pairs``: 8-bit codes decoded to half pairs like the narrower codes (the
    tensor-core GEMV's operand; float16 through the magic number, bfloat16 through float32), else
    the float32 path of the rows kernel."""
    ctype, t2, magic, mant, magic_f = ACT[act]
    src = load_helpers(nw)
    if bits == 8 and not half_pairs:
        # float32 path: activations to float, bytes to float through 2**23, float32 FMAs
        n_a = nw * 4
        cvt = "__half2float" if act == "float16" else "__bfloat162float"
        lines = [f"__device__ __forceinline__ float bb_prep_{tag}(const unsigned* a, float* af) {{",
                 f"  const {ctype}* h = reinterpret_cast<const {ctype}*>(a);",
                 "  float s0 = 0.f, s1 = 0.f;"]
        for i in range(n_a):
            lines.append(f"  af[{i}] = {cvt}(h[{i}]); s{i % 2} += af[{i}];")
        lines += ["  return s0 + s1;", "}"]
        src[f"bb_prep_{tag}"] = "\n" + "\n".join(lines) + "\n"
        lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, float* d) {{",
                 "  const float c = 8388608.f + (float)off;"]
        for j in range(nw):
            lines += _byte_floats(j, twos, lambda t: f"d[{4 * j + t}]")
            lines.append("  }")
        lines.append("}")
        src[f"bb_dec_{tag}"] = "\n" + "\n".join(lines) + "\n"
        lines = [f"__device__ __forceinline__ float bb_dot_{tag}(const float* d, const float* af) {{",
                 "  float s0 = 0.f, s1 = 0.f;"]
        for i in range(n_a):
            lines.append(f"  s{i % 2} = fmaf(d[{i}], af[{i}], s{i % 2});")
        lines += ["  return s0 + s1;", "}"]
        src[f"bb_dot_{tag}"] = "\n" + "\n".join(lines) + "\n"
        return src

    n = 32 // bits          # values per 32-bit word
    P = n // 2              # pairs per word
    npairs = nw * P
    fp = _field_plan(bits, mant)
    cvt2 = "__half22float2" if act == "float16" else "__bfloat1622float2"
    # prep: pair the activations of the codes of decoded pair i (slots p and p + P of word j: codes
    # k and k + P in natural order, decode.pair_codes under a code order), low half and high half
    lines = [f"__device__ __forceinline__ float bb_prep_{tag}(const unsigned* a, unsigned* ap) {{"]
    for i, (lo, hi) in enumerate(pair_codes("int", bits, nw, order)):
        sel = 2 * (lo % 2) | (2 * (lo % 2) + 1) << 4 | (4 + 2 * (hi % 2)) << 8 | (5 + 2 * (hi % 2)) << 12
        lines.append(f"  ap[{i}] = __byte_perm(a[{lo // 2}], a[{hi // 2}], 0x{sel:x});")
    # sum of the activations: half2 sums of 8 values, then float32
    na = npairs        # u32 words of activations (2 values each)
    lines.append("  float s = 0.f;")
    for g in range(0, na, 4):
        k = min(4, na - g)
        terms = [f"*reinterpret_cast<const {t2}*>(&a[{g + t}])" for t in range(k)]
        expr = terms[0]
        for t in terms[1:]:
            expr = f"__hadd2({expr}, {t})"
        lines.append(f"  {{ float2 f = {cvt2}({expr}); s += f.x + f.y; }}")
    lines += ["  return s;", "}"]
    src[f"bb_prep_{tag}"] = "\n" + "\n".join(lines) + "\n"

    # decode: d[pair] = (field ^ X) - off, exact, as half2/bfloat162 bits (X: the sign bit for two's complement)
    magic2 = magic * 0x10001
    lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, unsigned* d) {{",
             f"  const unsigned z0u = (0x{magic:x}u + (unsigned)off) * 0x10001u;",
             f"  const {t2} z0 = *reinterpret_cast<const {t2}*>(&z0u);"]
    poss = sorted({pos for _, pos in fp if pos})
    for pos in poss:
        # x * 2^-pos - (magic * 2^-pos + off) = field - off
        lines.append(f"  const {t2} m{pos} = __float2{'half2' if act == 'float16' else 'bfloat162'}_rn({2.0 ** -pos!r}f);")
        lines.append(f"  const {t2} c{pos} = __float2{'half2' if act == 'float16' else 'bfloat162'}_rn("
                     f"-({magic_f * 2.0 ** -pos!r}f + (float)off));")
    shifts = sorted({s for s, _ in fp})
    for j in range(nw):
        lines.append("  {")
        for s in shifts:
            lines.append(f"    const unsigned w{s} = w[{j}]" + (f" >> {s};" if s else ";"))
        for p, (s, pos) in enumerate(fp):
            field = ((1 << bits) - 1) << pos
            b_const = field * 0x10001
            sign = (1 << (pos + bits - 1)) if twos else 0
            c_const = (sign * 0x10001) | (magic2 & ~b_const & 0xFFFFFFFF)
            lines.append(f"    {{ unsigned x; asm(\"lop3.b32 %0, %1, 0x{b_const:08x}, 0x{c_const:08x}, 0x{LUT_FIELD:02x};\" "
                         f": \"=r\"(x) : \"r\"(w{s}));")
            if pos == 0:
                lines.append(f"      {t2} v = __hsub2(*reinterpret_cast<{t2}*>(&x), z0);")
            else:
                lines.append(f"      {t2} v = __hfma2(*reinterpret_cast<{t2}*>(&x), m{pos}, c{pos});")
            lines.append(f"      d[{j * P + p}] = *reinterpret_cast<unsigned*>(&v); }}")
        lines.append("  }")
    lines.append("}")
    src[f"bb_dec_{tag}"] = "\n" + "\n".join(lines) + "\n"
    if bits > mant:      # 8-bit codes, bfloat16: through float32 (2**23 + byte), packed to pairs (exact: |q| <= 256)
        lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, unsigned* d) {{",
                 "  const float c = 8388608.f + (float)off;"]
        for j in range(nw):
            lines += _byte_floats(j, twos, lambda t: f"f[{t}]", decl="float f[4];")
            for p in range(2):               # pair p: bytes p and p + 2, as the activations are paired
                lines.append(f"    {{ {t2} v = __floats2bfloat162_rn(f[{p}], f[{p + 2}]); "
                             f"d[{2 * j + p}] = *reinterpret_cast<unsigned*>(&v); }}")
            lines.append("  }")
        lines.append("}")
        src[f"bb_dec_{tag}"] = "\n" + "\n".join(lines) + "\n"

    src[f"bb_dot_{tag}"] = dot_helper(f"bb_dot_{tag}", act, npairs)
    return src


def dot_helper(name: str, act: str, npairs: int, nacc: int = 0) -> str:
    """CUDA source of ``float name(const unsigned* d, const unsigned* ap)``: the dot product of
    ``npairs`` decoded weight pairs ``d`` with the paired activations ``ap``. The pair products:
    fma.rn.f16x2 / bf16x2 into 2 (float16) / 4 (bfloat16) accumulators (pair q into q % nacc), as
    __hfma2 emits them, but DOT_FMAS_PER_ASM to an asm statement: one __hfma2 (an asm statement
    each) per pair made NVVM (cicc) spend minutes on kernels that inline many dot products in one
    block (8 channels per warp with the whole K in flight: 131 s -> 6 s of CPU, the same ptxas
    registers and spills); the accumulators start at 0 (the bits of __float2half2_rn(0.f)).
    ``nacc``: that many accumulators instead (float16 with 1: one chain, its two lanes added in half
    and converted once)."""
    t2 = ACT[act][1]
    nacc = nacc or (2 if act == "float16" else 4)
    cvt2 = "__half22float2" if act == "float16" else "__bfloat1622float2"
    lines = [f"__device__ __forceinline__ float {name}(const unsigned* d, const unsigned* ap) {{",
             "  unsigned " + ", ".join(f"a{k} = 0u" for k in range(nacc)) + ";"]
    op = "fma.rn.f16x2" if act == "float16" else "fma.rn.bf16x2"
    for q0 in range(0, npairs, DOT_FMAS_PER_ASM):
        qs = range(q0, min(npairs, q0 + DOT_FMAS_PER_ASM))
        body = [f"{op} %{q % nacc}, %{nacc + 2 * i}, %{nacc + 2 * i + 1}, %{q % nacc};" for i, q in enumerate(qs)]
        ins = ", ".join(f'"r"(d[{q}]), "r"(ap[{q}])' for q in qs)
        outs = ", ".join(f'"+r"(a{k})' for k in range(nacc))
        text = "\\n\\t".join(body)
        lines.append(f'  asm("{{{text}}}" : {outs} : {ins});')
    for k in range(nacc):
        lines.append(f"  const {t2} acc{k} = *reinterpret_cast<const {t2}*>(&a{k});")
    if act == "float16" and nacc == 1:        # the two lanes added in half, one conversion
        lines += ["  return __half2float(__hadd(__low2half(acc0), __high2half(acc0)));", "}"]
    elif act == "float16":                    # one rounding more in half, one conversion instead of two
        lines += ["  float2 f = __half22float2(__hadd2(acc0, acc1));", "  return f.x + f.y;", "}"]
    else:                                     # bfloat16 sums stay float32 (8-bit mantissa)
        lines.append("  float s = 0.f;")
        for k in range(nacc):
            lines.append(f"  {{ float2 f = {cvt2}(acc{k}); s += f.x + f.y; }}")
        lines += ["  return s;", "}"]
    return "\n" + "\n".join(lines) + "\n"


def e4m3x2_lines(src: str, dst, fp8_cvt) -> list:
    """C lines: the two float8_e4m3 bytes in the low 16 bits of ``src`` -> floats ``dst(0)``,
    ``dst(1)`` (the low byte first), exact: ``cvt.rn.f16x2.e4m3x2`` then ``cvt.f32.f16`` where
    ``fp8_cvt`` (sm_89+), else the exponent rebiased in the bit pattern (normal) or m * 2**-9
    (subnormal); ``fp8_cvt=None``: chosen by the compiler's ``__CUDA_ARCH__``. NaN bytes (0x7f /
    0xff, never written by the quantizers) give NaN with the conversion, +-480 without."""
    cvt = ["  { unsigned h_; unsigned short l_, u_;",
           f"    asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(h_) : \"h\"((unsigned short)(({src}) & 0xFFFFu)));",
           "    l_ = (unsigned short)(h_ & 0xFFFFu); u_ = (unsigned short)(h_ >> 16);",
           f"    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"({dst(0)}) : \"h\"(l_));",
           f"    asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"({dst(1)}) : \"h\"(u_)); }}"]
    arith = []
    for t in range(2):
        arith += [f"  {{ const unsigned b_ = (({src}) >> {8 * t}) & 0xFFu, mg_ = b_ & 0x7Fu;",
                  "    const float v_ = mg_ >= 8u ? __uint_as_float((mg_ + 960u) << 20) : (float)mg_ * 0.001953125f;",
                  f"    {dst(t)} = (b_ & 0x80u) ? -v_ : v_; }}"]
    if fp8_cvt is None:
        return ["#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890", *cvt, "#else", *arith, "#endif"]
    return cvt if fp8_cvt else arith


F8_HALF_SHIFT = 4       # float8 activations enter the float16 pairs times 2**-4 (f8_half_prep)


def f8_half_prep(tag: str, bits: int, nw: int, order=None) -> str:
    """``bb_prep_{tag}(a, ap)`` for float8_e4m3 activations in a float16-pair kernel
    (:func:`half_acts`): ``a`` holds the vector's activations as bytes (4 per word), ``ap[i]`` the
    float16 pair of the codes of decoded pair i (:func:`~.decode.pair_codes`, as the float16 prep
    pairs them): the two bytes by ``__byte_perm`` into one half word, ``cvt.rn.f16x2.e4m3x2``
    (sm_89+; the low byte in the low half), times 2**-F8_HALF_SHIFT (the kernel multiplies its
    scale by 2**F8_HALF_SHIFT). Exact: an e4m3 value (at most 448, at least 2**-9) times 2**-4 is
    a normal float16, and its product with a 4- or 2-bit code (at most 15) has at most 8
    significant bits; the float16 partial sums of a vector (16 products) stay under 28 * 15 * 16
    = 6720, where unscaled ones could pass 65504 (448 * 15 * 16). Returns 0: the activation sum
    serves zero points only, which float8 activations do not take."""
    lines = [f"__device__ __forceinline__ float bb_prep_{tag}(const unsigned* a, unsigned* ap) {{",
             f"  const __half2 k = __float2half2_rn({2.0 ** -F8_HALF_SHIFT!r}f);"]
    for i, (lo, hi) in enumerate(pair_codes("int", bits, nw, order)):
        sel = (lo % 4) | (4 + hi % 4) << 4
        lines.append(f"  {{ const unsigned short p = (unsigned short)__byte_perm(a[{lo // 4}], a[{hi // 4}], "
                     f"0x{sel:x}); "
                     f"unsigned h; asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(h) : \"h\"(p)); "
                     f"const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&h), k); "
                     f"ap[{i}] = *reinterpret_cast<const unsigned*>(&v); }}")
    lines += ["  return 0.f;", "}"]
    return "\n" + "\n".join(lines) + "\n"


def block_dot_helpers(tag: str, act: str, npairs: int) -> dict:
    """Two float8_e4m3 block scales per weight vector (nvfp4: 32 codes, two 16-code blocks; kernels
    whose hint has ``block_dots``): ``bb_doth_{tag}``, the dot product of half a vector
    (``npairs`` / 2 pairs, one block: pairs of the first half hold codes of the first block,
    :func:`block_scale_helpers` asserts the same of the pair order), and ``bb_dsb_{tag}(d, ap, s,
    acc)`` = acc + s0 * dot(block 0) + s1 * dot(block 1) with the two scale bytes ``s`` (the first
    in the low byte, ``bb_ldsb``) converted to float32 (:func:`e4m3x2_lines`, by the compiled
    arch): each block's half-precision dot times its own scale in float32, as with one block per
    8-byte vector, with half the weight loads and one conversion for both scales. A float16 block
    dot is one chain of its 8 pair products, the two lanes added in half and converted once: 2
    instructions fewer per block than two chains summed in float32, one more half rounding per
    lane (nvfp4 x float16, 8192^2, one row, H200: 12.38 us against 13.16 with the 2-byte scale
    load; largest error 5.8e-4 of the largest output against 4.7e-4)."""
    h = npairs // 2
    lines = [f"__device__ __forceinline__ float bb_dsb_{tag}(const unsigned* d, const unsigned* ap, unsigned s, "
             "float acc) {", "  float s0, s1;", *e4m3x2_lines("s", lambda t: f"s{t}", None),
             f"  acc = fmaf(s0, bb_doth_{tag}(d, ap), acc);",
             f"  return fmaf(s1, bb_doth_{tag}(d + {h}, ap + {h}), acc);", "}"]
    return {f"bb_doth_{tag}": dot_helper(f"bb_doth_{tag}", act, h, nacc=1 if act == "float16" else 0),
            f"bb_dsb_{tag}": "\n" + "\n".join(lines) + "\n"}


DOT_FMAS_PER_ASM = 8


# --------------------------------------------------------------------------------------------
# Lines of TVMScript every kernel body emits (entry, PDL, the step loop, the K-warp reduction)
# --------------------------------------------------------------------------------------------
def fmt_float(x: float) -> str:
    return f"T.float32({float(x)!r})"


def device_entry(add, hint, grid, threads, slots, NW, sdt, zdt, trigger=False, wait=True, cluster: int = 1):
    """Kernel entry, grid (``grid`` blocks of ``threads``) and the weight registers of every GEMV
    kernel: ``wq`` words (``slots`` + ``NW`` words per vector), raw scales ``sr`` (``sdt``) and
    zeros ``zr`` (``zdt``) per vector. ``hint.pdl``: wait for the previous kernel in the stream
    before any memory access (a plain launch's memory order holds), and let the next kernel launch
    here if ``trigger`` (else the body calls :func:`pdl_trigger` after its main loop: triggered
    at entry, the next kernel's blocks take free slots early and unevenly, which measured slower).
    ``cluster`` > 1: a cluster launch of that many consecutive blocks, ``cl`` the block's rank in it."""
    add("    T.device_entry()")
    if hint.min_blocks:
        add(f'    T.attr({{"tirx.launch_bounds_min_blocks_per_sm": {hint.min_blocks}}})')
    if hint.pdl and wait:                     # else the body waits (after loads of what no kernel writes)
        add("    T.ptx.griddepcontrol.wait()")
    if trigger:
        pdl_trigger(add, hint)
    add(f"    bx = T.cta_id([{grid}])")
    if cluster > 1:
        add(f"    cl = T.cta_id_in_cluster([{cluster}])")
    add(f"    tx = T.thread_id([{threads}])")
    sh = ", ".join(str(x) for x in slots)
    add(f"    wq = T.alloc_local(({sh}, {NW}), 'uint32')")
    if sdt:
        add(f"    sr = T.alloc_local(({sh}), {sdt!r})")
    if zdt:
        add(f"    zr = T.alloc_local(({sh}), {zdt!r})")


PF_L2 = """
__device__ __forceinline__ void bb_pf_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
"""


def l2_prefetch_unsupported(steps) -> Optional[str]:
    """Why a hint's ``l2_prefetch`` is refused (an int >= 0), else None."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        return f"l2_prefetch={steps!r}: the steps prefetched into L2 at entry, an int >= 0"
    return None


def l2_prefetch(add, hint, steps: int, U: int, R: int, ptrs):
    """A rows kernel's ``l2_prefetch`` (the GEMV's rows kernel, the batched NVFP4 GEMV): the first
    ``steps`` steps of each warp's ``R`` rows, ``U`` vectors a step, prefetched into L2
    (``ptrs(step)``: the pointer texts of one vector and its scales, loop variables ``u`` and
    ``r``), then the PDL wait, which :func:`device_entry` (``wait=False``) left to this. Nothing
    is read before the wait, and a prefetch binds no value: the loads after it see what an
    earlier kernel wrote."""
    add(f"    for s in T.unroll({steps}):")
    add(f"        for u in T.unroll({U}):")
    add(f"            for r in T.unroll({R}):")
    for p in ptrs("s"):
        add(f"                T.cuda.func_call('bb_pf_l2', {p}, source_code={PF_L2!r})")
    if hint.pdl:
        add("    T.ptx.griddepcontrol.wait()")


def pdl_trigger(add, hint):
    if hint.pdl:
        add("    T.ptx.griddepcontrol.launch_dependents()")


def reduce_k_warps(add, KW: int, idx: str, extents: str, acc: str, slot, loops=None) -> str:
    """The ``KW`` K warps (warpgroups) of a block meet in shared memory: all but the first store
    their accumulators ``acc`` (element text over the loop indices ``idx`` with ``extents``) at
    ``slot(k)`` (the element text of K warp ``k``, an index text), the first adds them up; returns
    the indent under which the first goes on (to its store). ``loops(ind)``: (header lines, body
    indent) of the loops over the accumulators instead of ``T.grid`` over ``idx``."""
    loops = loops or (lambda ind: ([f"{ind}for {idx} in T.grid({extents}):"], ind + "    "))

    def every(stmt):
        head, inner = loops("        ")
        for ln in head:
            add(ln)
        add(inner + stmt)
    add("    if kw > 0:")
    every(f"{slot('kw - 1')} = {acc}")
    add("    T.cuda.cta_sync()")
    add("    if kw == 0:")
    tot = " + ".join(slot(str(k)) for k in range(KW - 1))
    every(f"{acc} = {acc} + {tot}")
    return "        "


def split_steps(nit: int, unroll: int):
    """(vectors per lane and step, steps): the largest unroll <= ``unroll`` that divides ``nit``."""
    u = max(x for x in range(1, max(1, min(unroll, nit)) + 1) if nit % x == 0)
    return u, nit // u


def step_loop(add, NS, ST, load, process, after_prologue=None, unroll=False, group=0, peel=False):
    """The main loop over ``NS`` steps: ``load(ind, step, slot)`` issues a step's loads into
    register slot ``slot``, ``process(ind, step, slot)`` consumes them. ``ST >= 2``: a ring of
    ``ST`` register slots; steps 0 .. ST-2 are issued first, and step s+ST-1 is issued before step
    s is processed (the loop is unrolled by ``ST`` so that every slot index is a constant).
    ``after_prologue()`` emits its lines after the loads of steps 0 .. ST-2, before the loop.
    ``unroll``: the loop is unrolled (ptxas may then issue a step's loads earlier than the source).
    ``group``: unroll by this multiple of ``ST`` instead, and call ``process(ind, step, slot, j)``
    with the step's place ``j`` in the unrolled body. The last iteration may be partial, its steps
    past ``NS`` guarded; with ``peel`` (and ``group``) the last body (whole or partial) follows the
    loop instead, at constant step indices, unguarded (``j`` from 0 again). Which of the two ptxas
    allocates without spills depends on the kernel (the fused GEMM's ``overlap`` tiles:
    :func:`~..fused_wgmma.peel_last_body`)."""
    loop = "T.unroll" if unroll else "T.serial"
    if ST == 1 and not group:
        if after_prologue:
            after_prologue()
        add(f"    for st in {loop}({NS}):")
        load("        ", "st", 0)
        process("        ", "st", 0)
        return
    G = group or ST
    assert G % ST == 0, (G, ST)
    for s0 in range(min(ST - 1, NS)):
        load("    ", str(s0), s0)
    if after_prologue:
        after_prologue()

    def step(ind, cur, nxt, nxt_past, j):
        """Step ``cur``: the loads of step ``nxt`` (None: none left; ``nxt_past``: guarded, it may
        run past NS), then its processing."""
        if ST == 1:
            load(ind, cur, 0)
        elif nxt_past:
            add(f"{ind}if {nxt} < {NS}:")
            load(ind + "    ", nxt, (j + ST - 1) % ST)
        elif nxt is not None:
            load(ind, nxt, (j + ST - 1) % ST)
        if group:
            process(ind, cur, j % ST, j)
        else:
            process(ind, cur, j)

    peel = bool(group and peel)
    NO = (NS - 1) // G if peel else -(-NS // G)      # loop iterations (peel: the last body after them)
    if NO:
        add(f"    for s2 in {loop}({NO}):")
        for j in range(G):
            ind = "        "
            cur = f"s2 * {G} + {j}" if j else f"s2 * {G}"
            if (NO - 1) * G + j >= NS:        # step s2*G+j runs past NS in the last iteration
                add(f"{ind}if {cur} < {NS}:")
                ind += "    "
            step(ind, cur, f"s2 * {G} + {j + ST - 1}", (NO - 1) * G + j + ST - 1 >= NS, j)
    for j in range(NS - NO * G if peel else 0):
        cur = NO * G + j
        step("    ", str(cur), str(cur + ST - 1) if cur + ST - 1 < NS else None, False, j)
