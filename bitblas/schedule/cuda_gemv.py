"""The small-M CUDA template (decode, M = 1..16; the tensor-core kernels up to 64): float16/bfloat16
activations x int/uint, fp4_e2m1, nf4 (any 4-bit table), float8_e4m3 / float8_e5m2 and nvfp4
weights; int8 activations x int/uint weights (dp4a, rows kernel).

Hand-written TIRx kernels (TVM's "tirx" pipeline), generated per plan as TVMScript text (the
signature follows the plan's argument list); the per-vector decode and dot product are CUDA
device helpers passed through ``T.cuda.func_call``. Two shapes of kernel, chosen by the hint:

* rows (``k_warps=0``): a warp owns ``rows_per_warp`` output channels; its lanes walk K in
  vectors of packed weights, ``unroll`` per row per step, through a ring of ``stages`` register
  slots (the loads of ``stages - 1`` steps in flight while one is decoded) (``act_smem``, one
  row: the block stages the activation row in shared memory once, paired for the decoder);
* k-split (``k_warps>0``): the warps of a block split K, each lane keeps its slice of the
  activations in registers, blocks walk row batches (grid-stride) and meet in shared memory.

The rows kernel's body is in gemv_rows.py, the k-split one in gemv_ksplit.py, the tensor-core ones
(``mma=True``) in gemv_mma.py and gemv_mma_int8.py; the load, decode, scale and store lines they
all use are generated here (``_kernel_script``).

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

Table formats (:func:`_decoder` picks the rule from the format's table, not its name); the group
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
  result before the bias.

int8 activations (``A_dtype="int8"``, int/uint 1/2/4/8-bit weights; the rows kernel, or from 3 rows
(4 to 6 for group-scaled 4-bit and 8-bit codes, :meth:`GEMVHint._default_shape`) the m16n8k32
tensor-core kernel of gemv_mma_int8.py; the k-split kernel refuses them; the helpers live in
gemv_int8.py): a 16-byte activation load holds 16 values; the codes of a weight vector become
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
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from .._tvm import tvm
from .cuda_mma import _target_info
from .epilogue import scaled_sum
from .gemv_decode import (_ACT, _decoder, _e4m3_consts, _e4m3_scale_helper, _f8_pair_dec, _lut, _prep_adjacent,
                          _table_dec)
from .gemv_int8 import _i8_helpers

__all__ = ["GEMVHint", "gemv_unsupported", "gemv_default_takes", "schedule_cuda_gemv", "GEMV_MAX_ROWS",
           "GEMV_MMA_MAX_ROWS", "TIRX_PIPELINE_ATTR"]

GEMV_MAX_ROWS = 16          # the rows and k-split kernels
GEMV_MMA_MAX_ROWS = 64      # the tensor-core kernels (chunks of 16 rows, gemv_mma.row_chunks)
WGMMA_GEMV_MIN_ROWS = 9     # the wgmma GEMV is a default from here (GEMVHint._wgmma_tile) and tuned from here
TIRX_PIPELINE_ATTR = "bitblas.tir_pipeline"   # module attribute: compile with tir_pipeline="tirx"



@dataclass(frozen=True)
class GEMVHint:
    rows_per_warp: int = 2     # output channels per warp (activation reuse, loads in flight)
    warps: int = 4             # warps per block
    unroll: int = 4            # K vectors per lane loaded before the first is used
    vec_bytes: int = 0         # bytes of packed weights per lane and load (0: largest that fits)
    k_warps: int = 0           # >0: warps splitting K, activations held in registers (small m)
    grid: int = 0              # blocks of the k-split kernel (0: one per row batch)
    stages: int = 2            # register slots of weights (rows kernel): stages - 1 steps in flight while one decodes
    mma: bool = False          # tensor-core kernel: tiles of 16 channels x 8 or 16 rows (see gemv_mma._body_mma)
    min_blocks: int = 0        # __launch_bounds__ minimum blocks per SM (0: none); lets ptxas keep more loads in flight
    pdl: bool = False          # programmatic dependent launch (sm_90+): waits for the previous kernel before
                               # any access; the next may launch once this one's main loop is done
    chunk_loop: bool = False   # tensor-core kernel, 17..64 rows: a block serves every 16-row chunk of its
                               # channel tile, the weights decoded once (else one block per chunk)
    wgmma: bool = False        # tensor-core kernel on sm_90a: wgmma with the decoded weights in registers and the
                               # (permuted) activations in shared memory (gemv_wgmma.py)
    act_smem: bool = False     # rows kernel, one row: the block stages the activations in shared memory once,
                               # already paired for the decoder, in a conflict-free lane order (gemv_rows.py)

    @classmethod
    def default(cls, plan, target=None) -> "GEMVHint":
        """The default kernel shape (:meth:`_default_shape`); on sm_90+ targets with programmatic
        dependent launch (H200, back-to-back calls, W4A16 1x8192^2: 10.3 -> 9.6 us; the launch
        and ramp of one kernel overlap the previous one's tail)."""
        hint = cls._default_shape(plan, target)
        sm = _target_info(target)[0]
        return dataclasses.replace(hint, pdl=True) if sm is not None and sm >= 90 else hint

    @classmethod
    def _default_shape(cls, plan, target=None) -> "GEMVHint":
        """Measured on the H200 (W4A16 uint4 g128, N=8192/28672, K=8192, CUDA graphs over weight
        copies; docs/benchmarks.md): at m=1 one-warp blocks of 4 rows with the next step in flight
        (11.0 / 32.6 µs; the tensor-core kernel: 14.5 / 42.6; 8th session, with the 2-blocks-per-SM
        tiles: 9.67 / 30.74 vs 11.31 / 38.73); from m=2 the tensor-core kernel wins (8th session,
        m=2: 11.91 vs 13.22, 39.36 vs 42.96; 1-, 2-bit, nf4, fp4, nvfp4 and bfloat16 zero points
        13-42% faster; 8-bit codes within 4% either way), from m=3 by 2-4x (m=8: 15.5 vs 42.4, 49.2
        vs 136; m=16: 19.7 vs 77.3, 60.7 vs 265). Base tiles: 32 channels per block and 8 warps
        splitting K up to 8 rows, 4 warps and 32 (N < 16896) or 64 channels above;
        :meth:`_float_mma_tile` and :meth:`_int8_mma_tile` refine them. The tensor-core kernel needs
        a decoder that yields half pairs (every float-activation format) and sm_80+ (``target``: the
        CUDA Target, None = assume sm_80+). int8 activations: from 3 rows (group-scaled 4-bit codes
        4, 8-bit codes 5 with group scales and 6 without) the m16n8k32 tensor-core kernel
        (gemv_mma_int8) where it takes the plan (group sizes holding 4 weight vectors), else the
        rows kernel."""
        m = plan.m or 1
        sm = _target_info(target)[0]
        wg = cls._wgmma_tile(plan) if sm is not None and sm >= 90 else None
        if wg:
            return wg
        if m > GEMV_MAX_ROWS:
            return cls._chunk_tile(plan)
        if m >= 2 and (sm is None or sm >= 80):
            mma = cls._mma_base(plan, m)
            if plan.float_acts and _mma_decodable(plan.w):
                return cls._float_mma_tile(plan, m, mma)
            # int8: m16n8k32 (gemv_mma_int8) under 2 blocks per SM vs the dp4a rows kernel (H200,
            # K=8192, N=8192 / 28672, µs, 8th session, docs/benchmarks.md): 1-, 2-bit and per-channel
            # 4-bit codes from 3 rows (w2a8-g128 m=3 8.1 vs 12.6, 27.9 vs 32.2; w4a8-chan 10.5 vs 11.4,
            # 32.9 vs 33.5), group-scaled 4-bit from 4 (m=3 11.0 vs 10.7; m=4 10.9 vs 12.2, 35.5 vs
            # 38.4), group-scaled 8-bit from 5 (m=5 19.3 vs 26.6, 64.4 vs 63.6), per-channel 8-bit
            # from 6 (m=5 20.0 vs 18.9, 65.0 vs 57.9; m=6 20.1 vs 25.7, 64.6 vs 60.6)
            if plan.w.bits == 8:
                first = 5 if plan.groups > 1 else 6
            else:
                first = 4 if plan.groups > 1 and plan.w.bits == 4 else 3
            if not plan.float_acts and m >= first:
                from .gemv_mma_int8 import mma_int8_unsupported
                tile = cls._int8_mma_tile(plan, m, mma)
                if mma_int8_unsupported(plan, tile) is None:
                    return tile
        staged = cls._staged_row(plan) if m == 1 else None
        if staged:
            return staged
        if m <= 2 and _decoder(plan.w) != "lut4":
            # launch bounds of 8 blocks per SM let ptxas keep ~107 instead of 68 registers, so
            # more weight loads stay in flight (W4A16 1x8192^2: 11.1 -> 10.4 us); 2-bit weights want
            # 8 channels per warp (14.9 -> 10.3 us), 8-bit and nvfp4 2 channels in 2-warp blocks
            # (w8a16: 28.0 -> 18.7 us); the nf4 table decoder is faster without (18.4 vs 19.5)
            if plan.w.bits <= 2:              # 2-warp blocks: 10.1 -> 9.7 us (28672: 28.9 -> 25.4)
                return cls(rows_per_warp=8, warps=2, unroll=4, stages=2, min_blocks=8)
            if plan.w.bits == 8 or (_vec_bytes(plan) or 16) < 16:     # None: a plan the GEMV refuses
                return cls(rows_per_warp=2, warps=2, unroll=4, stages=2, min_blocks=8)
            return cls(rows_per_warp=4, warps=2, unroll=4, stages=2, min_blocks=8)
        if m <= 4:
            # int8 x per-channel 8-bit codes without the next step in flight (H200, m=3/4: 21.1 ->
            # 18.5, 22.8 -> 18.6 µs; N=28672: 59.1 -> 55.2, 61.1 -> 55.8)
            i8_chan8 = not plan.float_acts and plan.w.bits == 8 and plan.groups == 1
            return cls(rows_per_warp=4, warps=1, unroll=4, stages=1 if i8_chan8 else 2)
        if m <= 8:
            return cls(rows_per_warp=4, warps=1, unroll=4, stages=1)
        return cls(rows_per_warp=4, warps=1, unroll=2, stages=1)

    @classmethod
    def _staged_row(cls, plan) -> Optional["GEMVHint"]:
        """One activation row: the rows kernel with the row staged in shared memory (``act_smem``,
        gemv_rows.py; 15th session) where it measured faster, else None. 8-warp blocks under 4
        blocks per SM (<= 64 registers, 32 warps per SM: twice the warps of the register-bound
        default), one vector per row and step, the loop unrolled. H200, µs, against the previous
        defaults (docs/benchmarks.md): float activations, 2 channels per warp, 2 steps in flight:
        W4A16 g128 8192^2 9.18 vs 9.58 (28672x8192 28.3 vs 30.3; 4096^2 3.73 vs 4.03; 4096x14336
        10.24 vs 11.35; 10240x8192 12.3 vs 13.4), with zeros 9.90 vs 10.73 (30.7 vs 34.7), bfloat16
        with zeros 11.5 vs 13.3 (35.9 vs 40.7), nf4 15.1 vs 17.0 (45.8 vs 53.3; at K=14336 18.7 vs
        16.1: only up to K=8192), fp4 11.5 vs 11.7 (33.8 vs 36.9), nvfp4 15.5 vs 17.5 (49.1 vs
        53.1); 8-bit codes only where the 16-channel blocks fill 70..100% of one wave (w8a16 8192^2
        16.8 vs 18.0, 6144x4096 7.04 vs 7.27; 4096^2 5.49 vs 5.41, 10240x8192 25.3 vs 23.2). 1-
        and 2-bit codes from N=8192 with 8 channels per warp in 4-warp blocks: w2a16 g128 8.58 vs
        9.67 (23.9 vs 26.1), w1a16 9.68 vs 11.15 (29.1 vs 31.0); at 6144x4096 5.49 vs 4.92.
        int8 activations: 2-bit codes (w2a8 g128 6.01 vs 6.52, 16.1 vs 16.7); 4- and 8-bit codes
        tie or lose (w8a8 16.1 vs 16.0)."""
        b, dec, N = plan.w.bits, _decoder(plan.w), plan.config.N
        if not plan.float_acts:
            hint = _ROWS_STAGED if b == 2 else None
        elif b <= 2:
            hint = _ROWS_STAGED_8 if N >= 8192 else None
        elif b == 8:
            blocks, slots = -(-N // 16), 4 * _num_sms()
            hint = _ROWS_STAGED if 0.7 * slots <= blocks <= slots else None
        elif dec == "lut4":
            hint = _ROWS_STAGED if plan.config.K <= 8192 else None
        else:
            hint = _ROWS_STAGED
        return None if hint is None or gemv_hint_unsupported(plan, hint) else hint

    @classmethod
    def _mma_base(cls, plan, m) -> "GEMVHint":
        """The tensor-core GEMV's base tile (see :meth:`_default_shape`): 32 channels x 8 K warps
        up to 8 rows, then 4 K warps and 32 (N < 16896) or 64 channels."""
        if m <= 8:
            return cls(rows_per_warp=32, k_warps=8, unroll=2, stages=2, mma=True)
        if _wide_layer(plan):
            return _MMA_64
        return cls(rows_per_warp=32, k_warps=4, unroll=4, stages=2, mma=True)

    @classmethod
    def _float_mma_tile(cls, plan, m, base) -> "GEMVHint":
        """The float tensor-core GEMV's tile. Over 128 registers a 256-thread block (8 K warps)
        is alone on its SM; the wide tile under 2 blocks per SM fits (sm_90: W4A16 m=4 131 -> 106
        registers). H200, N=K=8192 (7th session, docs/benchmarks.md): 4-bit codes at m=4/8 gain
        19-36% (uint4 g128 14.8 -> 11.8 µs, nf4 23.1 -> 17.0), 4- and 8-bit codes at m=9/16 below
        N=16896 without the next step in flight 7-27% (fp8 weights 25.0 -> 19.9); nvfp4's float8
        scales and 1-/2-bit codes spill under the bound and keep ``base``."""
        b = plan.w.bits
        if m <= 8 and b == 4 and not _f8_scales(plan):
            return _MMA_WIDE
        if m > 8 and b in (4, 8):
            # wide layers too (14th session, N=28672, 9 / 16 rows, µs, vs the 64-channel base tile):
            # nf4 63.2 / 70.4 vs 92.7 / 93.5, fp4 57.1 / 64.9 vs 76.4 / 77.4, nvfp4 64.9 / 68.1 vs
            # 81.3 / 81.8, float8 weights 65.9 / 69.4 vs 77.1 / 77.4, w8a16 69.8 / 73.3 vs 72.0 / 74.0,
            # W4A16 g128 56.1 / 64.3 vs 59.2 / 60.9 (on sm_90 int codes take the wgmma GEMV instead)
            return dataclasses.replace(_MMA_WIDE, stages=1)
        return base

    @classmethod
    def _int8_mma_tile(cls, plan, m, base) -> "GEMVHint":
        """The int8 tensor-core GEMV's tile: the base tiles under 2 blocks per SM, from 9 rows below
        N=16896 the wide tile without the next step in flight (the 4-warp tile took 134-252
        registers), from N=16896 the 64-channel base tile likewise. H200, N=K=8192 (7th session):
        m=8 w4a8-g128 14.35 -> 10.81 µs, w8a8 22.33 -> 19.99; m=16 w4a8-g128 16.34 -> 11.79,
        w2a8-g128 13.76 -> 10.72, w8a8-g128 23.60 -> 19.67."""
        if m <= 8:
            return dataclasses.replace(base, min_blocks=2)
        if _wide_layer(plan):
            # the 64-channel base tile took 255 registers (7 warps per SM); under 2 blocks per SM
            # without the next step in flight (14th session, N=28672, 9 / 16 rows, µs): w4a8 g128
            # 41.4 / 42.5 vs 46.9 / 47.6, w8a8 g128 66.3 / 67.7 vs 70.3 / 70.9, w4a8 per channel
            # 34.8 / 35.9 vs 35.6 / 36.6, w8a8 62.3 / 63.5 vs 63.4 / 64.2, w2a8 g128 35.6 / 35.9 vs
            # 36.2 / 37.0
            return dataclasses.replace(base, stages=1, min_blocks=2)
        return dataclasses.replace(_MMA_WIDE, stages=1)

    @classmethod
    def _chunk_tile(cls, plan) -> "GEMVHint":
        """The tensor-core tile for 17..64 rows (chunks of 16 rows, gemv_mma.row_chunks).

        Float activations: the chunk loop (11th session; one block serves every chunk of its 32
        channels, the weights decoded once, 4 K warps, 255 registers). H200, K=8192, N=8192 /
        28672, rows 17 / 32 / 64, µs, against the 9th session's tiles (a block per chunk: 64
        channels x 4 K warps for int 4-bit codes, the wide tile for nf4, the 16-row tile for the
        others): W4A16 g128 23.6 / 28.3 / 45.5 vs 28.2 / 29.0 / 53.8 (28672: 87.5 / 106.5 / 175.5
        vs 97.1 / 101.0 / 186.0: 32 rows lose 5%); with float zero points 25.7 / 29.8 / 49.4 vs
        39.7 / 40.7 / 78.8; nf4 30.9 / 37.3 / 47.4 vs 35.9 / 37.0 / 72.0 (28672: 81.0 / 102.8 /
        180.5 vs 119.9 / 130.3 / 250.1); w8a16 per channel 28.2 / 30.3 / 39.1 vs 29.1 / 31.7 / 62.1.
        16 channels per warp lose by 2x (the activations of all rows read twice as often).

        int8 activations, the same chunk loop on the m16n8k32 kernel, against the 9th session's
        tiles (64 channels x 4 K warps for 8-bit codes, the wide tile without the next step in
        flight for the others): w4a8 g128 15.5 / 17.1 / 27.2 vs 19.9 / 20.8 / 39.3 (28672: 51.2 /
        60.3 / 101.6 vs 64.1 / 69.2 / 133.5); w8a8 per channel 20.6 / 22.2 vs 23.4 / 24.6 at 17 /
        32 rows (68.5 / 73.7 vs 85.4 / 89.2); w2a8 g128 16.2 / 17.2 / 27.7 vs 18.0 / 19.0 / 35.8;
        w4a8 per channel 15.5 / 16.7 / 21.4 vs 16.2 / 17.3 / 32.1.

        Float activations take weight vectors of 16 codes (:func:`span_vectors`; 12th
        session): a lane's activations of a vector then span 32 bytes, so the four lanes of a
        token row read one 128-byte line per load instead of two. The loop is bound by L1's
        load wavefronts (ncu, W4A16 64x8192^2: 94% of peak, one wavefront per line and row), so
        this cut the time by up to 2.4x: W4A16 g128 17 / 32 / 48 / 64 rows 24.2 / 24.7 / 32.0 /
        36.1 vs 23.6 / 28.3 / 36.2 / 45.5 µs (28672: 89.5 / 92.0 / 120.1 / 140.4 vs 87.4 / 105.7
        / 139.5 / 177.0); w2a16 g128 at 17 / 64 rows 21.3 / 34.5 vs 28.2 / 81.4 (28672: 64.9 /
        132.4 vs 109.2 / 318.7); nf4, fp4 and float zero points at 64 rows 37.7 / 37.5 / 41.2 vs
        47.3 / 47.1 / 49.4. int8 activations (one byte per value) already span 32 bytes with
        16-byte vectors of 4-bit codes."""
        m, hint = plan.m or 1, _MMA_LOOP
        span = span_vectors(plan)
        if span:                 # the same K per step as two of the default vectors (4-bit: 4 of 16 codes)
            hint = dataclasses.replace(hint, vec_bytes=span[0], unroll=2 * span[1])
        # 64 channels per warp on wide layers, where they fit and win: each activation fragment
        # feeds twice the mma; N=8192 (128 such blocks) loses (W4A16 32 rows 37.7 vs 24.8 µs).
        # H200, 28672x8192, µs. Float activations, 2- to 8-bit codes up to 48 rows (1-bit codes
        # spill), 17 / 32 / 48 rows: W4A16 g128 73.1 / 79.7 / 97.0 vs 87.8 / 92.6 / 120.9; with
        # zeros 88.7 / 90.6 / 114.1 vs 111.2 / 115.5 / 137.8; fp4 84.3 / 85.8 / 105.8 vs 86.4 /
        # 91.7 / 126.0; w2a16 68.7 / 70.2 / 95.0 vs 83.3 / 88.2 / 105.9; w8a16 per channel 82.3 /
        # 99.6 vs 88.5 / 121.6 at 32 / 48; nvfp4 104.2 / 115.5 vs 114.8 / 139.7; nf4 only from 33
        # rows: 112.2 vs 128.5 at 48, 99.8 / 99.2 vs 90.2 / 95.8 at 17 / 32. int8 activations,
        # sub-byte codes up to 32 rows, per-channel ones up to 48 (group-scaled ones spill at 48;
        # 8-bit codes tie): 32 rows w4a8 g128 55.4 vs 60.1, w2a8 g128 51.3 vs 59.5, w4a8 per channel
        # 40.8 vs 44.5; 48 rows w4a8 per channel 52.0 vs 65.4.
        if plan.float_acts:
            fits = plan.w.bits >= 2 and m <= 48 and not (_decoder(plan.w) == "lut4" and m <= 32)
        else:
            fits = plan.w.bits <= 4 and m <= (32 if plan.groups > 1 else 48)
        if fits and _wide_layer(plan):
            hint = dataclasses.replace(hint, rows_per_warp=64)
        return hint

    @classmethod
    def _wgmma_tile(cls, plan) -> Optional["GEMVHint"]:
        """The wgmma GEMV's tile for 9..64 rows on sm_90 (gemv_wgmma.py), where it measured faster
        than the chunk loop (17..64) or the tensor-core GEMV (9..16), else None. H200, K=8192, µs,
        13th session (docs/benchmarks.md): N=28672,
        one warpgroup of 64 channels per block up to 40 rows, 128 channels above (40 rows 66.9 vs
        73.2; 48 rows 80.8 vs 79.6, with float zeros 100.4 vs 86.4); W4A16 g128 17 / 32 / 64 rows
        56.4 / 62.0 / 85.6 vs 78.3 / 79.3 / 139.7 (cuBLAS fp16 112-114); with float zeros
        60.4 / 67.1 / 93.4 vs 89.2 / 110.6 (33 rows) / 154.5; w2a16 g128 51.8 / 54.5 / 73.0 vs 68.0 /
        92.4 (33) / 133.3 (128 channels at every row count); w8a16 per channel only above 48 rows
        (64: 100.1 vs 148.8; 17: 91.8 vs 80.3). N=8192 (128 blocks of 64 channels, 4 warpgroups
        splitting K): W4A16 g128 20.3 / 20.9 / 24.7 vs 23.6 / 24.6 / 36.8; int4, bfloat16 and
        quantized zeros alike; w2a16 no gain (23.0 vs 21.9 at 17 rows), w8a16 only from 33 rows
        (32.9 vs 39.3 at 64). Narrower layers (fewer than 128 blocks of 64 channels) keep the chunk
        loop; at 16 rows or fewer the chunk loop's 16-row kernel wins (8 rows: 12.1 vs 19.5).

        9..16 rows (14th session): on wide layers 2- and 4-bit codes take one warpgroup of 64
        channels, against the tensor-core GEMV's default tile (N=28672, 9 / 16 rows, µs): W4A16
        g128 52.0 / 58.1 vs 59.2 / 60.9, with float zeros 56.1 / 57.0 vs 79.8 / 82.2, bfloat16 with
        zeros 57.1 / 57.1 vs 78.4 / 80.5, int4 52.6 / 58.6 vs 60.7 / 62.4, w2a16 43.4 / 42.9 vs
        54.2 / 61.1; 8-bit codes lose (w8a16 86.6 / 88.6 vs 72.0 / 74.0). From N=8192 2-bit codes
        take 4 warpgroups splitting K: w2a16 g128 8192^2 15.6 / 15.4 vs 20.2 / 23.6 (4-bit codes
        there keep the tensor-core GEMV: 15.0 / 17.2 vs ~19 for the wgmma GEMV at 17 rows)."""
        from .gemv_wgmma import wgmma_gemv_unsupported
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


# one activation row staged in shared memory (GEMVHint._staged_row): 2 channels per warp, 8-warp blocks,
# one vector per row and step, 2 steps in flight, 4 blocks per SM; for 1- and 2-bit codes 8 channels per
# warp in 4-warp blocks, 1 step in flight
_ROWS_STAGED = GEMVHint(rows_per_warp=2, warps=8, unroll=1, stages=3, min_blocks=4, act_smem=True)
_ROWS_STAGED_8 = GEMVHint(rows_per_warp=8, warps=4, unroll=1, stages=2, min_blocks=4, act_smem=True)
# the wide tensor-core tile: 8 K warps x 4 vectors per step, 2 blocks per SM (<= 128 registers)
_MMA_WIDE = GEMVHint(rows_per_warp=32, k_warps=8, unroll=4, stages=2, mma=True, min_blocks=2)
# 64 channels x 4 K warps, 2 vectors per step, the next step in flight (the base tile from 9 rows at
# N >= 16896)
_MMA_64 = GEMVHint(rows_per_warp=64, k_warps=4, unroll=2, stages=2, mma=True)
# 17..64 rows (float and int8 activations): the chunk loop, one block of 32 channels x 4 K warps
# serving every 16-row chunk (gemv_mma); 16 channels per warp lose by 2x (each block reads the
# activations of all rows, so half the channels per block read them twice as often)
_MMA_LOOP = GEMVHint(rows_per_warp=32, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1, chunk_loop=True)
# the wgmma GEMV (gemv_wgmma): one warpgroup of 64 channels per block, 4 slabs of weights in flight in
# registers (up to 40 rows); 128 channels (two m64 tiles) with 2; 64 channels with 4 warpgroups
# splitting K (N < 16896)
_WGMMA_WIDE = GEMVHint(rows_per_warp=16, k_warps=1, unroll=1, stages=4, mma=True, wgmma=True)
_WGMMA_WIDE2 = GEMVHint(rows_per_warp=32, k_warps=1, unroll=1, stages=2, mma=True, wgmma=True)
_WGMMA_KSPLIT = GEMVHint(rows_per_warp=16, k_warps=4, unroll=1, stages=2, mma=True, wgmma=True)


def gemv_default_takes(plan, target=None) -> bool:
    """Whether an untuned operator runs ``plan`` (a static row count) on the GEMV template: 1..16
    rows wherever the template takes the plan; 17..64 rows on sm_80+ (the tensor-core kernel in
    chunks of 16 rows) except int8 x 8-bit codes above 32 rows.
    H200, K=8192, N=8192 / 28672 (9th session, docs/benchmarks.md): W4A16 g128 at 17 / 32 / 64
    rows 28.7 / 29.7 / 54.5 µs and 97.6 / 103.7 / 189.6 against 98.4 / 91.2 / 84.4 and 345 /
    338 / 323 for decode-then-wgmma (cuBLAS fp16: 33.5 / 34.1 / 36.5, 117 / 117 / 119); int8 x
    int8 per channel at 17 / 32 / 64 rows 23.7 / 24.3 / 41.6 and 85.4 / 89.9 / 150.5 against the
    wgmma kernel's 29.4 / 25.8 / 21.9 and 94.9 / 90.3 / 92.1; with g128 scales at 17 / 32 rows
    29.0 / 28.9 and 103.9 / 105.8 against 28.7 / 25.6 and 104.4 / 93.4. With the chunk loop (12th
    session) g128 scales at 17 / 32 / 48 / 64 rows: 24.6 / 27.1 / 30.1 / 34.0 and 73.0 / 78.7 /
    108.2 / 123.2 against the wgmma kernel's 28.7 / 26.0 / 22.5 / 22.7 and 111.7 / 98.8 / 92.9 /
    105.4, so up to 32 rows with or without group scales; per channel at 48 rows 28.5 / 87.8
    against 21.4 / 95.8."""
    if plan.target_kind != "cuda" or gemv_unsupported(plan) is not None:
        return False
    if plan.m <= GEMV_MAX_ROWS:
        return True
    sm = _target_info(target)[0]
    if sm is not None and sm < 80:
        return False
    return plan.float_acts or plan.w.bits < 8 or plan.m <= 32


def _f8_scales(plan) -> bool:
    """Float activations with float8_e4m3 scale bytes (nvfp4), decoded per vector."""
    return plan.config.A_dtype != "int8" and plan.config.with_scaling and plan.scale_dtype != plan.config.A_dtype


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


def _vec_bytes(plan, want: int = 0, group_vectors: int = 1) -> Optional[int]:
    """Weight bytes per lane vector (``want``, or the largest of 16 / 8 / 4 that fits): at least
    one 16-byte activation load of values, K a multiple of the values, <= 64 values unless asked,
    and with group scales ``group_vectors`` vectors inside one group (the int8 tensor-core GEMV: 4,
    one mma k-step of a lane quad)."""
    c, b = plan.config, plan.w.bits
    vmin = 8 if plan.float_acts else 16      # values per 16-byte activation load
    for vb in ((want,) if want else (16, 8, 4)):
        v = vb * 8 // b
        if v < vmin or c.K % v or (not want and v > 64):   # <= 64 values per vector: registers
            continue
        if plan.groups > 1 and c.group_size % (group_vectors * v):
            continue
        return vb
    return None


def span_vectors(plan) -> Optional[tuple]:
    """``(vec_bytes, n)`` for float activations whose default weight vector (:func:`_vec_bytes`)
    holds more than 16 codes: the smallest vector the plan takes of at least 16 codes (2 bytes
    per bit of code width), so that a lane's activations span 32 bytes and the four lanes of a
    token row in the tensor-core GEMV load one 128-byte line per load, and ``n`` of them cover one
    default vector. None otherwise."""
    vb0 = _vec_bytes(plan)
    if not plan.float_acts or vb0 is None:
        return None
    for vb in (4, 8, 16):
        if vb >= 2 * plan.w.bits and _vec_bytes(plan, vb) is not None:
            return (vb, vb0 // vb) if vb < vb0 else None
    return None


def decode_ops_per_weight(plan) -> float:
    """Rough ALU instructions per weight of the decode (the tuner's cost model)."""
    if not plan.float_acts:
        return 0.5                           # int8 activations: lop3 / shift per 4 codes, prmt shared
    return {"int": 1.5, "e2m1": 2.4, "lut4": 2.6, "e5m2": 1.5, "e4m3": 3.0}.get(_decoder(plan.w), 1.5)


def gemv_unsupported(plan) -> Optional[str]:
    """None when the GEMV template takes ``plan``, else why not."""
    c = plan.config
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if plan.m is None or not 1 <= plan.m <= GEMV_MMA_MAX_ROWS:
        return f"needs a static row count 1..{GEMV_MMA_MAX_ROWS}"
    if c.A_dtype not in _ACT and c.A_dtype != "int8":
        return f"A_dtype={c.A_dtype!r}: activations must be float16, bfloat16 or int8"
    if c.layout != "nt":
        return "layout must be 'nt'"
    if c.A_dtype == "int8":
        why = _int8_unsupported(plan)
        if why is None and plan.m > GEMV_MAX_ROWS:
            from .gemv_mma_int8 import mma_int8_unsupported
            mma_why = mma_int8_unsupported(plan, _MMA_WIDE)      # the plan's side of it: weights, groups
            if mma_why:
                why = f"{plan.m} rows: only the tensor-core kernel takes more than {GEMV_MAX_ROWS} rows ({mma_why})"
        return why
    if _decoder(plan.w) is None:
        return "weights must be int/uint, e2m1 (fp4_e2m1, nvfp4), a 4-bit table (nf4) or float8"
    if plan.m > GEMV_MAX_ROWS and not _mma_decodable(plan.w):
        return f"{plan.m} rows: only the tensor-core kernel takes more than {GEMV_MAX_ROWS} rows"
    if c.with_act_scaling:
        return "no activation scales"
    if c.with_scaling and plan.scale_dtype not in (c.A_dtype, "float8_e4m3"):
        return "scales must have the activation dtype (or be float8_e4m3 bytes)"
    if c.out_dtype not in ("float16", "bfloat16", "float32"):
        return "output must be float16, bfloat16 or float32"
    if _vec_bytes(plan) is None:
        return "K (and the group size) must be multiples of the values in one 4-byte weight vector (>= 8)"
    return None


def _int8_unsupported(plan) -> Optional[str]:
    """:func:`gemv_unsupported` for int8 activations: int/uint weights (dp4a), float32 scales, no
    zero points, int32 output only without scales."""
    c = plan.config
    if plan.w.kind not in ("int", "uint"):
        return f"W_dtype={c.W_dtype!r}: int8 activations take int/uint weights"
    if c.with_zeros:
        return "with_zeros=True: int8 activations take no zero points"
    if c.with_scaling and plan.scale_dtype != "float32":
        return f"scale dtype {plan.scale_dtype!r}: int8 activations take float32 scales"
    if c.out_dtype not in ("float16", "bfloat16", "float32", "int32"):
        return f"out_dtype={c.out_dtype!r}: output must be float16, bfloat16, float32 or int32"
    if _vec_bytes(plan) is None:
        return (f"K={c.K} (and group_size={c.group_size}) must be multiples of the values in one weight vector "
                f"(with int8 activations at least {max(16, 32 // plan.w.bits)} for {c.W_dtype})")
    return None


# --------------------------------------------------------------------------------------------
# CUDA helpers (device functions, inlined by nvcc), generated per format
# --------------------------------------------------------------------------------------------
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


def _helpers(tag: str, act: str, bits: int, storage: str, nw: int, dec: str = "int", table=None,
             half_pairs: bool = False):
    """CUDA source of the helpers for one (activation dtype, weight format, vector size);
    ``storage``: how the codes are stored (``plan.w_storage``: "offset", "twos", "plain"); ``dec``
    and ``table`` from :func:`_decoder`: table decoders reuse the int path's activation and dot
    helpers and replace the decoder (and, for adjacent pairs, the activation pairing); int8
    activations take the dp4a helpers of gemv_int8."""
    if act == "int8":
        return {**_load_helpers(nw), **_i8_helpers(tag, bits, storage, nw)}
    src = _int_helpers(tag, act, bits, storage == "twos", nw, half_pairs)
    if dec in ("e4m3", "e5m2") and half_pairs:
        src[f"bb_dec_{tag}"] = _f8_pair_dec(tag, act, nw, dec)
    elif dec != "int":
        src[f"bb_dec_{tag}"] = _table_dec(tag, act, nw, dec, table)
        if dec == "lut4":
            src[f"bb_prep_{tag}"] = _prep_adjacent(tag, act, nw)
        src["bb_e4m3f"] = _e4m3_scale_helper()
    return src


def _load_helpers(nw: int):
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


def _int_helpers(tag: str, act: str, bits: int, twos: bool, nw: int, half_pairs: bool = False):
    """``twos``: the codes are stored in two's complement (int8): the decoder XORs each field's
    sign bit, giving the offset-binary field ``q + 2**(bits-1)`` that offset-binary codes (signed
    1/2/4-bit weights) are stored as, and unsigned codes are taken as they are; the decode gives
    ``field - off``. ``half_pairs``: 8-bit codes decoded to half pairs like the narrower codes (the
    tensor-core GEMV's operand; float16 through the magic number, bfloat16 through float32), else
    the float32 path of the rows kernel."""
    ctype, t2, magic, mant, magic_f = _ACT[act]
    src = _load_helpers(nw)
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

    # the pair products: fma.rn.f16x2 / bf16x2 into nacc accumulators (pair q into q % nacc), as
    # __hfma2 emits them, but DOT_FMAS_PER_ASM to an asm statement: one __hfma2 (an asm statement
    # each) per pair made NVVM (cicc) spend minutes on kernels that inline many dot products in one
    # block (8 channels per warp with the whole K in flight: 131 s -> 6 s of CPU, the same ptxas
    # registers and spills); the accumulators start at 0 (the bits of __float2half2_rn(0.f))
    lines = [f"__device__ __forceinline__ float bb_dot_{tag}(const unsigned* d, const unsigned* ap) {{",
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
    if act == "float16":                      # one rounding more in half, one conversion instead of two
        lines += ["  float2 f = __half22float2(__hadd2(acc0, acc1));", "  return f.x + f.y;", "}"]
    else:                                     # bfloat16 sums stay float32 (8-bit mantissa)
        lines.append("  float s = 0.f;")
        for k in range(nacc):
            lines.append(f"  {{ float2 f = {cvt2}(acc{k}); s += f.x + f.y; }}")
        lines += ["  return s;", "}"]
    src[f"bb_dot_{tag}"] = "\n" + "\n".join(lines) + "\n"
    return src


DOT_FMAS_PER_ASM = 8


# --------------------------------------------------------------------------------------------
# The kernel, as TVMScript text (its signature follows the plan's argument list)
# --------------------------------------------------------------------------------------------
def _fmt_float(x: float) -> str:
    return f"T.float32({float(x)!r})"


def _kernel_script(plan, hint: GEMVHint, body=None):
    """The kernel's TVMScript text; ``body(add, locals)`` writes the body instead of the GEMV
    kernel ``hint`` asks for (fused_wgmma.py: its own checks, a run-time row count of any size)."""
    c, w = plan.config, plan.w
    act = c.A_dtype
    i8 = act == "int8"                      # int8 activations: dp4a (gemv_int8) or m16n8k32 (gemv_mma_int8)
    m, N, K, b = plan.m, c.N, c.K, w.bits
    signed = w.kind == "int"
    # int8 tensor cores: the 4 vectors of a lane quad inside one group
    VB = _vec_bytes(plan, hint.vec_bytes, group_vectors=4 if i8 and hint.mma else 1)
    if VB is None:
        raise ValueError(f"vec_bytes={hint.vec_bytes} does not fit K={K}, group_size={c.group_size}")
    NW = VB // 4
    V = VB * 8 // b                         # values per vector
    AV = 16 if i8 else 8                    # activation values per 16-byte load
    NA = V // 4 if i8 else V // 2           # activation words (4 int8 / 2 float16 values) per vector
    NC = K // V                             # vectors per row
    G = K if plan.groups == 1 else c.group_size
    dec = _decoder(w)
    if i8:
        tag = f"i8_{'i' if signed else 'u'}{b}_v{VB}"
    elif dec == "int":
        tag = f"{'f16' if act == 'float16' else 'bf16'}_{'i' if signed else 'u'}{b}_v{VB}"
    else:
        tag = f"{'f16' if act == 'float16' else 'bf16'}_{dec}_v{VB}"
    f32_path = _f32_path(plan, hint)
    helpers = _helpers(tag, act, b, plan.w_storage, NW, dec, w.table, half_pairs=b == 8 and not f32_path)
    s_f8 = _f8_scales(plan)
    dec_factor = _e4m3_consts()["factor"] if dec == "e4m3" and f32_path else 1.0   # 2**8 folded into the scale
    x_shift = (1 << (b - 1)) if signed else 0   # decode gives field - off, field = q + x_shift (offset-binary)
    off_max = (1 << b) - 1 + x_shift
    quant_zeros = c.with_zeros and c.zeros_mode == "quantized"
    float_zeros = c.with_zeros and not quant_zeros
    # register dtypes of raw scales / zeros (int8 activations: group scales only, per-channel ones at the store)
    sdt = plan.arg("scale").dtype if c.with_scaling and not plan.scale_in_epilogue else None
    zdt = ("int8" if quant_zeros else plan.scale_dtype) if c.with_zeros else None
    need_asum = float_zeros                    # sum(a*q) = dot + (off - x_shift) * sum(a)
    acc_dtype = "int32" if i8 and not sdt else "float32"    # int8: exact int32 sums unless group scales

    def src(name):
        return repr(helpers[name])

    ap_dtype = "float32" if f32_path else "uint32"
    ap_len = _prep_words(plan, hint, V)

    L = []
    add = L.append
    params = ", ".join(f"{a.name}_ptr: T.handle" for a in plan.args)
    add("@T.prim_func")
    add(f"def main({params}):")
    # the tensor-core kernels take their row count at run time (``mv``, 1..m: activation rows are
    # clamped on load, stores predicated), so one kernel serves every row count of its class
    # (gemv_mma.row_class); the rows kernel unrolls over its rows and stays static
    rows = "mv" if hint.mma else m
    if hint.mma:
        add("    mv = T.int32()")
    shapes = {"W": (N, K * b // 8), "bias": (N,)}
    for a in plan.args:
        shp = (rows, *a.shape[1:]) if a.per_row else shapes.get(a.name, tuple(a.shape))
        shp = "(" + ", ".join(str(x) for x in shp) + ("," if len(shp) == 1 else "") + ")"
        add(f"    {a.name} = T.match_buffer({a.name}_ptr, {shp}, {a.dtype!r}, align=16)"
            if a.name in ("A", "W") else
            f"    {a.name} = T.match_buffer({a.name}_ptr, {shp}, {a.dtype!r})")
    if hint.mma and m is not None:
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
        if i8:                                 # int8: the group scale only (dp4a sums are exact)
            return [f"{ind}sv[{idx}] = T.Cast('float32', {s_raw})"] if sdt else []
        s_expr = f"T.Cast('float32', {s_raw})" if c.with_scaling else "T.float32(1)"
        if s_f8:
            s_expr = (f"T.cuda.func_call('bb_e4m3f', T.Cast('int32', {s_raw}), source_code={src('bb_e4m3f')}, "
                      f"return_type='float32')")
        if dec_factor != 1.0:
            s_expr = f"{s_expr} * {_fmt_float(dec_factor)}" if c.with_scaling else _fmt_float(dec_factor)
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

    def ldw_line(ind, nr, cidx, dst):
        return (f"{ind}T.cuda.func_call('bb_ldw{NW}', W.ptr_to([{nr}, {cidx} * {VB}]), {dst}, "
                f"source_code={src(f'bb_ldw{NW}')})")

    def load_lines(ind, nr, cidx, at, scales=True):
        """Weight vector ``cidx`` of row ``nr`` into slot ``at`` (index text) of ``wq``, its raw
        scale (``scales``) / zero element into ``sr`` / ``zr`` at the same index."""
        out = [ldw_line(ind, nr, cidx, f"wq.ptr_to([{at}, 0])")]
        if sdt and scales:
            out.append(f"{ind}sr[{at}] = scale[{nr}, {gidx(cidx)}]")
        if zdt:
            out.append(f"{ind}zr[{at}] = {zsrc(nr, cidx)}")
        return out

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

    def store_line(ind, i, n, val):
        if i8:
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
    elif hint.wgmma:
        from .gemv_wgmma import _body_wgmma
        _body_wgmma(plan, hint, add, locals())
    elif hint.mma and i8:
        from .gemv_mma_int8 import _body_mma_int8
        _body_mma_int8(plan, hint, add, locals())
    elif hint.mma:
        from .gemv_mma import _body_mma      # lazily: gemv_mma imports this module's helpers
        _body_mma(plan, hint, add, locals())
    elif hint.k_warps:
        from .gemv_ksplit import _body_ksplit
        _body_ksplit(plan, hint, add, locals())
    else:
        from .gemv_rows import _body_rows
        _body_rows(plan, hint, add, locals())
    return "\n".join(L) + "\n"


def _device_entry(add, hint, grid, threads, slots, NW, sdt, zdt, trigger=False, wait=True):
    """Kernel entry, grid (``grid`` blocks of ``threads``) and the weight registers of every GEMV
    kernel: ``wq`` words (``slots`` + ``NW`` words per vector), raw scales ``sr`` (``sdt``) and
    zeros ``zr`` (``zdt``) per vector. ``hint.pdl``: wait for the previous kernel in the stream
    before any memory access (a plain launch's memory order holds), and let the next kernel launch
    here if ``trigger`` (else the body calls :func:`_pdl_trigger` after its main loop: triggered
    at entry, the next kernel's blocks take free slots early and unevenly; H200, 2-bit 1x8192^2
    with 1-warp blocks: 12.5 vs 9.8 us)."""
    add("    T.device_entry()")
    if hint.min_blocks:
        add(f'    T.attr({{"tirx.launch_bounds_min_blocks_per_sm": {hint.min_blocks}}})')
    if hint.pdl and wait:                     # else the body waits (after loads of what no kernel writes)
        add("    T.ptx.griddepcontrol.wait()")
    if trigger:
        _pdl_trigger(add, hint)
    add(f"    bx = T.cta_id([{grid}])")
    add(f"    tx = T.thread_id([{threads}])")
    sh = ", ".join(str(x) for x in slots)
    add(f"    wq = T.alloc_local(({sh}, {NW}), 'uint32')")
    if sdt:
        add(f"    sr = T.alloc_local(({sh}), {sdt!r})")
    if zdt:
        add(f"    zr = T.alloc_local(({sh}), {zdt!r})")


def _pdl_trigger(add, hint):
    if hint.pdl:
        add("    T.ptx.griddepcontrol.launch_dependents()")


def _reduce_k_warps(add, KW: int, idx: str, extents: str, acc: str, slot) -> str:
    """The ``KW`` K warps (warpgroups) of a block meet in shared memory: all but the first store
    their accumulators ``acc`` (element text over the loop indices ``idx`` with ``extents``) at
    ``slot(k)`` (the element text of K warp ``k``, an index text), the first adds them up; returns
    the indent under which the first goes on (to its store)."""
    add("    if kw > 0:")
    add(f"        for {idx} in T.grid({extents}):")
    add(f"            {slot('kw - 1')} = {acc}")
    add("    T.cuda.cta_sync()")
    add("    if kw == 0:")
    add(f"        for {idx} in T.grid({extents}):")
    tot = " + ".join(slot(str(k)) for k in range(KW - 1))
    add(f"            {acc} = {acc} + {tot}")
    return "        "


def _steps(nit: int, unroll: int):
    """(vectors per lane and step, steps): the largest unroll <= ``unroll`` that divides ``nit``."""
    u = max(x for x in range(1, max(1, min(unroll, nit)) + 1) if nit % x == 0)
    return u, nit // u


def _step_loop(add, NS, ST, load, process, after_prologue=None, unroll=False):
    """The main loop over ``NS`` steps: ``load(ind, step, slot)`` issues a step's loads into
    register slot ``slot``, ``process(ind, step, slot)`` consumes them. ``ST >= 2``: a ring of
    ``ST`` register slots; steps 0 .. ST-2 are issued first, and step s+ST-1 is issued before step
    s is processed (the loop is unrolled by ``ST`` so that every slot index is a constant).
    ``after_prologue()`` emits its lines after the loads of steps 0 .. ST-2, before the loop.
    ``unroll``: the loop is unrolled (ptxas may then issue a step's loads earlier than the source)."""
    loop = "T.unroll" if unroll else "T.serial"
    if ST == 1:
        if after_prologue:
            after_prologue()
        add(f"    for st in {loop}({NS}):")
        load("        ", "st", 0)
        process("        ", "st", 0)
        return
    for s0 in range(min(ST - 1, NS)):
        load("    ", str(s0), s0)
    if after_prologue:
        after_prologue()
    NO = -(-NS // ST)                         # outer iterations; the last one may be partial
    add(f"    for s2 in {loop}({NO}):")
    for j in range(ST):
        ind = "        "
        cur = f"s2 * {ST} + {j}" if j else f"s2 * {ST}"
        if (NO - 1) * ST + j >= NS:           # step s2*ST+j runs past NS in the last iteration
            add(f"{ind}if {cur} < {NS}:")
            ind += "    "
        nxt = f"s2 * {ST} + {j + ST - 1}"
        if (NO - 1) * ST + j + ST - 1 >= NS:
            add(f"{ind}if {nxt} < {NS}:")
            load(ind + "    ", nxt, (j + ST - 1) % ST)
        else:
            load(ind, nxt, (j + ST - 1) % ST)
        process(ind, cur, j)


def gemv_hint_unsupported(plan, hint: GEMVHint) -> Optional[str]:
    """None when the kernel shape ``hint`` asks for (rows, k-split, tensor cores) takes ``plan``,
    else why not."""
    if hint.wgmma:
        from .gemv_wgmma import wgmma_gemv_unsupported
        return wgmma_gemv_unsupported(plan, hint)
    if not plan.float_acts and hint.mma:
        from .gemv_mma_int8 import mma_int8_unsupported
        return mma_int8_unsupported(plan, hint)
    if not plan.float_acts and hint.k_warps:
        return (f"A_dtype={plan.config.A_dtype!r}: int8 activations take the rows kernel or the tensor-core "
                f"kernel (k_warps=0 or mma=True; got k_warps={hint.k_warps}, mma={hint.mma})")
    if hint.act_smem:
        why = _act_smem_unsupported(plan, hint)
        if why:
            return why
    if hint.mma:
        return mma_gemv_unsupported(plan, hint)
    if (plan.m or 1) > GEMV_MAX_ROWS:
        return (f"{plan.m} rows: the rows and k-split kernels take 1..{GEMV_MAX_ROWS} "
                f"(mma=True: up to {GEMV_MMA_MAX_ROWS})")
    if hint.k_warps and hint.rows_per_warp * (plan.m or 1) > 32 * hint.k_warps:
        return "rows_per_warp * m must be <= 32 * k_warps"
    return None


ACT_SMEM_MAX_BYTES = 48 * 1024      # static shared memory of one block


def _f32_path(plan, hint: GEMVHint) -> bool:
    """8-bit codes with float activations on the rows / k-split kernels: decoded to float32, the
    activations converted to float32 (the tensor-core kernel takes 8-bit codes as half pairs)."""
    return plan.w.bits == 8 and plan.float_acts and not hint.mma


def _prep_words(plan, hint: GEMVHint, V: int) -> int:
    """4-byte words of prepared (paired) activations per weight vector of ``V`` values: one
    float32 per value on the float32 path, else two float16 / bfloat16 or four int8 values."""
    if _f32_path(plan, hint):
        return V
    return V // 2 if plan.float_acts else V // 4


def keeps_act_sum(plan) -> bool:
    """Whether the rows kernel uses each vector's activation sum from the prep (float zero points;
    int8 activations: the dp4a chain's start), so that a staged row keeps it too."""
    c = plan.config
    return not plan.float_acts or (c.with_zeros and c.zeros_mode != "quantized")


def act_smem_bytes(plan, hint: GEMVHint) -> Optional[int]:
    """Shared memory of the rows kernel's staged activation row (``hint.act_smem``): the prepared
    activations of every vector position (:func:`_prep_words`) and, where the kernel uses them
    (:func:`keeps_act_sum`), one 4-byte sum per position; None if the hint's vector does not fit."""
    vb = _vec_bytes(plan, hint.vec_bytes)
    if vb is None:
        return None
    V = vb * 8 // plan.w.bits
    return -(-(plan.config.K // V) // 32) * 32 * 4 * (_prep_words(plan, hint, V) + keeps_act_sum(plan))


def _act_smem_unsupported(plan, hint: GEMVHint) -> Optional[str]:
    if hint.mma or hint.k_warps:
        return "act_smem=True is a rows-kernel option (mma=False, k_warps=0)"
    if (plan.m or 1) != 1:
        return f"act_smem=True stages one activation row; the plan has {plan.m} rows"
    nbytes = act_smem_bytes(plan, hint)
    if nbytes is not None and nbytes > ACT_SMEM_MAX_BYTES:
        return (f"act_smem=True: the staged row of K={plan.config.K} takes {nbytes} bytes of shared memory, "
                f"more than {ACT_SMEM_MAX_BYTES}")
    return None


def mma_gemv_unsupported(plan, hint: GEMVHint) -> Optional[str]:
    """None when the tensor-core kernel (``hint.mma``) takes ``plan`` with ``hint``, else why not."""
    if not plan.float_acts:
        return f"A_dtype={plan.config.A_dtype!r}: the tensor-core GEMV takes float16/bfloat16 activations"
    if not _mma_decodable(plan.w):
        return ("the tensor-core GEMV decodes int/uint 1/2/4/8-bit, fp4_e2m1 / nvfp4, nf4 and float8 codes to "
                "half pairs")
    from .gemv_mma import chunk_loop_unsupported
    return mma_tile_unsupported(hint) or chunk_loop_unsupported(plan, hint)


def mma_tile_unsupported(hint: GEMVHint) -> Optional[str]:
    """The tile limits both tensor-core GEMVs (float and int8 activations) share."""
    if hint.rows_per_warp % 16 or hint.rows_per_warp <= 0:
        return f"rows_per_warp={hint.rows_per_warp} must be a positive multiple of 16 (mma tiles of 16 channels)"
    if hint.k_warps > 8:
        return f"k_warps={hint.k_warps}: at most 8 warps split K"
    return None


def _mma_decodable(w) -> bool:
    """Weights whose decoder yields float16/bfloat16 pairs (what the mma consumes): 8-bit codes
    through the float16 magic number (10-bit mantissa) or, for bfloat16, through float32."""
    dec = _decoder(w)
    if w.bits == 8:
        return dec in ("int", "e4m3", "e5m2")
    return w.bits <= 4 and dec in ("int", "e2m1", "lut4")


def schedule_cuda_gemv(func, plan, hint: Optional[GEMVHint] = None, target=None):
    """IRModule of the GEMV kernel for ``plan`` (``func``, the TensorIR of the plan, is not used:
    the kernel is written directly). The module carries ``TIRX_PIPELINE_ATTR`` so the build uses
    TVM's tirx pipeline; a ``pdl`` hint's kernel is launched by TVM's runtime with programmatic
    stream serialization (its launch parameters say so)."""
    why = gemv_unsupported(plan)
    if why:
        raise ValueError(f"GEMV template does not take this plan: {why}")
    hint = hint or GEMVHint.default(plan, target)
    sm = _target_info(target)[0]
    if hint.pdl and (sm is None or sm < 90):
        raise ValueError(f"GEMVHint.pdl=True needs an sm_90+ target (griddepcontrol); "
                         f"target arch is {f'sm_{sm}' if sm else 'unknown'}")
    if hint.wgmma and (sm is None or sm < 90):
        raise ValueError(f"GEMVHint.wgmma=True needs an sm_90 target (wgmma, TMA); "
                         f"target arch is {f'sm_{sm}' if sm else 'unknown'}")
    from tvm.script import tirx as T
    text = _kernel_script(plan, hint)
    prim = tvm.script.from_source(text, extra_vars={"T": T})

    def pdl(f, dyn_smem=False):
        """The launch tags SplitHostDevice would derive (grid, block; the dynamic shared memory size
        last), plus programmatic dependent launch."""
        tags = ["blockIdx.x", "threadIdx.x", "tirx.use_programtic_dependent_launch"]
        return f.with_attr("tirx.kernel_launch_params",
                           tags + ["tirx.use_dyn_shared_memory"] * dyn_smem) if hint.pdl else f
    if hint.wgmma:   # the main kernel (dynamic shared memory) launches while the permute kernel runs
        from .cuda_wgmma import WGMMA_ARCH_ATTR
        from .gemv_wgmma import permute_script
        perm = pdl(tvm.script.from_source(permute_script(plan, hint), extra_vars={"T": T}))
        mod = tvm.IRModule({"main": pdl(prim, dyn_smem=True), "permute": perm})
        return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx").with_attr(WGMMA_ARCH_ATTR, "sm_90a")
    mod = tvm.IRModule({"main": pdl(prim)})
    return mod.with_attr(TIRX_PIPELINE_ATTR, "tirx")
