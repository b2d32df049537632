"""The small-M CUDA template (decode, M = 1..16): float16/bfloat16 activations x int/uint weights.

Hand-written TIRx kernels (TVM's "tirx" pipeline), generated per plan as TVMScript text (the
signature follows the plan's argument list); the per-vector decode and dot product are CUDA
device helpers passed through ``T.cuda.func_call``. Two shapes of kernel, chosen by the hint:

* rows (``k_warps=0``): a warp owns ``rows_per_warp`` output channels; its lanes walk K in
  16-byte vectors of packed weights (one warp pass over a row reads 512 contiguous bytes),
  ``unroll`` vectors per row per step. ``stages=2`` keeps the next step's weights in flight in a
  second register slot; ``stages>=3`` streams them through a cp.async ring in shared memory, so
  the bytes in flight do not depend on the registers the compiler is willing to spend;
* k-split (``k_warps>0``): the warps of a block split K, each lane keeps its slice of the
  activations in registers, blocks walk row batches (grid-stride) and meet in shared memory.

Decode: two values at a time into half2/bfloat162 with the magic-number trick: one ``lop3``
places a b-bit field (XOR-ed to unsigned for signed formats) in the low mantissa bits of 1024.0
(128.0 for bfloat16), one ``hsub2``/``hfma2`` removes the magic and an integer offset exactly, one
``hfma2`` multiplies with the activation pair (activations are paired with ``prmt`` to match).
8-bit weights decode to float32 (``prmt`` into 2**23) and use float32 FMAs. The dot product over
one vector accumulates in half2 (float16: 2, bfloat16: 4 independent accumulators), then in
float32 with the group scale. The integer offset centres the codes (the XOR for signed codes, the
zero-point code, the rounded float zero point); the float remainder of a zero point is applied
through the sum of the activations of the vector: ``s * sum(a * (q - z)) = s * dot + s * (o - z) * sum(a)``.

:func:`gemv_unsupported` says which plans the template does not take; those use the simple (or
tensor-core) schedule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .._tvm import tvm

__all__ = ["GEMVHint", "gemv_unsupported", "schedule_cuda_gemv", "GEMV_MAX_ROWS", "TIRX_PIPELINE_ATTR"]

GEMV_MAX_ROWS = 16
TIRX_PIPELINE_ATTR = "bitblas.tir_pipeline"   # module attribute: compile with tir_pipeline="tirx"

_ACT = {"float16": ("half", "__half2", 0x6400, 10, 1024.0),
        "bfloat16": ("nv_bfloat16", "__nv_bfloat162", 0x4300, 7, 128.0)}


@dataclass(frozen=True)
class GEMVHint:
    rows_per_warp: int = 2     # output channels per warp (activation reuse, loads in flight)
    warps: int = 4             # warps per block
    unroll: int = 4            # K vectors per lane loaded before the first is used
    vec_bytes: int = 0         # bytes of packed weights per lane and load (0: largest that fits)
    k_warps: int = 0           # >0: warps splitting K, activations held in registers (small m)
    grid: int = 0              # blocks of the k-split kernel (0: one per row batch)
    stages: int = 2            # register slots of in-flight weights (rows kernel): 2 = prefetch the next step

    @classmethod
    def default(cls, plan) -> "GEMVHint":
        """Measured on the H200 (W4A16 g128, N=8192/28672, K=8192): one-warp blocks of 4 rows were
        fastest at m=1 (11.1 µs at 8192^2 with the next step in flight, vs 11.7 without it, 12.8+
        through a cp.async ring, 11.8+ for the k-split kernel); larger m keeps one register slot
        (accumulators and decoded weights grow with m)."""
        m = plan.m or 1
        if m <= 4:
            return cls(rows_per_warp=4, warps=1, unroll=4, stages=2)
        if m <= 8:
            return cls(rows_per_warp=4, warps=1, unroll=4, stages=1)
        return cls(rows_per_warp=4, warps=1, unroll=2, stages=1)


_SMS = []


def _num_sms() -> int:
    """Multiprocessors of the local GPU (132, an H100/H200, when none is visible)."""
    if not _SMS:
        n = 132
        try:
            import torch
            if torch.cuda.is_available():
                n = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        except Exception:  # noqa: BLE001 - a broken driver must not stop code generation
            pass
        _SMS.append(int(n))
    return _SMS[0]


def _vec_bytes(plan, want: int = 0) -> Optional[int]:
    c, b = plan.config, plan.w.bits
    for vb in ((want,) if want else (16, 8, 4)):
        v = vb * 8 // b
        if v < 8 or c.K % v or (not want and v > 64):   # <= 64 values per vector: registers
            continue
        if plan.groups > 1 and c.group_size % v:
            continue
        return vb
    return None


def gemv_unsupported(plan) -> Optional[str]:
    """None when the GEMV template takes ``plan``, else why not."""
    c = plan.config
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if plan.m is None or not 1 <= plan.m <= GEMV_MAX_ROWS:
        return f"needs a static row count 1..{GEMV_MAX_ROWS}"
    if c.A_dtype not in _ACT:
        return "activations must be float16 or bfloat16"
    if _decoder(plan.w) is None:
        return "weights must be int/uint, e2m1 (fp4_e2m1, nvfp4), a 4-bit table (nf4) or float8"
    if c.layout != "nt":
        return "layout must be 'nt'"
    if c.with_act_scaling:
        return "no activation scales"
    if c.with_scaling and plan.scale_dtype not in (c.A_dtype, "float8_e4m3"):
        return "scales must have the activation dtype (or be float8_e4m3 bytes)"
    if c.out_dtype not in ("float16", "bfloat16", "float32"):
        return "output must be float16, bfloat16 or float32"
    if _vec_bytes(plan) is None:
        return "K (and the group size) must be multiples of the values in one 4-byte weight vector (>= 8)"
    return None


# --------------------------------------------------------------------------------------------
# CUDA helpers (device functions, inlined by nvcc), generated per format
# --------------------------------------------------------------------------------------------
def _lut(fn) -> int:
    a, b, c = 0xF0, 0xCC, 0xAA
    return fn(a, b, c) & 0xFF


# lop3 LUT of f(a, b, c) = b ? (a ^ c) : c  (b = field mask, c = sign bit inside the field, magic outside)
_LUT_FIELD = _lut(lambda a, b, c: (b & (a ^ c)) | (~b & c))


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


def _helpers(tag: str, act: str, bits: int, signed: bool, nw: int, dec: str = "int", table=None):
    """CUDA source of the helpers for one (activation dtype, weight format, vector size); ``dec``
    and ``table`` from :func:`_decoder`: table decoders reuse the int path's activation and dot
    helpers and replace the decoder (and, for adjacent pairs, the activation pairing)."""
    src = _int_helpers(tag, act, bits, signed, nw)
    if dec != "int":
        src[f"bb_dec_{tag}"] = _table_dec(tag, act, nw, dec, table)
        if dec == "lut4":
            src[f"bb_prep_{tag}"] = _prep_adjacent(tag, act, nw)
        src["bb_e4m3f"] = _e4m3_scale_helper()
    return src


def _int_helpers(tag: str, act: str, bits: int, signed: bool, nw: int):
    ctype, t2, magic, mant, magic_f = _ACT[act]
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
    src["bb_cpa16"] = r"""
