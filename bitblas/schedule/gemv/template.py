"""The small-M CUDA template (decode, M = 1..16; the tensor-core kernels up to 64): float16/bfloat16
activations x int/uint, fp4_e2m1, nf4 (any 4-bit table), float8_e4m3 / float8_e5m2 and nvfp4
weights; int8 activations x int/uint weights (dp4a, rows kernel).

Hand-written TIRx kernels (TVM's "tirx" pipeline), generated per plan as TVMScript text (the
signature follows the plan's argument list); the per-vector decode and dot product are CUDA
device helpers passed through ``T.cuda.func_call``. One kernel body per hint class (hints.py):

* rows (:class:`GEMVRowsHint`, rows.py): a warp owns ``rows_per_warp`` output channels; its lanes
  walk K in vectors of packed weights, ``unroll`` per row per step, through a ring of ``stages``
  register slots (the loads of ``stages - 1`` steps in flight while one is decoded) (``act_smem``,
  one row: the block stages the activation row in shared memory once, paired for the decoder);
* k-split (:class:`GEMVKSplitHint`, ksplit.py): the warps of a block split K, each lane keeps its
  slice of the activations in registers, blocks walk row batches (grid-stride) and meet in
  shared memory;
* mma GEMV (:class:`GEMVMmaHint`, mma.py / mma_int8.py for int8 activations) and wgmma GEMV
  (:class:`GEMVWgmmaHint`, wgmma.py): the tensor-core kernels, up to 64 rows.

This module holds which plans and hints the GEMV kernels take, the default hint
(:func:`default_gemv_hint`, the hint of the kernel that wins), and the dispatch from a hint to
its kernel body. :func:`kernel_script` generates the per-plan load, decode, scale and store lines
they all use (its locals, ``e``); the CUDA helpers and shared emit lines come from emit.py.

How each format decodes: emit.py's docstring.

int8 activations (``A_dtype="int8"``, int/uint 1/2/4/8-bit weights; the rows kernel, or from 3 rows
(4 to 6 for group-scaled 4-bit and 8-bit codes, :func:`default_shape`) the m16n8k32
tensor-core kernel of mma_int8.py; the k-split kernel refuses them; the helpers live in
int8.py): a 16-byte activation load holds 16 values; the codes of a weight vector become
bytes, four per word (one shift and one ``lop3`` per field of a word; signed codes are stored offset
by 2**(b-1), taken back by starting the dp4a chain at -2**(b-1) * sum(a)); the activations are
permuted (``prmt``) into the same K order once per vector and row, shared by the warp's weight
rows, and ``dp4a`` sums exactly in int32. Without group scales the int32 sums go through the warp
reduction to the store: out = sum * scale[n] * a_scale[m] + bias[n], the TensorIR's order (int32
output: sum + bias); group scales take each vector's int32 sum to float32 (``acc += s *
float(isum)``, a vector lies inside one group; a lane's consecutive vectors are 32 vectors apart,
so summing a whole group in int32 first would need groups of >= 32 vectors).

:func:`gemv_unsupported` says which plans the template does not take; those use the simple (or
tensor-core) schedule.

measurements: docs/performance.md
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..._tvm import tvm
from ..epilogue import scaled_sum
from ...arch import arch_of
from ..target import TIRX_PIPELINE_ATTR, WGMMA_ARCH_ATTR
from .decode import decoder, e4m3_consts, pair_codes
from .hints import GEMVHint, GEMVKSplitHint, GEMVMmaHint, GEMVRowsHint, GEMVWgmmaHint
from .emit import (F8_HALF_SHIFT, act_smem_bytes, block_dot_helpers, block_scale_helpers, e4m3_acts, f8_half_prep,
                   f8_scales, fmt_float, format_helpers, half_acts, l2_prefetch_unsupported, mma_decodable,
                   prep_words, span_vectors, uses_f32_path, vec_blocks, vec_bytes)
from .ksplit import body as ksplit_body
from .mma import body as mma_body, mma_gemv_unsupported
from .mma_int8 import body as mma_int8_body, mma_int8_unsupported
from .rows import body as rows_body
from .wgmma import body as wgmma_body, permute_script, wgmma_gemv_unsupported

__all__ = ["default_gemv_hint", "gemv_unsupported", "gemv_default_takes", "gemv_hint_unsupported", "schedule_cuda_gemv",
           "kernel_script", "GEMV_MAX_ROWS", "GEMV_MMA_MAX_ROWS", "WGMMA_GEMV_MIN_ROWS", "ACT_SMEM_MAX_BYTES",
           "GEMV_ACTIVATIONS", "gemv_arch_unsupported"]

GEMV_ACTIVATIONS = ("float16", "bfloat16", "int8", "float8_e4m3")      # the activation dtypes the GEMV kernels take
BYTE_ACTIVATIONS = ("int8", "float8_e4m3")        # the m16n8k32 GEMV's (mma_int8)
GEMV_MAX_ROWS = 16          # the rows and k-split kernels
GEMV_MMA_MAX_ROWS = 64      # the tensor-core kernels (chunks of 16 rows, mma.row_chunks)
WGMMA_GEMV_MIN_ROWS = 9     # the wgmma GEMV is a default from here (wgmma_tile) and tuned from here


def default_gemv_hint(plan, target=None) -> "GEMVHint":
    """The default kernel shape (:func:`default_shape`); on sm_90+ targets with programmatic
    dependent launch (the launch and ramp of one kernel overlap the previous one's tail), and
    there for nvfp4 x float16 in the staged rows kernel a tile whose blocks fill one wave where
    one does (:func:`_nvfp4_wave_tile`) and, where its blocks fit one wave, the first
    step of each row prefetched into L2 before the PDL wait (``l2_prefetch=1``; H200, three runs
    of ``benchmark.matmul --formats nvfp4-f16 --shapes brief,llama3-8b --m 1``, µs without ->
    with: 8192^2 11.76 / 11.72 / 11.71 -> 11.57 / 11.60 / 11.59, 6144 x 4096 6.70 / 6.71 / 6.75
    -> 6.47 / 6.49 / 6.46, 4096^2 5.26 / 5.19 / 5.23 -> 5.01 / 4.95 / 4.98, 4096 x 14336 13.68 /
    13.68 / 13.62 -> 13.21 / 13.26 / 13.16; more than a wave lost 3.5%: 28672 x 8192, 28672 x
    4096; w4a16-g128 in one run: -1.4% .. +1.4%, left without)."""
    hint = default_shape(plan, target)
    arch = arch_of(target)
    if not arch.pdl:
        return hint
    hint = dataclasses.replace(hint, pdl=True)
    if (isinstance(hint, GEMVRowsHint) and hint.act_smem and hint.min_blocks and f8_scales(plan)
            and plan.config.A_dtype == "float16"):
        hint = _nvfp4_wave_tile(plan, hint, arch.sm_count)
        if _rows_blocks(plan, hint) <= hint.min_blocks * arch.sm_count:
            hint = dataclasses.replace(hint, l2_prefetch=1)
    return hint


# nvfp4 x float16, one row, where one of them fills a wave (_nvfp4_wave_tile; the tuner's rows space has
# them too): 64 channels per block, one block per SM; 16 channels (one per warp, two vectors per step)
# per block, two per SM
NVFP4_WAVE_TILES = (GEMVRowsHint(rows_per_warp=2, warps=32, unroll=1, stages=3, min_blocks=1, act_smem=True),
                    GEMVRowsHint(rows_per_warp=1, warps=16, unroll=2, stages=3, min_blocks=2, act_smem=True))


def _rows_blocks(plan, hint) -> int:
    """Blocks of the rows kernel with ``hint`` over the plan's N channels."""
    return -(-plan.config.N // (hint.rows_per_warp * hint.warps))


def _nvfp4_wave_tile(plan, hint, sm_count: int) -> "GEMVHint":
    """nvfp4 x float16 at one row (the staged rows kernel, PDL): the first of these tiles whose
    blocks fill 70..100% (64-channel blocks, one per SM) or 90..100% (16-channel blocks, two per
    SM) of one wave, else ``hint``. H200, ``benchmark.matmul --formats nvfp4-f16 --m 1`` with the
    tiles as ``--hints`` (brief + llama3-8b twice, 12 more N x K once; time against the 16-channel
    default): 64-channel blocks 0.90-0.91 at 8192^2, 0.91 at 8192 x 4096, 0.95 at 6144 x 4096,
    0.98 at 6144 x 8192, but 1.10 at 5120^2 (0.61 of a wave), 1.22 at 4096 x 8192, 1.36 at 10240 x
    8192 (two waves); 16-channel blocks of single-channel warps 0.82 at 4096 x 14336, 0.96-0.97
    at 4096^2, 0.94 at 4096 x 8192, but 1.12 at 3072 x 4096 (0.73 of a wave), 1.08 at 5120^2 and
    1.18-1.21 at 11008 / 14336 x 4096 (more than a wave). 63-channel blocks (3 rows x 21 warps: 131
    blocks, every SM but one busy, 1.6% fewer rows per SM) at 8192^2 took 11.6 with 2 register
    slots and 12.5 with 3 (spilling), against 10.47-10.54 µs for the 64-channel tile in the same call."""
    for tile, low in zip(NVFP4_WAVE_TILES, (0.7, 0.9)):
        tile = dataclasses.replace(tile, pdl=hint.pdl)
        slots = tile.min_blocks * sm_count
        if low * slots <= _rows_blocks(plan, tile) <= slots and not gemv_hint_unsupported(plan, tile):
            return tile
    return hint


def default_shape(plan, target=None) -> "GEMVHint":
    """One row: the rows kernel (:func:`staged_row` where staging the row in shared memory
    wins, else small blocks under launch bounds). From 2 rows the tensor-core kernel, which
    needs a decoder that yields half pairs (every float-activation format) and sm_80+
    (``target``: the CUDA Target, None = assume sm_80+). Base tiles (:func:`mma_base`): 32
    channels per block and 8 warps splitting K up to 8 rows, 4 warps and 32 (N < 16896) or 64
    channels above; :func:`float_mma_tile` and :func:`int8_mma_tile` refine them. int8
    activations: from 3 rows (group-scaled 4-bit codes 4, 8-bit codes 5 with group scales and 6
    without) the m16n8k32 tensor-core kernel (mma_int8) where it takes the plan (group sizes
    holding 4 weight vectors), else the rows kernel. float8_e4m3 activations: one row the staged
    rows kernel where :func:`staged_row` takes it (the row converted to float16 pairs once per
    block; then the float16 kernel's decode and dot; not for float32 outputs), else and from 2 rows
    the m16n8k32 kernel (4-bit codes the wide tile without the next step in flight, 2-bit codes
    the int8 tiles). Above 16 rows :func:`chunk_tile`; on sm_90 :func:`wgmma_tile` first, where it
    applies."""
    m = plan.m or 1
    arch = arch_of(target)
    wg = wgmma_tile(plan) if arch.wgmma else None
    if wg:
        return wg
    if m > GEMV_MAX_ROWS:
        return chunk_tile(plan)
    if e4m3_acts(plan):
        staged = staged_row(plan, arch.sm_count) if m == 1 else None
        if staged:                     # one row: the rows kernel, the row converted to float16 pairs once
            return staged
        if plan.w.bits == 4:
            # the e4m3 table decode of 4-bit codes: the wide tile without the next step in flight
            # from one row (faster than the base tile at 1 and 16 rows, H100, W4A-fp8 g128 8192^2)
            return dataclasses.replace(_MMA_WIDE, stages=1)
        return int8_mma_tile(plan, m, mma_base(plan, m))
    if m >= 2 and arch.mma:
        mma = mma_base(plan, m)
        if plan.float_acts and mma_decodable(plan.w):
            return float_mma_tile(plan, m, mma)
        # int8: m16n8k32 (mma_int8) under 2 blocks per SM beats the dp4a rows kernel from 3 rows
        # for 1-, 2-bit and per-channel 4-bit codes, from 4 for group-scaled 4-bit codes, from 5
        # for group-scaled 8-bit codes, from 6 for per-channel 8-bit codes
        if plan.w.bits == 8:
            first = 5 if plan.groups > 1 else 6
        else:
            first = 4 if plan.groups > 1 and plan.w.bits == 4 else 3
        if not plan.float_acts and m >= first:
            tile = int8_mma_tile(plan, m, mma)
            if mma_int8_unsupported(plan, tile) is None:
                return tile
    staged = staged_row(plan, arch.sm_count) if m == 1 else None
    if staged:
        return staged
    if m <= 2 and decoder(plan.w) != "lut4":
        # launch bounds of 8 blocks per SM let ptxas keep more registers, so more weight loads
        # stay in flight; 2-bit weights want 8 channels per warp in 2-warp blocks, 8-bit and
        # nvfp4 2 channels; the nf4 table decoder is faster without launch bounds
        if plan.w.bits <= 2:
            return GEMVRowsHint(rows_per_warp=8, warps=2, unroll=4, stages=2, min_blocks=8)
        if plan.w.bits == 8 or (vec_bytes(plan) or 16) < 16:     # None: a plan the GEMV refuses
            return GEMVRowsHint(rows_per_warp=2, warps=2, unroll=4, stages=2, min_blocks=8)
        return GEMVRowsHint(rows_per_warp=4, warps=2, unroll=4, stages=2, min_blocks=8)
    if m <= 4:
        # int8 x per-channel 8-bit codes: faster without the next step in flight
        i8_chan8 = not plan.float_acts and plan.w.bits == 8 and plan.groups == 1
        return GEMVRowsHint(rows_per_warp=4, warps=1, unroll=4, stages=1 if i8_chan8 else 2)
    if m <= 8:
        return GEMVRowsHint(rows_per_warp=4, warps=1, unroll=4, stages=1)
    return GEMVRowsHint(rows_per_warp=4, warps=1, unroll=2, stages=1)


def staged_row(plan, sm_count: int) -> Optional["GEMVHint"]:
    """One activation row: the rows kernel with the row staged in shared memory (``act_smem``,
    rows.py) where it measured faster, else None. 8-warp blocks under 4 blocks per SM (<= 64
    registers, 32 warps per SM: twice the warps of the register-bound default), one vector per
    row and step, the loop unrolled. Float activations (and float8_e4m3 ones, converted to
    float16 pairs as the row is staged): 2 channels per warp, 2 steps in flight,
    for int and table codes (nf4 only up to K=8192); 8-bit codes only where the 16-channel
    blocks fill 70..100% of one wave; 1- and 2-bit codes from N=8192 with 8 channels per warp
    in 4-warp blocks (float8 activations: 2 channels per warp with 3 steps in flight, W2A-fp8
    per-channel on the H200: 21% less time at 8192^2, 9% less at 28672 x 8192). int8
    activations: 2-bit codes only (4- and 8-bit codes tie or lose)."""
    b, dec, N = plan.w.bits, decoder(plan.w), plan.config.N
    if plan.config.A_dtype == "int8":
        hint = _ROWS_STAGED if b == 2 else None
    elif b <= 2 and e4m3_acts(plan):           # float8: 2 channels per warp, 3 steps in flight
        hint = _ROWS_STAGED_S4 if N >= 8192 else None
    elif b <= 2:
        hint = _ROWS_STAGED_8 if N >= 8192 else None
    elif b == 8:
        blocks, slots = -(-N // 16), 4 * sm_count
        hint = _ROWS_STAGED if 0.7 * slots <= blocks <= slots else None
    elif dec == "lut4":
        hint = _ROWS_STAGED if plan.config.K <= 8192 else None
    else:
        hint = _ROWS_STAGED
    return None if hint is None or gemv_hint_unsupported(plan, hint) else hint


def mma_base(plan, m) -> "GEMVHint":
    """The tensor-core GEMV's base tile (see :func:`default_shape`): 32 channels x 8 K warps
    up to 8 rows, then 4 K warps and 32 (N < 16896) or 64 channels."""
    if m <= 8:
        return GEMVMmaHint(rows_per_warp=32, k_warps=8, unroll=2, stages=2)
    if _wide_layer(plan):
        return _MMA_64
    return GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=4, stages=2)


def float_mma_tile(plan, m, base) -> "GEMVHint":
    """The float tensor-core GEMV's tile. Over 128 registers a 256-thread block (8 K warps)
    is alone on its SM; the wide tile under 2 blocks per SM fits. 4-bit codes up to 8 rows take
    it; 4- and 8-bit codes from 9 rows take it without the next step in flight (wide layers
    too); nvfp4's float8 scales and 1-/2-bit codes spill under the bound and keep ``base``."""
    b = plan.w.bits
    if m <= 8 and b == 4 and not f8_scales(plan):
        return _MMA_WIDE
    if m > 8 and b in (4, 8):
        # wide layers too (on sm_90 the wgmma GEMV where wgmma_tile takes the plan)
        return dataclasses.replace(_MMA_WIDE, stages=1)
    return base


def int8_mma_tile(plan, m, base) -> "GEMVHint":
    """The int8 tensor-core GEMV's tile: the base tiles under 2 blocks per SM, from 9 rows below
    N=16896 the wide tile without the next step in flight (the 4-warp tile took 134-252
    registers), from N=16896 the 64-channel base tile likewise."""
    if m <= 8:
        return dataclasses.replace(base, min_blocks=2)
    if _wide_layer(plan):
        # the 64-channel base tile took 255 registers (7 warps per SM): under 2 blocks per SM
        # without the next step in flight
        return dataclasses.replace(base, stages=1, min_blocks=2)
    return dataclasses.replace(_MMA_WIDE, stages=1)


def chunk_tile(plan) -> "GEMVHint":
    """The tensor-core tile for 17..64 rows (chunks of 16 rows, mma.row_chunks).

    Float activations: the chunk loop (one block serves every chunk of its 32 channels, the
    weights decoded once, 4 K warps, 255 registers) rather than a block per chunk; 16 channels
    per warp lose (the activations of all rows read twice as often). int8 activations: the same
    chunk loop on the m16n8k32 kernel.

    Float activations take weight vectors of 16 codes (:func:`span_vectors`): a lane's
    activations of a vector then span 32 bytes, so the four lanes of a token row read one
    128-byte line per load instead of two. The loop is bound by L1's load wavefronts (one
    wavefront per line and row), so this is what sets its speed. int8 activations (one byte
    per value) already span 32 bytes with 16-byte vectors of 4-bit codes."""
    m, hint = plan.m or 1, _MMA_LOOP
    span = span_vectors(plan)
    if span:                 # the same K per step as two of the default vectors (4-bit: 4 of 16 codes)
        hint = dataclasses.replace(hint, vec_bytes=span[0], unroll=2 * span[1])
    # 64 channels per warp on wide layers, where they fit and win (each activation fragment
    # feeds twice the mma; N=8192, 128 such blocks, loses). Float activations: 2- to 8-bit codes
    # up to 48 rows (1-bit codes spill), nf4 only from 33 rows. int8 activations: sub-byte codes
    # up to 32 rows, per-channel ones up to 48 (group-scaled ones spill at 48; 8-bit codes tie).
    if plan.float_acts:
        fits = plan.w.bits >= 2 and m <= 48 and not (decoder(plan.w) == "lut4" and m <= 32)
    else:
        fits = plan.w.bits <= 4 and m <= (32 if plan.groups > 1 else 48)
    if fits and _wide_layer(plan):
        hint = dataclasses.replace(hint, rows_per_warp=64)
    return hint


def wgmma_tile(plan) -> Optional["GEMVHint"]:
    """The wgmma GEMV's tile for 9..64 rows on sm_90 (wgmma.py), where it measured faster
    than the chunk loop (17..64) or the tensor-core GEMV (9..16), else None. Codes by width: the
    table formats as the int codes of theirs (nf4, fp4_e2m1, nvfp4: 4-bit; float8: 8-bit; measured
    for int / uint codes).

    17..64 rows: 4-bit codes from N=8192, 2-bit codes on wide layers (N >= 16896), 8-bit codes
    above 48 rows. Wide layers: one warpgroup of 64 channels per block; above 16 rows 128
    channels (two m64 tiles) for 2-bit codes, and above 40 rows for 4-bit codes. Narrower
    layers (128 blocks of 64 channels at N=8192): 4 warpgroups splitting K. Layers below
    N=8192 keep the chunk loop.

    9..16 rows: 2-bit codes from N=8192 and 4-bit codes on wide layers (8-bit codes lose; 4-bit
    codes below N=16896 keep the tensor-core GEMV)."""
    m, bits, N = plan.m or 1, plan.w.bits, plan.config.N
    wide = _wide_layer(plan)
    if m < WGMMA_GEMV_MIN_ROWS or N < 8192 or not plan.float_acts:
        return None
    if m <= GEMV_MAX_ROWS:                # 2-bit codes from N=8192, 4-bit ones on wide layers
        takes = bits == 2 or (bits == 4 and wide)
    else:                                 # 4-bit codes, 2-bit ones on wide layers, 8-bit above 48 rows
        takes = bits == 4 or (bits == 2 and wide) or (bits == 8 and m > 48)
    if not takes:
        return None
    if not wide:
        hint = _WGMMA_KSPLIT
    elif m > GEMV_MAX_ROWS and (bits == 2 or (bits == 4 and m > 40)):
        hint = _WGMMA_WIDE2
    else:
        hint = _WGMMA_WIDE
    return None if wgmma_gemv_unsupported(plan, hint) else hint


def _wide_layer(plan) -> bool:
    """N of at least 16896: tensor-core GEMV blocks of 64 channels number 264+ (2+ per SM of the
    H200's 132), so the tiles take 64 channels per warp there (each activation fragment feeds
    twice the mma) and 32 below."""
    return plan.config.N >= 16896


# one activation row staged in shared memory (staged_row): 2 channels per warp, 8-warp blocks,
# one vector per row and step, 2 steps in flight, 4 blocks per SM; for 1- and 2-bit codes 8 channels per
# warp in 4-warp blocks, 1 step in flight
_ROWS_STAGED = GEMVRowsHint(rows_per_warp=2, warps=8, unroll=1, stages=3, min_blocks=4, act_smem=True)
_ROWS_STAGED_8 = GEMVRowsHint(rows_per_warp=8, warps=4, unroll=1, stages=2, min_blocks=4, act_smem=True)
_ROWS_STAGED_S4 = GEMVRowsHint(rows_per_warp=2, warps=8, unroll=1, stages=4, min_blocks=4, act_smem=True)
# the wide tensor-core tile: 8 K warps x 4 vectors per step, 2 blocks per SM (<= 128 registers)
_MMA_WIDE = GEMVMmaHint(rows_per_warp=32, k_warps=8, unroll=4, stages=2, min_blocks=2)
# 64 channels x 4 K warps, 2 vectors per step, the next step in flight (the base tile from 9 rows at
# N >= 16896)
_MMA_64 = GEMVMmaHint(rows_per_warp=64, k_warps=4, unroll=2, stages=2)
# 17..64 rows (float and int8 activations): the chunk loop, one block of 32 channels x 4 K warps
# serving every 16-row chunk (mma); 16 channels per warp lose by 2x (each block reads the
# activations of all rows, so half the channels per block read them twice as often)
_MMA_LOOP = GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=2, stages=1, min_blocks=1, chunk_loop=True)
# the wgmma GEMV (wgmma): one warpgroup of 64 channels per block, 4 slabs of weights in flight in
# registers (up to 40 rows); 128 channels (two m64 tiles) with 2; 64 channels with 4 warpgroups
# splitting K (N < 16896)
_WGMMA_WIDE = GEMVWgmmaHint(rows_per_warp=16, k_warps=1, stages=4)
_WGMMA_WIDE2 = GEMVWgmmaHint(rows_per_warp=32, k_warps=1, stages=2)
_WGMMA_KSPLIT = GEMVWgmmaHint(rows_per_warp=16, k_warps=4, stages=2)


def gemv_default_takes(plan, target=None) -> bool:
    """Whether an untuned operator runs ``plan`` (a static row count) on the GEMV template: 1..16
    rows wherever the template takes the plan; 17..64 rows on sm_80+ (the tensor-core kernel in
    chunks of 16 rows, faster there than decode-then-wgmma) except int8 x 8-bit codes above 32
    rows, where the int8 wgmma kernel wins."""
    if plan.target_kind != "cuda" or gemv_unsupported(plan) is not None:
        return False
    arch = arch_of(target)
    if e4m3_acts(plan):
        return _f8_gemv_takes(plan, arch)
    if plan.m <= GEMV_MAX_ROWS:
        return True
    if not arch.mma:
        return False
    return plan.float_acts or plan.w.bits < 8 or plan.m <= 32


F8_GEMV_MAX_ROWS_WGMMA = GEMV_MAX_ROWS      # float8 activations on sm_90: the fused wgmma GEMM above


def _f8_gemv_takes(plan, arch) -> bool:
    """Whether the untuned operator runs float8_e4m3 activations (``plan``, static rows) on the
    m16n8k32 GEMV: on archs with float8 mma.sync (sm_89+), up to ``F8_GEMV_MAX_ROWS_WGMMA`` rows
    where the fused wgmma GEMM serves the rest (sm_90), else up to 64."""
    if gemv_arch_unsupported(plan, arch):
        return False
    return plan.m <= (F8_GEMV_MAX_ROWS_WGMMA if arch.wgmma else GEMV_MMA_MAX_ROWS)


def gemv_arch_unsupported(plan, arch) -> Optional[str]:
    """None when ``arch`` (an :class:`bitblas.arch.Arch`) runs the GEMV kernels of ``plan``, else why
    not: float8 activations need float8 mma.sync (sm_89+)."""
    if e4m3_acts(plan) and not arch.fp8_mma:
        return (f"A_dtype={plan.config.A_dtype!r}: the GEMV's float8 mma.sync needs an sm_89+ target; target arch is "
                f"{arch.name()}")
    return None


def gemv_unsupported(plan) -> Optional[str]:
    """None when the GEMV template takes ``plan``, else why not."""
    c = plan.config
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if plan.m is None or not 1 <= plan.m <= GEMV_MMA_MAX_ROWS:
        return f"needs a static row count 1..{GEMV_MMA_MAX_ROWS}"
    if c.A_dtype not in GEMV_ACTIVATIONS:
        return f"A_dtype={c.A_dtype!r}: activations must be {', '.join(GEMV_ACTIVATIONS[:-1])} or {GEMV_ACTIVATIONS[-1]}"
    if c.layout != "nt":
        return "layout must be 'nt'"
    if c.A_dtype in BYTE_ACTIVATIONS:
        why = _int8_unsupported(plan)
        f8 = e4m3_acts(plan)        # the m16n8k32 kernel's weights, also where the rows kernel takes the row
        if why is None and (plan.m > GEMV_MAX_ROWS or f8):
            mma_why = mma_int8_unsupported(plan, _MMA_WIDE)      # the plan's side of it: weights, groups
            if mma_why:
                why = (f"A_dtype={c.A_dtype!r}: the GEMV kernels take these activations with the m16n8k32 "
                       "tensor-core kernel's weights" if f8
                       else f"{plan.m} rows: only the tensor-core kernel takes more than {GEMV_MAX_ROWS} rows")
                why += f" ({mma_why})"
        return why
    if decoder(plan.w) is None:
        return "weights must be int/uint, e2m1 (fp4_e2m1, nvfp4), a 4-bit table (nf4) or float8"
    if plan.m > GEMV_MAX_ROWS and not mma_decodable(plan.w):
        return f"{plan.m} rows: only the tensor-core kernel takes more than {GEMV_MAX_ROWS} rows"
    if c.with_act_scaling:
        return "no activation scales"
    if c.with_scaling and plan.scale_dtype not in (c.A_dtype, "float8_e4m3"):
        return "scales must have the activation dtype (or be float8_e4m3 bytes)"
    if c.out_dtype not in ("float16", "bfloat16", "float32"):
        return "output must be float16, bfloat16 or float32"
    if vec_bytes(plan) is None:
        return "K (and the group size) must be multiples of the values in one 4-byte weight vector (>= 8)"
    return None


def _int8_unsupported(plan) -> Optional[str]:
    """:func:`gemv_unsupported` for byte (int8, float8_e4m3) activations: int/uint weights (dp4a,
    m16n8k32), float32 scales, no zero points, int32 output only without scales."""
    c = plan.config
    if plan.w.kind not in ("int", "uint"):
        return f"W_dtype={c.W_dtype!r}: {c.A_dtype} activations take int/uint weights"
    if c.with_zeros:
        return "with_zeros=True: int8 activations take no zero points"
    if c.with_scaling and plan.scale_dtype != "float32":
        return f"scale dtype {plan.scale_dtype!r}: int8 activations take float32 scales"
    if c.out_dtype not in ("float16", "bfloat16", "float32", "int32"):
        return f"out_dtype={c.out_dtype!r}: output must be float16, bfloat16, float32 or int32"
    if vec_bytes(plan) is None:
        return (f"K={c.K} (and group_size={c.group_size}) must be multiples of the values in one weight vector "
                f"(with int8 activations at least {max(16, 32 // plan.w.bits)} for {c.W_dtype})")
    return None


def kernel_script(plan, hint: GEMVHint, body=None):
    """The kernel's TVMScript text; ``body(add, locals)`` writes the body instead of the GEMV
    kernel ``hint`` asks for (schedule/fused_wgmma.py: its own checks, a run-time row count of any
    size)."""
    c, w = plan.config, plan.w
    act = c.A_dtype
    i8 = act == "int8"                      # int8 activations: dp4a (int8) or m16n8k32 (mma_int8)
    b8 = act in BYTE_ACTIVATIONS            # 1-byte activations (float8: m16n8k32 or the fused wgmma GEMM's body)
    hf = b8 and half_acts(plan, hint)       # float8 activations as float16 pairs (the rows kernel): the float path
    m, N, K, b = plan.m, c.N, c.K, w.bits
    signed = w.kind == "int"
    # byte activations on tensor cores: the 4 vectors of a lane quad inside one group
    VB = vec_bytes(plan, hint.vec_bytes, group_vectors=4 if b8 and hint.tensor_cores else 1,
                   blocks=vec_blocks(plan, hint))
    if VB is None:
        raise ValueError(f"vec_bytes={hint.vec_bytes} does not fit K={K}, group_size={c.group_size}")
    NW = VB // 4
    V = VB * 8 // b                         # values per vector
    # scale blocks per vector: 2 for nvfp4 in the wgmma and rows kernels (two float8 bytes, one register)
    SB = V // c.group_size if plan.groups > 1 and V > c.group_size else 1
    AV = 16 if b8 else 8                    # activation values per 16-byte load
    NA = V // 4 if b8 else V // 2           # activation words (4 bytes / 2 float16 values) per vector
    NC = K // V                             # vectors per row
    G = K if plan.groups == 1 else c.group_size
    dec = decoder(w)
    if hf:
        tag = f"f8h_{'i' if signed else 'u'}{b}_v{VB}"
    elif b8:
        tag = f"{'i8' if i8 else 'f8'}_{'i' if signed else 'u'}{b}_v{VB}"
    elif dec == "int":
        tag = f"{'f16' if act == 'float16' else 'bf16'}_{'i' if signed else 'u'}{b}_v{VB}"
    else:
        tag = f"{'f16' if act == 'float16' else 'bf16'}_{dec}_v{VB}"
    # e2m1 x float16 in the rows kernel: the table decoder, measured faster there (decode._e2m1_lut_consts);
    # helpers of its own name, as TVM emits one definition per helper name
    e2m1_table = isinstance(hint, GEMVRowsHint) and dec == "e2m1" and act == "float16" and not hf
    if e2m1_table:
        tag = f"f16_e2m1t_v{VB}"
    f32_path = uses_f32_path(plan, hint)
    helpers = format_helpers(tag, "float16" if hf else act, b, plan.w_storage, NW, dec, w.table,
                             half_pairs=b == 8 and not f32_path, order=plan.w_order, e2m1_table=e2m1_table)
    if hf:
        helpers[f"bb_prep_{tag}"] = f8_half_prep(tag, b, NW, plan.w_order)
    s_f8 = f8_scales(plan)
    dec_factor = e4m3_consts()["factor"] if dec == "e4m3" and f32_path else 1.0   # 2**8 folded into the scale
    if hf:                                  # the float8 activations' 2**-4 in the float16 pairs (f8_half_prep)
        dec_factor = float(2 ** F8_HALF_SHIFT)
    x_shift = (1 << (b - 1)) if signed else 0   # decode gives field - off, field = q + x_shift (offset-binary)
    off_max = (1 << b) - 1 + x_shift
    quant_zeros = c.with_zeros and c.zeros_mode == "quantized"
    float_zeros = c.with_zeros and not quant_zeros
    # register dtypes of raw scales / zeros (int8 activations: group scales only, per-channel ones at the store)
    sdt = plan.arg("scale").dtype if c.with_scaling and not plan.scale_in_epilogue else None
    if SB > 1:
        sdt = "uint32"
        pairs = pair_codes(dec, b, NW, plan.w_order)
        helpers = {**helpers, **block_scale_helpers(tag, act, pairs, V, c.group_size)}
        if hint.block_dots:                    # a dot product per block: the first half of the pairs is block 0
            assert all(lo // c.group_size == hi // c.group_size == (2 * i >= len(pairs))
                       for i, (lo, hi) in enumerate(pairs)), pairs
            helpers = {**helpers, **block_dot_helpers(tag, act, len(pairs))}
    zdt = ("int8" if quant_zeros else plan.scale_dtype) if c.with_zeros else None
    need_asum = float_zeros                    # sum(a*q) = dot + (off - x_shift) * sum(a)
    acc_dtype = "int32" if i8 and not sdt else "float32"    # int8: exact int32 sums unless group scales

    def src(name):
        return repr(helpers[name])

    ap_dtype = "float32" if f32_path else "uint32"
    ap_len = prep_words(plan, hint, V)

    L = []
    add = L.append
    params = ", ".join(f"{a.name}_ptr: T.handle" for a in plan.args)
    add("@T.prim_func")
    add(f"def main({params}):")
    # the tensor-core kernels take their row count at run time (``mv``, 1..m: activation rows are
    # clamped on load, stores predicated), so one kernel serves every row count of its class
    # (mma.row_class); the rows kernel unrolls over its rows and stays static
    rows = "mv" if hint.tensor_cores else m
    if hint.tensor_cores:
        add("    mv = T.int32()")
    shapes = {"W": (N, K * b // 8), "bias": (N,)}
    for a in plan.args:
        shp = (rows, *a.shape[1:]) if a.per_row else shapes.get(a.name, tuple(a.shape))
        shp = "(" + ", ".join(str(x) for x in shp) + ("," if len(shp) == 1 else "") + ")"
        add(f"    {a.name} = T.match_buffer({a.name}_ptr, {shp}, {a.dtype!r}, align=16)"
            if a.name in ("A", "W") else
            f"    {a.name} = T.match_buffer({a.name}_ptr, {shp}, {a.dtype!r})")
    if hint.tensor_cores and m is not None:
        add(f"    assert 1 <= mv and mv <= {m}, \"{m}-row GEMV kernel: the row count must be 1..{m}\"")

    def gidx(cidx):
        return "0" if plan.groups == 1 else f"({cidx} * {V} // {G})"

    def zsrc(nr, cidx):
        """The zero-point element (float zeros) or the zero-point code (quantized: codes [groups, N]
        packed along N, the field of channel ``nr`` shifted out of its byte here, int8)."""
        g = gidx(cidx)
        if not quant_zeros:
            return f"zeros[{nr}, {g}]"
        cpb = w.codes_per_byte
        if cpb == 1:
            return f"zeros[{g}, {nr}]"
        return (f"T.Cast('int8', T.shift_right(T.Cast('int32', zeros[{g}, {nr} // {cpb}]), ({nr} % {cpb}) * {b}) "
                f"& {(1 << b) - 1})")

    def scale_lines(ind, cidx, idx, s_raw, z_raw):
        """sv (scale), ov (integer offset subtracted exactly in the decode), cv (coefficient of
        sum(a)) for weight vector cidx, from the raw scale / zero elements ``s_raw`` / ``z_raw``.
        The offset centres the codes: x_shift (signed codes, stored offset-binary), the zero-point
        code, or the rounded float zero point; what it misses (|residual| <= 0.5) goes through
        cv * sum(a)."""
        if b8 and not hf:                      # int8 / float8: the group scale only (on the slab's sums)
            return [f"{ind}sv[{idx}] = T.Cast('float32', {s_raw})"] if sdt else []
        if SB > 1:                             # the block scales: bb_sclb on the decoded pairs
            return [f"{ind}ov[{idx}] = {x_shift}", f"{ind}cv[{idx}] = T.float32(0)"]
        # no raw scale: none, or per-channel ones in the epilogue (float8 activations, scaled_sum)
        s_expr = f"T.Cast('float32', {s_raw})" if s_raw is not None else "T.float32(1)"
        if s_f8:
            s_expr = (f"T.cuda.func_call('bb_e4m3f', T.Cast('int32', {s_raw}), source_code={src('bb_e4m3f')}, "
                      f"return_type='float32')")
        if dec_factor != 1.0:
            s_expr = f"{s_expr} * {fmt_float(dec_factor)}" if s_raw is not None else fmt_float(dec_factor)
        out = [f"{ind}sv[{idx}] = {s_expr}"]
        if quant_zeros:                        # z_raw: the code (zsrc), an int8 holding 0 .. 2**b - 1
            out += [f"{ind}ov[{idx}] = T.Cast('int32', {z_raw}) & 255", f"{ind}cv[{idx}] = T.float32(0)"]
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
        return [f"{ind}for v in T.unroll({V // AV}):",
                f"{ind}    T.cuda.func_call('bb_lda', A.ptr_to([{i}, {cidx} * {V} + v * {AV}]), "
                f"{arbuf}.ptr_to([v * 4]), source_code={src('bb_lda')})"]

    def w_ptr(nr, cidx):
        return f"W.ptr_to([{nr}, {cidx} * {VB}])"

    def scale_col(cidx):
        """The scale column of weight vector ``cidx``: its first block scale, or its group's."""
        return f"{cidx} * {SB}" if SB > 1 else gidx(cidx)

    def ldw_line(ind, nr, cidx, dst):
        return f"{ind}T.cuda.func_call('bb_ldw{NW}', {w_ptr(nr, cidx)}, {dst}, source_code={src(f'bb_ldw{NW}')})"

    def load_lines(ind, nr, cidx, at, scales=True):
        """Weight vector ``cidx`` of row ``nr`` into slot ``at`` (index text) of ``wq``, its raw
        scale (``scales``) / zero element into ``sr`` / ``zr`` at the same index."""
        out = [ldw_line(ind, nr, cidx, f"wq.ptr_to([{at}, 0])")]
        if sdt and scales and SB > 1:
            out.append(f"{ind}sr[{at}] = T.cuda.func_call('bb_ldsb_{tag}', scale.ptr_to([{nr}, {scale_col(cidx)}]), "
                       f"source_code={src(f'bb_ldsb_{tag}')}, return_type='uint32')")
        elif sdt and scales:
            out.append(f"{ind}sr[{at}] = scale[{nr}, {scale_col(cidx)}]")
        if zdt:
            out.append(f"{ind}zr[{at}] = {zsrc(nr, cidx)}")
        return out

    def vec_ptrs(nr, cidx):
        """Pointers to weight vector ``cidx`` of row ``nr`` and to its scales (emit.l2_prefetch)."""
        return [w_ptr(nr, cidx)] + ([f"scale.ptr_to([{nr}, {scale_col(cidx)}])"] if sdt else [])

    def dec_line(ind, wsrc, off, dst):
        if i8:                                 # no offset: signed codes are centred through the dp4a chain
            return f"{ind}T.cuda.func_call('bb_dec_{tag}', {wsrc}, {dst}, source_code={src(f'bb_dec_{tag}')})"
        return f"{ind}T.cuda.func_call('bb_dec_{tag}', {wsrc}, {off}, {dst}, source_code={src(f'bb_dec_{tag}')})"

    def prep_expr(arbuf, apptr):
        return (f"T.cuda.func_call('bb_prep_{tag}', {arbuf}.ptr_to([0]), {apptr}, source_code={src(f'bb_prep_{tag}')}, "
                f"return_type={'int32' if i8 else 'float32'!r})")

    def idot_expr(dptr, apptr, c0):
        """int8 activations: the exact int32 dot product of one vector, the dp4a chain started at ``c0``."""
        return (f"T.cuda.func_call('bb_dot_{tag}', {dptr}, {apptr}, {c0}, source_code={src(f'bb_dot_{tag}')}, "
                f"return_type='int32')")

    def dot_expr(dptr, apptr):
        return (f"T.cuda.func_call('bb_dot_{tag}', {dptr}, {apptr}, source_code={src(f'bb_dot_{tag}')}, "
                f"return_type='float32')")

    def dsb_expr(dptr, apptr, s_raw, acc):
        """Two block scales per vector (``hint.block_dots``): ``acc`` plus each block's dot product
        times its scale (the raw bytes ``s_raw``)."""
        return (f"T.cuda.func_call('bb_dsb_{tag}', {dptr}, {apptr}, {s_raw}, {acc}, "
                f"source_code={helpers[f'bb_doth_{tag}'] + helpers[f'bb_dsb_{tag}']!r}, return_type='float32')")

    def store_line(ind, i, n, val):
        if b8:
            return f"{ind}output[{i}, {n}] = {int8_epilogue(i, n, val)}"
        if w.global_scale:
            val = f"{val} * global_scale[0]"
        if c.with_bias:
            val = f"{val} + T.Cast('float32', bias[{n}])"
        return f"{ind}output[{i}, {n}] = T.Cast({c.out_dtype!r}, {val})"

    def int8_epilogue(i, n, val):
        """The TensorIR's epilogue order (bitblas.schedule.epilogue.scaled_sum), cast to the output."""
        v, vt = scaled_sum(plan, val, acc_dtype, i, n)
        return v if vt == c.out_dtype else f"T.Cast({c.out_dtype!r}, {v})"

    why = None if body else gemv_hint_unsupported(plan, hint)
    if why:
        raise ValueError(f"{hint}: {why}")
    if body:
        body(add, locals())
    else:
        _BODIES[type(hint)](b8)(plan, hint, add, locals())
    return "\n".join(L) + "\n"


# the kernel body of each hint class (the mma GEMV's by activation bytes: int8 / float8 or float)
_BODIES = {GEMVRowsHint: lambda b8: rows_body, GEMVKSplitHint: lambda b8: ksplit_body,
           GEMVMmaHint: lambda b8: mma_int8_body if b8 else mma_body, GEMVWgmmaHint: lambda b8: wgmma_body}


def gemv_hint_unsupported(plan, hint: GEMVHint) -> Optional[str]:
    """None when the kernel ``hint`` asks for (its class: rows, k-split, mma or wgmma GEMV) takes
    ``plan`` with that hint, else why not."""
    if type(hint) not in _BODIES:
        return (f"{type(hint).__name__} is not a GEMV kernel's hint (accepted: "
                f"{', '.join(c.__name__ for c in _BODIES)})")
    c = plan.config
    if e4m3_acts(plan):
        if not (isinstance(hint, GEMVMmaHint) or hint.f8_halves):
            return (f"A_dtype={c.A_dtype!r}: only the m16n8k32 tensor-core GEMV (GEMVMmaHint) and the rows "
                    f"kernel (GEMVRowsHint, converting them to float16 pairs) take these activations; got {hint}")
        if hint.f8_halves and c.out_dtype == "float32":
            # float16 partial sums (relative error ~2**-11) would dominate a float32 output's error;
            # the m16n8k32 kernel keeps float32 sums
            return (f"out_dtype='float32': the rows kernel sums A_dtype={c.A_dtype!r} activations in float16 "
                    f"pairs; float32 outputs take the m16n8k32 tensor-core GEMV (GEMVMmaHint); got {hint}")
    if isinstance(hint, GEMVWgmmaHint):
        return wgmma_gemv_unsupported(plan, hint)
    if isinstance(hint, GEMVMmaHint):
        return mma_gemv_unsupported(plan, hint) if plan.float_acts else mma_int8_unsupported(plan, hint)
    if isinstance(hint, GEMVKSplitHint):
        if not plan.float_acts:
            return (f"A_dtype={plan.config.A_dtype!r}: int8 activations take the rows kernel or the mma GEMV "
                    f"(GEMVRowsHint or GEMVMmaHint; got {hint})")
        if hint.k_warps < 1:
            return f"k_warps={hint.k_warps}: the k-split kernel needs at least one warp splitting K"
    if isinstance(hint, GEMVRowsHint) and l2_prefetch_unsupported(hint.l2_prefetch):
        return l2_prefetch_unsupported(hint.l2_prefetch)
    if isinstance(hint, GEMVRowsHint) and hint.act_smem:
        why = _act_smem_unsupported(plan, hint)
        if why:
            return why
    if (plan.m or 1) > GEMV_MAX_ROWS:
        return (f"{plan.m} rows: the rows and k-split kernels take 1..{GEMV_MAX_ROWS} "
                f"(the mma GEMV: up to {GEMV_MMA_MAX_ROWS})")
    if isinstance(hint, GEMVKSplitHint) and hint.rows_per_warp * (plan.m or 1) > 32 * hint.k_warps:
        return "rows_per_warp * m must be <= 32 * k_warps"
    return None


ACT_SMEM_MAX_BYTES = 48 * 1024      # static shared memory of one block


def _act_smem_unsupported(plan, hint: GEMVRowsHint) -> Optional[str]:
    if (plan.m or 1) != 1:
        return f"act_smem=True stages one activation row; the plan has {plan.m} rows"
    nbytes = act_smem_bytes(plan, hint)
    if nbytes is not None and nbytes > ACT_SMEM_MAX_BYTES:
        return (f"act_smem=True: the staged row of K={plan.config.K} takes {nbytes} bytes of shared memory, "
                f"more than {ACT_SMEM_MAX_BYTES}")
    return None


def schedule_cuda_gemv(func, plan, hint: Optional[GEMVHint] = None, target=None):
    """IRModule of the GEMV kernel for ``plan`` (``func``, the TensorIR of the plan, is not used:
    the kernel is written directly). The module carries ``TIRX_PIPELINE_ATTR`` so the build uses
    TVM's tirx pipeline; a ``pdl`` hint's kernel is launched by TVM's runtime with programmatic
    stream serialization (its launch parameters say so)."""
    why = gemv_unsupported(plan)
    if why:
        raise ValueError(f"GEMV template does not take this plan: {why}")
    hint = hint or default_gemv_hint(plan, target)
    arch = arch_of(target)
    if hint.pdl and not arch.pdl:
        raise ValueError(f"{type(hint).__name__}.pdl=True needs an sm_90+ target (griddepcontrol); "
                         f"target arch is {arch.name()}")
    why = gemv_arch_unsupported(plan, arch)
    if why:
        raise ValueError(why)
    if isinstance(hint, GEMVWgmmaHint) and not arch.wgmma:
        raise ValueError(f"GEMVWgmmaHint (the wgmma GEMV) needs an sm_90 target (wgmma, TMA); target arch is "
                         f"{arch.name()}")
    from tvm.script import tirx as T
    text = kernel_script(plan, hint)
    prim = tvm.script.from_source(text, extra_vars={"T": T})

    def pdl(f, dyn_smem=False):
        """The launch tags SplitHostDevice would derive (grid, block; the dynamic shared memory size
        last), plus programmatic dependent launch."""
        tags = ["blockIdx.x", "threadIdx.x", "tirx.use_programtic_dependent_launch"]
        return f.with_attr("tirx.kernel_launch_params",
                           tags + ["tirx.use_dyn_shared_memory"] * dyn_smem) if hint.pdl else f
    if isinstance(hint, GEMVWgmmaHint):   # the main kernel (dynamic shared memory) launches while the permute kernel runs
        perm = pdl(tvm.script.from_source(permute_script(plan, hint), extra_vars={"T": T}))
        mod = tvm.IRModule({"main": pdl(prim, dyn_smem=True), "permute": perm})
        return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx").with_attr(WGMMA_ARCH_ATTR, arch.wgmma_arch)
    mod = tvm.IRModule({"main": pdl(prim)})
    return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx")
