"""The small-M CUDA template (decode, M = 1..16): float16/bfloat16 activations x int/uint weights.

A hand-written TIRx kernel (TVM's "tirx" pipeline), generated per plan as TVMScript text:

* a warp owns ``rows_per_warp`` output channels; its lanes walk K in 16-byte vectors of packed
  weights (``ld.global.nc.L1::no_allocate``, ``unroll`` x ``rows_per_warp`` loads in flight per
  lane), so one warp pass over a row reads 512 contiguous bytes;
* weights are decoded in registers two at a time into half2/bfloat162 with the magic-number
  trick: one ``lop3`` places a b-bit field (XOR-ed to unsigned for signed formats) in the low
  mantissa bits of 1024.0 (128.0 for bfloat16), one ``hsub2``/``hfma2`` subtracts the magic and
  the integer offset exactly, one ``hfma2`` multiplies with the activation pair;
  8-bit weights decode to float32 (``prmt`` into 2**23) and use float32 FMAs;
* the dot product over one vector (32 int4 values) accumulates in half2 (float16: 2, bfloat16: 4
  independent accumulators), then in float32 with the group scale; float zero points and the
  centring of unsigned codes are applied through the sum of the activations of the vector:
  ``s * sum(a * (q - z)) = s * dot + s * (off - z) * sum(a)``;
* the lanes' partial sums meet in a warp shuffle reduction; bias and the output cast follow.

The activations are read through L1 (every warp of the grid reads the same [m, K] tile).
:func:`gemv_unsupported` says which plans the template does not take; those use the simple
schedule.
"""
from __future__ import annotations

import math
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

    @classmethod
    def default(cls, plan) -> "GEMVHint":
        m = plan.m or 1
        if m <= 2:
            return cls(rows_per_warp=2, warps=4, unroll=4)
        if m <= 8:
            return cls(rows_per_warp=2, warps=4, unroll=2)
        return cls(rows_per_warp=1, warps=4, unroll=2)


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
    if plan.w.kind not in ("int", "uint"):
        return "weights must be an int/uint format"
    if c.layout != "nt":
        return "layout must be 'nt'"
    if plan.w.global_scale or c.with_act_scaling:
        return "no global or activation scales"
    if c.with_scaling and plan.scale_dtype != c.A_dtype:
        return "scales must have the activation dtype"
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