__device__ __forceinline__ void bb_cpa16(void* s, const void* g) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(a), "l"(g) : "memory");
}
"""
    src["bb_cpa_commit"] = r"""
__device__ __forceinline__ void bb_cpa_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
"""
    for n in range(8):
        src[f"bb_cpa_wait{n}"] = ("\n__device__ __forceinline__ void bb_cpa_wait%d() "
                                  "{ asm volatile(\"cp.async.wait_group %d;\" ::: \"memory\"); }\n" % (n, n))
    src["bb_lds16"] = r"""
__device__ __forceinline__ void bb_lds16(const void* p, unsigned* d) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a));
}
"""
    src["bb_lda"] = r"""
__device__ __forceinline__ void bb_lda(const void* p, unsigned* d) {
  uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}
"""
    if bits == 8:
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
            x = f"(w[{j}] ^ 0x80808080u)" if signed else f"w[{j}]"
            lines.append(f"  {{ unsigned x = {x};")
            for t in range(4):
                lines.append(f"    d[{4 * j + t}] = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x{0x7540 | t:x})) - c;")
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
    nacc = 2 if act == "float16" else 4
    cvt2 = "__half22float2" if act == "float16" else "__bfloat1622float2"
    # prep: pair activation k (low half) with k + P (high half), as the decoded pairs are laid out
    lines = [f"__device__ __forceinline__ float bb_prep_{tag}(const unsigned* a, unsigned* ap) {{"]
    for j in range(nw):
        for p in range(P):
            lo = j * n + p
            hi = lo + P
            sel = 0x7632 if p & 1 else 0x5410
            lines.append(f"  ap[{j * P + p}] = __byte_perm(a[{lo // 2}], a[{hi // 2}], 0x{sel:x});")
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

    # decode: d[pair] = (field ^ X) - off, exact, as half2/bfloat162 bits
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
            sign = (1 << (pos + bits - 1)) if signed else 0
            c_const = (sign * 0x10001) | (magic2 & ~b_const & 0xFFFFFFFF)
            lines.append(f"    {{ unsigned x; asm(\"lop3.b32 %0, %1, 0x{b_const:08x}, 0x{c_const:08x}, 0x{_LUT_FIELD:02x};\" "
                         f": \"=r\"(x) : \"r\"(w{s}));")
            if pos == 0:
                lines.append(f"      {t2} v = __hsub2(*reinterpret_cast<{t2}*>(&x), z0);")
            else:
                lines.append(f"      {t2} v = __hfma2(*reinterpret_cast<{t2}*>(&x), m{pos}, c{pos});")
            lines.append(f"      d[{j * P + p}] = *reinterpret_cast<unsigned*>(&v); }}")
        lines.append("  }")
    lines.append("}")
    src[f"bb_dec_{tag}"] = "\n" + "\n".join(lines) + "\n"

    lines = [f"__device__ __forceinline__ float bb_dot_{tag}(const unsigned* d, const unsigned* ap) {{"]
    for k in range(nacc):
        lines.append(f"  {t2} acc{k} = __float2{'half2' if act == 'float16' else 'bfloat162'}_rn(0.f);")
    for q in range(npairs):
        k = q % nacc
        lines.append(f"  acc{k} = __hfma2(*reinterpret_cast<const {t2}*>(&d[{q}]), "
                     f"*reinterpret_cast<const {t2}*>(&ap[{q}]), acc{k});")
    lines.append("  float s = 0.f;")
    for k in range(nacc):
        lines.append(f"  {{ float2 f = {cvt2}(acc{k}); s += f.x + f.y; }}")
    lines += ["  return s;", "}"]
    src[f"bb_dot_{tag}"] = "\n" + "\n".join(lines) + "\n"
    return src


# --------------------------------------------------------------------------------------------
# Table formats: the decode rule is chosen by the format's table (no format names)
# --------------------------------------------------------------------------------------------
def _decoder(w) -> Optional[str]:
    """How the template decodes weight format ``w``: "int" (int/uint codes, magic numbers),
    "e2m1" (4-bit e2m1 codes: bit placement), "lut4" (any other 16-entry table: prmt lookup),
    "e5m2" / "e4m3" (float8 bit patterns), None (not taken)."""
    from ..formats import E2M1_TABLE, E4M3_TABLE, E5M2_TABLE
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


def _act_bits(v: float, act: str) -> int:
    """16-bit pattern of ``v`` rounded as the TensorIR does (float64 -> float32 -> act, nearest even)."""
    import struct
    f = struct.unpack("<I", struct.pack("<f", v))[0]
    if act == "bfloat16":
        return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16) & 0xFFFF
    return struct.unpack("<H", struct.pack("<e", struct.unpack("<f", struct.pack("<I", f))[0]))[0]


_LUT_AND = _lut(lambda a, b, c: a & b)                       # a & b
_LUT_AND_OR = _lut(lambda a, b, c: (a & b) | c)              # (a & b) | c
_LUT_SEL = _lut(lambda a, b, c: (c & b) | (~c & a))          # c ? b : a, bitwise


def _e2m1_consts(act: str):
    """e2m1 -> half/bfloat16 by bit placement. Pair p of a word takes nibble p (low half) and
    nibble p + 4 (high half), as the int path. For each pair: (left shift of the word that puts
    the sign bits at 15 / 31, left shift that puts the 3 magnitude bits (e1 e0 m) at the lowest
    exponent bits and the top mantissa bit); negative = right shift. The result is the e2m1 value
    times 2**-(bias - 1) (an e2m1 subnormal, e = 0, becomes a subnormal half), so one multiply by
    ``mul`` makes it exact."""
    mant = _ACT[act][3]
    bias = 15 if act == "float16" else 127
    shifts = [(12 - 4 * p, (mant - 1) - 4 * p) for p in range(4)]
    return dict(shifts=shifts, mag_mask=(7 << (mant - 1)) * 0x10001, sign_mask=0x80008000,
                mul=2.0 ** (bias - 1), lut_mag=_LUT_AND, lut_sign=_LUT_AND_OR)


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
                sel_mask=0x77777777, msel=(0x9D8C, 0xBFAE), ilv=(0x5140, 0x7362), lut_sel=_LUT_SEL)


def _e4m3_consts():
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


def _e4m3_scale_helper():
    """float8_e4m3 scale byte -> float32, exact (normal: exponent rebiased in the bit pattern;
    subnormal: m * 2**-9). 0x7f / 0xff (NaN in e4m3fn) decode to +-480; quantizers never write them."""
    return r"""
