"""NVFP4 x NVFP4 kernels (A_dtype = W_dtype = "nvfp4"): batched over L, strided, hand-written.

Both operands are e2m1 codes (two per byte along K, the even code in the low nibble) with one
float8_e4m3 block scale per 16 K elements. Every kernel takes its tensors batched, ``[L, rows,
K/2]`` etc. with L and every stride but K's read at run time: the issue's permuted views (b
padded to 128 rows, only row 0 used) go in as they are. TVM's tirx lowering flattens strided
buffers as if they were compact, so the CUDA kernels declare each tensor strided (the runtime
binds and checks the strides) and index a flat alias of its data with the bound strides by hand.

The GEMV (CUDA, ``NVFP4GemvHint``; sm_90 has no FP4 tensor cores): e2m1 x e2m1 products are
small integers: with values doubled (0, 1, 2, 3, 4, 6, 8, 12) a product is 4 * w * a and a sum of
16 of them fits int32 exactly, so a 16-element block is two chains of ``dp4a``. The weight codes
become bytes by ``prmt`` from an 8-byte table of the doubled magnitudes (``MAG2_TABLE``): the low
three bits of each selector nibble index the table, its top bit (the code's sign) switches
``prmt`` to sign replication, which yields 0 (every table byte is < 0x80). So ``prmt(q)`` gives
the magnitudes of the positive codes and ``prmt(q ^ 0x88888888)`` those of the negative ones, and
the block's dot product is ``dp4a(pos, a) - dp4a(neg, a)``: per 8 codes 4 ``prmt``, 4 ``dp4a``, an
xor and two shifts (~1.4 instructions per weight; the GEMV template's e2m1 -> half2 decoder and hfma2
take ~2.9). The activation row (signed doubled values, 8 words per 32 codes) and its block
scales (times 1/4) are decoded once per block into shared memory (conflict-free
``[row, position // 32, half, position % 32, 4]`` word quads) and read by every row of the block.
The two block scales of a 32-code vector come in one 2-byte load and convert by
``cvt.rn.f16x2.e4m3x2`` (sm_89+; arithmetic below). Per block ``acc += float(dot) * (sw * sa / 4)``:
the integer, the scale product (8 significant bits) and their product (20) are exact in float32,
so only the float32 sums round, as in the reference. A warp owns ``rows_per_warp`` weight rows
of one batch and walks K in 16-byte vectors (32 codes, a warp load = 512 contiguous bytes),
``unroll`` vectors per row per step through a ring of ``stages`` register slots (the GEMV template's step
loop: the loads of ``stages - 1`` steps in flight); lanes are warp-reduced and one lane stores.
The grid covers L x row blocks; the first steps' loads go out before the activation staging, and
with ``l2_prefetch`` the first steps are prefetched into L2 before the PDL wait (the default for K >
4096: (7168, 16384, 1) 1.20x -> 1.12x its byte floor, see ``NVFP4GemvHint.default``).
Looked at and refuted (H200, one run, ``benchmark.nvfp4`` with a hint sweep): at (M, K, L) =
(7168, 16384, 1) the default's one wave of 448 blocks is uneven on 132 SMs (the fullest SMs hold
18% more rows than the average), and 14-row blocks (R2W7: one even wave) were expected to take
the shape ~12% closer to its floor; they measured 1.4% faster (R2W14 the same), and 7-9% slower
on (4096, 7168, 8): the wave's evenness is not what keeps it at 1.2x its byte floor.
ncu on the H200 (one cold launch of the default at (7168, 16384, 1)): 51% of the ALU pipe, 51% of
the issue slots, stalls mostly on memory (long scoreboard), DRAM bytes equal to the bytes the
shape must move. More warps or more loads in flight per warp did not help either
(``benchmark.nvfp4`` with these hints as its SWEEP, one run, µs; default 18.89): 16-warp blocks
with 1 or 2 rows per warp 20.69 / 19.71, launch bounds of 2 blocks per SM with 2 or 3 steps in
flight 21.27 / 19.34, 1 row x 2 vectors per step 19.15, 4 rows under 2 blocks per SM 19.12,
4-warp blocks 19.08. At (7168, 2048, 4) 1 row x 2 vectors per step took 9.96 against the
default's 10.38 (one run; the default there came from two), so the default stays until a repeat.
Also refuted (H200, ``benchmark.nvfp4`` with a sweep, two runs in one call): several consecutive
row tiles per block walked as one stream of steps (the ring of loads running on from one tile into
the next, the activation row staged once per block), expected to take (7168, 2048, 4) from 10.3
to ~9 µs by amortizing each block's start over more rows. It was slower at every tile count and
ring depth: (7168, 2048, 4) 10.28 / 10.33 default, 10.71 .. 12.61 with 2, 4 or 7 tiles per block;
(7168, 16384, 1) 17.6 -> 21.6 .. 43.3; (4096, 7168, 8) 30.5 -> 33.4 .. 42.6. Fewer, longer-lived
blocks keep fewer bytes in flight per SM than the many short blocks that all fit at once.
Three more, each expected to take (7168, 2048, 4) from ~9.95 toward 9.0 µs (H200, two or three runs
each): (a) the one-step row's weight loads issued before the activation staging (the ring clipped to
one slot stages first, then loads after the barrier): 11.08-11.19 µs; (b) the PDL trigger right after
the wait instead of after the main loop: 9.88-9.95, and (7168, 16384, 1) 17.5 -> 18.7; (c) each lane
loading and decoding its own activation vectors in registers, no staging and no barrier (branch
``exp/nvfp4-act-regs``, local): 14.4, and 24-32 / 40-56 µs on the other shapes: decoding the activation
per warp rather than per block doubles the ALU work of a kernel whose issue slots are half busy.
What a kernel that only reads these bytes reaches in the same harness (``benchmark.probe_floor``,
triton): 8.50 µs for (7168, 2048, 4) with PDL in 8 KB blocks of 256 threads (9.00 without PDL),
15.68 for (7168, 16384, 1), 29.96 for (4096, 7168, 8); this GEMV's 9.95 / 17.4 / 30.1-31.8 are 1.17x,
1.11x and 1.00-1.06x of those.
Where (7168, 2048, 4) loses the rest (ncu on the H200, one launch of the default, default clocks):
32 registers, 8 blocks of 256 threads per SM, 78% of the warp slots occupied over 3.39 waves of 3584
blocks, 18.9 cycles per issued instruction of which 5.2 wait on the weight loads (long scoreboard)
and 3.8 at the staging barrier (the six warps that wait while two decode the activation row). Six
more ways to shorten that wait, measured (two or three rounds each; default 9.92-9.99 µs): the
weight loads issued before the staging with the registers held to 32 (launch bounds of 8 blocks;
unbounded, the device's compiler gave it 40 registers and 6 blocks per SM) 10.77; the staging
threads' activation loads first, then every warp's weight loads, then the staging decode and the
barrier (all loads ``asm volatile``, in that order) 11.33-11.38, 11.0 at 32 registers; with no CTA
barrier at all (which orders the memory accesses its threads made before it), one or two producer
warps of their own staging the row and arriving on an mbarrier (release) while the row warps load at
once and wait on it (acquire) took 11.2-12.2 µs (6 to 15 row warps): weight loads issued before the
row is staged cost ~1 µs here in every arrangement tried. Why, from the SASS (nvcc 13.0 for sm_90a
and nvdisasm, of this default and of the first variant): ptxas already hoists every warp's weight
loads above the barrier (they are ``.nc`` loads), so the six row warps issue theirs at once and the
two staging warps issue theirs after the staging's stores; the variants change only the staging
warps, whose activation load then queues behind their own weight loads, and the barrier, which every
warp waits at, opens later (inferred from the instruction order; not profiled). So the row warps'
loads are already early; what is left to shorten is the staging path (activation load, decode,
store). The staging spread over
four threads per vector, a code word each (a 4x shorter chain; every warp then stages) 10.77-10.79,
and in 16-warp blocks of one row per warp 9.80-9.83 against 9.97-10.01 for that tile without it, the
one gain (1.5%; the longer rows' tiles got slower with it: (7168, 16384, 1) 17.4 -> 17.7, (4096,
7168, 8) 30.5 -> 34.5); two rows per warp held to 32 registers (8 blocks per SM, half the waves)
10.07-10.09, 32-row blocks 10.24-10.30.

The CPU kernel (``NVFP4CPUHint``, LLVM): the same arithmetic (integer block dot products of
doubled values, one float32 multiply-add per block), parallel over (batch, row tiles).

The decode kernel (:func:`decode_script`, CUDA): codes and block scales of one batch index ->
float16 values [rows, K], exact (an e2m1 x e4m3 product has at most 6 significant bits and |v| <=
2688): the operands of the decode-then-GEMM path for many rows (bitblas/ops/nvfp4.py). On sm_89+
each code becomes the float8_e4m3 byte of its value times 2**-6 by integer arithmetic on four
codes at once (:func:`e4m3_code_bytes`), pairs convert by ``cvt.rn.f16x2.e4m3x2``, and one
``mul.f16x2`` by the block scale times 2**6 restores the value (all exact). Each lane loads four
code words, a warp's 32 apart, before it decodes and stores them (coalesced 512-byte warp stores).
H200, 8192 x 8192 codes: 44.6 µs (3.85 TB/s of codes, scales and values) against 63.9-69.7 µs for
the earlier kernel (one word per thread, per-code float arithmetic); 4096 rows 23.6 against 36.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .._tvm import tvm
from ..arch import arch_of, as_arch
from .gemv.emit import (LDS4, e4m3x2_lines, l2_prefetch, l2_prefetch_unsupported, load_helpers, pdl_trigger,
                        split_steps, step_loop)
from .target import TIRX_PIPELINE_ATTR

__all__ = ["NVFP4GemvHint", "NVFP4CPUHint", "MAG2_TABLE", "SIGN_FLIP", "NVFP4_GEMV_MAX_ROWS", "gemv_script",
           "cpu_script", "decode_script", "schedule_nvfp4", "nvfp4_gemv_unsupported", "gemv_smem_bytes",
           "gemv_smem_cap", "cuda_helpers", "decode_module"]

MAG2_TABLE = (0x03020100, 0x0C080604)   # bytes 0..7: 2 x e2m1 magnitude of codes & 7: 0, 1, 2, 3, 4, 6, 8, 12
SIGN_FLIP = 0x88888888                  # xor: the sign bit of every code of a word
# the same doubled magnitudes as nibbles (nibble i: code i), the CPU kernel's table
MAG2_NIBBLES = sum(((MAG2_TABLE[i // 4] >> (8 * (i % 4))) & 0xF) << (4 * i) for i in range(8))
NVFP4_GEMV_MAX_ROWS = 8                 # activation rows of one GEMV kernel (the operator runs more in chunks)
GEMV_SMEM_MAX = 200 * 1024              # the staged activation rows, within sm_90's 227 KB (sm_80: 163 KB)
_SMEM_MAX_SM80 = 160 * 1024
STRIDES = {"A": ("sA0", "sA1"), "W": ("sW0", "sW1"), "scale": ("sS0", "sS1"), "a_scale": ("sB0", "sB1")}


@dataclass(frozen=True)
class NVFP4GemvHint:
    """The CUDA GEMV's shape: ``rows_per_warp`` weight rows per warp, ``warps`` per block,
    ``unroll`` 16-byte vectors per row per step, ``stages`` register slots (``stages - 1`` steps in
    flight), ``min_blocks`` (launch bounds: blocks per SM, 0: none), ``pdl`` (programmatic
    dependent launch, sm_90), ``l2_prefetch``: the first steps of each warp's weight rows and
    their scales prefetched into L2 at entry, before the PDL wait (``prefetch.global.L2`` binds no
    value: the loads after the wait still see what an earlier kernel wrote)."""

    rows_per_warp: int = 2
    warps: int = 8
    unroll: int = 1
    stages: int = 3
    min_blocks: int = 0
    pdl: bool = False
    l2_prefetch: int = 0

    @classmethod
    def default(cls, plan, target=None) -> "NVFP4GemvHint":
        """By the length of a row, as benchmark/nvfp4.py's sweep measured on the H200 (the issue's
        three shapes, two runs each, one call): K <= 4096 and one activation row, one weight row
        per warp in 8-warp blocks, two vectors per step, one step in flight ((7168, 2048, 4): 10.20
        / 10.41 with the 2-row tile below -> 9.95 / 9.93 in one call, 10.38 -> 9.96 in another; it
        took 6-20% more time on the two longer rows); longer rows 2 rows per warp in 8-warp blocks;
        K <= 8192 3 steps in flight and the first step of each row prefetched into L2 before the
        PDL wait ((4096, 7168, 8): 32.01 / 32.10 -> 31.51 / 31.93; 2 or 3 steps prefetched were
        slower); longer rows 2 steps in flight (3 took 9% more) and 2 steps prefetched ((7168,
        16384, 1): 18.69 / 18.83 -> 17.45 / 17.48; 1 step 17.47 / 17.53, 3 steps 17.60 / 17.63).
        The prefetch needs the PDL wait to gain: the blocks that start while the previous kernel
        drains fetch their first weights meanwhile. PDL on sm_90+."""
        pdl = arch_of(target).pdl
        K = plan.config.K
        if K <= 4096:
            return cls(rows_per_warp=1, unroll=2, stages=2, pdl=pdl) if plan.m == 1 else cls(pdl=pdl)
        if K <= 8192:
            return cls(stages=4, pdl=pdl, l2_prefetch=1 if pdl else 0)
        return cls(pdl=pdl, l2_prefetch=2 if pdl else 0)


@dataclass(frozen=True)
class NVFP4CPUHint:
    """The CPU kernel: ``n_tile`` weight rows per parallel task."""

    n_tile: int = 8

    @classmethod
    def default(cls, plan) -> "NVFP4CPUHint":
        return cls()


def _positions(K: int):
    """(16-byte vectors per row, blocks of 32 vector positions per row)."""
    nv = K // 32
    return nv, -(-nv // 32)


TABLE_WORDS = 64         # MAG2_TABLE once per lane, after the staged rows in shared memory (gemv_script)


def gemv_smem_bytes(K: int, m: int) -> int:
    """Shared memory of the GEMV's staged activation rows: 8 value words and 2 float scales per
    vector position of each row; then the magnitude table, one copy per lane."""
    return m * _positions(K)[1] * 32 * (8 + 2) * 4 + TABLE_WORDS * 4


def gemv_smem_cap(sm=None) -> int:
    """Shared memory the GEMV may stage activation rows in on ``sm`` (an Arch or a compute
    capability; None: unknown, taken as Hopper's 227 KB): 200 KB with TMA-class shared memory,
    160 KB before, and never more than the family's opt-in limit per block (sm_86 / sm_89 /
    sm_120: 99 KB)."""
    arch = as_arch(sm)
    cap = GEMV_SMEM_MAX if not arch.known or arch.tma else _SMEM_MAX_SM80
    optin = arch.optin_smem_per_block
    return cap if optin is None else min(cap, optin)


def nvfp4_gemv_unsupported(plan, hint: NVFP4GemvHint, sm=None) -> Optional[str]:
    """None when the GEMV takes ``plan`` with ``hint`` on ``sm`` (an Arch or a compute capability),
    else why not."""
    if plan.target_kind != "cuda" or not plan.nvfp4_acts:
        return "not a CUDA plan with nvfp4 activations"
    m = plan.m
    if m is None or not 1 <= m <= NVFP4_GEMV_MAX_ROWS:
        return f"the GEMV kernel takes a static row count 1..{NVFP4_GEMV_MAX_ROWS} (plan: {m})"
    if not as_arch(sm).dp4a:
        return f"sm_{as_arch(sm).sm}: dp4a needs sm_61+"
    for name in ("rows_per_warp", "warps", "unroll", "stages"):
        v = getattr(hint, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{name}={v!r} must be a positive int"
    if l2_prefetch_unsupported(hint.l2_prefetch):
        return l2_prefetch_unsupported(hint.l2_prefetch)
    if hint.warps > 32:
        return f"warps={hint.warps}: at most 32 warps per block"
    if hint.min_blocks < 0:
        return f"min_blocks={hint.min_blocks} must be >= 0"
    cap = gemv_smem_cap(sm)
    nbytes = gemv_smem_bytes(plan.config.K, m)
    if nbytes > cap:
        return (f"{m} staged activation rows of K={plan.config.K} take {nbytes} bytes of shared memory, more than "
                f"{cap}; fewer rows per launch")
    return None


# --------------------------------------------------------------------------------------------
# CUDA helpers. TVM emits each helper once per name (func_call's source_code), so every helper is
# self-contained; the e4m3 pair conversion is generated into each that needs it.
# --------------------------------------------------------------------------------------------
PRMT_LAMBDA = ("  auto bb_prmt_ = [](unsigned a, unsigned b, unsigned s) { unsigned d; "
               "asm(\"prmt.b32 %0, %1, %2, %3;\" : \"=r\"(d) : \"r\"(a), \"r\"(b), \"r\"(s)); return d; };")


def _mag_lines(src: str, tag: str, out, table=None) -> list:
    """C lines, one statement each (testing/test_nvfp4.py interprets them): the doubled magnitudes
    of the codes of word ``src``: ``out(0)`` / ``out(1)``: positive codes 0..3 / 4..7 (0 for the
    negative ones), ``out(2)`` / ``out(3)``: the negative codes. ``table``: the names of two
    registers holding MAG2_TABLE (None: the constants)."""
    t = ", ".join(table or [f"0x{v:08x}u" for v in MAG2_TABLE])
    n = f"n{tag}"
    return [f"  const unsigned {n} = {src} ^ 0x{SIGN_FLIP:08x}u;",
            f"  {out(0)} = bb_prmt_({t}, {src});", f"  {out(1)} = bb_prmt_({t}, {src} >> 16);",
            f"  {out(2)} = bb_prmt_({t}, {n});", f"  {out(3)} = bb_prmt_({t}, {n} >> 16);"]


def cuda_helpers(sm=None) -> dict:
    """name -> CUDA source of the GEMV's helpers for ``sm`` (an Arch or a compute capability;
    None: unknown, taken as sm_89+). ``bb_nv_mag``,
    ``bb_nv_dot`` and ``bb_nv_act8`` are straight-line code of one statement per line."""
    h = {"bb_ldw4": load_helpers(4)["bb_ldw4"], "bb_lds4": LDS4}
    h["bb_nv_ldsc"] = r"""
