"""The fused mixed-input Hopper GEMM for more rows than the wgmma GEMV takes (``FusedWgmmaHint``,
sm_90a, float16 / bfloat16 activations x int/uint 2-, 4- and 8-bit codes, fp4_e2m1, nvfp4 (two
float8 block scales per vector, per decoded pair), nf4 (4-bit tables) and float8 weights; the mma
GEMV's decoder of the format; int8 and float8_e4m3 activations x int/uint 2- and 4-bit codes, below): packed weights
stay packed in HBM and are decoded in registers straight into the ``wgmma`` A operand; no global
temporary but the permuted activations (rows x K values, as the wgmma GEMV), and none with
``permute=False`` (4-bit int / uint codes, nf4, fp4_e2m1: :func:`natural_dec_helper`).

It is the wgmma GEMV (gemv/wgmma.py, 17..64 rows) over tiles of rows. A block owns
``channel_tiles`` x 64 output channels per warpgroup, ``warpgroups`` warpgroups side by side in N
(one block: ``64 * channel_tiles * warpgroups`` channels), and one tile of ``row_tile`` activation
rows (the wgmma N: 64, 128 or 256); the grid is (channel blocks) x ceil(rows / row_tile), in
groups of ``raster_rows`` rows x every channel block, the group's row tiles adjacent (a wave reads
the same weights for the group's row tiles and the same activations for its channel blocks from
L2: W4A16 8192^2 at 4096 rows, 256-row tiles, a wave of 132 blocks touches 16 MB of activations
and 17 MB of weights, where row tiles alone in the inner order would stream all 64 MB of
activations through L2 every wave). Per lane and slab the
weights are loaded (16-byte vectors, a ring of ``stages`` register slots), decoded by the GEMV's
lop3 / magic-number decoder (``bb_dec``) into the wgmma A fragment, group scales applied to the
pairs (``hfma2``), as in the GEMV. The activations, reordered per slab by the GEMV's ``permute``
kernel (all rows), come by TMA in boxes of 64 K values x ``row_tile`` rows (128-byte swizzle) into
a ring of box slots in shared memory shared by the block's warpgroups (``full`` mbarriers; with
two warpgroups ``empty`` mbarriers, one arrival per warpgroup, say a slot was read); one thread
refills the slots of the previous slab. A slab of ``512 / bits`` K values is 2 (4-bit), 4 (2-bit)
or 1 (8-bit) boxes: per box one wait and 4 k16 steps of ``wgmma m64n{row_tile}k16`` per 64-channel
tile, one commit group per slab. Without ``overlap`` each warpgroup waits for its own wgmma before
decoding the next slab, and the other warpgroup's wgmma fill that gap; with ``overlap`` it decodes
slab s + 1 into a second set of registers while the wgmma of slab s run (``wait_group 1``), in a
loop body of OVERLAP_STEPS slabs that ends with ``wait_group 0`` (a wgmma in flight across the
loop's back edge makes ptxas serialize them all, C7513). With
``split_k`` the warpgroups of a block take the same channels and alternate slabs of K instead,
each with its own ring (its own thread refills it), and add their sums through the ring's shared
memory at the end: two warpgroups per SM where there are only ~132 tiles (128 rows). float32
accumulators (``channel_tiles * row_tile / 2`` per thread, at most 128), stored from registers
with the per-channel scale, bias and cast; rows past the call's rows are zeros (TMA's
out-of-bounds fill) and not stored, channels past N are clamped on load and not stored. K must be
a multiple of the slab (as for the GEMV; otherwise the operator's default serves the plan).

The default where decode-then-GEMM would otherwise serve (sm_90a, rows past the GEMV), up to 1024
rows, and 2048 where N >= 8192 (:func:`fused_default`, from H100 sweeps of W4A16 g128 over Llama
shapes and of the other int / uint formats at 8192^2, docs/performance.md): ``split_k`` 128-row
tiles up to 128 rows and where 256-row tiles of 128 channels would make at most 64 blocks (past 128
rows, for 4-bit codes, ``split_k`` 256-row tiles where they need fewer waves), else 256-row tiles
with two warpgroups side by side; without the permute pass where the natural-order decoder takes the
plan and measured faster (below: :func:`_natural_max_n`). The tuner searches the rest (:func:`fused_space`). Above that,
decode-then-GEMM stays faster: each 256-row tile decodes the weights again, and the permute pass
reads and writes the activations.

What bounds it: the tensor rate (an m64nNk16 takes ~N / 2 SM cycles) plus the decode that no other
warpgroup's wgmma hides (~14 instructions per wgmma for 4-bit codes: a larger share of an n128 wgmma
than of an n256 one); DRAM only at the fewest rows; from ~1024 rows the permute pass. ncu on an H100
(W4A16 g128 8192^2, default tiles): at 128 rows latency, not a unit's rate (clocks locked at 1.40
GHz, caches flushed: 8 warps per SM, 0.23 eligible per scheduler and cycle, issue slots 19% busy, SM
throughput 50%; with warm caches at the default clocks, as in a call, L2 64% and DRAM 30% of peak);
at 1024 rows the hmma pipe 90% active, SM throughput 85%. Where the warps wait at 128 rows (source
counters, warm caches, default clocks): 25% of the stall samples at the activation ring's ``full``
wait (a slab's first box), ~6% at the first use of a slab's weight registers. With ``overlap`` and a
ring of 2 slabs per warpgroup a slab's boxes are requested only once the slab two steps back has
finished its wgmma, in the very step that reads them: only that slab's decode hides the TMA. A ring
of 3 slabs (192 KB) cut that wait to 8% of the samples, yet the main kernel took 5% longer (the
stalls moved to dispatch and the decode) and the call ~10% longer under PDL; only with ncu's default
cache flush (the activations then come from DRAM: that wait 35% of the samples) was it faster. In a
CUPTI timeline of eager calls the permute kernel and the gap after it are ~10% of a 128-row call
without PDL; under PDL this kernel starts early and the permute kernel beside it takes ~1.7x as
long, the call ~7% shorter. Half the activation bytes per FLOP (128-channel blocks over half of K:
N=16384, K=4096, the proxy of a K split over a CTA pair) gave no gain. (All with the permute pass.)
On the H200 at 256 rows (ncu, one launch, the default split-K 256-row tiles: 128 blocks, 255
registers, 2 warps per scheduler): 12.6 M instructions, 0.27 issued per scheduler cycle, 7.3 cycles
per instruction (fixed-latency waits 1.8, the warpgroups' barrier 1.5, dispatch 0.9, long scoreboard
0.75), 11% of the stall samples on the wgmma instructions, L2 68% and DRAM 12% busy: latency again.
At 128 rows on the H200 (ncu source counters, one launch of the default split-K natural-order tile,
default clocks, 37.1 us): 2 warps per scheduler, 0.43 eligible, 5.8 cycles per issued instruction,
L2 53% and DRAM 19% busy; of the stall samples 26% wait on fixed latencies, 21% on the long
scoreboard, 18% issue, 9% at the warpgroup barrier. The two hottest lines (9% of the samples) are
the first decode instruction of one weight slot in four: ptxas puts every global load of the loop on
one scoreboard (nvcc 13.0), so the decode that waits for a slot's words also waits for the next
slab's loads issued a few instructions before it. Issuing each step's loads after its slab's first
activation box arrived instead (so the wait drains only loads a step old; speeds relative to the
default in the same call, two rounds each, on kernels built for exactly that many rows) measured
0.93x at 128 rows (W4A16 g128; W4A8 g128 0.92x, nvfp4 1.01x), 1.01-1.05x on the split-K 256-row
tiles, 1.00-1.015x on the 256-row tiles with ``overlap`` (W4A16, nf4, fp4, nvfp4 at 512-2048 rows,
also 28672 x 8192) and 0.85-0.95x on those without it (uint2, 8-bit codes, int8 per channel): not
adopted. 6 or 8 register slots instead of 4 at 128 rows: 0.92-0.96x (W4A8 g128 with 6: 1.03-1.06x
over four pairs, but 0.94x on the symbolic-M kernel of Matmul's buckets, where 128-row samples also
spread ~10% between rounds); 6 activation boxes per warpgroup instead of 4: 0.97x.
Weights staged in shared memory (``w_smem``): each step's weight vectors (16 bytes a lane,
``cp.async.cg``) and raw scales (the 4-byte word holding a 2-byte scale, ``cp.async.ca``) go into a
ring of ``stages`` slots after the activation ring, one commit group per step, and the decode first
waits with ``cp.async.wait_group stages - 1`` (0 at the last steps), then reads its slot with one
16-byte ``ld.shared``: no global load left in the loop (local SASS: ``LDGSTS`` + ``DEPBAR.LE SB0,
0x3``, 190 registers instead of 222-231 for the W4A16 128-row tile), so a decode waits only for its
own step's bytes. Expected at 128 rows: the 9% of samples above gone, 5-10% faster. Measured (H200,
8192^2, symbolic-M kernels against the same tile with register weights, two rounds): W4A16 g128 at
128 rows (split-K with ``overlap``) 0.92x, with zeros 0.95x, nvfp4 1.035x; staged and without
``overlap`` 0.86x of the default, where register weights without ``overlap`` are 0.88x: the miss is
not profiled. Without ``overlap`` it pays on every split-K tile
measured: the 8-bit-activation and 2-bit defaults 1.09-1.54x (:func:`_staged`), the 4-bit 256-row
split-K tile 1.04-1.06x; the tiles side by side lose (0.77-0.98x). So the defaults take it on the
split-K tiles without ``overlap``. In the same 128-row profile the group scales' 2-byte loads
request 27% of the kernel's L2 sectors (8 per warp instruction where its 64 bytes need 2: a warp's
scales are those of several channels, 128 bytes apart in the [N, K / group] layout); a scale layout of the
operator's own, a warp's scales for a step adjacent, would cut that (not built; L2 was 53% busy).
Left to try: the weights loaded by a producer of their own.
Rows short of the row tile (``tail_box``, the default): the last row tile's TMA boxes come from a
second map whose boxes hold just its rows (``(mv - 1) % row_tile + 1``; the barrier expects that
many bytes), instead of boxes running past the rows with the TMA unit filling zeros; the ring's rows
past them keep stale values that feed only rows not stored. H200, symbolic-M kernels against the
same tile with boxes partly out of bounds, 8192^2, two rounds: W4A16 g128 at 96 rows 48.7 -> 36.7
us (1.33x; 128 rows, no partial box: 1.01x), 300 rows 142.1 -> 102.6 (1.38x), W2A16 g128 at 80 rows
1.64x, W4A8 per channel at 80 rows 1.32x. Padding the permute pass's temporary to whole row tiles
instead (a map over the padded rows) measured about the same (1.45x / 1.70x / 1.31x) and needs the
permute pass: not kept.
Measured times: docs/performance.md.

int8 activations (W4A8 / W2A8; ``A_dtype="int8"``, per-token scales): ``wgmma m64nNk32
.s32.{s8,u8}.s8``, the A fragment the int8 mma GEMV's byte decoder (gemv/mma_int8.py: signed codes
at the top of each byte, a factor 2**(8 - bits) divided out after) and the same K order for the
activations, which the permute kernel reorders byte-wise (:func:`~.gemv.wgmma.slab_permutation_i8`);
128-byte boxes hold 128 K values, so a slab of 4-bit codes is one box and the k32 steps advance 32
bytes as the k16 ones do. int32 sums (``iacc``): with group scales each slab's first k32 overwrites
them, and after its wgmma they are promoted into the float32 sums with the slab's scale (groups
hold whole slabs); per-channel scales take the exact int32 sums to the store. With group scales the
two sets of sums allow at most 128-row tiles of 64 channels per warpgroup; no ``overlap``. What bounds it (ncu,
H100, W4A8 g128 at 256 rows): issue and latency, 0.44 warps issued per scheduler cycle with two
warpgroups per SM, ~240 SASS instructions per slab and warp of which 128 are the promotion
(I2FP + FFMA per sum); converting through the float bits of 1.5 * 2**23 + sum instead measured
slower (more instructions), and a per-warp ``empty`` arrival instead of the warpgroup barrier per
slab did not help (its stall moved to the ring's TMA thread).

float8_e4m3 activations (W4A-fp8 / W2A-fp8, per-token scales): the int8 path with ``wgmma
m64nNk32 .f32.e4m3.e4m3`` on the codes decoded to e4m3 bytes (:func:`~.gemv.decode.e4m3_code_dec`,
a ``prmt`` table; the permute follows its slots), float32 sums ``pacc`` promoted into the float32
accumulators after every slab (times the group scale where there is one): the float8 wgmma's sums
keep fewer bits than float32. Past the m16n8k32 GEMV's rows (gemv/mma_int8.py: 1..16 on sm_90):
split-K 64-row tiles up to 64 rows, then the int8 defaults. What bounds it (ncu, H100,
W4A-fp8 g128 8192^2): at 256 rows the int8 path's issue and latency (18.0 M instructions against
int8's 17.0 M, ~2 warps per scheduler, 46% issue-active); at one row the weight loads (long
scoreboard 1.9 stalls per issued instruction, DRAM 34% of peak). Two changes missed there (H100,
W4A-fp8 g128 at 1 / 16 / 64 rows, 64-row split-K tiles): 8 weight slots per lane instead of 4,
expected to put twice the bytes in flight (5% and 7% faster at 1 and 64 rows, 1% slower at 16),
and 4 warpgroups splitting K with 2 slots, expected to hide twice the latency (9% slower at 16
rows, 10% faster at 64; W2A-fp8 slower): neither the loads in flight per lane nor the warps per
SM is the limit, which is not found yet (4 warpgroups are not allowed: no gain).
On the H200 (ncu, one launch each, default tiles, 8192^2): W4A-fp8 per channel at 1024 rows (128-row
tiles, one warpgroup per block, 252 registers, 2 warps per scheduler) 75.1 M instructions against
W4A8 per channel's 23.4 M (256-row tiles of two warpgroups, no promotion), of which the promotion's
``fadd`` are 17.0 M (every output x every 128 K, fixed by the interval, not the tile) and the e4m3
table decode's ``prmt`` 12.6 M; 0.42 issued per scheduler cycle, 4.5 cycles per instruction (fixed
latency 1.0, long scoreboard 0.7, barrier 0.6): it waits, then issues ~286 instructions per warp and
slab that one other warpgroup per SM cannot cover. Overlap would need a second set of sums and of A
fragments (64 + 2 x 64 + 2 x 16 registers before the weight ring), past the 255 a thread has; at 64-row
tiles the decode per FLOP doubles.

Two changes that measured slower or no faster (H100, 8192^2, W4A16 g128 / W4A8 g128 / nvfp4 at
128, 256 and 1024 rows, beside the defaults in one run). CTA pairs on adjacent channel blocks, each
CTA loading half of every activation box and multicasting it into both rings (half the L2 -> SM
activation bytes; L2 is not the limit, above): correct, but 1.12-1.58x the time (W4A16 at 128
rows 1.25x, W4A8 at 256 rows 1.58x); not profiled, the likely cause: the refilling thread is a
consumer lane that now waits every slab for the other CTA's release, so both CTAs' warpgroups run
in lockstep (a pair would need a producer warp of its own). The epilogue's 2-byte stores replaced
by ``stmatrix .trans`` + 16-byte stores (the dense GEMM's gain): from 1.2% slower to 3.6% faster
over the nine cases with the scratch in the ring, no consistent gain (1-3% slower with the scratch
as 4 KB of shared memory more, likely past an L1 carve-out step): the stores are not the bound.

Activations in natural K order (``permute=False``, float16 / bfloat16 activations x 4-bit int / uint
codes whose groups hold whole slabs, plain or fast-decoding code order, and the 4-bit table codes
nf4 and fp4_e2m1 through the permuted path's table decoders): no permute kernel and no
temporary; the codes move in registers instead. k16 step s needs codes 16 s + 2 q + {0, 1, 8, 9} in
lane q of a quad, all in the vector of lane s // 2, byte q of each of its 4 words: per vector a 4x4
byte transpose (8 ``prmt``), the 4x4 word transpose across the quad (3 shuffles, as the dense GEMM's
``bb_st4q``) and one ``prmt`` more per decoded pair (:func:`natural_dec_helper`; the default 128-row
kernel's SASS grows 1.4x, the 256-row one's 1.2x). H100, W4A16 g128 8192^2, against the permuted
kernel of the same tile in one run: 6% faster at 128 rows, 12% at 256 (split-K tiles), the same at
512 and 1024 (256-row tiles side by side, which also spill a few words with it for some formats).
H200, the same comparison at 128 and 256 rows (two samples each, one run): no gain there, 1-2%
slower at 256 rows, at 128 rows within the samples' spread (why the H100's gain does not carry
over: not profiled). The defaults take it in the split-K tiles: faster on the H100, within 2% on
the H200, and no temporary. nf4 / fp4_e2m1 g128, H200, the defaults against the same tiles
permuted, cuBLAS fp16 in the same run (``benchmark.matmul --hints 'Default(permute=true,pdl=false)'``):
N = K = 4096 at 128 rows (clustered) 12.79 / 13.31 us against 16.00 / 15.57 (1.25x / 1.17x; cuBLAS
14.05), 256 rows 1.11x / 1.05x; 8192^2 at 128 and 256 rows 0.99-1.03x. nvfp4 (each pair's float8
block scale gathered from the lane that loaded it: :func:`natural_block_scale_helper`) and 8-bit
int / uint / float8 codes (:func:`natural_dec_helper` ``bits=8``) in natural order too, and 2-bit
int / uint codes (groups of 128: half a slab, each half's scale and offset gathered per quad), by
default up to the channels where they measured faster (:func:`_natural_max_n`: N <= 4096, 2-bit
6144; 1.14-1.23x at N = K = 4096 and 128 rows, 0.87-1.00x at 8192^2). The tiles side by side
(past the split-K rows) take natural order for 2-bit codes and nf4 up to N = 8192, 8-bit codes and
fp4_e2m1 up to 4096, where it measured faster (:func:`_natural_max_n`; uint4 and nvfp4 lose 1-6% at
every N measured). The 4-bit codes' split-K tiles take it up to N = 8192. Not done yet (issue 24): the other tiles and int8 / float8
activations keep the permute pass (a rows x K x 2-byte temporary, 16 MB at 1024 x 8192, where the
issue asks <= 1 MB), and past 1024 / 2048 rows decode-then-GEMM (an N x K x 2-byte temporary) stays
the default: the fused 256-row tiles measured 0.89-0.97x of it at 4096 rows (H200, W4A16 / nf4 /
uint2 g128, 8192^2 and 28672 x 8192); no persistent tile loop or warp-specialized producer.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Optional

from .._tvm import tvm
from ..arch import GENERIC_SM_COUNT, arch_of
from .cuda_wgmma import QUAD_TRANSPOSE
from .gemv.decode import ACT, decoder, table_dec
from .gemv.emit import LUT_FIELD, e4m3_acts, f8_scales
from .gemv.mma import scale_helper
from .gemv.wgmma import (TMA_2D, box_values, decode_vectors, for_accs, init_accs_barriers, load_vectors, reduce_warpgroups,
                         scales_at_store, slab_codes, slab_locals, store_accs, tensor_map, vector_channel,
                         wgmma_helper, wgmma_slot, wgmma_wait)

__all__ = ["FusedWgmmaHint", "fused_wgmma_unsupported", "fused_default", "fused_space", "FUSED_DEFAULT_MAX_ROWS",
           "schedule_fused_wgmma", "main_script", "FUSED_SMEM_MAX", "W_SMEM_MAX", "ring_slots", "register_words",
           "w_smem_words", "tile_count"]

FUSED_SMEM_MAX = 200 * 1024        # the activation ring of a block, within sm_90's 227 KB
W_SMEM_MAX = 224 * 1024            # w_smem: both rings (sm_90 gives a block 227 KB)
OVERLAP_STEPS = 8                  # overlap=True: slabs per unrolled loop body (all but its first overlap)


@dataclass(frozen=True)
class FusedWgmmaHint:
    row_tile: int = 128            # activation rows per block: the wgmma N (64, 128, 256)
    channel_tiles: int = 1         # 64-channel wgmma tiles per warpgroup (1, 2)
    warpgroups: int = 1            # warpgroups per block, side by side in N, sharing the activation ring (1, 2)
    split_k: bool = False          # the warpgroups split K instead (same channels, each its own ring; their
                                   # sums meet in shared memory): two warpgroups per SM where the tiles are few
    stages: int = 2                # register slots of weight vectors (slabs in flight per lane)
    ring: int = 0                  # activation box slots in shared memory (0: as many as fit FUSED_SMEM_MAX, <= 8)
    raster_rows: int = 1024        # blocks run in groups of this many rows (row tiles) x every channel block
    pdl: bool = True               # programmatic dependent launch (the permute kernel and this one)
    overlap: bool = False          # two sets of decoded registers: a warpgroup decodes slab s + 1 while its
                                   # wgmma of slab s run (wait_group 1); needs a ring of 2 slabs
    permute: bool = True           # False: no permute kernel (no temporary); the activations in natural K
                                   # order, the codes moved in registers instead (natural_dec_helper)
    w_smem: bool = False           # weight vectors staged by cp.async in a shared-memory ring (one commit group
                                   # per step, cp.async.wait_group before the decode) instead of registers
    tail_box: bool = True          # the last row tile's boxes from a second map whose boxes hold just its
                                   # rows (no box partly out of bounds); False: the boxes run past the rows
    k_ctas: int = 1                # 2: a 2-CTA cluster per tile, the CTAs splitting K; the second sends its
                                   # sums into the first's shared memory (distributed shared memory)

    @classmethod
    def default(cls, plan, target=None) -> "FusedWgmmaHint":
        """A first tile (not measured yet): 128 rows x 64 channels per block up to 512 rows (128
        blocks at N=8192 and 128 rows keep 132 SMs busy; two blocks per SM from 256 rows), 256
        rows x 2 warpgroups of 64 channels above (half the activation reads per FLOP)."""
        m = plan.m or 4096
        if m <= 512 or _byte_acts(plan):   # 3 slabs of weights in flight cover a slab's wgmma here (int8,
                                           # float8: two sets of sums, at most 128-row tiles of 64 channels)
            return cls(row_tile=128, stages=4)
        return cls(row_tile=256, warpgroups=2)


def _cp_helpers(stages: int) -> dict:
    """CUDA helpers of ``w_smem`` (name -> source): a 16-byte ``cp.async`` into shared memory, the
    commit, the waits (``bb_cpwait{n}``: at most n groups pending, n = 0 and stages - 1), a 16-byte
    shared read; a 2-byte scale (or nvfp4's pair of float8 block scales) staged as the 4-byte word
    that holds it (``bb_cps4``, the address rounded down) and read back at its half (``bb_ldsh``).
    The word may hold a neighbour outside the scale tensor's view, never outside its allocation
    where that starts and ends on 4-byte boundaries (CUDA allocations are 256-byte aligned, torch's
    caching allocator rounds sizes to 512 bytes); compute-sanitizer memcheck is clean on it
    (``benchmark/memcheck.py``, family ``fused_wgmma``)."""
    src = {"bb_cpw16": r"""
__device__ __forceinline__ void bb_cpw16(void* s, const void* g) {
  unsigned sa = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa), "l"(g) : "memory");
}
""", "bb_cpcommit": r"""
__device__ __forceinline__ void bb_cpcommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
""", "bb_cps4": r"""
__device__ __forceinline__ void bb_cps4(void* s, const void* g) {
  unsigned sa = (unsigned)__cvta_generic_to_shared(s);
  const void* ga = (const void*)((unsigned long long)g & ~3ull);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(sa), "l"(ga) : "memory");
}
""", "bb_ldsh": r"""
__device__ __forceinline__ unsigned short bb_ldsh(const void* s, const void* g) {
  return *reinterpret_cast<const unsigned short*>(reinterpret_cast<const char*>(s) + ((unsigned long long)g & 2ull));
}
""", "bb_ldsw": r"""
__device__ __forceinline__ unsigned bb_ldsw(const void* s) { return *reinterpret_cast<const unsigned*>(s); }
""", "bb_lds4": r"""
__device__ __forceinline__ void bb_lds4(const void* s, unsigned* d) {
  uint4 v = *reinterpret_cast<const uint4*>(s);
  d[0] = v.x; d[1] = v.y; d[2] = v.z; d[3] = v.w;
}
"""}
    for n in sorted({0, max(0, stages - 1)}):
        src[f"bb_cpwait{n}"] = (f"\n__device__ __forceinline__ void bb_cpwait{n}() {{ asm volatile("
                                f"\"cp.async.wait_group {n};\" ::: \"memory\"); }}\n")
    return src


def w_smem_words(hint: FusedWgmmaHint) -> int:
    """4-byte words of the ``w_smem`` weight ring: per thread ``stages`` x ``channel_tiles`` x 2
    vectors of 16 bytes and their scale words."""
    if not hint.w_smem:
        return 0
    kw = hint.warpgroups if hint.split_k else 1
    cw = 1 if hint.split_k else hint.warpgroups
    return 128 * cw * kw * max(1, hint.stages) * hint.channel_tiles * 2 * 5


def ring_slots(plan, hint: FusedWgmmaHint) -> int:
    """Activation box slots of the ring: ``hint.ring``, or as many as fit in FUSED_SMEM_MAX per
    warpgroup over 2 (one-warpgroup blocks: two per SM, so that one decodes while the other's wgmma
    run), less the ``w_smem`` weight ring, at most 8, at least one slab's boxes."""
    if hint.ring:
        return hint.ring
    box = box_bytes(hint)
    ups = boxes_per_slab(plan)
    room = min(FUSED_SMEM_MAX, W_SMEM_MAX - 4 * w_smem_words(hint))   # w_smem: the weight ring's room
    if hint.split_k:                          # a ring per warpgroup, one block per SM
        return max(ups, min(8, room // hint.warpgroups // box))
    return max(ups, min(8, room * hint.warpgroups // 2 // box))


def box_bytes(hint: FusedWgmmaHint) -> int:
    """Bytes of one activation box slot: ``row_tile`` rows of 128 bytes."""
    return hint.row_tile * 128


def boxes_per_slab(plan) -> int:
    """TMA boxes (128 bytes of K per row) per slab of the weights' codes."""
    return slab_codes(plan.w.bits) // box_values(plan.config.A_dtype)


def _int8(plan) -> bool:
    """int8 activations: ``wgmma m64nNk32 .s8`` on the weights decoded to bytes (the int8 mma GEMV's
    decoder), int32 sums promoted to float32 with the group scale after each slab's wgmma."""
    return plan.config.A_dtype == "int8"


def _byte_acts(plan) -> bool:
    """1-byte activations (int8, float8_e4m3): k32 wgmma on decoded bytes, byte-wise permute."""
    return _int8(plan) or e4m3_acts(plan)


def _sum_sets(plan) -> int:
    """Accumulator sets a thread holds through the main loop: the wgmma's sums of a slab and the
    float32 accumulators they are promoted into, for int8 activations with group scales and for
    float8 activations (the float8 wgmma's sums keep fewer bits than float32: promoted every slab,
    as DeepSeek-V3 does every 128 K); one set otherwise (per-channel int8 sums become float32 only
    after the loop)."""
    return 2 if (_int8(plan) and plan.groups > 1) or e4m3_acts(plan) else 1


# accumulators + decoded words + weight register slots per thread: 224 compiled without spills at
# 255 registers (uint4, 2 tiles x n128, 2 slots), 288 spilled 548 bytes (uint2, the same tile)
_REG_WORDS_MAX = 224


def register_words(plan, hint: FusedWgmmaHint) -> int:
    """32-bit registers a thread holds for its tile: float32 accumulators (``channel_tiles x
    row_tile / 2``), the decoded pairs of one slab (2 channels x ``512 / bits / 8`` words per tile)
    and the ``stages`` slots of loaded weight vectors (2 channels x 4 words per tile); ``overlap``:
    two slabs of decoded pairs; ``permute=False``: 8 more (the words a vector's codes move through)."""
    R = hint.channel_tiles
    decoded = R * 2 * (64 // plan.w.bits // (2 if _byte_acts(plan) else 1)) * (2 if hint.overlap else 1)
    moved = 0 if hint.permute else 8          # permute=False: the transposed words live beside the vector
    return R * hint.row_tile // 2 * _sum_sets(plan) + decoded + max(1, hint.stages) * R * 2 * 4 + moved


# code orders inside a word the natural-order decoder undoes -> the byte permutation it folds into
# its byte transpose (None: the plain order; BitBLAS's fast-decoding interleave of 4-bit codes)
NATURAL_ORDERS = {None: (0, 1, 2, 3), (0, 4, 1, 5, 2, 6, 3, 7): (0, 2, 1, 3)}


# the 16-bit pair types the natural-order decoders use: TVM includes these headers only where the
# kernel's TensorIR touches that dtype, and with the activations read by TMA alone (no permute kernel)
# and no 16-bit scales or output (e.g. float32 output, no scales) it touches none
ACT_HEADERS = {"float16": "#include <cuda_fp16.h>\n", "bfloat16": "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"}


def _quad_delivery(x, sigma=(0, 1, 2, 3)) -> list:
    """Lines of the natural-order decoders: the 4x4 byte transpose of the words ``x`` (4 expressions;
    natural byte j of a word is its byte ``sigma[j]``) into ``u0`` .. ``u3`` (word r: byte r of each
    word), then the quad's word transpose (:data:`~.cuda_wgmma.QUAD_TRANSPOSE`): word p of lane q
    holds byte q of lane p's words."""
    lo = sigma[0] | (4 + sigma[0]) << 4 | sigma[1] << 8 | (4 + sigma[1]) << 12
    hi = sigma[2] | (4 + sigma[2]) << 4 | sigma[3] << 8 | (4 + sigma[3]) << 12
    return [f"  const unsigned a0 = __byte_perm({x[0]}, {x[1]}, 0x{lo:04x}u), a1 = __byte_perm({x[0]}, {x[1]}, 0x{hi:04x}u);",
            f"  const unsigned a2 = __byte_perm({x[2]}, {x[3]}, 0x{lo:04x}u), a3 = __byte_perm({x[2]}, {x[3]}, 0x{hi:04x}u);",
            "  unsigned u0 = __byte_perm(a0, a2, 0x5410u), u1 = __byte_perm(a0, a2, 0x7632u);",
            "  unsigned u2 = __byte_perm(a1, a3, 0x5410u), u3 = __byte_perm(a1, a3, 0x7632u);",
            "  bb_quad_t(u0, u1, u2, u3);"]


def _field_pairs(act: str, bits: int, storage: str):
    """The int decoders' pair of fields, for the natural-order decoders: ``(offset(name, off),
    pair(ind, src, z, dst))``. ``offset``: the line defining the 16-bit pair ``name`` of magic + ``off``;
    ``pair``: the lines decoding ``src`` (an expression holding one field of ``bits`` in the low bits
    of each half) to ``dst`` = field - off (``lop3`` onto the magic number, ``hsub2`` of ``z``;
    ``storage`` "twos": the field's sign bit XOR-ed)."""
    t2, magic = ACT[act][1], ACT[act][2]
    mask = ((1 << bits) - 1) * 0x10001
    sign = (1 << (bits - 1)) * 0x10001 if storage == "twos" else 0
    c_const = sign | ((magic * 0x10001) & ~mask & 0xFFFFFFFF)

    def offset(name: str, off: str) -> str:
        return (f"  const unsigned {name}u = (0x{magic:x}u + (unsigned)({off})) * 0x10001u; "
                f"const {t2} {name} = *reinterpret_cast<const {t2}*>(&{name}u);")

    def pair(ind: str, src: str, z: str, dst: str) -> list:
        return [f"{ind}{{ unsigned x; asm(\"lop3.b32 %0, %1, 0x{mask:08x}, 0x{c_const:08x}, 0x{LUT_FIELD:02x};\" "
                f": \"=r\"(x) : \"r\"({src}));",
                f"{ind}  {t2} v = __hsub2(*reinterpret_cast<{t2}*>(&x), {z});",
                f"{ind}  {dst} = *reinterpret_cast<unsigned*>(&v); }}"]
    return offset, pair


def natural_dec_helper(tag: str, act: str, storage: str, order=None, dec: str = "int", table=None,
                       bits: int = 4, halves: bool = False) -> str:
    """``bb_ndec_{tag}(w, off, d)``: the decoder of ``FusedWgmmaHint(permute=False)``, the activations
    in natural K order (4-bit codes, one 16-byte vector per lane).
    Lane q of a quad holds the 32 codes of K 32 q .. 32 q + 31 of the slab, 8 per word, two per byte
    (the even K in the low nibble); k16 step s needs codes 16 s + 2 q + {0, 1} (A fragment word 2 s)
    and 16 s + 2 q + {8, 9} (word 2 s + 1), byte q of words 0..3 of lane s // 2's vector. So: a 4x4
    byte transpose per lane (``prmt``: word j holds byte j of words 0..3), the 4x4 word transpose
    across the quad (:data:`~.cuda_wgmma.QUAD_TRANSPOSE`: word p now holds byte q of lane p's words),
    then byte b of word p, the codes of K 32 p + 8 b + 2 q + {0, 1}, to decoded pair d[4 p + b].
    ``dec`` (:func:`~.gemv.decode.decoder`) "int": the low nibble and the high one (the word shifted
    right by 4) ``prmt``-ed into the two halves, magic number and ``hsub2`` as the int decoders
    (field - ``off``, exact; ``storage`` "twos": the sign bit XOR-ed); ``order``
    :data:`NATURAL_ORDERS`: BitBLAS's fast-decoding interleave (code j in slot ``order[j]``: the
    even codes in the low half) is undone first, nibbles 1, 3 swapped with 4, 6 (two shifts, two
    ``lop3``) and bytes 1 and 2 swapped in the byte transpose's selectors. "lut4" (a 16-entry
    ``table``: nf4, ...): the table decoder of the permuted path (``bb_dec_n{tag}``,
    :func:`~.gemv.decode.table_dec`) on the four words, whose pairs are a byte's two codes already;
    "e2m1": each word's nibbles unzipped first (the even codes into the low half, the odd ones into
    the high half: the slots p, p + 4 its bit-placement decoder pairs). Every lane of the warp calls
    it (shuffles).

    ``bits=8`` (int / uint bytes, float8 ``dec`` "e4m3" / "e5m2"): lane q holds K 16 q .. 16 q + 15;
    k16 step s needs codes 16 s + 2 q + {0, 1} (bytes 2 (q % 2) + {0, 1} of word q // 2 of lane s)
    and + 8 (the same bytes of word 2 + q // 2). Each lane merges, per destination lane, those bytes
    of its words into one word (``prmt``: words 0 and 2 for lanes 0, 1, words 1 and 3 for lanes 2,
    3, interleaved so that the 8-bit pair decoders' slots p, p + 2 hold a pair), the quad's word
    transpose delivers them, and the permuted path's 8-bit pair decoder (the GEMV template's int
    decoder, :func:`~.gemv.decode.f8_pair_dec`) decodes word p into d[2 p], d[2 p + 1].

    ``bits=2`` (int / uint): lane q holds K 64 q .. 64 q + 63, 16 codes per word; k16 step s = 4 p + j
    needs codes 16 s + 2 q + {0, 1, 8, 9}, one byte's worth of word j of lane p: :func:`_natural_dec2`.
    ``halves``: groups of 128 (half a slab): the pairs of lanes 0, 1 take lane 0's offset ``off``,
    those of lanes 2, 3 lane 2's (two shuffles)."""
    if bits == 8:
        return _natural_dec8(tag, act, storage, dec)
    if bits == 2:
        return _natural_dec2(tag, act, storage, order, halves)
    if dec not in ("int", "lut4", "e2m1"):
        raise ValueError(f"dec={dec!r}: the natural-order decoder takes int, lut4 or e2m1 codes")
    if order is not None and dec != "int":
        raise ValueError(f"order={order}: only int / uint codes take a code order")
    head = table_dec(f"n{tag}", act, 4, dec, table) if dec != "int" else ""
    lines = [f"__device__ __forceinline__ void bb_ndec_{tag}(const unsigned* w, int off, unsigned* d) {{"]
    if order is None:
        lines.append("  const unsigned x0 = w[0], x1 = w[1], x2 = w[2], x3 = w[3];")
    else:
        for j in range(4):
            lines.append(f"  const unsigned t{j} = (w[{j}] ^ (w[{j}] >> 12)) & 0x0000f0f0u, "
                         f"x{j} = w[{j}] ^ t{j} ^ (t{j} << 12);")
    # natural byte j of a word is its byte NATURAL_ORDERS[order][j] (after the nibble swap)
    lines += _quad_delivery(("x0", "x1", "x2", "x3"), NATURAL_ORDERS[order])
    if dec == "lut4":
        lines.append("  const unsigned u[4] = {u0, u1, u2, u3};")
        lines.append(f"  bb_dec_n{tag}(u, off, d);")
    elif dec == "e2m1":
        # nibble b of y = the low nibble of byte b, nibble b + 4 its high one
        lines.append("  unsigned y[4];")
        for p in range(4):
            lines.append(f"  {{ const unsigned l = u{p} & 0x0f0f0f0fu, h = (u{p} >> 4) & 0x0f0f0f0fu;")
            lines.append(f"    y[{p}] = __byte_perm(l | (l >> 4), h | (h >> 4), 0x6420u); }}")
        lines.append(f"  bb_dec_n{tag}(y, off, d);")
    else:
        offset, pair = _field_pairs(act, 4, storage)
        lines.append(offset("z0", "off"))
        for p in range(4):
            lines.append(f"  {{ const unsigned h = u{p} >> 4;")
            for b in range(4):
                sel = b | b << 4 | (4 + b) << 8 | (4 + b) << 12
                lines += pair("    ", f"__byte_perm(u{p}, h, 0x{sel:04x}u)", "z0", f"d[{4 * p + b}]")
            lines.append("  }")
    lines.append("}")
    return ACT_HEADERS[act] + QUAD_TRANSPOSE + head + "\n".join(lines) + "\n"


def _natural_dec8(tag: str, act: str, storage: str, dec: str) -> str:
    """:func:`natural_dec_helper` for 8-bit codes."""
    from .gemv.emit import format_helpers
    if dec not in ("int", "e4m3", "e5m2"):
        raise ValueError(f"dec={dec!r}: the natural-order decoder takes int, e4m3 or e5m2 codes of 8 bits")
    head = format_helpers(f"n{tag}", act, 8, storage, 4, dec=dec, half_pairs=True)[f"bb_dec_n{tag}"]
    lines = [f"__device__ __forceinline__ void bb_ndec_{tag}(const unsigned* w, int off, unsigned* d) {{",
             # word for lane r: bytes 2 (r % 2), 2 (r % 2) + 1 of words r // 2 and 2 + r // 2, interleaved
             "  unsigned u0 = __byte_perm(w[0], w[2], 0x5140u), u1 = __byte_perm(w[0], w[2], 0x7362u);",
             "  unsigned u2 = __byte_perm(w[1], w[3], 0x5140u), u3 = __byte_perm(w[1], w[3], 0x7362u);",
             "  bb_quad_t(u0, u1, u2, u3);",
             "  const unsigned u[4] = {u0, u1, u2, u3};",
             f"  bb_dec_n{tag}(u, off, d);",
             "}"]
    return ACT_HEADERS[act] + QUAD_TRANSPOSE + head + "\n".join(lines) + "\n"


# 2-bit code orders the natural-order decoder takes: the plain one and BitBLAS's fast-decoding one,
# whose byte i holds, in its four fields, codes 2 f + i % 2 + 8 (i // 2) (f = 0..3)
NATURAL_ORDERS_2 = (None, (0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15))


def _natural_dec2(tag: str, act: str, storage: str, order, halves: bool) -> str:
    """:func:`natural_dec_helper` for 2-bit int / uint codes. Lane q of the quad needs, from word j
    of lane p, the codes 2 q, 2 q + 1, 2 q + 8, 2 q + 9 of the word (k16 step 4 p + j): one byte.
    Each lane first makes each word ``t`` whose byte r is that byte for lane r: in the plain order
    nibbles r and r + 4 of the word (two shifts and masks), in the fast-decoding order field r of
    its four bytes (a 4x4 transpose of 2-bit fields: two delta swaps). Then the 4x4 byte transpose
    (``prmt``) puts the bytes for lane r into word r, the quad's word transpose delivers them: word p
    of lane q holds its bytes from lane p's words j = 0..3, whose fields 0, 1 are A fragment word
    2 s (s = 4 p + j) and fields 2, 3 word 2 s + 1, decoded as the int decoders do (a field into
    each half by ``prmt`` of the word and the word shifted by 2 bits, masked onto the magic number
    by ``lop3``, ``hsub2`` of the offset; ``storage`` "twos": the sign bit XOR-ed)."""
    if order not in NATURAL_ORDERS_2:
        raise ValueError(f"order={order}: the natural-order decoder of 2-bit codes undoes {NATURAL_ORDERS_2}")
    offset, pair = _field_pairs(act, 2, storage)
    lines = [f"__device__ __forceinline__ void bb_ndec_{tag}(const unsigned* w, int off, unsigned* d) {{",
             "  unsigned x[4];"]
    for j in range(4):
        if order is None:              # byte r: nibble r | nibble r + 4 << 4 (A: r = 0, 2; B: r = 1, 3)
            lines.append(f"  {{ const unsigned a = (w[{j}] & 0x0f0fu) | ((w[{j}] >> 12) & 0xf0f0u), "
                         f"b = ((w[{j}] >> 4) & 0x0f0fu) | ((w[{j}] >> 16) & 0xf0f0u);")
            lines.append(f"    x[{j}] = __byte_perm(a, b, 0x5140u); }}")
        else:                          # field r of each byte -> byte r: a 4x4 transpose of 2-bit fields
            lines.append(f"  {{ unsigned v = w[{j}], t = (v ^ (v >> 12)) & 0x0000f0f0u; v ^= t ^ (t << 12);")
            lines.append("    t = (v ^ (v >> 6)) & 0x00cc00ccu; v ^= t ^ (t << 6);")
            lines.append(f"    x[{j}] = v; }}")
    lines += _quad_delivery(("x[0]", "x[1]", "x[2]", "x[3]"))
    # lanes 0, 1 / 2, 3 of the quad: one group each (halves), else the lane's own offset for both
    lines += [offset("z0", "__shfl_sync(0xffffffffu, off, 0, 4)" if halves else "off"),
              offset("z1", "__shfl_sync(0xffffffffu, off, 2, 4)" if halves else "off")]
    for p in range(4):
        lines.append(f"  {{ const unsigned h[4] = {{u{p}, u{p} >> 2, u{p} >> 4, u{p} >> 6}};")
        for j in range(4):
            sel = j | j << 4 | (4 + j) << 8 | (4 + j) << 12
            for t in range(2):
                lines += pair("    ", f"__byte_perm(h[{2 * t}], h[{2 * t + 1}], 0x{sel:04x}u)", f"z{p // 2}",
                              f"d[{8 * p + 2 * j + t}]")
        lines.append("  }")
    lines.append("}")
    return ACT_HEADERS[act] + QUAD_TRANSPOSE + "\n".join(lines) + "\n"


def natural_scale_halves_helper(tag: str, act: str, npairs: int) -> str:
    """``bb_scl2_{tag}(d, s, c)``: :func:`~.gemv.mma.mma_helpers`' ``bb_scl`` (``d = d * s + c`` per
    pair, ``hfma2``) for 2-bit codes in natural order with groups of 128: the first half of the
    ``npairs`` pairs (lanes 0, 1's codes) with lane 0's scale and zero term, the second half with
    lane 2's (four shuffles; :func:`~.gemv.mma.scale_helper` with ``halves``). Every lane of the
    warp calls it."""
    return scale_helper(f"bb_scl2_{tag}", act, npairs, halves=True)


def natural_block_scale_helper(tag: str, act: str) -> str:
    """``bb_sclb_{tag}(d, s)`` of ``FusedWgmmaHint(permute=False)`` for float8_e4m3 block scales of 16
    codes (nvfp4): the pairs of :func:`natural_dec_helper` times their blocks' scales. Decoded pair
    ``d[4 p + b]`` holds the codes of K 32 p + 8 b + 2 q + {0, 1}: lane p's vector, its block ``b // 2``.
    Each lane holds its own vector's two scale bytes (``s``, the first block in the low byte); the
    quad's 8 bytes are gathered by two shuffles (lane q ^ 1's pair merged beside its own, in lane
    order, then the other two lanes' word), then per lane p one ``cvt.rn.f16x2.e4m3x2`` (exact; for
    bfloat16 through float32, exact) and ``hmul2`` of its four pairs by the low or high half,
    broadcast. Every lane of the warp calls it (shuffles)."""
    t2 = ACT[act][1]
    low, high = ("__low2half2", "__high2half2") if act == "float16" else ("__low2bfloat162", "__high2bfloat162")
    lines = [f"__device__ __forceinline__ void bb_sclb_{tag}(unsigned* d, unsigned s) {{",
             "  const unsigned q = threadIdx.x & 3u;",
             "  const unsigned o = __shfl_xor_sync(0xffffffffu, s, 1);",
             "  const unsigned x = __byte_perm(s, o, (q & 1u) ? 0x1054u : 0x5410u);   // lanes q & 2, (q & 2) + 1",
             "  const unsigned y = __shfl_xor_sync(0xffffffffu, x, 2);",
             "  const unsigned w[2] = {(q & 2u) ? y : x, (q & 2u) ? x : y};            // lanes 0, 1 / 2, 3"]
    for p in range(4):
        lines.append(f"  {{ unsigned h; asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(h) : "
                     f"\"h\"((unsigned short)(w[{p // 2}] >> {16 * (p % 2)})));")
        if act == "bfloat16":
            lines.append("    { __nv_bfloat162 b = __float22bfloat162_rn(__half22float2("
                         "*reinterpret_cast<const __half2*>(&h))); h = *reinterpret_cast<unsigned*>(&b); }")
        lines.append(f"    const {t2} s01 = *reinterpret_cast<const {t2}*>(&h);")
        lines.append(f"    const {t2} sb[2] = {{{low}(s01), {high}(s01)}};")
        for b in range(4):
            lines.append(f"    {{ {t2} v = __hmul2(*reinterpret_cast<{t2}*>(&d[{4 * p + b}]), sb[{b // 2}]); "
                         f"d[{4 * p + b}] = *reinterpret_cast<unsigned*>(&v); }}")
        lines.append("  }")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def _natural_unsupported(plan) -> Optional[str]:
    """``permute=False``: why the natural-order decoder does not take ``plan`` (None: it does)."""
    c, w = plan.config, plan.w
    if c.A_dtype not in ("float16", "bfloat16"):
        return f"permute=False: A_dtype={c.A_dtype!r}; the natural-order decoder takes float16 / bfloat16 activations"
    if not ((decoder(w) in ("int", "lut4", "e2m1") and w.bits == 4)
            or (decoder(w) in ("int", "e4m3", "e5m2") and w.bits == 8) or (decoder(w) == "int" and w.bits == 2)):
        return (f"permute=False: W_dtype={c.W_dtype!r}; the natural-order decoder takes 2-bit int / uint codes, "
                f"4-bit int / uint / table codes (nf4, fp4_e2m1, nvfp4) and 8-bit int / uint / float8 codes")
    orders = NATURAL_ORDERS_2 if w.bits == 2 else NATURAL_ORDERS
    if plan.w_order not in orders:
        return f"permute=False: code order {plan.w_order}; the natural-order decoder undoes {sorted(orders, key=str)}"
    nvfp4_blocks = f8_scales(plan) and w.bits == 4 and c.group_size == 16     # gathered per quad
    # 2-bit codes: groups of half a slab (lanes 0, 1 / 2, 3), their scales and offsets gathered
    span = slab_codes(w.bits) // (2 if w.bits == 2 else 1)
    if plan.groups > 1 and c.group_size % span and not nvfp4_blocks:
        return (f"permute=False: group_size={c.group_size}; each lane decodes codes of the whole slab, so a group "
                f"must hold multiples of {span} K values (or be nvfp4's 16-value float8 blocks)")
    return None


def _natural_halves(plan) -> bool:
    """2-bit codes in natural order whose groups end inside a slab (e.g. 128): each half of the
    decoded pairs takes the scale and offset of its own group (gathered by shuffles)."""
    return plan.w.bits == 2 and plan.groups > 1 and plan.config.group_size % slab_codes(2) != 0


def fused_wgmma_unsupported(plan, hint: FusedWgmmaHint) -> Optional[str]:
    """None when the fused wgmma GEMM takes ``plan`` with ``hint``, else why not (naming the field)."""
    from .gemv.emit import vec_blocks, vec_bytes
    from .gemv.wgmma import weights_unsupported
    c, w = plan.config, plan.w
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if not plan.args or plan.args[0].name != "A":
        return "the fused wgmma GEMM passes the activations as the first argument"
    if c.A_dtype not in ("float16", "bfloat16", "int8", "float8_e4m3"):
        return (f"A_dtype={c.A_dtype!r}: the fused wgmma GEMM takes float16 / bfloat16 / int8 / float8_e4m3 "
                f"activations")
    if c.layout != "nt":
        return f"layout={c.layout!r}: the fused wgmma GEMM takes 'nt' weights"
    if not hint.permute:
        why = _natural_unsupported(plan)
        if why:
            return why
    if _byte_acts(plan):
        why = _byte_acts_unsupported(plan, hint)
        if why:
            return why
    else:
        why = weights_unsupported(plan, "the fused wgmma GEMM")
        if why:
            return why
        if c.with_act_scaling:
            return "with_act_scaling=True: the fused wgmma GEMM takes no activation scales with float activations"
        if c.with_scaling and plan.scale_dtype not in (c.A_dtype, "float8_e4m3"):
            return (f"scale dtype {plan.scale_dtype!r}: the fused wgmma GEMM takes scales in the activation dtype "
                    f"(or nvfp4's float8_e4m3 block scales)")
    if c.out_dtype not in ("float16", "bfloat16", "float32"):
        return f"out_dtype={c.out_dtype!r}: the fused wgmma GEMM writes float16, bfloat16 or float32"
    if hint.row_tile not in (64, 128, 256):
        return f"row_tile={hint.row_tile}: the fused wgmma GEMM takes 64, 128 or 256 rows per tile"
    if hint.channel_tiles not in (1, 2):
        return f"channel_tiles={hint.channel_tiles}: 1 or 2 tiles of 64 channels per warpgroup"
    if hint.warpgroups not in (1, 2):
        return f"warpgroups={hint.warpgroups}: 1 or 2 warpgroups per block"
    nacc = hint.channel_tiles * hint.row_tile // 2 * _sum_sets(plan)
    if nacc > 128:
        return (f"channel_tiles={hint.channel_tiles}, row_tile={hint.row_tile}: {nacc} accumulators per thread"
                f"{' (two sets: per slab and float32)' if _sum_sets(plan) > 1 else ''}, at most 128")
    if hint.stages < 1:
        return f"stages={hint.stages}: at least one weight register slot"
    if hint.raster_rows < 1:
        return f"raster_rows={hint.raster_rows}: a positive number of rows per raster group"
    regs = register_words(plan, hint)
    if regs > _REG_WORDS_MAX:
        return (f"channel_tiles={hint.channel_tiles}, row_tile={hint.row_tile}, stages={hint.stages}: {regs} "
                f"registers of accumulators, decoded and loaded weights per thread, more than {_REG_WORDS_MAX} "
                f"(ptxas would spill)")
    # the template's rule (int8 tensor cores: a lane quad's 4 vectors inside one group)
    if vec_bytes(plan, 16, group_vectors=4 if _byte_acts(plan) else 1,
                 blocks=vec_blocks(plan, _gemv_stand_in(hint))) != 16:
        return (f"K={c.K}, group_size={c.group_size}: the fused wgmma GEMM streams 16-byte weight vectors "
                f"({16 * 8 // w.bits} codes inside one group)")
    if hint.k_ctas not in (1, 2):
        return f"k_ctas={hint.k_ctas}: 1 or 2 CTAs (a cluster) per tile splitting K"
    kw = hint.warpgroups if hint.split_k else 1
    if c.K % (slab_codes(w.bits) * kw * hint.k_ctas):
        return (f"K={c.K}: the fused wgmma GEMM needs K to be a multiple of {slab_codes(w.bits) * kw * hint.k_ctas} "
                f"(one slab per warpgroup{', split_k=True' if kw > 1 else ''}{', k_ctas=2' if hint.k_ctas > 1 else ''})")
    ups = boxes_per_slab(plan)
    slots = ring_slots(plan, hint)
    box = box_bytes(hint)
    need = ups * (2 if hint.overlap else 1)
    if hint.w_smem and kw * slots * box + 4 * w_smem_words(hint) > W_SMEM_MAX:
        return (f"w_smem=True: the activation ring ({kw * slots * box} bytes) and the weight ring "
                f"({4 * w_smem_words(hint)} bytes) exceed {W_SMEM_MAX} bytes of shared memory")
    if slots < need or kw * slots * box > FUSED_SMEM_MAX:
        return (f"ring={hint.ring}, row_tile={hint.row_tile}: the activation ring needs {need}..."
                f"{FUSED_SMEM_MAX // box // kw} slots of {box} bytes ({need // ups} slab(s) of {slab_codes(w.bits)} "
                f"K values{', per warpgroup' if kw > 1 else ''}{', overlap=True' if hint.overlap else ''})")
    return None


def _byte_acts_unsupported(plan, hint: FusedWgmmaHint) -> Optional[str]:
    """:func:`fused_wgmma_unsupported` for int8 and float8_e4m3 activations: int/uint 2- and 4-bit
    codes (8-bit int8 ones are the dense int8 wgmma GEMM's), float32 group scales whose groups hold
    whole slabs (a slab's sums are promoted with one scale per channel), or per-channel scales; a
    float output; no ``overlap`` (a slab's sums are promoted before the next slab's wgmma overwrite
    them)."""
    c, w = plan.config, plan.w
    act = c.A_dtype
    if w.kind not in ("int", "uint") or w.bits not in (2, 4):
        return (f"W_dtype={c.W_dtype!r}: the fused wgmma GEMM takes int/uint 2- and 4-bit codes with {act} "
                f"activations")
    if c.with_zeros:
        return f"with_zeros=True: {act} activations take no zero points"
    if plan.groups > 1 and c.group_size % slab_codes(w.bits):
        return (f"group_size={c.group_size}: with {act} activations the fused wgmma GEMM needs whole slabs of "
                f"{slab_codes(w.bits)} {c.W_dtype} codes in a group")
    if c.out_dtype not in ("float16", "bfloat16", "float32"):
        return (f"out_dtype={c.out_dtype!r}: with int8 activations the fused wgmma GEMM writes float16, bfloat16 "
                f"or float32 (exact int32 sums: the GEMV or decode-then-GEMM)")
    if hint.overlap:
        return f"overlap=True: with {act} activations each slab's sums are promoted before the next slab's wgmma"
    return None


FUSED_DEFAULT_MAX_ROWS = 2048      # the most rows fused_default serves (N >= 8192; 1024 below)


def fused_default(plan, rows: int, sms: Optional[int] = None) -> Optional[FusedWgmmaHint]:
    """The fused kernel's tile for ``rows`` rows of ``plan`` (a CUDA plan that decode-then-GEMM would
    serve: the caller checks that) on a GPU of ``sms`` SMs (None: ``arch.GENERIC_SM_COUNT``), or
    None where decode-then-GEMM stays the default: more than 1024 rows (2048 where N >= 8192), or a
    plan no tile takes; int8 and float8_e4m3 activations: :func:`_byte_acts_default`. Each tile with
    ``overlap`` for 4-bit codes (uint2 refuses it for its registers or ring; 8-bit codes measured
    slower with it).

    Few tiles (up to 128 rows, or where 256-row tiles of 128 channels would make at most 64
    blocks): two warpgroups splitting K over 64 channels, in 128-row tiles, or for 4- and 8-bit codes
    in 256-row tiles past 128 rows where these run in fewer waves (each weight decoded once per 256
    rows; H100, 8192^2 at 256 rows: W4A16 in 0.93x and nf4 in 0.87x the time of two waves of
    128-row tiles; H200, 8192^2 at 256 rows, int8 / float8_e4m3 per channel 88.22 / 92.46 us -> 72.70 /
    72.93 (1.21x / 1.27x; in natural order 68.83 / 70.49, not taken: N > _natural_max_n; at N = K =
    4096, one wave either way, they took 1.36x the 128-row tiles' time); uint2 took 1.17x with them
    (H100), and its 256-row split-K tiles do not fit its registers or ring: it keeps 128-row
    tiles); else 256-row tiles with two warpgroups side by side. Split-K tiles that fill at most half
    the SMs are split over K once more by a 2-CTA cluster (:func:`_clustered`)."""
    N = plan.config.N
    sms = sms or GENERIC_SM_COUNT
    if _byte_acts(plan):
        return _finish(plan, _byte_acts_default(plan, rows), rows, sms)
    if rows > FUSED_DEFAULT_MAX_ROWS or (rows > 1024 and N < 8192):
        return None
    split = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True)
    wide = FusedWgmmaHint(row_tile=256, warpgroups=2)
    few = rows <= 128 or (-(-N // 128)) * (-(-rows // 256)) <= 64
    waves = lambda rt: math.ceil(math.ceil(N / 64) * math.ceil(rows / rt) / sms)   # noqa: E731 - split-K tiles, 64 channels
    if few and rows > 128 and plan.w.bits in (4, 8) and waves(256) < waves(128):
        split = FusedWgmmaHint(row_tile=256, warpgroups=2, split_k=True, stages=4)
    for hint in ((split, wide) if few else (wide, split)) + (FusedWgmmaHint(row_tile=128, stages=4),):
        # each tile with its decode overlapping its wgmma where its registers and ring allow, for
        # 4-bit codes (8-bit: decoding is cheap, and the second register set made it slower); split
        # over K with 4 weight slots and a ring of 4 boxes per warpgroup (H100: 5-10% faster than 2
        # slots and 6 boxes from 128 to 512 rows over the 8192^2 and Llama-3-8B layers)
        ov = replace(hint, overlap=True, **(dict(stages=4, ring=4) if hint.split_k else {}))
        for h in ((ov,) if plan.w.bits < 8 else ()) + (hint,):
            if fused_wgmma_unsupported(plan, h) is None:
                # the activations as given where the natural-order decoder takes the plan, up to the
                # channels measured faster in this kind of tile (_natural_max_n)
                nat = replace(h, permute=False)
                limit = _natural_max_n(plan, h.split_k)
                if (fused_wgmma_unsupported(plan, nat) is None
                        and (limit is None or plan.config.N <= limit)):
                    h = nat
                return _finish(plan, h, rows, sms)
    return None


def _finish(plan, hint: Optional[FusedWgmmaHint], rows: int, sms: int) -> Optional[FusedWgmmaHint]:
    """The default tile ``hint`` with the launch choices measured for it: PDL (:func:`_pdl`), the
    weights staged in shared memory (:func:`_staged`), a 2-CTA cluster (:func:`_clustered`)."""
    return _clustered(plan, _staged(plan, _pdl(plan, hint, rows, sms)), rows, sms)


# the most output channels (N) at which natural K order measured faster than the permute pass, per
# code family (nvfp4; 4-bit tables "lut4", e.g. nf4; fp4_e2m1 "e2m1"; else int / float8 codes by bits)
# and tile: (split over K, side by side); None: any N, 0: never
NATURAL_MAX_N = {"nvfp4": (4096, 0), "lut4": (8192, 8192), "e2m1": (8192, 4096), 2: (6144, 8192), 4: (8192, 0),
                 8: (4096, 4096)}


def _natural_max_n(plan, split_k: bool) -> Optional[int]:
    """The most output channels at which the defaults take natural K order for ``plan`` in split-K
    tiles (``split_k``) or in the tiles side by side (256-row tiles, two warpgroups in N: the defaults
    past the split-K rows); None: any, 0: never (:data:`NATURAL_MAX_N`).

    Split over K: H200, the defaults against the same tiles permuted (with and without PDL), cuBLAS
    fp16 in the same run (``benchmark.matmul --hints 'Default(permute=true,pdl=false);Default(permute=false,
    pdl=true)'``; docs/tuning.md has the rows), natural over the faster permuted tile: N = K = 4096
    at 128 rows (clustered) nvfp4 1.15-1.16x (13.84 / 16.01 us, cuBLAS 13.77), int8 / float8_e4m3
    per channel 1.14x / 1.15x, int2 / uint2 g128 1.23x (12.52 / 15.41, cuBLAS 13.93); at 256 rows
    nvfp4 1.00-1.02x, 8-bit 1.03-1.04x, 2-bit 1.19x (17.19 / 20.45, cuBLAS 18.31; 1.39x over the
    permuted default with PDL); N = K = 8192 at 128 and 256 rows nvfp4 0.87-0.99x, 8-bit 0.90-0.93x,
    2-bit 0.95-1.00x at 128 rows and 0.92-0.94x at 256. Llama-3-8B layers, int2 g128 at 128 rows:
    qkv (N = 6144, K = 4096) 1.09x, o (4096 x 4096) 1.22x, down (4096 x 14336) 1.05x, gate_up
    (28672 x 4096) 0.93x. So the channels decide, not K: the shuffles and ``prmt`` of the codes cost
    per weight and row tile (a share of the main loop at any N), while the permute pass costs per
    activation (its share shrinks as N grows). nvfp4 and 8-bit codes are not measured at N = 6144.
    4-bit int / uint and table codes (H200, 128 rows, the default natural tile against
    ``Default(permute=true)`` and ``Default(permute=true,pdl=false)``, one run, ``--shapes
    llama3-8b,n-sweep,up70b``), natural over the faster permuted tile, uint4 / nf4 g128: N = 4096 (down,
    K = 14336) 1.13x / 1.10x, 6144 0.97x / 1.03x, 8192 within the spread of two runs (above), 10240
    0.89x / 0.97x, 14336 0.91x / 0.95x, 20480 0.91x / 0.95x, 28672 0.88x / 0.95x (K = 4096) and 0.89x /
    0.95x (K = 8192); fp4_e2m1 g128 at 10240 / 14336 / 20480 0.89x / 0.94x / 0.90x. So 4-bit codes
    keep natural order (and no temporary) up to N = 8192.

    Side by side: H200, the defaults against ``Default(permute=false)`` in the same run (``benchmark.matmul --shapes square8k --m 512,1024,2048``
    two rounds, ``--shapes llama3-8b --m 1024`` one; docs/tuning.md has the rows), natural over
    permuted: nf4 g128 at 8192^2 1.011-1.017x, Llama-3-8B o / down (N = 4096) 1.05x / 1.06x, qkv (6144)
    1.03x, gate_up (28672) 0.98x; uint2 g128 1.00-1.02x at 8192^2, o / down 1.10x / 1.09x, qkv 1.00x,
    gate_up 0.94x; int8 per channel 0.98-1.00x at 8192^2, o / down 1.05x / 1.03x, qkv 0.99x; fp4_e2m1
    g128 0.96-0.98x at 8192^2, o / down 1.02x / 1.01x, qkv 0.97x; nvfp4 0.95-0.97x at 8192^2, o / down
    0.99x / 1.00x; uint4 g128 0.94-0.96x at 8192^2, o / down 0.98x / 0.99x: the split-K tiles'
    pattern. float8 weights
    take the 8-bit rule (not measured in these tiles). nf4 and fp4_e2m1 run these tiles with
    ``overlap``; in natural order ptxas (nvcc 13.0) spilled them at K = 1536, 2048, 2560, 3584, 4608,
    11008 (40-304 bytes of spill stores) while the loop's last body was a guarded iteration; with the
    last body after the loop (:func:`peel_last_body`) they compile clean at those K, and the
    defaults take them (H200, Llama-3-8B at 1024 rows, the new defaults against
    ``Default(permute=true)`` in one run: nf4 g128 qkv / o / down 1.04x / 1.07x / 1.05x, fp4_e2m1 g128
    o / down 1.01x / 1.01x)."""
    dec = decoder(plan.w)
    family = "nvfp4" if f8_scales(plan) else dec if dec in ("lut4", "e2m1") else plan.w.bits
    return NATURAL_MAX_N.get(family, (None, 0))[0 if split_k else 1]


def _pdl(plan, hint: Optional[FusedWgmmaHint], rows: int, sms: int) -> Optional[FusedWgmmaHint]:
    """``hint`` (a permuted tile) without programmatic dependent launch where that measured faster
    behind the permute kernel: nvfp4's split-K tiles in one wave, and int8 activations' per-channel
    tiles side by side in one wave of more than half the SMs. H200, ``Default(pdl=false)`` against
    the default in the same run (docs/tuning.md has the rows): nvfp4 at 8192^2 and 128 rows, three
    runs, 41.36 / 41.65 / 41.31 -> 39.80 / 39.98 / 37.97 us (1.04-1.09x), 256 rows 64.22 -> 63.59;
    W4A8 / W2A8 per channel at 8192^2 (128 tiles) 1.09-1.10x / 1.12x at 200 and 256 rows (W4A8 at 256
    rows in three runs: 48.71 / 48.67 / 48.85 -> 44.79 / 44.56 / 44.67 us), 1.03x / 1.07x at 512,
    while at N = K = 4096 (64 tiles) 0.96-1.00x. The other permuted split-K defaults in one wave
    measured the same or slower without it (8192^2 at 128 rows: int8 / float8 weights per channel
    0.96x / 0.98x, uint2 g128 1.01x, W4A8 g128 / per channel 0.96x / 0.97x, W4A-fp8 g128 0.94x),
    and so did the permuted 4-bit tiles in more waves (uint4 / nf4 / fp4_e2m1 g128 at N = 10240,
    14336, 20480, K = 4096, 128 rows: 0.90-0.96x)."""
    if hint is None or not hint.permute:     # (a permuted cluster drops PDL itself: _cluster_pair)
        return hint
    tiles = tile_count(plan, hint, rows)
    if f8_scales(plan) and hint.split_k and tiles <= sms:
        return replace(hint, pdl=False)
    if _int8(plan) and plan.groups == 1 and not hint.split_k and sms // 2 < tiles <= sms:
        return replace(hint, pdl=False)
    return hint


def tile_count(plan, hint: FusedWgmmaHint, rows: int) -> int:
    """Output tiles of ``hint`` for ``rows`` rows (channel blocks x row tiles; a cluster's CTAs share one)."""
    CW = 1 if hint.split_k else hint.warpgroups
    return math.ceil(plan.config.N / (64 * hint.channel_tiles * CW)) * math.ceil(rows / hint.row_tile)


def _clustered(plan, hint: Optional[FusedWgmmaHint], rows: int, sms: int) -> Optional[FusedWgmmaHint]:
    """``hint`` split over K by a 2-CTA cluster per tile (``k_ctas=2``) where its split-K tiles would
    fill at most half of the ``sms`` SMs (the clusters' CTAs in one wave); behind the permute kernel
    without programmatic dependent launch (``pdl=False``). int8 / float8 activations: only with group
    scales, on the 128-row tile (per channel it measured slower). H200, N = K = 4096 (64 tiles),
    symbolic-M kernels, ``benchmark.matmul --hints 'Default(...)'`` beside cuBLAS fp16 in the same
    run (13.6-14.7 us at 80 and 128 rows), us unclustered -> clustered at 80 / 128 rows: W4A16 g128 in
    natural order 18.67 -> 12.41 at 128 (1.50x; 1.10x cuBLAS), 96 rows 1.51x; permuted, pdl=False:
    nvfp4 18.90 -> 14.96 / 19.26 -> 15.81 (1.26x / 1.22x), W2A16 g128 1.06x / 1.05x, W8A16 per
    channel 1.04x / 1.02x over the cluster with PDL, float8 weights per channel 1.00x (nf4 / fp4 g128
    permuted 1.31x / 1.19-1.23x; the defaults run them in natural order, faster still); W4A8 g128 1.13x /
    1.10x, W4A-fp8 g128 1.18x / 1.17x; Llama-3-8B down (4096 x 14336) at 128 rows nf4 1.49x, W4A8
    g128 1.47x. With PDL the permuted clusters lose (W2A16 20.54 against 15.24 us, W4A8 g128 17.25
    against 14.31): their CTAs launch early and hold the SMs the permute kernel still runs on. Not
    taken: W4A8 per channel (17.77 clustered against 16.39), more tiles (128: 8192^2 at 128 rows
    0.91x, N=4096 at 256 rows 0.74x; a run without a baseline). docs/tuning.md has the table."""
    if hint is None or not hint.split_k or 2 * tile_count(plan, hint, rows) > sms:
        return hint
    if _byte_acts(plan) and (plan.groups == 1 or hint.row_tile != 128):
        return hint
    pair = _cluster_pair(hint)
    return pair if fused_wgmma_unsupported(plan, pair) is None else hint


def _cluster_pair(hint: FusedWgmmaHint) -> FusedWgmmaHint:
    """``hint`` as a 2-CTA cluster splitting K; behind the permute kernel without PDL (with it the
    clusters measured slower: :func:`_clustered`)."""
    return replace(hint, k_ctas=2, pdl=hint.pdl and not hint.permute)


def _staged(plan, hint: Optional[FusedWgmmaHint]) -> Optional[FusedWgmmaHint]:
    """``hint`` with its weights staged in shared memory (``w_smem``, 4 weight slots) where it splits
    K over 128- or 256-row tiles without ``overlap`` and the rings fit. H200, 8192^2, the symbolic-M
    kernels Matmul's buckets run, against the same tile without (speed-ups): W4A8 g128 1.12 / 1.09 at
    96 / 128 rows (28672 x 8192: 1.06), W4A8 per channel 1.27 / 1.26 at 80 / 128, W2A8 per channel
    1.25, W4A-fp8 g128 1.09, per channel 1.21, W2A-fp8 per channel 1.54 (128 rows); W2A16 g128 1.26 /
    1.09 at 128 / 256 (0.97 at 80), uint2 with zeros 1.13; int8 per channel 1.45 (128), float8 weights
    per channel 1.30 (256); the 4-bit 256-row split-K tile (ring of 2 boxes) W4A16 g128 1.04, nvfp4
    1.06. Not taken: tiles with ``overlap`` (W4A16 g128 at 128 rows 0.92, with zeros 0.95; nvfp4
    1.035), tiles side by side (W4A16 at 512 / 1024 rows 0.97 / 0.98, W4A8 g128 one warpgroup at 256 /
    1024 rows 0.78 / 0.77), float8 activations' 64-row tile (W4A-fp8 g128 at 48 rows 0.63)."""
    if hint is None or not hint.split_k or hint.overlap or hint.row_tile < 128:
        return hint
    staged = replace(hint, w_smem=True, stages=4)
    return staged if fused_wgmma_unsupported(plan, staged) is None else hint


BYTE_ACTS_DEFAULT_MAX_ROWS = 1024     # the most rows _byte_acts_default serves
E4M3_CHANNEL_DEFAULT_MAX_ROWS = 384   # ... for float8 activations with per-channel weight scales


def _byte_acts_default(plan, rows: int) -> Optional[FusedWgmmaHint]:
    """int8 and float8_e4m3 activations: the fused tile where it measured faster than decode-then-GEMM
    (H100, 8192^2, tuner runs beside torch._int_mm / torch._scaled_mm), up to 1024 rows. float8 up
    to 64 rows: split-K 64-row tiles (from one row, for a tuned bucket; the untuned operator runs
    1..16 rows on the m16n8k32 GEMV). Past that float8 takes the int8 rules
    with its two sets of sums (W4A-fp8 g128 at 128 and 256 rows: the default was the tuner's best
    or within 3%). int8 with group scales (W4A8 g128: 2.3x, 1.8x and 1.1x as fast at 128, 256 and
    1024 rows) split-K 128-row tiles up to 128 rows (two warpgroups over 64 channels, 4 weight
    slots, a ring of 4 boxes each), else 128-row tiles of one warpgroup; per-channel (W4A8 / W2A8:
    2.1x / 2.6x as fast at 128 rows, 1.5x / 1.7x at 256, 1.13x / 1.22x at 1024) the same split-K
    tile up to 128 rows, 128-row tiles of two warpgroups side by side up to 256, 256-row ones
    above (at 4096 rows decode-then-GEMM's dense int8 GEMM was 2% faster than the best fused tile
    for 4-bit codes and 8% slower for 2-bit ones: left to the tuner).

    float8 activations with per-channel scales (W4A-fp8 / W2A-fp8 without groups): the fused tile up
    to 384 rows only, decode-then-GEMM above. H200, `benchmark.matmul` with the limit patched, µs
    fused / decode-then-GEMM, after the e4m3 decode lost its select chain (``ir.matmul.e4m3_bits``):
    int4 at 8192^2, 256 rows 59.0 / 72.2, 384 95.3 / 94.8, 512 110.9 / 94.5, 768 163.4 / 137.8, 1024
    218.6 / 148.6; int2 at 8192^2 384 95.3 / 97.4, 512 101.4 / 96.9, 1024 197.7 / 148.3; 28672 x 8192
    (int4 / int2) at 384 rows 277.9 / 296.1 and 260.0 / 300.4, at 768 523.2 / 442.5 and 486.0 /
    443.8. The fused float8 tile runs 3.2x the instructions of the int8 one (the promotion's fadd
    every 128 K, the e4m3 table decode), while the dense float8 GEMM after the decode runs at
    1.0-1.1x torch._scaled_mm. With group scales the dense half is the slower group-scaled float8
    GEMM: the fused tile stays the default up to 1024 rows (int4 g128 at 8192^2: 512 rows 101.7 /
    116.6, 768 149.6 / 154.7, 1024 200.2 / 192.1; 28672 x 8192 at 768 rows 520.8 / 548.5)."""
    if rows > (E4M3_CHANNEL_DEFAULT_MAX_ROWS if e4m3_acts(plan) and plan.groups == 1 else BYTE_ACTS_DEFAULT_MAX_ROWS):
        return None
    if rows <= 64:                   # float8 (int8: the GEMV's rows): H100, W4A-fp8 8192^2 at 1 / 16 /
                                     # 64 rows: 1.4-1.6x as fast as the 128-row tile
        hint = FusedWgmmaHint(row_tile=64, warpgroups=2, split_k=True, stages=4, ring=4)
    elif rows <= 128:                # 4 weight slots: 6 measured 1.03-1.06x as fast for W4A8 g128 on the
                                     # static-M kernel (H200, 8192^2 at 96 / 128 rows, 28672 x 8192 at
                                     # 128) but 0.94x / 0.98x on the symbolic-M one that Matmul's buckets
                                     # run; float8 g128 0.94x at 80 rows, per channel 0.92x (static M)
        hint = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4)
    elif _sum_sets(plan) > 1:        # two sets of sums (group scales; float8 always): 128-row tiles
        hint = FusedWgmmaHint(row_tile=128, stages=4)
    else:
        hint = FusedWgmmaHint(row_tile=128 if rows <= 256 else 256, warpgroups=2, stages=4)
    return hint if fused_wgmma_unsupported(plan, hint) is None else None


def fused_space(plan) -> list:
    """Every tile of the fused GEMM that takes ``plan`` (the tuner's space): 64-, 128- or 256-row
    tiles; 1 or 2 channel tiles per warpgroup; one warpgroup, two side by side in N, or two splitting
    K; 1, 2 or 4 weight register slots; with and without ``overlap``; the largest activation ring
    that fits, and for ``split_k`` also a ring of 4 boxes per warpgroup (the default's); each with
    the permute kernel and, where the natural-order decoder takes the plan, without
    (``permute=False``); split-K tiles without overlap with 2 or 4 slots also with ``w_smem``; every
    split-K tile also with ``k_ctas=2`` (``pdl=False`` where it permutes). The defaults of
    :func:`fused_default` are among them."""
    out = []
    for rt, r, (wg, split), stages, ov in itertools.product((64, 128, 256), (1, 2), ((1, False), (2, False), (2, True)),
                                                            (1, 2, 4), (False, True)):
        base = FusedWgmmaHint(row_tile=rt, channel_tiles=r, warpgroups=wg, split_k=split, stages=stages, overlap=ov)
        for hint in (base, replace(base, ring=4)) if split else (base,):
            if hint.ring and hint.ring == ring_slots(plan, base):
                continue                  # the same ring as the largest that fits
            for h in (hint, replace(hint, permute=False)):
                # split over K without overlap: also with the weights staged in shared memory
                for hh in (h, replace(h, w_smem=True)) if split and not ov and stages > 1 else (h,):
                    # split over K: also by a 2-CTA cluster per tile
                    for kc in (hh, _cluster_pair(hh)) if split else (hh,):
                        if fused_wgmma_unsupported(plan, kc) is None:
                            out.append(kc)
    return out


def peel_last_body(plan) -> bool:
    """Whether the ``overlap`` loop's last body follows the loop (unguarded, constant indices) rather
    than running as a guarded iteration (:func:`~.gemv.emit.step_loop`): both are correct, and which
    one ptxas (nvcc 13.0) allocates in 255 registers without spills depends on the kernel. Bytes of
    spill stores, guarded / peeled, of the 256-row tiles side by side (N = 4096; none in either form
    at the K not listed among 1536, 2048, 4096, 14336): nf4 g128 in natural order K = 1536 304 / 0,
    2048 56 / 0; permuted fp4_e2m1 g128 and nvfp4 (float16) at 2048 32 / 0; uint4 g128 with zeros at
    2048 20 / 36; with quantized zeros 2048 80 / 4, 4096 0 / 20, 14336 0 / 12. So the codes without
    zero points peel it, those with them keep the guarded form. The peeled body was not timed against
    the guarded one in one run (the old code's run in that call failed to import); across H200 calls
    the ``overlap`` defaults at 8192^2 stayed within the run-to-run spread: 1024 rows W4A16 g128 /
    nvfp4 226.92 / 232.60 us before, 227.88 / 231.93 after; 128 rows W4A16 40.11 (docs/performance.md
    run 17) before, 40.73 and 37.40 in two calls after."""
    return not plan.config.with_zeros


def _gemv_stand_in(hint: FusedWgmmaHint):
    """The GEMV hint whose load / decode / scale / store lines the kernel shares (gemv.template)."""
    from .gemv.hints import GEMVWgmmaHint
    return GEMVWgmmaHint(rows_per_warp=16 * hint.channel_tiles, k_warps=1, stages=hint.stages, pdl=hint.pdl)


def _body(plan, hint: FusedWgmmaHint):
    """The main kernel's body writer, given gemv.template ``kernel_script``'s ``add`` and locals
    (the wgmma GEMV's emit helpers; accumulator loops unrolled)."""
    from .gemv.emit import device_entry, pdl_trigger, step_loop

    def body(add, e):
        c = plan.config
        N, K, NW, NA, tag = e["N"], c.K, e["NW"], e["NA"], e["tag"]
        R, RT = hint.channel_tiles, hint.row_tile
        KW = hint.warpgroups if hint.split_k else 1     # warpgroups splitting K, each with its own ring
        CW = 1 if hint.split_k else hint.warpgroups     # warpgroups side by side in N, sharing one ring
        I8 = _int8(plan)                        # int8 activations: int32 sums ``iacc``, promoted per slab
        # float8 activations: wgmma m64nNk32 .e4m3.e4m3 on the weights decoded to e4m3 bytes
        # (gemv.decode.e4m3_code_dec), each slab's float32 sums ``pacc`` promoted (times the group scale)
        F8 = e4m3_acts(plan)
        B8 = I8 or F8                           # k32 wgmma on decoded bytes
        SL = slab_codes(plan.w.bits)
        UPS = boxes_per_slab(plan)              # boxes per slab
        BV = box_values(c.A_dtype)              # K values per box row
        KC = hint.k_ctas                        # CTAs of a cluster splitting K (rank ``cl``)
        KT = KW * KC                            # warpgroups splitting K in all
        KQ = "cl * {} + kw".format(KW) if KC > 1 and KW > 1 else "cl" if KC > 1 else "kw"  # this one's rank
        NS = K // SL // KT                      # slabs per warpgroup
        NU = NS * UPS                           # boxes per warpgroup
        STG = ring_slots(plan, hint)            # box slots per ring
        PROD = "t4 == 0" if KW > 1 else "tx == 0"       # the thread that issues a ring's TMA
        OV = hint.overlap                       # two decoded register sets, alternating by step
        STW = max(1, min(hint.stages, NS))
        LAG = 2 if OV else 1                    # a slab's boxes are free LAG slabs later
        NACC = RT // 2
        BOXB = box_bytes(hint)                  # bytes per box slot
        SW = BOXB // 4                          # float32 words per box slot
        CH = 64 * R * CW                        # channels per block
        NBLK = -(-N // CH)
        NRT = f"((mv + {RT - 1}) // {RT})"
        at_store = scales_at_store(plan, e)
        GS = (I8 and plan.groups > 1) or F8     # promote each slab's sums (times its group scale)
        SUMS = "iacc" if I8 else "pacc" if F8 else "acc"     # the accumulators the wgmma write
        SH = 0
        if I8:
            from .gemv.mma_int8 import mma_i8_helpers, code_shift
            SH = code_shift(plan)               # signed codes decode to q * 2**SH
            dname = f"bb_mdec_m{tag}"
            dsrc = repr(mma_i8_helpers("m" + tag, plan.w.bits, plan.w_storage, 4, plan.w_order)[dname])
            wsrc = repr(wgmma_helper(tag, "int8", RT, 4, BOXB, a_type="s8" if plan.w.kind == "int" else "u8"))
        elif F8:
            from .gemv.decode import e4m3_code_dec
            dname = f"bb_fdec_{tag}"
            dsrc = repr(e4m3_code_dec(tag, plan.w.bits, plan.w_storage, 4))
            wsrc = repr(wgmma_helper(tag, c.A_dtype, RT, 4, BOXB))
        else:
            wsrc = repr(wgmma_helper(tag, c.A_dtype, RT, 4, BOXB))

        if not hint.permute:          # the activations as given: the codes move in registers instead
            halves = _natural_halves(plan)
            nsrc = natural_dec_helper(tag, c.A_dtype, plan.w_storage, plan.w_order, decoder(plan.w), plan.w.table,
                                      plan.w.bits, halves)
            e = dict(e, dec_line=lambda ind, wsrc, off, dst: f"{ind}T.cuda.func_call('bb_ndec_{tag}', {wsrc}, "
                                                             f"{off}, {dst}, source_code={nsrc!r})")
            if e["SB"] > 1:                     # nvfp4: each pair's block scale from the lane whose codes it holds
                e["helpers"] = {**e["helpers"], f"bb_sclb_{tag}": natural_block_scale_helper(tag, c.A_dtype)}
            if halves:                          # 2-bit, groups of 128: each half's scale from its group
                e["scl"] = (f"bb_scl2_{tag}", natural_scale_halves_helper(tag, c.A_dtype, NA))
        tensor_map(add, plan.arg("A").dtype, K, RT)
        if hint.tail_box:                       # boxes of the last tile's rows: (mv - 1) % RT + 1
            tensor_map(add, plan.arg("A").dtype, K, RT, name="A_tail", box_rows=f"(mv - 1) % {RT} + 1")
        device_entry(add, e["hint"], f"{NBLK} * {NRT}{f' * {KC}' if KC > 1 else ''}", 128 * CW * KW, (STW, R, 2), NW,
                     None if at_store else e["sdt"], e["zdt"], wait=False, cluster=KC)
        # the rings; after the main loop the K warpgroups' sums (``red``) reuse them, and with k_ctas=2
        # the first CTA's receive the second's
        AW = max(KW * STG * SW, (KW - 1) * R * NACC * 128, (KC - 1) * R * NACC * 128 * CW)  # words before w_smem
        TT = 128 * CW * KW                                     # threads
        slab_locals(add, AW + w_smem_words(hint), KW * STG, R, NA, NACC,
                    empty=STG if CW > 1 else 0, side_by_side=True, dq_buffers=2 if OV else 1)
        # grouped raster: GR row tiles (the last group may have fewer) x every channel block, the
        # group's row tiles adjacent: a wave's blocks share weights across the group's row tiles and
        # activations across its channel blocks in L2
        GR = max(1, hint.raster_rows // RT)
        BX = f"(bx // {KC})" if KC > 1 else "bx"       # the tile (a cluster's CTAs share it)
        add(f"    grp = T.meta_var({BX} // {GR * NBLK})")
        add(f"    gsz = T.meta_var(T.min({GR}, {NRT} - grp * {GR}))")
        add(f"    n0 = T.meta_var({BX} % {GR * NBLK} // gsz * {CH}{f' + cw * {64 * R}' if CW > 1 else ''})")
        add(f"    r0 = T.meta_var((grp * {GR} + {BX} % {GR * NBLK} % gsz) * {RT})")
        if B8:
            add(f"    {SUMS} = T.alloc_local(({R}, {NACC}), {'uint32' if I8 else 'float32'!r})")
            if plan.groups > 1:                # the slab's group scales (promote); per-channel: at the store
                add(f"    gs = T.alloc_local(({R}, 2), 'float32')")
            for_accs(add, "    ", f"{SUMS}[r, j] = T.{'uint32' if I8 else 'float32'}(0)", R, NACC, unroll=True)
            if plan.groups > 1:
                add(f"    for r, h in T.grid({R}, 2):")
                add("        gs[r, h] = T.float32(0)")
        init_accs_barriers(add, R, NACC, KW * STG, empty=STG if CW > 1 else 0, arrivals=CW, unroll=True)

        def slot(u):
            """The ring slot of this warpgroup's box ``u``."""
            return f"kw * {STG} + ({u}) % {STG}" if KW > 1 else f"({u}) % {STG}"

        def kbox(u):
            """K box (of 64 values) of this warpgroup's box ``u``: slab ``u // UPS`` of the warpgroup
            is slab ``(u // UPS) * KW + kw`` of the row."""
            return f"(({u}) // {UPS} * {KT} + {KQ}) * {UPS} + ({u}) % {UPS}" if KT > 1 else f"({u})"

        def tma(ind, u):
            """Box ``u`` (K values 64 kbox(u) .. + 63 of the tile's rows) into its slot."""
            sl = slot(u)
            if hint.tail_box:             # the last tile short of RT rows: its own boxes, its bytes
                nbytes = f"T.Cast('uint32', T.min(mv - r0, {RT}) * {BOXB // RT})"
                amap = f"T.if_then_else(r0 + {RT} > mv, T.address_of(A_tail), T.address_of(A_map))"
            else:
                nbytes, amap = f"T.uint32({BOXB})", "T.address_of(A_map)"
            add(f"{ind}T.ptx.mbarrier.arrive.expect_tx.shared.b64(full.ptr_to([{sl}]), {nbytes})")
            add(f"{ind}T.ptx[{TMA_2D!r}](Sm.ptr_to([({sl}) * {SW}]), {amap}, "
                f"({kbox(u)}) * {BV}, r0, full.ptr_to([{sl}]))")

        def cidx(step):
            return f"((({step}) * {KT} + {KQ}) * 4 + q)" if KT > 1 else f"(({step}) * 4 + q)"

        def first_activations():
            if hint.pdl:
                add("    T.ptx.griddepcontrol.wait()")
            add(f"    if {PROD}:")
            for u in range(min(STG, NU)):
                tma("        ", str(u))

        cps = _cp_helpers(STW)

        def wsm(ws):
            """This thread's 16-byte slot of vector (r, h) of weight slot ``ws`` in the ring."""
            return f"Sm.ptr_to([{AW} + ((({ws}) * {R} + r) * 2 + h) * {TT * 4} + tx * 4])"

        def ssm(ws):
            """This thread's scale word of vector (r, h) of weight slot ``ws`` (after the vectors)."""
            return f"Sm.ptr_to([{AW + STW * R * 2 * TT * 4} + ((({ws}) * {R} + r) * 2 + h) * {TT} + tx])"

        SRAW = bool(e["sdt"]) and not scales_at_store(plan, e)    # raw scales per vector (registers sr)
        # bytes of a vector's raw scale: nvfp4's two float8 block scales, else the scale dtype's
        SBYTES = 2 if e["SB"] > 1 else (tvm.DataType(plan.arg("scale").dtype).bits // 8 if SRAW else 0)

        def load(ind, step, ws):
            if not hint.w_smem:
                load_vectors(add, plan, e, ind, R, cidx(step), ws)
                return
            ch = vector_channel(plan, e)
            add(f"{ind}for r, h in T.grid({R}, 2):")
            lines = e["load_lines"](ind + "    ", ch, cidx(step), f"{ws}, r, h", False)
            ptrs = e["vec_ptrs"](ch, cidx(step))
            add(f"{ind}    T.cuda.func_call('bb_cpw16', {wsm(ws)}, {ptrs[0]}, source_code={cps['bb_cpw16']!r})")
            if SRAW:
                add(f"{ind}    T.cuda.func_call('bb_cps4', {ssm(ws)}, {ptrs[1]}, source_code={cps['bb_cps4']!r})")
            for ln in lines[1:]:                  # zeros as before (registers)
                add(ln)
            add(f"{ind}T.cuda.func_call('bb_cpcommit', source_code={cps['bb_cpcommit']!r})")

        def stage_in(ind, step, ws):
            """w_smem: wait for step ``step``'s commit group (the groups of the STW - 1 later steps may
            still be pending; at the last steps fewer were issued: wait for all) and read the slot."""
            if STW > 1:
                add(f"{ind}if ({step}) + {STW - 1} < {NS}:")
                add(f"{ind}    T.cuda.func_call('bb_cpwait{STW - 1}', source_code={cps[f'bb_cpwait{STW - 1}']!r})")
                add(f"{ind}else:")
                add(f"{ind}    T.cuda.func_call('bb_cpwait0', source_code={cps['bb_cpwait0']!r})")
            else:
                add(f"{ind}T.cuda.func_call('bb_cpwait0', source_code={cps['bb_cpwait0']!r})")
            add(f"{ind}for r, h in T.grid({R}, 2):")
            add(f"{ind}    T.cuda.func_call('bb_lds4', {wsm(ws)}, wq.ptr_to([{ws}, r, h, 0]), source_code={cps['bb_lds4']!r})")
            if SRAW:
                if SBYTES == 4:                   # float32 scales (int8 activations): the word itself
                    val = (f"T.reinterpret({e['sdt']!r}, T.cuda.func_call('bb_ldsw', {ssm(ws)}, "
                           f"source_code={cps['bb_ldsw']!r}, return_type='uint32'))")
                else:
                    half = (f"T.cuda.func_call('bb_ldsh', {ssm(ws)}, {e['vec_ptrs'](vector_channel(plan, e), cidx(step))[1]}, "
                            f"source_code={cps['bb_ldsh']!r}, return_type='uint16')")
                    val = (f"T.Cast('uint32', {half})" if e["sdt"] == "uint32" else
                           f"T.reinterpret({e['sdt']!r}, {half})")
                add(f"{ind}    sr[{ws}, r, h] = {val}")

        def process(ind, step, ws, j=0):
            # this warpgroup's wgmma of slab step - LAG are done (with overlap, those of the previous
            # slab may still run, except at the top of the unrolled body: ptxas serializes every
            # wgmma, C7513, when one may be in flight across the loop's back edge): that slab's
            # decoded registers and (for this warpgroup) box slots are free
            dq = "dq1" if OV and j % 2 else "dq"
            wgmma_wait(add, ind, R, NACC, unroll=True, pending=1 if OV and j else 0, acc=SUMS)
            if GS:                        # the previous slab's sums (zeros at the first) with its scales
                promote(ind)
            add(f"{ind}T.cuda.warpgroup_sync(cw + 1)")
            add(f"{ind}if ({step}) > {LAG - 1}:")
            if CW > 1:
                add(f"{ind}    if t4 == 0:")
                for b in range(UPS):
                    add(f"{ind}        T.ptx.mbarrier.arrive.shared.b64(empty.ptr_to([((({step}) - {LAG}) * {UPS} + {b}) "
                        f"% {STG}]), T.uint32(1))")
            add(f"{ind}    if {PROD}:")
            for b in range(UPS):          # refill the slots of that slab's boxes
                u = f"(({step}) - {LAG}) * {UPS} + {STG + b}"
                add(f"{ind}        if {u} < {NU}:")
                if CW > 1:
                    add(f"{ind}            T.cuda.mbarrier_wait(empty.ptr_to([({u}) % {STG}]), (({u}) // {STG} + 1) % 2)")
                tma(ind + "            ", u)
            if hint.w_smem:
                stage_in(ind, step, ws)
            if B8:
                decode_bytes(ind, ws, dq)
            else:
                decode_vectors(add, plan, e, ind, R, cidx(step), ws, dq=dq)
            for b in range(UPS):
                u = f"({step}) * {UPS} + {b}"
                # bytes: the first k32 of a slab overwrites the sums where they are promoted per slab
                wgmma_slot(add, ind, slot(u), f"(({u}) // {STG}) % 2", SW, R, NACC, wsrc, tag, pair0=8 * b,
                           unroll=True, dq=dq, acc=SUMS, extra=("0" if GS and b == 0 else "1") if B8 else "")
            add(f"{ind}T.ptx.wgmma.commit_group.sync.aligned()")
            if OV and j == GRP - 1:
                wgmma_wait(add, ind, R, NACC, unroll=True)

        def decode_bytes(ind, ws, dq):
            """The slab's vectors to bytes (int8: the int8 mma GEMV's decoder; float8: e4m3 codes) and,
            with group scales, the slab's scales (int8: times 2**-SH) for its promotion."""
            add(f"{ind}for r, h in T.grid({R}, 2):")
            if GS and plan.groups > 1:
                add(f"{ind}    gs[r, h] = T.Cast('float32', sr[{ws}, r, h]){f' * T.float32({2.0 ** -SH!r})' if SH else ''}")
            add(f"{ind}    T.cuda.func_call({dname!r}, wq.ptr_to([{ws}, r, h, 0]), {dq}.ptr_to([r, h, 0]), "
                f"source_code={dsrc})")

        def promote(ind):
            """acc += the sums of the last slab (int8: as int32) x its channel's group scale (channel
            g + 8 * (j % 4 // 2)); float8 per-channel: the sums alone (the scale at the store)."""
            part = f"T.Cast('float32', T.reinterpret('int32', {SUMS}[r, j]))" if I8 else f"{SUMS}[r, j]"
            scaled = " * gs[r, j % 4 // 2]" if plan.groups > 1 else ""
            for_accs(add, ind, f"acc[r, j] = acc[r, j] + {part}{scaled}", R, NACC, unroll=True)

        GRP = STW * -(-OVERLAP_STEPS // STW)
        step_loop(add, NS, STW, load, process, after_prologue=first_activations,
                  group=GRP if OV else 0, peel=peel_last_body(plan))
        wgmma_wait(add, "    ", R, NACC, unroll=True, acc=SUMS)
        if GS:
            promote("    ")
        elif I8:                          # per-channel scales (at the store): the exact sums, 2**SH out
            for_accs(add, "    ", "acc[r, j] = T.Cast('float32', T.reinterpret('int32', iacc[r, j]))"
                                   f"{f' * T.float32({2.0 ** -SH!r})' if SH else ''}", R, NACC, unroll=True)
        pdl_trigger(add, hint)
        # every warpgroup is past its ring: the words hold the sums
        ind = reduce_warpgroups(add, KW, R, NACC, unroll=True)
        if KC > 1:
            ind = _cluster_reduce(add, KW, CW, R, NACC)
        store_accs(add, plan, e, ind, R, NACC, row0="r0 + ", unroll=True)
    return body


_PEER = {
    "bb_cluster_sync": r"""
__device__ __forceinline__ void bb_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
""",
    "bb_st_rank0": r"""
__device__ __forceinline__ void bb_st_rank0(float* s, float v) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s), ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(ra) : "r"(a));
  asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(ra), "f"(v) : "memory");
}
"""}


def _cluster_reduce(add, KW: int, CW: int, R: int, NACC: int) -> str:
    """``k_ctas=2``, after the CTA's own K reduction (the sums in the warpgroups of ``kw == 0``): a
    cluster barrier (the first CTA is done reading its words), the second CTA stores its sums into
    the first's shared memory (``mapa`` + ``st.shared::cluster``), a cluster barrier (release /
    acquire: the stores are visible), and the first adds them; returns the indent of its store."""
    from .gemv.wgmma import acc_loops
    sync = f"T.cuda.func_call('bb_cluster_sync', source_code={_PEER['bb_cluster_sync']!r})"
    mine = "kw == 0" if KW > 1 else "True"
    word = f"(r * {NACC} + j) * {128 * CW} + tx"        # the first CTA's word of sum (r, j)

    def after_sync(rank: int, stmt: str):
        """A cluster barrier, then ``stmt`` for each sum in the CTA of rank ``rank``."""
        add(f"    {sync}")
        add(f"    if cl == {rank} and {mine}:")
        head, inner = acc_loops("        ", R, NACC, True)
        for ln in head:
            add(ln)
        add(inner + stmt)
    after_sync(1, f"T.cuda.func_call('bb_st_rank0', Sm.ptr_to([{word}]), acc[r, j], "
                  f"source_code={_PEER['bb_st_rank0']!r})")
    after_sync(0, f"acc[r, j] = acc[r, j] + Sm[{word}]")
    return "        "


def main_script(plan, hint: FusedWgmmaHint) -> str:
    """TVMScript text of the main kernel (the GEMV template's argument list, loads, decode, scale
    and store lines; this module's body)."""
    from .gemv.template import kernel_script
    return kernel_script(plan, _gemv_stand_in(hint), body=_body(plan, hint))


def schedule_fused_wgmma(func, plan, hint: Optional[FusedWgmmaHint] = None, target=None):
    """IRModule of the fused GEMM for ``plan`` (any row count, static or symbolic; ``func`` is not
    used): ``main`` (this kernel) and ``permute`` (the wgmma GEMV's; none with ``permute=False``),
    compiled for sm_90a with the tirx pipeline; ``build.kernel_callable`` runs them in turn."""
    from tvm.script import tirx as T
    from .gemv.wgmma import permute_script
    from .target import TIRX_PIPELINE_ATTR, WGMMA_ARCH_ATTR
    hint = hint or FusedWgmmaHint.default(plan, target)
    arch = arch_of(target)
    if not arch.wgmma:
        raise ValueError(f"FusedWgmmaHint needs an sm_90 target (wgmma, TMA); target arch is {arch.name()}")
    why = fused_wgmma_unsupported(plan, hint)
    if why:
        raise ValueError(f"{hint}: {why}")
    prim = tvm.script.from_source(main_script(plan, hint), extra_vars={"T": T})
    funcs = {"main": prim}
    if hint.permute:
        funcs["permute"] = tvm.script.from_source(permute_script(plan, _gemv_stand_in(hint)), extra_vars={"T": T})
    if hint.pdl:
        tags = ["blockIdx.x", "threadIdx.x", "tirx.use_programtic_dependent_launch"]
        cl_tags = ["clusterCtaIdx.x"] if hint.k_ctas > 1 else []
        funcs = {name: f.with_attr("tirx.kernel_launch_params", (cl_tags + tags + ["tirx.use_dyn_shared_memory"])
                                   if name == "main" else tags)
                 for name, f in funcs.items()}
    mod = tvm.IRModule(funcs)
    return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx").with_attr(WGMMA_ARCH_ATTR, arch.wgmma_arch)
