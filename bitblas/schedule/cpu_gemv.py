"""CPU (LLVM) GEMV-style kernel for float activations: weights decoded in SIMD registers, never
written to memory (llama.cpp's design for x86 AVX2 / AVX-512 and Arm NEON).

Hand-written TIRx, compiled by TVM's LLVM backend; threads through TVM's thread pool
(``T.parallel``). M is symbolic: one kernel serves every row count.

* The activations are first converted to float32 and permuted per *step* (``lanes`` weight bytes,
  ``lanes * codes_per_byte`` codes): the codes sharing bit position ``c`` of ``lanes`` consecutive
  bytes become one vector of ``lanes`` activations, so a step's bytes decode to ``codes_per_byte``
  float32 vectors by a vector shift and mask (no per-element shifts) that meet contiguous
  activation vectors. For groups with zero points, the lane sums of each group's activations are
  kept too.
* Output channels are split over threads in blocks of ``block`` channels. A block's rows are
  processed ``rows`` at a time by a micro-kernel of ``row_channels`` channels x ``rows`` rows
  (each decoded vector used by every row), the remaining rows one at a time by a micro-kernel of
  ``channels`` channels (each activation vector used by every channel).
* Per group, each (channel, row) accumulates ``sum(v * a)`` in a vector register by FMA; the
  group's scale is applied to that partial sum (``acc += s * sum``), zero points through the
  group's activation sums (``(v - z) * s``: ``- s*z*sum(a)``; ``v * s - z``: ``- z * sum(a)``),
  so a weight costs its decode and one FMA. Horizontal sum and epilogue per output.
* 16-entry tables (nf4, fp4_e2m1, nvfp4) are looked up by register permutes (AVX-512 ``vpermps``;
  AVX2: two and a select), other tables by a gather. Each loop trip prefetches the weight lines
  ``prefetch`` bytes ahead (a row of packed codes is a few KB: the hardware prefetcher does not
  ramp up within it).

Against torch's float32 F.linear and the tile schedule it replaced: docs/cpu.md.

The decode of a code, the scale lookup and the zero point come from ``bitblas.ir.matmul``
(``decode_code``, ``scale_value``, ``zero_value``), the one definition the TensorIR uses.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from .._tvm import tvm
from ..code_order import order_bits, slot_codes
from ..ir.matmul import decode_code, scale_value, zero_value
from .cpu import largest_divisor as _divisor
from .target import host_cpu_target

__all__ = ["CPUGemvHint", "cpu_gemv_unsupported", "schedule_cpu_gemv", "vector_lanes"]


@functools.lru_cache(maxsize=None)
def _target_lanes(target_str: str) -> int:
    t = tvm.target.Target(target_str)
    try:
        bits = int(tvm.target.codegen.llvm_get_vector_width(t))
    except Exception:  # noqa: BLE001 - an LLVM without the query: assume 128-bit SIMD
        bits = 128
    return max(4, min(16, bits // 32))


def vector_lanes(target=None) -> int:
    """float32 lanes of the target's widest SIMD register (AVX-512: 16, AVX2: 8, NEON / SSE: 4)."""
    if target is None:
        target = host_cpu_target()
    return _target_lanes(str(target))


def _group_len(plan) -> int:
    c = plan.config
    return c.K if (not c.with_scaling or plan.groups == 1) else c.group_size


def step_lanes(plan, lanes: int) -> Optional[int]:
    """Bytes per step: the widest of ``lanes``, ``lanes / 2``, .. (at least 4) whose codes divide
    the scale group (and K); None where none does."""
    cpb = plan.w.codes_per_byte
    g = _group_len(plan)
    L = lanes
    while L >= 4:
        if g % (L * cpb) == 0 and plan.config.K % (L * cpb) == 0:
            return L
        L //= 2
    return None