__device__ __forceinline__ unsigned bb_nv_ldsc(const void* p) {
  unsigned short x;
  asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(x) : "l"(p));
  return (unsigned)x;
}
"""
    h["bb_nv_sc2"] = "\n".join(["", "__device__ __forceinline__ void bb_nv_sc2(unsigned s, float* d) {",
                                *e4m3x2_lines("s", lambda t: f"d[{t}]", as_arch(sm).fp8_cvt), "}", ""])
    # the table in two registers the kernel loaded from shared memory (t0, t1): as constants, ptxas
    # keeps them in uniform registers and copies them into ordinary ones before every prmt (70 IMAD
    # per 96 prmt in the 7168 x 16384 kernel's loop)
    lines = ["", "__device__ __forceinline__ void bb_nv_mag(const unsigned* w, unsigned* pm, unsigned t0, "
             "unsigned t1) {", PRMT_LAMBDA]
    for j in range(4):
        lines.append(f"  const unsigned q{j} = w[{j}];")
        lines += _mag_lines(f"q{j}", str(j), lambda x, j=j: f"pm[{4 * j + x}]", table=("t0", "t1"))
    lines += ["}", ""]
    h["bb_nv_mag"] = "\n".join(lines)
    # one 32-code vector: blocks b = 0, 1 (code words 2b, 2b+1; activation words 4b .. 4b+3); the
    # activation scales ``sa`` carry the 1/4 of the doubled values
    lines = ["", "__device__ __forceinline__ float bb_nv_dot(const unsigned* pm, const unsigned* av, const float* sa, "
             "const float* sw, float acc) {"]
    for b in range(2):
        p, n = f"p{b}", f"n{b}"
        lines += [f"  int {p} = 0;", f"  int {n} = 0;"]
        for j in (2 * b, 2 * b + 1):
            for half in range(2):
                lines.append(f"  {p} = __dp4a((int)pm[{4 * j + half}], (int)av[{2 * j + half}], {p});")
                lines.append(f"  {n} = __dp4a((int)pm[{4 * j + 2 + half}], (int)av[{2 * j + half}], {n});")
        lines.append(f"  acc = fmaf((float)({p} - {n}), sw[{b}] * sa[{b}], acc);")
    lines += ["  return acc;", "}", ""]
    h["bb_nv_dot"] = "\n".join(lines)
    h["bb_nv_lds2f"] = r"""