__device__ __forceinline__ float bb_e4m3f(int b) {
  const unsigned mg = (unsigned)b & 0x7Fu;
  const float v = mg >= 8u ? __uint_as_float((mg + 960u) << 20) : (float)mg * 0.001953125f;
  return (b & 0x80) ? -v : v;
}
"""


def _table_dec(tag: str, act: str, nw: int, dec: str, table):
    """``bb_dec_{tag}`` for the table decoders (the signature of the int decoders)."""
    ctype, t2, magic, mant, magic_f = _ACT[act]
    h2 = "half2" if act == "float16" else "bfloat162"
    if dec == "e5m2":
        lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, float* d) {{"]
        for j in range(nw):
            for t, sel in enumerate(E5M2_PRMT):
                lines.append(f"  {{ unsigned x = __byte_perm(w[{j}], 0u, 0x{sel:x});")
                lines.append(f"    float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));")
                lines.append(f"    d[{4 * j + 2 * t}] = f.x; d[{4 * j + 2 * t + 1}] = f.y; }}")
        lines.append("}")
        return "\n" + "\n".join(lines) + "\n"
    if dec == "e4m3":
        k = _e4m3_consts()
        lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, float* d) {{"]
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}], qm = q & 0x{k['mag_mask']:08x}u;")
            for sel, sh, (b0, b1) in k["pairs"]:
                sgn = f"q << {sh}" if sh else "q"
                lines.append(f"    {{ unsigned x; const unsigned t = __byte_perm(qm, 0u, 0x{sel:x}) >> 1;")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['sign_mask']:08x}, %2, 0x{k['lut_sign']:02x};\" "
                             f": \"=r\"(x) : \"r\"({sgn}), \"r\"(t));")
                lines.append(f"      float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));")
                lines.append(f"      d[{4 * j + b0}] = f.x; d[{4 * j + b1}] = f.y; }}")
            lines.append("  }")
        lines.append("}")
        return "\n" + "\n".join(lines) + "\n"
    lines = [f"__device__ __forceinline__ void bb_dec_{tag}(const unsigned* w, int off, unsigned* d) {{"]
    if dec == "e2m1":
        k = _e2m1_consts(act)
        lines.append(f"  const {t2} k = __float2{h2}_rn({k['mul']!r}f);")
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}];")
            for p, (ss, ms) in enumerate(k["shifts"]):
                sgn = f"q << {ss}" if ss > 0 else (f"q >> {-ss}" if ss < 0 else "q")
                mag = f"q << {ms}" if ms > 0 else (f"q >> {-ms}" if ms < 0 else "q")
                lines.append(f"    {{ unsigned mg, x;")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['mag_mask']:08x}, 0, 0x{k['lut_mag']:02x};\" "
                             f": \"=r\"(mg) : \"r\"({mag}));")
                lines.append(f"      asm(\"lop3.b32 %0, %1, 0x{k['sign_mask']:08x}, %2, 0x{k['lut_sign']:02x};\" "
                             f": \"=r\"(x) : \"r\"({sgn}), \"r\"(mg));")
                lines.append(f"      {t2} v = __hmul2(*reinterpret_cast<{t2}*>(&x), k);")
                lines.append(f"      d[{4 * j + p}] = *reinterpret_cast<unsigned*>(&v); }}")
            lines.append("  }")
    else:                                   # lut4
        k = _lut4_consts(table, act)
        for nm in ("tl0", "tl1", "th0", "th1"):
            a, b = k[nm]
            lines.append(f"  const unsigned {nm}a = 0x{a:08x}u, {nm}b = 0x{b:08x}u;")
        for j in range(nw):
            lines.append(f"  {{ const unsigned q = w[{j}], s0 = q & 0x{k['sel_mask']:08x}u, s1 = s0 >> 16, q4 = q << 4;")
            lines.append("    unsigned m0, m1;")
            lines.append(f"    asm(\"prmt.b32 %0, %1, %2, 0x{k['msel'][0]:x};\" : \"=r\"(m0) : \"r\"(q), \"r\"(q4));")
            lines.append(f"    asm(\"prmt.b32 %0, %1, %2, 0x{k['msel'][1]:x};\" : \"=r\"(m1) : \"r\"(q), \"r\"(q4));")
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


def _prep_adjacent(tag: str, act: str, nw: int) -> str:
    """``bb_prep_{tag}`` for decoders whose pairs are adjacent codes (k, k+1): the activation words
    as they are, and their sum."""
    ctype, t2, magic, mant, magic_f = _ACT[act]
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


# --------------------------------------------------------------------------------------------
# The kernel, as TVMScript text (its signature follows the plan's argument list)
# --------------------------------------------------------------------------------------------
def _fmt_float(x: float) -> str:
    return f"T.float32({float(x)!r})"


def _kernel_script(plan, hint: GEMVHint):
    c, w = plan.config, plan.w
    act = c.A_dtype
    m, N, K, b = plan.m, c.N, c.K, w.bits
    signed = w.kind == "int"
    VB = _vec_bytes(plan, hint.vec_bytes)
    if VB is None:
        raise ValueError(f"vec_bytes={hint.vec_bytes} does not fit K={K}, group_size={c.group_size}")
    NW = VB // 4
    V = VB * 8 // b                         # values per vector
    NA = V // 2                             # activation words (2 values) per vector
    NC = K // V                             # vectors per row
    G = K if plan.groups == 1 else c.group_size
    dec = _decoder(w)
    if dec == "int":
        tag = f"{'f16' if act == 'float16' else 'bf16'}_{'i' if signed else 'u'}{b}_v{VB}"
    else:
        tag = f"{'f16' if act == 'float16' else 'bf16'}_{dec}_v{VB}"
    helpers = _helpers(tag, act, b, signed, NW, dec, w.table)
    s_f8 = c.with_scaling and plan.scale_dtype != act        # float8_e4m3 scale bytes (nvfp4)
    dec_factor = _e4m3_consts()["factor"] if dec == "e4m3" else 1.0
    f32_path = b == 8
    x_shift = (1 << (b - 1)) if signed else 0   # decode gives (code ^ x_shift) - off; q = that + off - x_shift
    off_max = (1 << b) - 1 + x_shift
    quant_zeros = c.with_zeros and c.zeros_mode == "quantized"
    float_zeros = c.with_zeros and not quant_zeros
    need_asum = float_zeros                    # sum(a*q) = dot + (off - x_shift) * sum(a)

    def src(name):
        return repr(helpers[name])

    ap_dtype = "float32" if f32_path else "uint32"
    ap_len = V if f32_path else NA

    L = []
    add = L.append
    params = ", ".join(f"{a.name}_ptr: T.handle" for a in plan.args)
    add("@T.prim_func")
    add(f"def main({params}):")
    shapes = {"A": (m, K), "W": (N, K * b // 8), "output": (m, N), "bias": (N,)}
    for a in plan.args:
        shp = shapes.get(a.name, tuple(a.shape))
        add(f"    {a.name} = T.match_buffer({a.name}_ptr, {tuple(shp)!r}, {a.dtype!r}, align=16)"
            if a.name in ("A", "W") else
            f"    {a.name} = T.match_buffer({a.name}_ptr, {tuple(shp)!r}, {a.dtype!r})")

    def gidx(cidx):
        return "0" if plan.groups == 1 else f"({cidx} * {V} // {G})"

    def zsrc(nr, cidx):
        """The zero-point element (float zeros) or the byte holding the code (quantized)."""
        g = gidx(cidx)
        return f"zeros[{nr}, {g} // {w.codes_per_byte}]" if quant_zeros else f"zeros[{nr}, {g}]"

    def scale_lines(ind, cidx, idx, s_raw, z_raw):
        """sv (scale), ov (integer offset subtracted exactly in the decode), cv (coefficient of
        sum(a)) for weight vector cidx, from the raw scale / zero elements ``s_raw`` / ``z_raw``.
        The offset centres the codes: x_shift (signed codes, centred by the XOR), the zero-point
        code, or the rounded float zero point; what it misses (|residual| <= 0.5) goes through
        cv * sum(a)."""
        g = gidx(cidx)
        s_expr = f"T.Cast('float32', {s_raw})" if c.with_scaling else "T.float32(1)"
        if s_f8:
            s_expr = (f"T.cuda.func_call('bb_e4m3f', T.Cast('int32', {s_raw}), source_code={src('bb_e4m3f')}, "
                      f"return_type='float32')")
        if dec_factor != 1.0:
            s_expr = f"{s_expr} * {_fmt_float(dec_factor)}" if c.with_scaling else _fmt_float(dec_factor)
        out = [f"{ind}sv[{idx}] = {s_expr}"]
        if quant_zeros:
            cpb = w.codes_per_byte
            if cpb == 1:
                zc = f"T.Cast('int32', {z_raw}) & 255"
            else:
                zc = f"T.shift_right(T.Cast('int32', {z_raw}), ({g} % {cpb}) * {b}) & {(1 << b) - 1}"
            out += [f"{ind}ov[{idx}] = {zc}", f"{ind}cv[{idx}] = T.float32(0)"]
        elif float_zeros:
            z = f"T.Cast('float32', {z_raw})"
            # original: (q - z) * s -> off ~ z; rescale: q * s - z -> off ~ z / s
            zq = z if c.zeros_mode == "original" else \
                f"T.if_then_else(sv[{idx}] != T.float32(0), {z} / sv[{idx}], T.float32(0))"
            out.append(f"{ind}ov[{idx}] = T.max(T.min(T.Cast('int32', T.floor({zq} + T.float32(0.5))) + {x_shift}, "
                       f"{off_max}), 0)")
            if c.zeros_mode == "original":
                out.append(f"{ind}cv[{idx}] = sv[{idx}] * (T.Cast('float32', ov[{idx}] - {x_shift}) - {z})")
            else:
                out.append(f"{ind}cv[{idx}] = sv[{idx}] * T.Cast('float32', ov[{idx}] - {x_shift}) - {z}")
        else:
            out += [f"{ind}ov[{idx}] = {x_shift}", f"{ind}cv[{idx}] = T.float32(0)"]
        return out

    def lda_lines(ind, i, cidx, arbuf):
        return [f"{ind}for v in T.unroll({NA // 4}):",
                f"{ind}    T.cuda.func_call('bb_lda', A.ptr_to([{i}, {cidx} * {V} + v * 8]), {arbuf}.ptr_to([v * 4]), "
                f"source_code={src('bb_lda')})"]

    def ldw_line(ind, nr, cidx, dst):
        return (f"{ind}T.cuda.func_call('bb_ldw{NW}', W.ptr_to([{nr}, {cidx} * {VB}]), {dst}, "
                f"source_code={src(f'bb_ldw{NW}')})")

    def dec_line(ind, wsrc, off, dst):
        return f"{ind}T.cuda.func_call('bb_dec_{tag}', {wsrc}, {off}, {dst}, source_code={src(f'bb_dec_{tag}')})"

    def prep_expr(arbuf, apptr):
        return (f"T.cuda.func_call('bb_prep_{tag}', {arbuf}.ptr_to([0]), {apptr}, source_code={src(f'bb_prep_{tag}')}, "
                f"return_type='float32')")

    def dot_expr(dptr, apptr):
        return (f"T.cuda.func_call('bb_dot_{tag}', {dptr}, {apptr}, source_code={src(f'bb_dot_{tag}')}, "
                f"return_type='float32')")

    def store_line(ind, i, n, val):
        if w.global_scale:
            val = f"{val} * global_scale[0]"
        if c.with_bias:
            val = f"{val} + T.Cast('float32', bias[{n}])"
        return f"{ind}output[{i}, {n}] = T.Cast({c.out_dtype!r}, {val})"

    if hint.k_warps and hint.rows_per_warp * m > 32 * hint.k_warps:
        raise ValueError(f"{hint}: rows_per_warp * m must be <= 32 * k_warps")
    if hint.k_warps:
        _body_ksplit(plan, hint, add, locals())
    else:
        _body_rows(plan, hint, add, locals())
    return "\n".join(L) + "\n"


def _row_locals(add, e, R, m, WARPS, warp_var=False):
    """The registers both rows kernels use beside their weight buffers, and zeroed accumulators."""
    NA = e["NA"]
    add(f"    ar = T.alloc_local(({NA},), 'uint32')")
    add(f"    ap = T.alloc_local(({e['ap_len']},), {e['ap_dtype']!r})")
    add(f"    dq = T.alloc_local(({R}, {e['ap_len']}), {e['ap_dtype']!r})")
    add(f"    acc = T.alloc_local(({R}, {m}), 'float32')")
    add(f"    sv = T.alloc_local(({R},), 'float32')")
    add(f"    cv = T.alloc_local(({R},), 'float32')")
    add(f"    ov = T.alloc_local(({R},), 'int32')")
    add("    asum = T.alloc_local((1,), 'float32')")
    add("    lane = T.meta_var(tx % 32)")
    if warp_var:
        add("    wp = T.meta_var(tx // 32)")
    add(f"    n0 = T.meta_var((bx * {WARPS} + tx // 32) * {R})")
    add(f"    for r, i in T.grid({R}, {m}):")
    add("        acc[r, i] = T.float32(0)")


def _row_dot(add, e, ind1, R, m, col):
    """Per activation row: load and pair the activations of vector ``col``, then accumulate the
    dot products with the ``R`` decoded weight vectors."""
    add(f"{ind1}for i in T.unroll({m}):")
    for ln in e["lda_lines"](ind1 + "    ", "i", col, "ar"):
        add(ln)
    add(f"{ind1}    asum[0] = {e['prep_expr']('ar', 'ap.ptr_to([0])')}")
    add(f"{ind1}    for r in T.unroll({R}):")
    tail = " + cv[r] * asum[0]" if e["need_asum"] else ""
    add(f"{ind1}        acc[r, i] = acc[r, i] + sv[r] * "
        f"{e['dot_expr']('dq.ptr_to([r, 0])', 'ap.ptr_to([0])')}{tail}")


def _row_store(add, e, R, m, N):
    """Warp-reduce every (row, activation) accumulator; one lane each stores it."""
    add(f"    for r in T.unroll({R}):")
    add(f"        for i in T.unroll({m}):")
    add("            acc[r, i] = T.cuda.warp_sum(acc[r, i])")
    add(f"            if lane == (r * {m} + i) % 32 and n0 + r < {N}:")
    add(e["store_line"]("                ", "i", "n0 + r", "acc[r, i]"))


def _body_rows(plan, hint, add, e):
    """Warps own ``rows_per_warp`` rows; lanes walk all of K, ``unroll`` vectors per row per step;
    with ``stages=2`` the packed weights and raw scales / zeros of step s+1 are in flight while
    step s is decoded (two register slots). Activations are re-read (L1) for every step."""
    c = plan.config
    m, N, NC, NW = e["m"], e["N"], e["NC"], e["NW"]
    NIT = -(-NC // 32)
    U = max(u for u in range(1, max(1, min(hint.unroll, NIT)) + 1) if NIT % u == 0)
    NS = NIT // U                            # steps
    R, WARPS = hint.rows_per_warp, hint.warps
    ST = 2 if hint.stages >= 2 and NS > 1 else 1
    if hint.stages >= 3 and NW == 4:
        return _body_rows_ring(plan, hint, add, e)
    NBLK = -(-N // (R * WARPS))
    sdt = plan.arg("scale").dtype if c.with_scaling else None
    zdt = ("int8" if c.zeros_mode == "quantized" else plan.scale_dtype) if c.with_zeros else None
    add("    T.device_entry()")
    add(f"    bx = T.cta_id([{NBLK}])")
    add(f"    tx = T.thread_id([{32 * WARPS}])")
    add(f"    wq = T.alloc_local(({ST}, {U}, {R}, {NW}), 'uint32')")
    if sdt:
        add(f"    sr = T.alloc_local(({ST}, {U}, {R}), {sdt!r})")
    if zdt:
        add(f"    zr = T.alloc_local(({ST}, {U}, {R}), {zdt!r})")
    _row_locals(add, e, R, m, WARPS)
    nr = f"T.min(n0 + r, {N - 1})"

    def cexpr(step):
        return f"((({step}) * {U} + u) * 32 + lane)"

    def cload(step):
        return cexpr(step) if NC % 32 == 0 else f"T.min({cexpr(step)}, {NC - 1})"

    def load(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        add(f"{ind}    for r in T.unroll({R}):")
        add(e["ldw_line"](ind + "        ", nr, cload(step), f"wq.ptr_to([{slot}, u, r, 0])"))
        if sdt:
            add(f"{ind}        sr[{slot}, u, r] = scale[{nr}, {e['gidx'](cload(step))}]")
        if zdt:
            add(f"{ind}        zr[{slot}, u, r] = {e['zsrc'](nr, cload(step))}")

    def process(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        if NC % 32:
            add(f"{ind1}if {cexpr(step)} < {NC}:")
            ind1 += "    "
        add(f"{ind1}for r in T.unroll({R}):")
        for ln in e["scale_lines"](ind1 + "    ", cload(step), "r", f"sr[{slot}, u, r]" if sdt else None,
                                   f"zr[{slot}, u, r]" if zdt else None):
            add(ln)
        add(e["dec_line"](ind1 + "    ", f"wq.ptr_to([{slot}, u, r, 0])", "ov[r]", "dq.ptr_to([r, 0])"))
        _row_dot(add, e, ind1, R, m, cexpr(step))

    if ST == 1:
        add(f"    for st in T.serial({NS}):")
        load("        ", "st", 0)
        process("        ", "st", 0)
    else:
        load("    ", "0", 0)
        add(f"    for s2 in T.serial({(NS + 1) // 2}):")
        if NS % 2:
            add(f"        if s2 * 2 + 1 < {NS}:")
            load("            ", "s2 * 2 + 1", 1)
        else:
            load("        ", "s2 * 2 + 1", 1)
        process("        ", "s2 * 2", 0)
        ind = "        "
        if NS % 2:
            add(f"        if s2 * 2 + 1 < {NS}:")
            ind += "    "
        add(f"{ind}if s2 * 2 + 2 < {NS}:")
        load(ind + "    ", "s2 * 2 + 2", 0)
        process(ind, "s2 * 2 + 1", 1)
    _row_store(add, e, R, m, N)


def _body_rows_ring(plan, hint, add, e):
    """The rows kernel with the packed weights streamed through a ``stages``-slot cp.async ring in
    shared memory (each lane copies and later reads back its own 16-byte vectors, so only
    ``cp.async.wait_group`` orders them): the bytes in flight do not depend on how many registers
    the compiler is willing to spend."""
    c = plan.config
    m, N, NC, VB = e["m"], e["N"], e["NC"], e["VB"]
    NIT = -(-NC // 32)
    U = max(u for u in range(1, max(1, min(hint.unroll, NIT)) + 1) if NIT % u == 0)
    NS = NIT // U
    R, WARPS, ST = hint.rows_per_warp, hint.warps, hint.stages
    NBLK = -(-N // (R * WARPS))
    sdt = plan.arg("scale").dtype if c.with_scaling else None
    zdt = ("int8" if c.zeros_mode == "quantized" else plan.scale_dtype) if c.with_zeros else None
    src = e["src"]
    add("    T.device_entry()")
    add(f"    bx = T.cta_id([{NBLK}])")
    add(f"    tx = T.thread_id([{32 * WARPS}])")
    add(f"    ring = T.alloc_buffer(({WARPS}, {ST}, {U}, {R}, 32, 4), 'uint32', scope='shared', align=16)")
    add("    wv = T.alloc_local((4,), 'uint32')")
    if sdt:
        add(f"    sr = T.alloc_local(({U}, {R}), {sdt!r})")
    if zdt:
        add(f"    zr = T.alloc_local(({U}, {R}), {zdt!r})")
    _row_locals(add, e, R, m, WARPS, warp_var=True)
    nr = f"T.min(n0 + r, {N - 1})"

    def cexpr(step):
        return f"((({step}) * {U} + u) * 32 + lane)"

    def cload(step):
        return cexpr(step) if NC % 32 == 0 else f"T.min({cexpr(step)}, {NC - 1})"

    def issue(ind, step):
        add(f"{ind}for u in T.unroll({U}):")
        add(f"{ind}    for r in T.unroll({R}):")
        add(f"{ind}        T.cuda.func_call('bb_cpa16', ring.ptr_to([wp, ({step}) % {ST}, u, r, lane, 0]), "
            f"W.ptr_to([{nr}, {cload(step)} * {VB}]), source_code={src('bb_cpa16')})")

    def commit(ind):
        add(f"{ind}T.cuda.func_call('bb_cpa_commit', source_code={src('bb_cpa_commit')})")

    for s0 in range(ST - 1):                  # prologue: steps 0 .. ST-2 in flight
        if s0 < NS:
            issue("    ", str(s0))
        commit("    ")
    add(f"    for st in T.serial({NS}):")
    if sdt or zdt:                            # raw scales / zeros of this step (none: no loop)
        add(f"        for u in T.unroll({U}):")
        add(f"            for r in T.unroll({R}):")
    if sdt:
        add(f"                sr[u, r] = scale[{nr}, {e['gidx'](cload('st'))}]")
    if zdt:
        add(f"                zr[u, r] = {e['zsrc'](nr, cload('st'))}")
    add(f"        T.cuda.func_call('bb_cpa_wait{ST - 2}', source_code={src(f'bb_cpa_wait{ST - 2}')})")
    add(f"        if st + {ST - 1} < {NS}:")
    issue("            ", f"st + {ST - 1}")
    commit("        ")
    add(f"        for u in T.unroll({U}):")
    ind1 = "            "
    if NC % 32:
        add(f"            if {cexpr('st')} < {NC}:")
        ind1 += "    "
    add(f"{ind1}for r in T.unroll({R}):")
    for ln in e["scale_lines"](ind1 + "    ", cload("st"), "r", "sr[u, r]" if sdt else None,
                               "zr[u, r]" if zdt else None):
        add(ln)
    add(f"{ind1}    T.cuda.func_call('bb_lds16', ring.ptr_to([wp, st % {ST}, u, r, lane, 0]), wv.ptr_to([0]), "
        f"source_code={src('bb_lds16')})")
    add(e["dec_line"](ind1 + "    ", "wv.ptr_to([0])", "ov[r]", "dq.ptr_to([r, 0])"))
    _row_dot(add, e, ind1, R, m, cexpr("st"))
    _row_store(add, e, R, m, N)


def _body_ksplit(plan, hint, add, e):
    """``k_warps`` warps split K; each lane keeps its slice of the activations in registers for
    the whole kernel; blocks walk batches of ``rows_per_warp`` rows (grid-stride), the packed
    weights and raw scales / zeros of batch b+1 in flight while batch b is decoded (two register
    slots), and meet in shared memory once per batch."""
    c = plan.config
    m, N, NC, NA, NW = e["m"], e["N"], e["NC"], e["NA"], e["NW"]
    WK, R = hint.k_warps, hint.rows_per_warp
    NJ = -(-NC // (32 * WK))                 # vectors per lane
    NB = -(-N // R)                          # row batches
    GRID = min(NB, hint.grid or NB)
    guard = NJ * 32 * WK != NC
    sdt = plan.arg("scale").dtype if c.with_scaling else None
    zdt = ("int8" if c.zeros_mode == "quantized" else plan.scale_dtype) if c.with_zeros else None
    add("    T.device_entry()")
    add(f"    bx = T.cta_id([{GRID}])")
    add(f"    tx = T.thread_id([{32 * WK}])")
    add(f"    wq = T.alloc_local((2, {R}, {NJ}, {NW}), 'uint32')")
    if sdt:
        add(f"    sr = T.alloc_local((2, {R}, {NJ}), {sdt!r})")
    if zdt:
        add(f"    zr = T.alloc_local((2, {R}, {NJ}), {zdt!r})")
    add(f"    ar = T.alloc_local(({NA},), 'uint32')")
    add(f"    ap = T.alloc_local(({m}, {NJ}, {e['ap_len']}), {e['ap_dtype']!r})")
    add(f"    asum = T.alloc_local(({m}, {NJ}), 'float32')")
    add(f"    dq = T.alloc_local(({e['ap_len']},), {e['ap_dtype']!r})")
    add(f"    acc = T.alloc_local(({R}, {m}), 'float32')")
    add(f"    sv = T.alloc_local(({R}, {NJ}), 'float32')")
    add(f"    cv = T.alloc_local(({R}, {NJ}), 'float32')")
    add(f"    ov = T.alloc_local(({R}, {NJ}), 'int32')")
    add(f"    red = T.alloc_buffer((2, {WK}, {R * m}), 'float32', scope='shared')")
    add("    lane = T.meta_var(tx % 32)")
    add("    kw = T.meta_var(tx // 32)")
    add(f"    nbk = T.meta_var((({NB} - bx) + {GRID - 1}) // {GRID})")
    cexpr = f"((kw * {NJ} + j) * 32 + lane)"
    cload = f"T.min({cexpr}, {NC - 1})" if guard else cexpr
    nr = f"T.min((bx + (BATCH) * {GRID}) * {R} + r, {N - 1})"

    def load(ind, batch, slot):
        row = nr.replace("BATCH", batch)
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for j in T.unroll({NJ}):")
        add(e["ldw_line"](ind + "        ", row, cload, f"wq.ptr_to([{slot}, r, j, 0])"))
        if sdt:
            add(f"{ind}        sr[{slot}, r, j] = scale[{row}, {e['gidx'](cload)}]")
        if zdt:
            add(f"{ind}        zr[{slot}, r, j] = {e['zsrc'](row, cload)}")

    def process(ind, batch, slot):
        n0 = f"(bx + ({batch}) * {GRID}) * {R}"
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for j in T.unroll({NJ}):")
        for ln in e["scale_lines"](ind + "        ", cload, "r, j", f"sr[{slot}, r, j]" if sdt else None,
                                   f"zr[{slot}, r, j]" if zdt else None):
            add(ln)
        add(f"{ind}for r, i in T.grid({R}, {m}):")
        add(f"{ind}    acc[r, i] = T.float32(0)")
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for j in T.unroll({NJ}):")
        ind2 = ind + "        "
        if guard:
            add(f"{ind2}if {cexpr} < {NC}:")
            ind2 += "    "
        add(e["dec_line"](ind2, f"wq.ptr_to([{slot}, r, j, 0])", "ov[r, j]", "dq.ptr_to([0])"))
        add(f"{ind2}for i in T.unroll({m}):")
        tail = " + cv[r, j] * asum[i, j]" if e["need_asum"] else ""
        add(f"{ind2}    acc[r, i] = acc[r, i] + sv[r, j] * "
            f"{e['dot_expr']('dq.ptr_to([0])', 'ap.ptr_to([i, j, 0])')}{tail}")
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for i in T.unroll({m}):")
        add(f"{ind}        acc[r, i] = T.cuda.warp_sum(acc[r, i])")
        add(f"{ind}        if lane == 0:")
        add(f"{ind}            red[{slot}, kw, r * {m} + i] = acc[r, i]")
        add(f"{ind}T.cuda.cta_sync()")
        add(f"{ind}if tx < {R * m}:")
        add(f"{ind}    if {n0} + tx // {m} < {N}:")
        tot = " + ".join(f"red[{slot}, {k}, tx]" for k in range(WK))
        add(e["store_line"](ind + "        ", f"tx % {m}", f"{n0} + tx // {m}", f"({tot})"))

    load("    ", "0", 0)                       # the first batch's weights fly during the prologue
    # prologue: this lane's activation vectors, paired for the decoded weights, and their sums
    add(f"    for i in T.unroll({m}):")
    add(f"        for j in T.unroll({NJ}):")
    for ln in e["lda_lines"]("            ", "i", cload, "ar"):
        add(ln)
    add(f"            asum[i, j] = {e['prep_expr']('ar', 'ap.ptr_to([i, j, 0])')}")
    add("    for b2 in T.serial((nbk + 1) // 2):")
    add("        if b2 * 2 + 1 < nbk:")
    load("            ", "b2 * 2 + 1", 1)
    process("        ", "b2 * 2", 0)
    add("        if b2 * 2 + 1 < nbk:")
    add("            if b2 * 2 + 2 < nbk:")
    load("                ", "b2 * 2 + 2", 0)
    process("            ", "b2 * 2 + 1", 1)


def schedule_cuda_gemv(func, plan, hint: Optional[GEMVHint] = None):
    """IRModule of the GEMV kernel for ``plan`` (``func``, the TensorIR of the plan, is not used:
    the kernel is written directly). The module carries ``TIRX_PIPELINE_ATTR`` so the build uses
    TVM's tirx pipeline."""
    why = gemv_unsupported(plan)
    if why:
        raise ValueError(f"GEMV template does not take this plan: {why}")
    hint = hint or GEMVHint.default(plan)
    from tvm.script import tirx as T
    text = _kernel_script(plan, hint)
    prim = tvm.script.from_source(text, extra_vars={"T": T})
    mod = tvm.IRModule({"main": prim})
    return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx")