def cpu_gemv_unsupported(plan, lanes: Optional[int] = None) -> Optional[str]:
    """Why the kernel does not take ``plan`` (None: it does)."""
    c, w = plan.config, plan.w
    if plan.target_kind != "cpu":
        return "not a CPU plan"
    if not plan.float_acts:
        return f"A_dtype={c.A_dtype}: integer / table activations use the tile schedule"
    if c.layout != "nt":
        return f"layout={c.layout!r}: the weight is [K, N]"
    if plan.accum != "float32" or plan.decode_dtype != "float32":
        return f"accumulation {plan.accum}, decode {plan.decode_dtype}"
    if plan.scale_in_epilogue:
        return "per-channel scales in the epilogue"
    if w.kind not in ("int", "uint", "table", "float"):
        return f"W_dtype={c.W_dtype}"
    if step_lanes(plan, lanes or vector_lanes()) is None:
        return (f"K={c.K} / group_size={c.group_size}: no whole step of {4 * w.codes_per_byte}+ codes "
                "per scale group")
    return None


def _permute_lookup(plan, L: int, target=None):
    """``lookup(table, idx)``: the float32 vector ``table[idx]`` of a 16-entry table (nf4, e2m1) by
    register permutes, where the target has them: AVX-512 ``vpermps`` (16 lanes), AVX2 two
    ``vpermps`` and a select (8 lanes). None: a gather (other tables, lanes or ISAs)."""
    w = plan.w
    if w.kind != "table" or len(w.table) != 16:
        return None
    if target is None:
        target = host_cpu_target()
    has = lambda f: bool(tvm.target.codegen.target_has_features(f, target))  # noqa: E731
    from tvm import tirx
    if L == 16 and has("avx512f"):
        def lookup(tab, idx):
            tv = tirx.BufferLoad(tab, [tirx.Ramp(0, 1, 16)])
            return tirx.call_llvm_pure_intrin("float32x16", "llvm.x86.avx512.permvar.sf.512", tv, idx)
        return lookup
    if L == 8 and has("avx2"):
        def lookup(tab, idx):
            lo = tirx.call_llvm_pure_intrin("float32x8", "llvm.x86.avx2.permps",
                                            tirx.BufferLoad(tab, [tirx.Ramp(0, 1, 8)]), idx)
            hi = tirx.call_llvm_pure_intrin("float32x8", "llvm.x86.avx2.permps",
                                            tirx.BufferLoad(tab, [tirx.Ramp(8, 1, 8)]), idx)
            b8 = tirx.Broadcast(tirx.IntImm("int32", 8), 8)
            return tirx.Select(tirx.NE(idx & b8, tirx.Broadcast(tirx.IntImm("int32", 0), 8)), hi, lo)
        return lookup
    return None


@dataclass(frozen=True)
class CPUGemvHint:
    """``block`` channels per thread task; ``channels`` per one-row micro-kernel; ``rows`` x
    ``row_channels`` per many-row micro-kernel (``rows`` 1: none); ``lanes`` bytes of weights per
    step (0: the target's SIMD width, narrowed to fit the group); ``unroll`` steps per loop trip;
    ``prefetch``: each trip software-prefetches the weight bytes this far ahead of every channel's
    position (0: none; rows of a few KB end before the hardware prefetcher ramps up, so weights
    read from memory gain markedly from a prefetch distance of 16 KB)."""

    block: int = 16
    channels: int = 4
    rows: int = 4
    row_channels: int = 2
    lanes: int = 0
    unroll: int = 4
    prefetch: int = 16384

    @classmethod
    def default(cls, plan, target=None) -> "CPUGemvHint":
        N = plan.config.N
        block = _divisor(N, (16, 8, 4, 2))
        return cls(block=block, channels=_divisor(block, (4, 2)), rows=4, row_channels=_divisor(block, (2,)),
                   lanes=0, unroll=4, prefetch=16384)

    def check(self, plan) -> Optional[str]:
        """Why this hint does not fit ``plan`` (None: it does)."""
        N = plan.config.N
        for name in ("block", "channels", "rows", "row_channels", "unroll"):
            if getattr(self, name) < 1:
                return f"{name}={getattr(self, name)} < 1"
        if N % self.block:
            return f"block={self.block} does not divide N={N}"
        if self.block % self.channels or self.block % self.row_channels:
            return f"channels={self.channels} / row_channels={self.row_channels} do not divide block={self.block}"
        if self.lanes and self.lanes not in (4, 8, 16):
            return f"lanes={self.lanes}: 0, 4, 8 or 16"
        if self.channels > 8 or self.rows * self.row_channels > 16:
            return "more accumulators than SIMD registers"
        if self.prefetch < 0:
            return f"prefetch={self.prefetch} < 0"
        return None