__device__ __forceinline__ void bb_nv_lds2f(const void* p, float* d) {
  const float2 v = *reinterpret_cast<const float2*>(p);
  d[0] = v.x; d[1] = v.y;
}
"""
    # staging of one activation vector: signed doubled values (positive minus negative magnitudes
    # per byte: one of the two is 0), the two scales / 4
    lines = ["", "__device__ __forceinline__ void bb_nv_act8(const unsigned* q, unsigned* o) {", PRMT_LAMBDA]
    for j in range(4):
        lines += _mag_lines(f"q[{j}]", str(j), lambda x, j=j: f"unsigned m{j}_{x}")
        lines += [f"  o[{2 * j}] = __vsub4(m{j}_0, m{j}_2);", f"  o[{2 * j + 1}] = __vsub4(m{j}_1, m{j}_3);"]
    lines += ["}", ""]
    act8 = "\n".join(lines)
    lines = ["__device__ __forceinline__ void bb_nv_stage(const void* codes, const void* sc, void* q0, void* q1, "
             "void* sd) {",
             "  const uint4 v = __ldg(reinterpret_cast<const uint4*>(codes));",
             "  const unsigned q[4] = {v.x, v.y, v.z, v.w};", "  unsigned o[8];", "  bb_nv_act8(q, o);",
             "  *reinterpret_cast<uint4*>(q0) = make_uint4(o[0], o[1], o[2], o[3]);",
             "  *reinterpret_cast<uint4*>(q1) = make_uint4(o[4], o[5], o[6], o[7]);",
             "  const unsigned s = (unsigned)__ldg(reinterpret_cast<const unsigned short*>(sc));",
             "  float f[2];", *e4m3x2_lines("s", lambda t: f"f[{t}]", as_arch(sm).fp8_cvt),
             "  *reinterpret_cast<float2*>(sd) = make_float2(f[0] * 0.25f, f[1] * 0.25f);", "}", ""]
    h["bb_nv_act8"] = act8
    h["bb_nv_stage"] = act8 + "\n".join(lines)      # bb_nv_act8 is only called from here
    return h


# --------------------------------------------------------------------------------------------
# Kernel texts (TVMScript, tirx)
# --------------------------------------------------------------------------------------------
def _signature(add, plan, m_text: str):
    """The kernel's parameters: every tensor batched [L, ...] and strided (last dimension
    contiguous, the output fully strided), the global scales [1]; ``m_text``: the activation
    rows, an int or the symbolic ``m``."""
    c = plan.config
    K2, KS = c.K // 2, c.K // 16
    add("@T.prim_func")
    add("def main(A_ptr: T.handle, W_ptr: T.handle, scale_ptr: T.handle, a_scale_ptr: T.handle, "
        "global_scale_ptr: T.handle, a_global_scale_ptr: T.handle, output_ptr: T.handle):")
    add("    L = T.int32()")
    if not m_text.isdigit():
        add(f"    {m_text} = T.int32()")
    for v in [s for pair in STRIDES.values() for s in pair] + ["sO0", "sO1", "sO2"]:
        add(f"    {v} = T.int32()")
    rows = {"A": m_text, "W": c.N, "scale": c.N, "a_scale": m_text}
    cols = {"A": K2, "W": K2, "scale": KS, "a_scale": KS}
    for name, (s0, s1) in STRIDES.items():
        add(f"    {name} = T.match_buffer({name}_ptr, (L, {rows[name]}, {cols[name]}), 'int8', "
            f"strides=({s0}, {s1}, 1))")
    add("    global_scale = T.match_buffer(global_scale_ptr, (1,), 'float32')")
    add("    a_global_scale = T.match_buffer(a_global_scale_ptr, (1,), 'float32')")
    add(f"    output = T.match_buffer(output_ptr, (L, {m_text}, {c.N}), {c.out_dtype!r}, strides=(sO0, sO1, sO2))")


def gemv_script(plan, hint: NVFP4GemvHint, sm=None) -> str:
    why = nvfp4_gemv_unsupported(plan, hint, sm)
    if why:
        raise ValueError(f"{hint}: {why}")
    c = plan.config
    m, N, K = plan.m, c.N, c.K
    NV, NVB = _positions(K)
    U, NS = split_steps(NVB, hint.unroll)
    R, WARPS = hint.rows_per_warp, hint.warps
    ST = max(1, min(hint.stages, NS))
    NB = -(-N // (R * WARPS))
    threads = 32 * WARPS
    AQW = m * NVB * 256                      # words of staged activation values
    TAB = AQW + m * NVB * 64                 # + 2 float scales per position
    SMW = TAB + TABLE_WORDS                  # + the magnitude table (bb_nv_mag)
    H = cuda_helpers(sm)

    def call(name, *args, ret=None):
        r = f", return_type={ret!r}" if ret else ""
        return f"T.cuda.func_call({name!r}, {', '.join(args)}, source_code={H[name]!r}{r})"

    def aq(i, pos, half, ln):
        return f"(({i}) * {NVB} + ({pos})) * 256 + {half} * 128 + ({ln}) * 4"

    def asc(i, pos, ln):
        return f"{AQW} + ((({i}) * {NVB} + ({pos})) * 32 + ({ln})) * 2"

    L_ = []
    add = L_.append
    _signature(add, plan, str(m))
    add("    T.device_entry()")
    if hint.min_blocks:
        add(f'    T.attr({{"tirx.launch_bounds_min_blocks_per_sm": {hint.min_blocks}}})')
    PF = min(hint.l2_prefetch, NS)
    if hint.pdl and not PF:
        add("    T.ptx.griddepcontrol.wait()")
    for name in ("A", "W", "scale", "a_scale"):
        add(f"    {name}_f = T.decl_buffer((1,), 'int8', data={name}.data)")
    add(f"    out_f = T.decl_buffer((1,), {c.out_dtype!r}, data=output.data)")
    add(f"    bx = T.cta_id([L * {NB}])")
    add(f"    tx = T.thread_id([{threads}])")
    add(f"    wq = T.alloc_local(({ST}, {U}, {R}, 4), 'uint32')")
    add(f"    sr = T.alloc_local(({ST}, {U}, {R}), 'uint32')")
    add("    pm = T.alloc_local((16,), 'uint32')")
    add("    av = T.alloc_local((8,), 'uint32')")
    add("    asv = T.alloc_local((2,), 'float32')")
    add("    wsv = T.alloc_local((2,), 'float32')")
    add("    tab = T.alloc_local((2,), 'uint32')")
    add(f"    acc = T.alloc_local(({R}, {m}), 'float32')")
    add(f"    smem = T.alloc_buffer(({SMW},), 'uint32', scope='shared.dyn', align=16)")
    add("    lane = T.meta_var(tx % 32)")
    add(f"    lb = T.meta_var(bx // {NB})")
    add(f"    n0 = T.meta_var((bx % {NB} * {WARPS} + tx // 32) * {R})")
    add(f"    for r, i in T.grid({R}, {m}):")
    add("        acc[r, i] = T.float32(0)")

    def cexpr(step):
        return f"((({step}) * {U} + u) * 32 + lane)"

    def vec_ptrs(step):
        """Pointers to this lane's weight vector of row ``n0 + r`` at ``step`` and to its two scales."""
        cl = cexpr(step) if NV % 32 == 0 else f"T.min({cexpr(step)}, {NV - 1})"
        nr = f"T.min(n0 + r, {N - 1})"
        return [f"W_f.ptr_to([lb * sW0 + {nr} * sW1 + {cl} * 16])",
                f"scale_f.ptr_to([lb * sS0 + {nr} * sS1 + {cl} * 2])"]

    if PF:
        l2_prefetch(add, hint, PF, U, R, vec_ptrs)

    def load(ind, step, slot):
        wptr, sptr = vec_ptrs(step)
        add(f"{ind}for u in T.unroll({U}):")
        add(f"{ind}    for r in T.unroll({R}):")
        add(f"{ind}        " + call("bb_ldw4", wptr, f"wq.ptr_to([{slot}, u, r, 0])"))
        add(f"{ind}        sr[{slot}, u, r] = " + call("bb_nv_ldsc", sptr, ret="uint32"))

    def act(ind, i, step):
        pos = f"({step}) * {U} + u"
        add(f"{ind}" + call("bb_lds4", f"smem.ptr_to([{aq(i, pos, 0, 'lane')}])", "av.ptr_to([0])"))
        add(f"{ind}" + call("bb_lds4", f"smem.ptr_to([{aq(i, pos, 1, 'lane')}])", "av.ptr_to([4])"))
        add(f"{ind}" + call("bb_nv_lds2f", f"smem.ptr_to([{asc(i, pos, 'lane')}])", "asv.ptr_to([0])"))

    def process(ind, step, slot):
        add(f"{ind}for u in T.unroll({U}):")
        ind1 = ind + "    "
        if NV % 32:
            add(f"{ind1}if {cexpr(step)} < {NV}:")
            ind1 += "    "
        if m == 1:                           # one activation row: read once for all R weight rows
            act(ind1, "0", step)
        add(f"{ind1}for r in T.unroll({R}):")
        ind2 = ind1 + "    "
        add(f"{ind2}" + call("bb_nv_sc2", f"sr[{slot}, u, r]", "wsv.ptr_to([0])"))
        add(f"{ind2}" + call("bb_nv_mag", f"wq.ptr_to([{slot}, u, r, 0])", "pm.ptr_to([0])", "tab[0]", "tab[1]"))
        add(f"{ind2}for i in T.unroll({m}):")
        if m > 1:
            act(ind2 + "    ", "i", step)
        add(f"{ind2}    acc[r, i] = " + call("bb_nv_dot", "pm.ptr_to([0])", "av.ptr_to([0])", "asv.ptr_to([0])",
                                             "wsv.ptr_to([0])", "acc[r, i]", ret="float32"))

    def stage():
        """Every thread decodes activation vectors tx, tx + threads, .. (row idx // NV, vector
        idx % NV) into shared memory; then the block synchronises."""
        tot = m * NV
        add(f"    for it in T.serial({-(-tot // threads)}):")
        ind = "        "
        idx = f"(it * {threads} + tx)"
        if tot % threads:
            add(f"{ind}if {idx} < {tot}:")
            ind += "    "
        i, cc = f"{idx} // {NV}", f"{idx} % {NV}"
        add(f"{ind}" + call("bb_nv_stage", f"A_f.ptr_to([lb * sA0 + {i} * sA1 + {cc} * 16])",
                            f"a_scale_f.ptr_to([lb * sB0 + {i} * sB1 + {cc} * 2])",
                            f"smem.ptr_to([{aq(i, f'{cc} // 32', 0, f'{cc} % 32')}])",
                            f"smem.ptr_to([{aq(i, f'{cc} // 32', 1, f'{cc} % 32')}])",
                            f"smem.ptr_to([{asc(i, f'{cc} // 32', f'{cc} % 32')}])"))
        add("    if tx < 32:")
        for j, v in enumerate(MAG2_TABLE):
            add(f"        smem[{TAB} + tx * 2 + {j}] = T.uint32({v})")
        add("    T.cuda.cta_sync()")
        # read back from the lane's own copy: values ptxas cannot prove uniform or constant stay in
        # ordinary registers through the loop (bb_nv_mag)
        for j in range(2):
            add(f"    tab[{j}] = smem[{TAB} + lane * 2 + {j}]")

    step_loop(add, NS, ST, load, process, after_prologue=stage)
    pdl_trigger(add, hint)
    add(f"    for r in T.unroll({R}):")
    add(f"        for i in T.unroll({m}):")
    add("            acc[r, i] = T.cuda.warp_sum(acc[r, i])")
    add(f"            if lane == (r * {m} + i) % 32 and n0 + r < {N}:")
    add(f"                out_f[lb * sO0 + i * sO1 + (n0 + r) * sO2] = T.Cast({c.out_dtype!r}, "
        "acc[r, i] * (global_scale[0] * a_global_scale[0]))")
    return "\n".join(L_) + "\n"