def _helpers(tag: str, act: str, bits: int, signed: bool, nw: int):
    """CUDA source of the helpers for one (activation dtype, weight format, vector size)."""
    ctype, t2, magic, mant, magic_f = _ACT[act]
    src = {}
    src[f"bb_ldw{nw}"] = {
        4: r"""
__device__ __forceinline__ void bb_ldw4(const void* p, unsigned* d) {
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "l"(p));
}
""", 2: r"""
__device__ __forceinline__ void bb_ldw2(const void* p, unsigned* d) {
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(d[0]), "=r"(d[1]) : "l"(p));
}
""", 1: r"""
__device__ __forceinline__ void bb_ldw1(const void* p, unsigned* d) {
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(d[0]) : "l"(p));
}
"""}[nw]
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
    NIT = -(-NC // 32)                      # lane iterations
    U = max(u for u in range(1, max(1, min(hint.unroll, NIT)) + 1) if NIT % u == 0)
    R, WARPS = hint.rows_per_warp, hint.warps
    NBLK = -(-N // (R * WARPS))
    G = K if plan.groups == 1 else c.group_size
    tag = f"{'f16' if act == 'float16' else 'bf16'}_{'i' if signed else 'u'}{b}_v{VB}"
    helpers = _helpers(tag, act, b, signed, NW)
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
    dq_len = V if f32_path else NA

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
    add("    T.device_entry()")
    add(f"    bx = T.cta_id([{NBLK}])")
    add(f"    tx = T.thread_id([{32 * WARPS}])")
    add(f"    wq = T.alloc_local(({U}, {R}, {NW}), 'uint32')")
    add(f"    ar = T.alloc_local(({NA},), 'uint32')")
    add(f"    ap = T.alloc_local(({ap_len},), {ap_dtype!r})")
    add(f"    dq = T.alloc_local(({R}, {dq_len}), {ap_dtype!r})")
    add(f"    acc = T.alloc_local(({R}, {m}), 'float32')")
    add(f"    sv = T.alloc_local(({U}, {R}), 'float32')")
    add(f"    cv = T.alloc_local(({U}, {R}), 'float32')")
    add(f"    ov = T.alloc_local(({U}, {R}), 'int32')")
    add("    asum = T.alloc_local((1,), 'float32')")
    add("    lane = T.meta_var(tx % 32)")
    add(f"    n0 = T.meta_var((bx * {WARPS} + tx // 32) * {R})")
    add(f"    for r, i in T.grid({R}, {m}):")
    add("        acc[r, i] = T.float32(0)")
    add(f"    for it in T.serial({NIT // U}):")
    # chunk index of (it, u) for this lane, clamped for the loads when NC is no multiple of 32
    cexpr = f"((it * {U} + u) * 32 + lane)"
    cload = cexpr if NC % 32 == 0 else f"T.min({cexpr}, {NC - 1})"
    add(f"        for u in T.unroll({U}):")
    add(f"            for r in T.unroll({R}):")
    add(f"                T.cuda.func_call('bb_ldw{NW}', W.ptr_to([T.min(n0 + r, {N - 1}), {cload} * {VB}]), "
        f"wq.ptr_to([u, r, 0]), source_code={src(f'bb_ldw{NW}')})")
    # scales, zeros -> sv (scale), ov (integer offset), cv (coefficient of sum(a))
    add(f"        for u in T.unroll({U}):")
    add(f"            for r in T.unroll({R}):")
    nr = f"T.min(n0 + r, {N - 1})"
    g = "0" if plan.groups == 1 else f"({cload} * {V} // {G})"
    s_expr = f"T.Cast('float32', scale[{nr}, {g}])" if c.with_scaling else "T.float32(1)"
    add(f"                sv[u, r] = {s_expr}")
    # the integer offset subtracted exactly in the decode centres the codes: x_shift (signed codes
    # are centred by the XOR), the zero-point code, or the rounded float zero point; what it misses
    # (|residual| <= 0.5) goes through cv * sum(a)
    if quant_zeros:
        cpb = w.codes_per_byte
        if cpb == 1:
            zc = f"T.Cast('int32', zeros[{nr}, {g}]) & 255"
        else:
            zc = (f"T.shift_right(T.Cast('int32', zeros[{nr}, {g} // {cpb}]), ({g} % {cpb}) * {b}) & {(1 << b) - 1}")
        add(f"                ov[u, r] = {zc}")
        add("                cv[u, r] = T.float32(0)")
    elif float_zeros:
        z = f"T.Cast('float32', zeros[{nr}, {g}])"
        # original: (q - z) * s -> off ~ z; rescale: q * s - z -> off ~ z / s
        zq = z if c.zeros_mode == "original" else \
            f"T.if_then_else(sv[u, r] != T.float32(0), {z} / sv[u, r], T.float32(0))"
        add(f"                ov[u, r] = T.max(T.min(T.Cast('int32', T.floor({zq} + T.float32(0.5))) + {x_shift}, "
            f"{off_max}), 0)")
        if c.zeros_mode == "original":
            add(f"                cv[u, r] = sv[u, r] * (T.Cast('float32', ov[u, r] - {x_shift}) - {z})")
        else:
            add(f"                cv[u, r] = sv[u, r] * T.Cast('float32', ov[u, r] - {x_shift}) - {z}")
    else:
        add(f"                ov[u, r] = {x_shift}")
        add("                cv[u, r] = T.float32(0)")
    add(f"        for u in T.unroll({U}):")
    ind = "            "
    if NC % 32:
        add(f"            if {cexpr} < {NC}:")
        ind += "    "
    add(f"{ind}for r in T.unroll({R}):")
    add(f"{ind}    T.cuda.func_call('bb_dec_{tag}', wq.ptr_to([u, r, 0]), ov[u, r], dq.ptr_to([r, 0]), "
        f"source_code={src(f'bb_dec_{tag}')})")
    add(f"{ind}for i in T.unroll({m}):")
    add(f"{ind}    for v in T.unroll({NA // 4}):")
    add(f"{ind}        T.cuda.func_call('bb_lda', A.ptr_to([i, {cexpr} * {V} + v * 8]), ar.ptr_to([v * 4]), "
        f"source_code={src('bb_lda')})")
    add(f"{ind}    asum[0] = T.cuda.func_call('bb_prep_{tag}', ar.ptr_to([0]), ap.ptr_to([0]), "
        f"source_code={src(f'bb_prep_{tag}')}, return_type='float32')")
    add(f"{ind}    for r in T.unroll({R}):")
    dot = (f"T.cuda.func_call('bb_dot_{tag}', dq.ptr_to([r, 0]), ap.ptr_to([0]), "
           f"source_code={src(f'bb_dot_{tag}')}, return_type='float32')")
    tail = " + cv[u, r] * asum[0]" if need_asum else ""
    add(f"{ind}        acc[r, i] = acc[r, i] + sv[u, r] * {dot}{tail}")
    # reduce across the lanes, epilogue
    add(f"    for r in T.unroll({R}):")
    add(f"        for i in T.unroll({m}):")
    add("            acc[r, i] = T.cuda.warp_sum(acc[r, i])")
    add(f"            if lane == (r * {m} + i) % 32 and n0 + r < {N}:")
    val = "acc[r, i]"
    if c.with_bias:
        val = f"{val} + T.Cast('float32', bias[n0 + r])"
    add(f"                output[i, n0 + r] = T.Cast({c.out_dtype!r}, {val})")
    return "\n".join(L) + "\n"


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