def _elem_bytes(dtype: str) -> int:
    return max(1, tvm.DataType(dtype).bits // 8)


def _shape(spec) -> str:
    dims = ", ".join("m" if d == "m" else str(d) for d in spec.shape)
    return f"({dims},)" if len(spec.shape) == 1 else f"({dims})"


def _code_of_slot(slot: str, order) -> str:
    """TVMScript text of the K index of the code stored in slot ``slot`` (text) of a weight whose
    32-bit words hold their codes in ``order`` (``Plan.w_order``; None: the slot itself). The
    inverse of an order is again a permutation of the bits of the index within a word."""
    if order is None:
        return slot
    n, img = len(order), order_bits(slot_codes(order))
    return " + ".join([f"({slot}) // {n} * {n}"] + [f"({slot}) // {1 << i} % 2 * {1 << t}" for i, t in enumerate(img)])


def _kernel_script(plan, hint: CPUGemvHint, L: int, permute: bool):
    """(TVMScript text, parameter names) of the kernel; ``permute``: table codes are looked up by a
    register permute (``lookup``) instead of a gather."""
    c, w = plan.config, plan.w
    N, K = c.N, c.K
    cpb = w.codes_per_byte
    CH = L * cpb                     # codes per step
    G = _group_len(plan)             # codes per group (K: one group)
    NG = K // G
    S = G // CH                      # steps per group
    U = _divisor(S, tuple(u for u in (8, 4, 2) if u <= hint.unroll))
    scaled = c.with_scaling and w.kind != "float"
    zeros = scaled and c.with_zeros
    names = [s.name for s in plan.args]
    allb = ", ".join(names)
    esize = w.bits // 8 if w.kind == "float" else 1     # bytes per element of W
    # align: the element size, so vector loads and stores make no alignment assumption (tensors
    # reach the kernel as they are, e.g. views into a safetensors file at any offset)
    params = ", ".join(f"{s.name}: T.Buffer({_shape(s)}, {s.dtype!r}, align={_elem_bytes(s.dtype)})"
                       for s in plan.args)

    lines = []
    add = lines.append
    add("@T.prim_func")
    add(f"def main({params}):")
    add('    T.func_attr({"global_symbol": "main", "tirx.noalias": True})')
    add(f"    Ap = T.alloc_buffer((m, {K}), 'float32')")
    if zeros:
        add(f"    As = T.alloc_buffer((m, {NG}, {L}), 'float32')")
    # activations: float32, permuted per step (to the code stored in each slot: Plan.w_order)
    add(f"    for i, b in T.grid(m, {K // CH}):")
    add(f"        for c in T.unroll({cpb}):")
    add(f"            for l in T.vectorized({L}):")
    add(f"                Ap[i, b * {CH} + c * {L} + l] = T.Cast('float32', "
        f"A[i, {_code_of_slot(f'(b * {L} + l) * {cpb} + c', plan.w_order)}])")
    if zeros:
        add(f"    for i, g in T.grid(m, {NG}):")
        add(f"        for l in T.vectorized({L}):")
        add("            As[i, g, l] = T.float32(0)")
        add(f"        for s, c in T.grid({S}, {cpb}):")
        add(f"            for l in T.vectorized({L}):")
        add(f"                As[i, g, l] = As[i, g, l] + Ap[i, g * {G} + s * {CH} + c * {L} + l]")

    def micro(ind, nc, R, row0, n0):
        """nc channels from n0 x R rows from row0."""
        p = " " * ind
        add(f"{p}for j in T.unroll({nc}):")
        add(f"{p}    for r in T.unroll({R}):")
        add(f"{p}        for l in T.vectorized({L}):")
        add(f"{p}            acc[j * {R} + r, l] = T.float32(0)")
        add(f"{p}for g in range({NG}):")
        q = p + "    "
        add(f"{q}for j in T.unroll({nc}):")
        add(f"{q}    for r in T.unroll({R}):")
        add(f"{q}        for l in T.vectorized({L}):")
        add(f"{q}            accg[j * {R} + r, l] = T.float32(0)")
        add(f"{q}for so in range({S // U}):")
        if hint.prefetch:            # the lines ``prefetch`` bytes ahead of each channel's next U steps
            for line in range(-(-(U * L * esize) // 64)):
                ahead = (line * 64 + hint.prefetch) // esize
                add(f"{q}    for j in T.unroll({nc}):")
                add(f"{q}        T.evaluate(pf({n0} + j, g * {G // cpb} + so * {U * L} + {ahead}, {allb}))")
        add(f"{q}    for si in T.unroll({U}):")
        add(f"{q}        for j in T.unroll({nc}):")
        add(f"{q}            for c in T.unroll({cpb}):")
        add(f"{q}                for l in T.vectorized({L}):")
        kexpr = f"((g * {G // cpb} + (so * {U} + si) * {L} + l) * {cpb} + c)"
        if permute:          # 16-entry table: the codes, then one register permute per vector
            add(f"{q}                    qi[j, c, l] = code({n0} + j, {kexpr}, {allb})")
            add(f"{q}                wv[j, c, T.Ramp(0, 1, {L})] = lookup(qi[j, c, T.Ramp(0, 1, {L})], {allb})")
        else:
            add(f"{q}                    wv[j, c, l] = dec({n0} + j, {kexpr}, {allb})")
        add(f"{q}            for c in T.unroll({cpb}):")
        add(f"{q}             for r in T.unroll({R}):")
        add(f"{q}                for l in T.vectorized({L}):")
        add(f"{q}                    accg[j * {R} + r, l] = T.fma(wv[j, c, l], "
            f"Ap[{row0} + r, g * {G} + (so * {U} + si) * {CH} + c * {L} + l], accg[j * {R} + r, l])")
        add(f"{q}for j in T.unroll({nc}):")
        add(f"{q} for r in T.unroll({R}):")
        if scaled:
            add(f"{q}    sv = T.meta_var(sc({n0} + j, g, {allb}))")
        if zeros:
            add(f"{q}    zt = T.meta_var(zt_of({n0} + j, g, sv, {allb}))")
        add(f"{q}    for l in T.vectorized({L}):")
        if not scaled:
            add(f"{q}        acc[j * {R} + r, l] = acc[j * {R} + r, l] + accg[j * {R} + r, l]")
        elif not zeros:
            add(f"{q}        acc[j * {R} + r, l] = T.fma(accg[j * {R} + r, l], sv, acc[j * {R} + r, l])")
        else:
            add(f"{q}        acc[j * {R} + r, l] = T.fma(accg[j * {R} + r, l], sv, "
                f"T.fma(As[{row0} + r, g, l], zt, acc[j * {R} + r, l]))")
        # horizontal sum and epilogue
        add(f"{p}for j in T.unroll({nc}):")
        add(f"{p} for r in T.unroll({R}):")
        add(f"{p}    hs[0] = T.float32(0)")
        add(f"{p}    for l in T.unroll({L}):")
        add(f"{p}        hs[0] = hs[0] + acc[j * {R} + r, l]")
        add(f"{p}    output[{row0} + r, {n0} + j] = epi({row0} + r, {n0} + j, hs[0], {allb})")

    B = hint.block
    n_acc, n_ch = max(hint.channels, hint.rows * hint.row_channels), max(hint.channels, hint.row_channels)
    add(f"    for nb in T.parallel({N // B}):")
    add(f"        acc = T.alloc_buffer(({n_acc}, {L}), 'float32', scope='local')")
    add(f"        accg = T.alloc_buffer(({n_acc}, {L}), 'float32', scope='local')")
    add(f"        wv = T.alloc_buffer(({n_ch}, {cpb}, {L}), 'float32', scope='local')")
    add("        hs = T.alloc_buffer((1,), 'float32', scope='local')")
    if permute:
        add(f"        qi = T.alloc_buffer(({n_ch}, {cpb}, {L}), 'int32', scope='local')")
    R = hint.rows
    if R > 1:
        add(f"        for rb in range(m // {R}):")
        add(f"            for jb in range({B // hint.row_channels}):")
        micro(16, hint.row_channels, R, f"rb * {R}", f"(nb * {B} + jb * {hint.row_channels})")
        add(f"        for ri in range(m % {R}):")
        add(f"            for jb in range({B // hint.channels}):")
        micro(16, hint.channels, 1, f"(m - m % {R} + ri)", f"(nb * {B} + jb * {hint.channels})")
    else:
        add("        for ri in range(m):")
        add(f"            for jb in range({B // hint.channels}):")
        micro(16, hint.channels, 1, "ri", f"(nb * {B} + jb * {hint.channels})")
    return "\n".join(lines), names


def schedule_cpu_gemv(func, plan, hint: Optional[CPUGemvHint] = None, target=None):
    """IRModule of the kernel for ``plan`` (``func``, the plan's TensorIR, is not used: the kernel
    is written directly; its arguments are the plan's, in order)."""
    lanes = vector_lanes(target)
    why = cpu_gemv_unsupported(plan, lanes)
    if why:
        raise ValueError(f"CPU GEMV kernel does not take this plan: {why}")
    hint = hint or CPUGemvHint.default(plan, target)
    bad = hint.check(plan)
    if bad:
        raise ValueError(f"CPUGemvHint does not fit this plan: {bad}")
    L = step_lanes(plan, min(hint.lanes or lanes, lanes) if hint.lanes else lanes)
    if L is None:
        raise ValueError(f"CPUGemvHint(lanes={hint.lanes}): no step of that width fits "
                         f"group_size={plan.config.group_size}")
    lookup = _permute_lookup(plan, L, target)
    text, names = _kernel_script(plan, hint, L, lookup is not None)
    rows = tvm.tirx.Var("m", "int32") if plan.m is None else tvm.tirx.IntImm("int32", plan.m)
    from tvm.script import tirx as T
    c, w = plan.config, plan.w

    def with_bufs(fn):
        """``fn(bufs, *args)`` called from the script as ``name(*args, <every parameter>)``."""
        n = len(names)
        return lambda *a: fn(dict(zip(names, a[-n:])), *a[:-n])

    def pf(bufs, n, b):
        """Prefetch the cache line of byte b of W's row n (past the row: the rows after it)."""
        from tvm import tirx
        addr = tirx.address_of(tirx.BufferLoad(bufs["W"], [n, b]))
        i32 = lambda v: tirx.IntImm("int32", v)  # noqa: E731
        return tirx.call_llvm_intrin("void", "llvm.prefetch.p0", addr, i32(0), i32(3), i32(1))

    def code(bufs, n, k):
        # the code in slot k as stored: the activations were permuted to the code order instead
        return decode_code(bufs["W"], n, k, w, plan.w_storage)

    def dec(bufs, n, k):
        """The value of element (n, k) of W, float32, before scales."""
        if w.kind == "float":
            return bufs["W"][n, k].astype("float32")
        q = code(bufs, n, k)
        v = bufs["w_table"][q] if w.kind == "table" else q
        return v.astype("float32")

    def sc(bufs, n, g):
        return scale_value(plan, bufs, "float32")(n, g * _group_len(plan))

    def zt_of(bufs, n, g, s):
        """The factor of the group's activation sum: -(s * z) for (v - z) * s, -z for v * s - z."""
        z = zero_value(plan, bufs, "float32")(n, g)
        return -z if c.zeros_mode == "rescale" else -(s * z)

    def epi(bufs, i, n, v):
        """emit_matmul's epilogue on the float32 sum (float activations: no per-channel epilogue scale)."""
        if c.with_act_scaling:
            v = v * bufs["a_scale"][i]
        if w.global_scale:
            v = v * bufs["global_scale"][0]
        if c.with_bias:
            v = v + bufs["bias"][n].astype("float32")
        return v.astype(c.out_dtype)

    extra = {"T": T, "m": rows}
    extra.update({f.__name__: with_bufs(f) for f in (pf, code, dec, sc, zt_of, epi)})
    if lookup is not None:
        extra["lookup"] = with_bufs(lambda bufs, idx: lookup(bufs["w_table"], idx))
    prim = tvm.script.from_source(text, extra_vars=extra)
    return tvm.IRModule({"main": prim})