def cpu_script(plan, hint: NVFP4CPUHint) -> str:
    """The CPU kernel: symbolic rows and batch, strided like the CUDA ones (LLVM's lowering
    honours the declared strides). Per (batch, weight row, activation row) the K/16 block dot
    products of doubled values in int32, each times its two scales and 1/4, summed in float32."""
    c = plan.config
    N, KS = c.N, c.K // 16
    NT = -(-N // hint.n_tile)
    mag = f"T.uint32(0x{MAG2_NIBBLES:08x})"
    L_ = []
    add = L_.append
    _signature(add, plan, "m")
    add(f"    for lt in T.parallel(L * {NT}):")
    add("        acc = T.alloc_buffer((1,), 'float32', scope='local')")
    add("        dot = T.alloc_buffer((1,), 'int32', scope='local')")
    add(f"        for nn, i in T.grid({hint.n_tile}, m):")
    add(f"            if lt % {NT} * {hint.n_tile} + nn < {N}:")
    ind = "                "
    n, l = f"(lt % {NT} * {hint.n_tile} + nn)", f"(lt // {NT})"
    add(f"{ind}acc[0] = T.float32(0)")
    add(f"{ind}for kb in range({KS}):")
    add(f"{ind}    dot[0] = 0")
    add(f"{ind}    for kk in range(16):")
    k2 = "kb * 8 + kk // 2"
    for v, buf, row in (("wc", "W", n), ("ac", "A", "i")):
        add(f"{ind}        {v} = T.shift_right(T.Cast('int32', {buf}[{l}, {row}, {k2}]), (kk % 2) * 4) & 15")
    for v, code in (("wv", "wc"), ("xv", "ac")):
        add(f"{ind}        {v} = T.Cast('int32', T.shift_right({mag}, T.Cast('uint32', ({code} & 7) * 4)) "
            "& T.uint32(15))")
    add(f"{ind}        dot[0] = dot[0] + T.if_then_else(((wc ^ ac) & 8) != 0, 0 - wv * xv, wv * xv)")
    add(f"{ind}    acc[0] = acc[0] + T.Cast('float32', dot[0]) * ({_e4m3_text(f'scale[{l}, {n}, kb]')} * "
        f"{_e4m3_text('a_scale[' + l + ', i, kb]')} * T.float32(0.25))")
    add(f"{ind}output[{l}, i, {n}] = T.Cast({c.out_dtype!r}, acc[0] * (global_scale[0] * a_global_scale[0]))")
    return "\n".join(L_) + "\n"


def _e4m3_text(b: str) -> str:
    """TVMScript text: the float8_e4m3 bit pattern ``b`` (int8) -> float32, exact (bb_e4m3f's rule:
    normal numbers rebiased in the bit pattern, subnormals m * 2**-9)."""
    u = f"(T.Cast('int32', {b}) & 255)"
    mg = f"({u} & 127)"
    normal = f"T.reinterpret('float32', T.Cast('uint32', T.shift_left({mg} + 960, 20)))"
    v = f"T.if_then_else({mg} >= 8, {normal}, T.Cast('float32', {mg}) * T.float32(0.001953125))"
    return f"T.if_then_else(({u} & 128) != 0, T.float32(0) - {v}, {v})"


# e2m1 code -> float8_e4m3 byte of its value times 2**-6, four codes per word (one per byte, each
# byte's code in its low nibble): byte = 4 * c + 12 * (c & 8). The sign bit goes to bit 7 and the
# three magnitude bits (e1 e0 m) to bits 4..2: exponent field e, mantissa 4 * m, so a normal code is
# 2**(e - 7) * (1 + m / 2) and a subnormal one (e = 0) m / 2 * 2**-6, each its e2m1 value times
# 2**-6. No byte carries into the next (at most 4 * 15 + 96 = 156).
E4M3_SIGN_MASK = 0x08080808
E4M3_SIGN_MUL = 12
E4M3_SHIFT = -6                          # the byte's value is the code's times 2**E4M3_SHIFT
DEC_PAIR_SEL = (0x5140, 0x7362)          # prmt(even codes' bytes, odd codes' bytes): codes 0..3, 4..7
UNSHIFT_H2 = ((15 - E4M3_SHIFT) << 10) * 0x10001   # float16 pair (2**6, 2**6): the block scales times it


def e4m3_code_bytes(nib4: int) -> int:
    """The decode kernel's word rule on one word of four code nibbles (one per byte, low nibble):
    their float8_e4m3 bytes (testing/test_nvfp4.py checks it against torch's e4m3 values)."""
    return (nib4 * 4 + (nib4 & E4M3_SIGN_MASK) * E4M3_SIGN_MUL) & 0xFFFFFFFF


def _dec8_source(sm) -> str:
    """``bb_nv_dec8(q, sb, dst)``: one word of 8 codes and its block scale byte -> 8 float16 values
    (one 16-byte store). sm_89+: the even and odd codes' nibbles spread to bytes,
    :func:`e4m3_code_bytes` (each value times 2**E4M3_SHIFT), two ``prmt`` back into code order,
    ``cvt.rn.f16x2.e4m3x2`` per pair, times the block scale times 2**-E4M3_SHIFT (a power of two:
    exact) in one ``mul.f16x2``; without the float8 conversion, per code in float32."""
    L_ = ["", "__device__ __forceinline__ void bb_nv_dec8(unsigned q, unsigned sb, void* dst) {", "  unsigned h[4];"]
    if as_arch(sm).fp8_cvt:
        L_ += ["  unsigned sc;",
               "  asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(sc) : \"h\"((unsigned short)(sb * 0x101u)));",
               f"  asm(\"mul.rn.f16x2 %0, %1, %2;\" : \"=r\"(sc) : \"r\"(sc), \"r\"(0x{UNSHIFT_H2:08x}u));",
               "  const unsigned lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;",
               f"  const unsigned el = lo * 4u + (lo & 0x{E4M3_SIGN_MASK:08x}u) * {E4M3_SIGN_MUL}u;",
               f"  const unsigned eh = hi * 4u + (hi & 0x{E4M3_SIGN_MASK:08x}u) * {E4M3_SIGN_MUL}u;",
               f"  const unsigned b0 = __byte_perm(el, eh, 0x{DEC_PAIR_SEL[0]:04x}), "
               f"b1 = __byte_perm(el, eh, 0x{DEC_PAIR_SEL[1]:04x});",
               "  const unsigned short p[4] = {(unsigned short)(b0 & 0xFFFFu), (unsigned short)(b0 >> 16), "
               "(unsigned short)(b1 & 0xFFFFu), (unsigned short)(b1 >> 16)};",
               "  for (int t = 0; t < 4; ++t) {",
               "    unsigned v;",
               "    asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(v) : \"h\"(p[t]));",
               "    asm(\"mul.rn.f16x2 %0, %1, %2;\" : \"=r\"(h[t]) : \"r\"(v), \"r\"(sc));",
               "  }"]
    else:
        L_ += ["  float s[2];", *e4m3x2_lines("sb", lambda t: f"s[{t}]", False),
               "  for (int t = 0; t < 8; t += 2) {",
               "    float v[2];",
               "    for (int e = 0; e < 2; ++e) {",
               "      const unsigned c = (q >> (4 * (t + e))) & 15u;",
               "      v[e] = (float)((0xC8643210u >> ((c & 7u) * 4)) & 15u) * ((c & 8u) ? -0.5f : 0.5f) * s[0];",
               "    }",
               "    unsigned short a_, b_;",
               "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(a_) : \"f\"(v[0]));",
               "    asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(b_) : \"f\"(v[1]));",
               "    h[t / 2] = (unsigned)a_ | ((unsigned)b_ << 16);",
               "  }"]
    L_ += ["  *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);", "}", ""]
    return "\n".join(L_)


DEC_WORDS = 4            # code words per thread of the decode kernel, a warp's 32 apart


def decode_script(K: int, sm=None, threads: int = 256) -> str:
    """The decode kernel of one batch index: codes [R, K/2] and block scales [R, K/16] (row strides
    and R at run time) -> float16 values [R, K] (compact). A warp takes 32 * DEC_WORDS consecutive
    words of 8 codes (word e: row e // (K/8), the output's 8 values at 8 * e), each lane every
    32nd: first all its 4-byte code and 1-byte scale loads (each a coalesced warp load), then per
    word the decode (:func:`_dec8_source`) and one 16-byte store (a warp's: 512 contiguous
    bytes)."""
    K2, KS, K8 = K // 2, K // 16, K // 8
    W = DEC_WORDS
    body = _dec8_source(sm)
    L_ = []
    add = L_.append
    add("@T.prim_func")
    add("def main(codes_ptr: T.handle, scales_ptr: T.handle, out_ptr: T.handle):")
    for v in ("R", "sC", "sS"):
        add(f"    {v} = T.int32()")
    add(f"    codes = T.match_buffer(codes_ptr, (R, {K2}), 'int8', strides=(sC, 1))")
    add(f"    scales = T.match_buffer(scales_ptr, (R, {KS}), 'int8', strides=(sS, 1))")
    add(f"    out = T.match_buffer(out_ptr, (R, {K}), 'float16', align=16)")
    add("    T.device_entry()")
    add("    codes_f = T.decl_buffer((1,), 'int8', data=codes.data)")
    add("    scales_f = T.decl_buffer((1,), 'int8', data=scales.data)")
    add("    out_f = T.decl_buffer((1,), 'float16', data=out.data)")
    add(f"    bx = T.cta_id([T.ceildiv(R * {K8}, {threads * W})])")
    add(f"    tx = T.thread_id([{threads}])")
    add(f"    q = T.alloc_local(({W},), 'uint32')")
    add(f"    sb = T.alloc_local(({W},), 'uint32')")
    add(f"    e0 = T.meta_var((bx * {threads // 32} + tx // 32) * {32 * W} + tx % 32)")
    add(f"    for i in T.unroll({W}):")
    add("        e = T.meta_var(e0 + i * 32)")
    add(f"        if e < R * {K8}:")
    add(f"            q[i] = T.cuda.func_call('bb_nv_ldw1', codes_f.ptr_to([e // {K8} * sC + e % {K8} * 4]), "
        f"source_code={_LDW1!r}, return_type='uint32')")
    add(f"            sb[i] = T.Cast('uint32', T.Cast('int32', scales_f[e // {K8} * sS + e % {K8} // 2]) & 255)")
    add(f"    for i in T.unroll({W}):")
    add("        e = T.meta_var(e0 + i * 32)")
    add(f"        if e < R * {K8}:")
    add(f"            T.cuda.func_call('bb_nv_dec8', q[i], sb[i], out_f.ptr_to([e * 8]), source_code={body!r})")
    return "\n".join(L_) + "\n"


_LDW1 = r"""
__device__ __forceinline__ unsigned bb_nv_ldw1(const void* p) {
  unsigned x;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(x) : "l"(p));
  return x;
}
"""


def _pdl_attr(f, hint):
    if not hint.pdl:
        return f
    tags = ["blockIdx.x", "threadIdx.x", "tirx.use_programtic_dependent_launch", "tirx.use_dyn_shared_memory"]
    return f.with_attr("tirx.kernel_launch_params", tags)


def schedule_nvfp4(plan, hint, target=None):
    """IRModule of the NVFP4 x NVFP4 kernel of ``plan``: the CPU kernel or the CUDA GEMV."""
    from tvm.script import tirx as T
    if plan.target_kind == "cpu":
        if not isinstance(hint, NVFP4CPUHint):
            raise ValueError(f"hint={hint!r}: the CPU kernel of nvfp4 activations takes an NVFP4CPUHint")
        prim = tvm.script.from_source(cpu_script(plan, hint), extra_vars={"T": T})
        return tvm.IRModule({"main": prim})
    if not isinstance(hint, NVFP4GemvHint):
        raise ValueError(f"hint={hint!r}: the CUDA kernel of nvfp4 activations takes an NVFP4GemvHint")
    arch = arch_of(target)
    if hint.pdl and not arch.pdl:
        raise ValueError(f"NVFP4GemvHint.pdl=True needs an sm_90+ target; target arch is {arch.name()}")
    prim = tvm.script.from_source(gemv_script(plan, hint, arch), extra_vars={"T": T})
    return tvm.IRModule({"main": _pdl_attr(prim, hint)}).with_attr(TIRX_PIPELINE_ATTR, "tirx")


def decode_module(K: int, target=None):
    """IRModule of the decode kernel (:func:`decode_script`) for ``target``."""
    from tvm.script import tirx as T
    prim = tvm.script.from_source(decode_script(K, arch_of(target)), extra_vars={"T": T})
    return tvm.IRModule({"main": prim}).with_attr(TIRX_PIPELINE_ATTR, "tirx")
