"""The Hopper (sm_90a) tensor-core template: TMA + mbarrier ring + wgmma, warp-specialized.

For plans whose weights need no decoding: float16 x float16 and bfloat16 x bfloat16 (fp32
accumulate), int8 x int8 (int32), float8 x float8 (e4m3 / e5m2, fp32), each with an epilogue of
per-channel weight scales, per-token activation scales and bias (the scales of the 8-bit paths
apply to whole K sums, so only per-channel scales qualify). Hand-written TIRx, generated per
plan as TVMScript text, compiled with TVM's "tirx" pipeline for ``sm_90a``.

One CTA = one producer warpgroup + ``consumers`` (1 or 2) consumer warpgroups, a BM x BN output
tile with BM = 64 * consumers:

* producer: one thread issues ``cp.async.bulk.tensor`` (TMA) loads of a BM x BK activation tile
  and a BN x BK weight tile (128-byte rows, 128-byte swizzle) per K step into a ``stages``-deep
  ring in shared memory; ``full[s]`` (expect-tx) says a stage landed, ``empty[s]`` (one arrive per
  consumer warp) that its readers are done. The producer warpgroup gives registers away
  (``setmaxnreg.dec 40``), the consumers take them (``setmaxnreg.inc 232``);
* consumers: warpgroup w owns rows 64w..64w+63: per K step it waits on ``full``, issues
  BK*eb/32 ``wgmma.mma_async m64nBNk16`` (k32 for 8-bit inputs) straight from the swizzled
  tiles (shared-memory descriptors encoded once, in uniform registers; each wgmma adds its
  stage's and k step's offset), commits, and waits for the previous
  step's group (``wait_group 1``) before releasing that stage: one group of tensor-core work is
  always in flight;
* epilogue: accumulators (BN/2 registers per thread, the m64nN fragment: lane l of warp q owns
  rows 16q + l/4 (+8), columns 8j + 2(l%4) (+1)) -> scales, bias, cast -> global. 16-bit
  outputs with N a multiple of 8: a lane quad transposes its four 8-column blocks of a row
  (shuffles) and each lane stores one block as 16 bytes; otherwise (and for a row's last,
  partial 32 columns) column pairs go out as one 32-bit word. Rows >= M and columns >= N are
  predicated off (TMA fills out-of-range tiles with zeros, so any M, N, and K with 16-byte rows
  work);
* ``persistent``: a grid of min(tiles, SMs) CTAs walks the tiles (grouped raster: ``group_m``
  row tiles per band) and the ring runs on across tiles, so the producer fetches the next tile
  while the consumers store the last; otherwise one CTA per tile in the same order;
* ``cluster=2``: CTA pairs (a 2-CTA cluster launch) on adjacent row tiles of one column tile; each
  CTA loads its own A tile and half of the W tile, multicast into the same ring slot of both CTAs
  (``.multicast::cluster`` TMA; ``full`` still expects the whole stage's bytes), and each consumer
  warp releases the slot in both CTAs (``empty`` counts the warps of both); the pair meets at a
  cluster barrier after the mbarrier init and before exit. The persistent grid walks pair tiles.
  A consumer's release is a default (``.release.cta``) arrive: a ``.release.cluster`` arrive there,
  every K step, doubled the kernel's time on an H100.

Against cuBLAS (ncu on an H100, float16 4096 x 8192 x 8192; not yet checked on the H200): cuBLAS
runs the same 128 x 256 tile with 4 stages (``nvjet_sm90_hsh_128x256_64x4_2x1``) in CTA pairs
with multicast, and this kernel keeps the tensor pipe as busy (about 97% of the active cycles)
in the same time. What that takes: few consumer instructions per k step (descriptors encoded per
k step kept it near 89%) and an epilogue that does not queue on the LSU (4-byte stores did; the
tensor pipe idles while both warpgroups store). L2 traffic is not the bound: the pairs cut the
L2 -> SM bytes by a fifth without changing the time. The tuner measures both.

Group scales on 8-bit inputs (a float32 promotion every K tile) cost about half again the time
(H200, 4096 x 8192 x 8192, int8: 634-661 µs against 445 per channel; float8 g128 616-627): ncu
(one launch, default clocks) shows 4.2x the instructions of the per-channel kernel (303.6 M against
72.7 M: ~220 more per consumer warp and K tile, the promotion), issue slots 55% busy against 21%, and
the tensor (INT) pipe 48% busy against 77%. Not what bounds it (measured, local branch
``exp/wgmma-dual-ahead``): the wait for each tile's own wgmma before promoting (two partial-sum sets,
tile t's wgmma running while tile t-1's sums are promoted, in bodies of 8 tiles so that none is in
flight across the loop's back edge, where ptxas serializes them, C7514: int8 634-661 µs against
648-656 with one set; float8 617-627 against 616-623) and the group scales' L2 round trip per K tile
in the stagers (4 tiles loaded ahead: int8 634-656, float8 616-617; 8 ahead: 729 and 627).

float8 g128 against per channel on the same 128-column tile (H200, 4096 x 8192 x 8192,
`benchmark.matmul --hints`): 625-644 µs against 485 (the default 256-column per-channel tile: 438-443),
so ~145 µs is the promotion and its scales, ~45 the narrower tile. ncu (one launch each): L1/TEX
throughput 94% against 63%, 169 M instructions against 71 M, issue slots 36% busy, and 14.7 M of the
19 M L2 sectors "excessive" (the stagers' per-column scale loads, one word of each sector). Refuted
(local branch ``exp/wgmma-order``, correctness checked by the benchmark and the GPU tests of the
group-scaled families): the two consumer warpgroups issuing their wgmma in turn through named
barriers, after the other's issue or after its completion (float8 652 / 662 µs, int8 677 / 694,
against 629 and 657 in the same run); each consumer thread's scales contiguous in shared memory
(16-byte loads, half the wavefronts: float8 634-644, int8 639-644); and on top of that the
stagers loading 4 K tiles' scales per load (8 columns x 4 groups a warp: excessive sectors 14.7 M ->
2.1 M, L1/TEX 94% -> 89%; float8 631, int8 678). So neither shared-memory nor L1 traffic, nor the
two warpgroups promoting at the same time, is what the promotion costs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .._tvm import tvm
from ..arch import Arch, arch_of, as_arch
from .cuda_mma import PTX_FP8
from .epilogue import scaled_sum
from .target import TIRX_PIPELINE_ATTR, WGMMA_ARCH_ATTR

__all__ = ["WGMMAHint", "wgmma_unsupported", "schedule_cuda_wgmma"]

ROW_BYTES = 128                         # one swizzled tile row (BK * element bytes)
HOPPER = Arch.from_sm(90)               # the arch this template is written for (wgmma, TMA)
_SMEM_LIMIT = HOPPER.optin_smem_per_block      # its opt-in shared memory per block
_TMA = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
# wgmma N of s8 inputs in TVM 0.27's PTX table (the ISA also has 240 and 256; the table omits them)
_S8_N = (8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224)
# with float32 promotion a consumer thread holds BN/2 partial + BN/2 float32 sums + BN/4 scales
_PROMOTE_MAX_BN = 160
_SCALE_THREADS = 96                     # producer threads (warps 1..3) that stage group scales


@dataclass(frozen=True)
class WGMMAHint:
    """BN output columns per CTA (wgmma N), ``stages``-deep TMA ring, ``consumers`` warpgroups of
    64 rows each (BM = 64 * consumers), ``persistent`` tile loop, ``group_m`` row tiles per raster band."""

    BN: int = 256
    stages: int = 4
    consumers: int = 2
    persistent: bool = True
    group_m: int = 8
    promote: int = 0        # 8-bit inputs: K tiles (128) per float32 promotion of the partial sums (0: group scales' size, else none)
    cluster: int = 1        # 2: CTA pairs on adjacent row tiles of one column tile; each loads half the
                            # weight tile and multicasts it to both (TMA .multicast::cluster)

    @property
    def BM(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    def smem_bytes(self, plan=None) -> int:
        """The ring's bytes, plus (group-scaled ``plan``) the staged float32 scales."""
        scales = self.stages * self.BN * 4 if plan is not None and _group_tiles(plan) else 0
        return self.stages * (self.BM + self.BN) * ROW_BYTES + scales

    def check(self, plan=None):
        if self.consumers not in (1, 2):
            raise ValueError(f"WGMMAHint.consumers={self.consumers!r}: 1 or 2 is accepted")
        if not isinstance(self.BN, int) or self.BN < 16 or self.BN > 256 or self.BN % 16:
            raise ValueError(f"WGMMAHint.BN={self.BN!r}: a multiple of 16 in 16..256 is required")
        if plan is not None and plan.config.A_dtype == "int8" and self.BN not in _S8_N:
            raise ValueError(f"WGMMAHint.BN={self.BN}: int8 wgmma takes N in {_S8_N}")
        if not isinstance(self.stages, int) or self.stages < 2:
            raise ValueError(f"WGMMAHint.stages={self.stages!r}: an int >= 2 is required")
        if self.smem_bytes(plan) > _SMEM_LIMIT:
            raise ValueError(f"{self}: {self.smem_bytes(plan)} bytes of shared memory exceed {_SMEM_LIMIT}")
        if not isinstance(self.group_m, int) or self.group_m < 1:
            raise ValueError(f"WGMMAHint.group_m={self.group_m!r}: an int >= 1 is required")
        if not isinstance(self.promote, int) or self.promote < 0:
            raise ValueError(f"WGMMAHint.promote={self.promote!r}: an int >= 0 is required")
        if self.cluster not in (1, 2):
            raise ValueError(f"WGMMAHint.cluster={self.cluster!r}: 1 or 2 is accepted")
        if plan is not None:
            P = self.promote_tiles(plan)
            if P and elem_bytes(plan) != 1:
                raise ValueError(f"WGMMAHint.promote={self.promote}: promotion applies to 8-bit inputs only")
            if P and _group_tiles(plan) % P:
                raise ValueError(f"WGMMAHint.promote={self.promote}: must divide the K tiles of one scale group "
                                 f"({_group_tiles(plan)})")
            if P and plan.config.out_dtype == "int32":
                raise ValueError(f"WGMMAHint.promote={self.promote}: float32 promotion cannot give an exact int32 output")
            if P and self.BN > _PROMOTE_MAX_BN:
                raise ValueError(f"WGMMAHint.BN={self.BN} with promotion: the partial and float32 accumulators need "
                                 f"BN <= {_PROMOTE_MAX_BN}")
        return self

    def promote_tiles(self, plan) -> int:
        """K tiles (BK = 128 one-byte elements) accumulated in the tensor cores' accumulator
        between float32 promotions: ``promote`` if set; for group-scaled weights 1 with int8
        inputs, one group with float8; else 0 (the whole K in the accumulator)."""
        if self.promote:
            return self.promote
        if _group_tiles(plan):
            # int8: every tile (its int32 sum converts to float32 exactly with two full-rate
            # instructions); float8: once per group
            return 1 if plan.config.A_dtype == "int8" else _group_tiles(plan)
        return 0

    @classmethod
    def default(cls, plan, target=None, rows: Optional[int] = None) -> Optional["WGMMAHint"]:
        """The default tile, or None where the template does not apply (see :func:`wgmma_unsupported`).

        128 x 256 tiles (2 consumer warpgroups), 4 stages, persistent; int8: 128 x 128, 6 stages
        (TVM's s8 wgmma stops at N=224; 128 measured as fast as 224 on the H200); N <= 128: BN=128.
        With few rows, the first of 128 x 256, 128 x 128, 64 x 128, 64 x 64 tiles whose count reaches 90% of
        the SMs (else the smallest). Only rings that fit the target's ``max_shared_memory_per_block``;
        None below 128 KB. ``rows``: size the tiles for this row count instead of the plan's."""
        arch = arch_of(target)
        smem = arch.smem_per_block
        if wgmma_unsupported(plan, arch) is not None:
            return None
        c = plan.config
        big = [] if c.A_dtype == "int8" or c.N <= 128 or _group_tiles(plan) else [cls()]
        # fewer rows: smaller tiles until the tiles fill the SMs (H200, fp16 N=K=4096: m=32..128 run
        # best on 64 x 64 tiles, 256 on 64 x 128, 512 on 128 x 128, >= 1024 on 128 x 256)
        tiles = big + [cls(BN=128, stages=6), cls(BN=128, stages=6, consumers=1), cls(BN=64, stages=8, consumers=1)]
        # a target without the opt-in shared memory (a bare "sm_90" assumes 48 KB) gets no wgmma:
        # rings that small starve the tensor cores; the mma.sync template fits them better
        fits = [h for h in tiles if smem is None or h.smem_bytes(plan) <= smem]
        if not fits:
            return None
        m = plan.m if rows is None else rows     # rows: a call's row count on a symbolic plan
        if m is None:
            return fits[0]
        want = 0.9 * arch.sm_count
        for h in fits:
            if -(-m // h.BM) * -(-c.N // h.BN) >= want:
                return h
        return fits[-1]


def elem_bytes(plan) -> int:
    return 1 if plan.config.A_dtype == "int8" or plan.a.torch_dtype in PTX_FP8 else 2


def _bk(plan) -> int:
    """K elements of one tile (one 128-byte swizzled row)."""
    return ROW_BYTES // elem_bytes(plan)


def _group_tiles(plan) -> int:
    """K tiles per scale group of a group-scaled plan (0: no group scales)."""
    return plan.config.group_size // _bk(plan) if plan.config.with_scaling and plan.groups > 1 else 0


def wgmma_unsupported(plan, sm=None) -> Optional[str]:
    """Why the wgmma template cannot take this plan on ``sm`` (an :class:`bitblas.arch.Arch` or a
    compute capability; None: unknown) (None: it can)."""
    c, a, w = plan.config, plan.a, plan.w
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    arch = as_arch(sm)
    if not arch.wgmma:
        return f"wgmma needs sm_90 (the target's arch is {'unknown' if arch.sm is None else f'sm_{arch.sm}'})"
    if c.layout != "nt":
        return "layout='nn'"
    if c.A_dtype in ("float16", "bfloat16"):
        if c.W_dtype != c.A_dtype:
            return f"W_dtype={c.W_dtype} with A_dtype={c.A_dtype}: the weights would need decoding"
    elif c.A_dtype == "int8":
        if c.W_dtype != "int8":
            return f"W_dtype={c.W_dtype} with int8 activations: only int8 weights go to wgmma as they are"
    elif a.torch_dtype in PTX_FP8:
        if w.torch_dtype not in PTX_FP8:
            return f"W_dtype={c.W_dtype} with float8 activations: float8 weights are needed"
    else:
        return f"A_dtype={c.A_dtype}: the wgmma template takes float16, bfloat16, int8 and float8 activations"
    if c.with_zeros:
        return "with_zeros=True: zero points need a decode"
    if c.with_scaling and not (plan.scale_in_epilogue and plan.groups == 1):
        if elem_bytes(plan) != 1:
            return "group scales: only per-channel scales (group_size=-1 or K) apply in the epilogue"
        if c.group_size % _bk(plan):
            return (f"group_size={c.group_size}: group scales of 8-bit inputs are applied per K tile of "
                    f"{_bk(plan)}, so the group size must be a multiple of it")
    if w.global_scale or (w.kind == "table" and w.torch_dtype not in PTX_FP8):
        return f"W_dtype={c.W_dtype}: table / global-scale formats need a decode"
    if (c.K * elem_bytes(plan)) % 16:
        return f"K={c.K}: TMA needs 16-byte rows (K a multiple of {16 // elem_bytes(plan)})"
    return None


def _wgmma_instr(plan, BN: int):
    """(instruction, trailing immediates, accumulator dtype, K per instruction)."""
    c = plan.config
    if c.A_dtype in ("float16", "bfloat16"):
        p = "f16" if c.A_dtype == "float16" else "bf16"
        return f"wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{p}.{p}", ", T.bool(True), 1, 1, 0, 0", "float32", 16
    if c.A_dtype == "int8":
        return f"wgmma.mma_async.sync.aligned.m64n{BN}k32.s32.s8.s8", ", T.bool(True)", "uint32", 32
    pa, pb = PTX_FP8[plan.a.torch_dtype], PTX_FP8[plan.w.torch_dtype]
    return f"wgmma.mma_async.sync.aligned.m64n{BN}k32.f32.{pa}.{pb}", ", T.bool(True), 1, 1", "float32", 32


_ST2 = r"""
__device__ __forceinline__ void bb_st2(void* p, float a, float b) {
  *reinterpret_cast<unsigned*>(p) = bb_pack2(a, b);
}
"""


# CTA pairs (WGMMAHint.cluster=2): the multicast weight load, the release of a ring slot in both CTAs,
# and the cluster-wide barrier (after the mbarrier init; before exit, while the peer may still arrive)
_CLUSTER = {
    "bb_tma_mc": r"""
__device__ __forceinline__ void bb_tma_mc(void* dst, unsigned long long map, int c0, int c1, void* bar) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst), b = (unsigned)__cvta_generic_to_shared(bar);
  unsigned short mask = 3;
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(d), "l"(map), "r"(c0), "r"(c1), "r"(b), "h"(mask) : "memory");
}
""",
    "bb_arrive_pair": r"""
__device__ __forceinline__ void bb_arrive_pair(void* bar) {
  unsigned a = (unsigned)__cvta_generic_to_shared(bar);
  #pragma unroll
  for (unsigned r = 0; r < 2; ++r) {
    unsigned ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(r));
    // the default .release.cta (see the module docstring)
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(ra) : "memory");
  }
}
""",
    "bb_cluster_sync": r"""
__device__ __forceinline__ void bb_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
""",
    "bb_fence_barrier_init": r"""
__device__ __forceinline__ void bb_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
""",
}


_WG_INDEX = r"""
__device__ __forceinline__ int bb_wg_index() {
  return __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128) - 1, 0);
}
"""


def _cl_call(name: str, *args: str) -> str:
    """TVMScript of a call of the cluster helper ``name``."""
    return f"T.cuda.func_call({', '.join([repr(name), *args])}, source_code={_CLUSTER[name]!r})"


QUAD_TRANSPOSE = r"""
#ifndef BB_QUAD_T
#define BB_QUAD_T
__device__ __forceinline__ void bb_xswap(unsigned& a, unsigned& b, bool c) {
  unsigned t = c ? b : a; b = c ? a : b; a = t;
}
// The 4x4 transpose of words across a lane quad: lane q (= lane % 4) holds v0..v3, and after it
// v[i] holds lane i's v[q] (three shuffles; the per-lane order by XOR with q is two conditional
// swaps, so no register is indexed at run time). Every lane of the warp calls it.
__device__ __forceinline__ void bb_quad_t(unsigned& v0, unsigned& v1, unsigned& v2, unsigned& v3) {
  const unsigned q = threadIdx.x & 3;
  // v[i] <- v[i ^ q]
  bb_xswap(v0, v1, q & 1); bb_xswap(v2, v3, q & 1);
  bb_xswap(v0, v2, q & 2); bb_xswap(v1, v3, q & 2);
  // round k: read lane q ^ k, which sends its v[(q ^ k) ^ k] = v[q] (its v[k]): lane q ^ k's v[q]
  unsigned o1 = __shfl_xor_sync(0xffffffffu, v1, 1);
  unsigned o2 = __shfl_xor_sync(0xffffffffu, v2, 2);
  unsigned o3 = __shfl_xor_sync(0xffffffffu, v3, 3);
  unsigned o0 = v0;
  // o[k] holds lane q ^ k's: put lane i's at i
  bb_xswap(o0, o1, q & 1); bb_xswap(o2, o3, q & 1);
  bb_xswap(o0, o2, q & 2); bb_xswap(o1, o3, q & 2);
  v0 = o0; v1 = o1; v2 = o2; v3 = o3;
}
#endif
"""

_ST4Q = QUAD_TRANSPOSE + r"""
// The 16-byte store of a lane quad's four 8-column blocks of one row: lane q (= lane % 4) holds
// word q (columns 2q, 2q + 1) of blocks 0..3; after the transpose in the quad it holds words 0..3
// of block q and stores them at p, block q's first column, if ok. Every lane of the warp calls it
// (the shuffles); ok only predicates the store.
__device__ __forceinline__ void bb_st4q(void* p, float a0, float b0, float a1, float b1, float a2, float b2,
                                        float a3, float b3, int ok) {
  unsigned v0 = bb_pack2(a0, b0), v1 = bb_pack2(a1, b1), v2 = bb_pack2(a2, b2), v3 = bb_pack2(a3, b3);
  bb_quad_t(v0, v1, v2, v3);
  if (ok) *reinterpret_cast<uint4*>(p) = make_uint4(v0, v1, v2, v3);
}
"""


def _pack_source(out_dtype: str) -> str:
    """``unsigned bb_pack2(float a, float b)``: a and b rounded to ``out_dtype`` (16-bit), a in the
    low half; guarded, as both epilogue stores (``bb_st2``, ``bb_st4q``) carry it in their source."""
    h2, cvt = ("__half2", "__floats2half2_rn") if out_dtype == "float16" else ("__nv_bfloat162",
                                                                              "__floats2bfloat162_rn")
    return ("#ifndef BB_PACK2\n#define BB_PACK2\n"
            "__device__ __forceinline__ unsigned bb_pack2(float a, float b) {\n"
            f"  {h2} h = {cvt}(a, b); return *reinterpret_cast<unsigned*>(&h);\n}}\n#endif\n")


def _st2_source(out_dtype: str) -> str:
    return _pack_source(out_dtype) + _ST2


def _st4q_source(out_dtype: str) -> str:
    return _pack_source(out_dtype) + _ST4Q


def _kernel_script(plan, hint: WGMMAHint, num_sms: int) -> str:
    c = plan.config
    eb = elem_bytes(plan)
    BM, BN, ST = hint.BM, hint.BN, hint.stages
    BK = _bk(plan)
    instr, tail, acc_t, kstep = _wgmma_instr(plan, BN)
    NACC = BN // 2
    A_EL, B_EL = BM * BK, BN * BK
    STAGE_BYTES = (A_EL + B_EL) * eb
    N, K = c.N, c.K
    KT = -(-K // BK)
    tdt = plan.arg("A").dtype                    # int8 for both 8-bit paths (bits), else the float dtype
    m = "m" if plan.m is None else str(plan.m)
    out = c.out_dtype
    pair_store = out in ("float16", "bfloat16") and N % 2 == 0
    tiles_n = -(-N // BN)
    P = hint.promote_tiles(plan)                 # K tiles between float32 promotions (0: none)
    grouped = bool(_group_tiles(plan))

    L = []
    add = L.append
    params = ", ".join(f"{s.name}_ptr: T.handle" for s in plan.args)
    add("@T.prim_func")
    add(f"def main({params}):")
    if plan.m is None:
        add("    m = T.int32()")
    shapes = {"A": (m, K), "W": (N, K), "output": (m, N), "a_scale": (m,)}
    for s in plan.args:
        shp = shapes.get(s.name, tuple(s.shape))
        shp_txt = "(" + ", ".join(str(x) for x in shp) + ("," if len(shp) == 1 else "") + ")"
        align = ", align=16" if s.name in ("A", "W") else ""
        add(f"    {s.name} = T.match_buffer({s.name}_ptr, {shp_txt}, {s.dtype!r}{align})")
    CL = hint.cluster
    for name, rows, box in (("A", m, BM), ("W", N, BN // CL)):
        add(f"    {name}_map: T.let[T.handle('tensormap')] = T.tvm_stack_alloca('tensormap', 1)")
        # dims (inner, outer), outer stride (bytes), box (inner, outer), element strides, interleave 0,
        # swizzle 3 (128B), L2 promotion 2 (128B), OOB fill 0 (zeros)
        add(f"    T.call_packed('runtime.cuTensorMapEncodeTiled', {name}_map, {tdt!r}, 2, {name}.data, "
            f"{K}, {rows}, {K * eb}, {BK}, {box}, 1, 1, 0, 3, 2, 0)")
    add("    T.device_entry()")
    # row tiles, or pairs of them (a pair of CTAs, one per row tile, shares each column tile's weights)
    tiles_m = f"(({m} + {BM * CL - 1}) // {BM * CL})"
    ntiles = f"({tiles_m} * {tiles_n})"
    units = f"T.min({ntiles}, {num_sms // CL})" if hint.persistent else ntiles   # CTAs (clusters) that walk the tiles
    add(f"    bx = T.cta_id([{units} * {CL}])" if CL > 1 else f"    bx = T.cta_id([{units}])")
    if CL > 1:
        add(f"    cl = T.cta_id_in_cluster([{CL}])")
    add(f"    tx = T.thread_id([{hint.threads}])")
    add(f"    Sm = T.alloc_buffer(({ST}, {A_EL + B_EL}), {tdt!r}, scope='shared.dyn', align=1024)")
    add(f"    full = T.alloc_shared(({ST},), 'uint64')")
    add(f"    empty = T.alloc_shared(({ST},), 'uint64')")
    add(f"    acc = T.alloc_local(({NACC},), {acc_t!r})")
    if P:
        add(f"    tot = T.alloc_local(({NACC},), 'float32')")
    if grouped:
        add(f"    Ss = T.alloc_shared(({ST}, {BN}), 'float32')")     # the stage's group scales of the BN columns
        add(f"    sc = T.alloc_local(({NACC // 2},), 'float32')")
    add("    descA: T.uint64")
    add("    descB: T.uint64")
    add("    if tx == 0:")
    add(f"        for s in T.unroll({ST}):")
    # full: the TMA thread's expect-tx arrival (+ one per scale-loading thread of warps 1..3)
    add(f"            T.ptx.mbarrier.init.shared.b64(full.ptr_to([s]), T.uint32({1 + _SCALE_THREADS if grouped else 1}))")
    add(f"            T.ptx.mbarrier.init.shared.b64(empty.ptr_to([s]), T.uint32({4 * hint.consumers * CL}))")
    add("    T.ptx.fence.proxy.async_.shared__cta()")
    if CL > 1:
        # the barriers are initialised before the peer's multicast loads and arrivals reach them
        add(f"    {_cl_call('bb_fence_barrier_init')}")
        add(f"    {_cl_call('bb_cluster_sync')}")
    else:
        add("    T.cuda.cta_sync()")
    G = hint.group_m
    unit = "bx" if CL == 1 else f"(bx // {CL})"
    if hint.persistent:
        n_my = f"(({ntiles} - {unit} + {units} - 1) // {units})"
        tile = f"({unit} + it * {units})"
    else:
        n_my = "1"
        tile = unit

    def tile_coords(ind):
        # grouped raster: bands of G row tiles, columns outer within a band, rows inner
        return [f"{ind}t = {tile}",
                f"{ind}first_m = t // {G * tiles_n} * {G}",
                f"{ind}gsz = T.min({tiles_m} - first_m, {G})",
                f"{ind}mt = first_m + t % {G * tiles_n} % gsz" if CL == 1 else
                f"{ind}mt = (first_m + t % {G * tiles_n} % gsz) * {CL} + cl",       # a pair's row tiles
                f"{ind}nt = t % {G * tiles_n} // gsz"]

    def producer_loop(cond):
        """Threads ``cond`` walk the tiles and K steps; each step waits until its ring slot is free."""
        add(f"        if {cond}:")
        add(f"            for it in T.serial({n_my}):")
        L.extend(tile_coords("                "))
        add(f"                for kt in T.serial({KT}):")
        add(f"                    g = it * {KT} + kt")
        add(f"                    if g >= {ST}:")
        add(f"                        T.cuda.mbarrier_wait(empty.ptr_to([g % {ST}]), (g // {ST} + 1) % 2)")

    # producer
    add("    if tx < 128:")
    add("        T.ptx['setmaxnreg.dec.sync.aligned.u32'](40)")
    if grouped:
        # warps 1..3 stage the K tile's group scales of the BN columns in shared memory (each
        # consumer thread then reads its columns' scales there instead of from global memory)
        producer_loop(f"tx >= {128 - _SCALE_THREADS}")
        add(f"                    for q in T.unroll({-(-BN // _SCALE_THREADS)}):")
        add(f"                        cs = q * {_SCALE_THREADS} + tx - {128 - _SCALE_THREADS}")
        add(f"                        if cs < {BN}:")
        add(f"                            Ss[g % {ST}, cs] = T.Cast('float32', scale[T.min(nt * {BN} + cs, {N - 1}), "
            f"kt * {BK} // {c.group_size}])")
        add(f"                    T.ptx.mbarrier.arrive.shared.b64(full.ptr_to([g % {ST}]), T.uint32(1))")
    producer_loop("tx == 0")
    add(f"                    T.ptx.mbarrier.arrive.expect_tx.shared.b64(full.ptr_to([g % {ST}]), T.uint32({STAGE_BYTES}))")
    add(f"                    T.ptx[{_TMA!r}](Sm.ptr_to([g % {ST}, 0]), T.address_of(A_map), kt * {BK}, mt * {BM}, "
        f"full.ptr_to([g % {ST}]))")
    if CL == 1:
        add(f"                    T.ptx[{_TMA!r}](Sm.ptr_to([g % {ST}, {A_EL}]), T.address_of(W_map), kt * {BK}, nt * {BN}, "
            f"full.ptr_to([g % {ST}]))")
    else:           # this CTA's half of the weight tile, into the same slot of both CTAs
        half = BN // CL
        add("                    " + _cl_call("bb_tma_mc", f"Sm.ptr_to([g % {ST}, {A_EL} + cl * {half * BK}])",
                                                  "T.address_of(W_map)", f"kt * {BK}", f"nt * {BN} + cl * {half}",
                                                  f"full.ptr_to([g % {ST}])"))
    # consumers
    add("    else:")
    add("        T.ptx['setmaxnreg.inc.sync.aligned.u32'](232)")
    # the consumer warpgroup, broadcast from lane 0 so that the compiler knows it is warp-uniform
    # (as CUTLASS does): the descriptors below then live in uniform registers
    add(f"        wg = T.cuda.func_call('bb_wg_index', source_code={_WG_INDEX!r}, return_type='int32')")
    add("        t4 = tx % 128")
    # the descriptors of stage 0, k step 0 (this warpgroup's A rows, the W tile), encoded once; a
    # stage and k step add their byte offset / 16 to the start-address field (bits 0-13), which
    # gives the encoder's own descriptor of that address (it sets base offset 0 and address >> 4)
    # because the ring ends below 256 KB: the sum never carries out of the field
    assert ST * STAGE_BYTES <= 1 << 18, "the ring must end below 256 KB (descriptor start-address field)"
    add(f"        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descA), Sm.ptr_to([0, wg * {64 * BK}]), 1, 64, 3)")
    add(f"        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB), Sm.ptr_to([0, {A_EL}]), 1, 64, 3)")
    add(f"        for it in T.serial({n_my}):")
    L.extend(tile_coords("            "))
    add(f"            for i in T.unroll({NACC}):")
    add(f"                acc[i] = T.{acc_t}(0)")
    if P:
        add("                tot[i] = T.float32(0)")
    add(f"            for kt in T.serial({KT}):")
    add(f"                g = it * {KT} + kt")
    add(f"                T.cuda.mbarrier_wait(full.ptr_to([g % {ST}]), (g // {ST}) % 2)")
    add(f"                for i in T.unroll({NACC}):")
    add("                    T.cuda.wgmma.noop_barrier(acc[i])")
    add("                T.ptx.wgmma.fence.sync.aligned()")
    add(f"                for kk in T.unroll({BK // kstep}):")
    step = f"T.uint64(g % {ST} * {STAGE_BYTES // 16} + kk * {kstep * eb // 16})"     # 16-byte units
    dA, dB = f"descA + {step}", f"descB + {step}"
    accs = ", ".join(f"acc[{i}]" for i in range(NACC))
    if P:     # the first instruction of a promotion chunk overwrites the partial sums (scale-d = 0)
        first = "kk > 0" if P == 1 else f"kk > 0 or kt % {P} != 0"
        tail = tail.replace("T.bool(True)", f"T.bool({first})", 1)
    add(f"                    T.ptx[{instr!r}]({accs}, {dA}, {dB}{tail})")
    add("                T.ptx.wgmma.commit_group.sync.aligned()")
    def release(slot):
        """One consumer warp's release of ring slot ``slot`` (in both CTAs of a pair)."""
        if CL == 1:
            return f"T.ptx.mbarrier.arrive.shared.b64(empty.ptr_to([{slot}]), T.uint32(1))"
        return _cl_call("bb_arrive_pair", f"empty.ptr_to([{slot}])")

    release_prev = release(f"(g + {ST - 1}) % {ST}")
    if not P:
        add("                T.ptx.wgmma.wait_group.sync.aligned(1)")
        add(f"                for i in T.unroll({NACC}):")
        add("                    T.cuda.wgmma.noop_barrier(acc[i])")
        add("                if kt > 0 and t4 % 32 == 0:")
        add(f"                    {release_prev}")
        add("            T.ptx.wgmma.wait_group.sync.aligned(0)")
        add(f"            for i in T.unroll({NACC}):")
        add("                T.cuda.wgmma.noop_barrier(acc[i])")
        add("            if t4 % 32 == 0:")
        add(f"                {release(f'(it * {KT} + {KT - 1}) % {ST}')}")
    else:
        # every P-th K tile (and the last): wait for all wgmma, add the partial sums (times the
        # group's scales) to the float32 sums, restart them; the stage of the previous K tile is
        # released once its wgmma is done (unless the previous tile ended a chunk: already released)
        add(f"                if (kt + 1) % {P} == 0 or kt == {KT - 1}:")
        if grouped:
            add(f"                    for j in T.unroll({BN // 8}):")
            add("                        for e in T.unroll(2):")
            add(f"                            sc[j * 2 + e] = Ss[g % {ST}, j * 8 + t4 % 4 * 2 + e]")
        add("                    T.ptx.wgmma.wait_group.sync.aligned(0)")
        add(f"                    for i in T.unroll({NACC}):")
        add("                        T.cuda.wgmma.noop_barrier(acc[i])")
        if acc_t != "uint32":
            part = "acc[i]"
        elif P == 1:
            # |one K tile's int32 sum| <= 128 * 128 * 128 = 2**21 < 2**22: exact through the float
            # bits of 1.5 * 2**23 + x (an integer add and a float subtract; I2F runs at 1/8 rate)
            part = "(T.reinterpret('float32', acc[i] + T.uint32(0x4B400000)) - T.float32(12582912))"
        else:
            part = "T.Cast('float32', T.reinterpret('int32', acc[i]))"
        if grouped:
            part = f"{part} * sc[i // 4 * 2 + i % 2]"
        add(f"                    for i in T.unroll({NACC}):")
        add(f"                        tot[i] = tot[i] + {part}")
        add("                    if t4 % 32 == 0:")
        if P > 1:
            add(f"                        if kt % {P} != 0:")
            add(f"                            {release_prev}")
        add(f"                        {release(f'g % {ST}')}")
        add("                else:")
        add("                    T.ptx.wgmma.wait_group.sync.aligned(1)")
        add(f"                    for i in T.unroll({NACC}):")
        add("                        T.cuda.wgmma.noop_barrier(acc[i])")
        add(f"                    if kt % {P} != 0 and t4 % 32 == 0:")
        add(f"                        {release_prev}")
    # epilogue
    def value(e, j="j", cc="cc", r="r"):
        v = f"{'tot' if P else 'acc'}[{j} * 4 + h * 2 + {e}]"
        vt = "float32"
        if acc_t == "uint32" and not P:
            v, vt = f"T.reinterpret('int32', {v})", "int32"
        v, vt = scaled_sum(plan, v, vt, r, f"{cc} + {e}")
        return (f"T.Cast('float32', {v})", "float32") if pair_store and vt != "float32" else (v, vt)

    row = f"mt * {BM} + wg * 64 + t4 // 32 * 16 + t4 % 32 // 4 + h * 8"
    # 16-bit outputs whose rows are whole 16-byte words: a lane quad's four 8-column blocks of a row
    # go out as one 16-byte store per lane after a transpose in the quad (bb_st4q) where all 32
    # columns are in range (uniform over the warp; else the 4-byte pairs below): the tensor pipe
    # idles while both warpgroups store, and 4-byte stores stall on the LSU queue (module docstring)
    quad = pair_store and N % 8 == 0 and BN % 32 == 0
    add(f"            for j{'q' if quad else ''} in T.unroll({BN // 32 if quad else BN // 8}):")
    add("                for h in T.unroll(2):")
    add(f"                    r = {row}")
    ind = "                    "
    if quad:
        add(f"                    c0 = nt * {BN} + jq * 32")
        add(f"                    if c0 + 32 <= {N}:")
        # every lane takes part in the shuffles: rows past the call's are computed from the last
        # row's activation scale and not stored
        add(f"                        rs = T.min(r, {m} - 1)")
        vals = []
        for k in range(4):
            for e in range(2):
                vals.append(value(e, f"(jq * 4 + {k})", f"(c0 + {8 * k} + t4 % 4 * 2)", "rs")[0])
        add(f"                        T.cuda.func_call('bb_st4q', output.ptr_to([rs, c0 + t4 % 4 * 8]), "
            f"{', '.join(vals)}, T.Cast('int32', r < {m}), source_code={_st4q_source(out)!r})")
        add("                    else:")
        add("                        for k in T.unroll(4):")
        add("                            j = jq * 4 + k")
        ind = "                            "
    add(f"{ind}cc = nt * {BN} + j * 8 + t4 % 4 * 2")
    add(f"{ind}if r < {m}:")
    if pair_store:
        v0, _ = value(0)
        v1, _ = value(1)
        add(f"{ind}    if cc < {N}:")
        add(f"{ind}        T.cuda.func_call('bb_st2', output.ptr_to([r, cc]), {v0}, {v1}, "
            f"source_code={_st2_source(out)!r})")
    else:
        for e in range(2):
            v, _ = value(e)
            add(f"{ind}    if cc + {e} < {N}:")
            add(f"{ind}        output[r, cc + {e}] = T.Cast({out!r}, {v})")
    if CL > 1:
        add(f"    {_cl_call('bb_cluster_sync')}")     # the peer may still arrive on this CTA's barriers
    return "\n".join(L) + "\n"


def schedule_cuda_wgmma(func, plan, hint: Optional[WGMMAHint] = None, target=None):
    """IRModule of the wgmma kernel for ``plan`` (``func``, the plan's TensorIR, is not used: the
    kernel is written directly). Carries the tirx-pipeline and sm_90a attributes for the build."""
    why = wgmma_unsupported(plan, HOPPER)
    if why:
        raise ValueError(f"wgmma template does not take this plan: {why}")
    hint = (hint or WGMMAHint.default(plan, target) or WGMMAHint()).check(plan)
    from tvm.script import tirx as T
    text = _kernel_script(plan, hint, arch_of(target).sm_count)
    prim = tvm.script.from_source(text, extra_vars={"T": T})
    mod = tvm.IRModule({"main": prim})
    return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx").with_attr(WGMMA_ARCH_ATTR, HOPPER.wgmma_arch)
