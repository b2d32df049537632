"""Candidate kernels for one M bucket: (plan rows, hint) pairs, every one valid for the plan.

A bucket ``b`` of a config stands for the row counts it serves (see :mod:`bitblas.dispatch`);
its kernels are tuned at ``m = b``. On CUDA the candidates span both templates:

* tensor cores (:class:`MMAHint`): block tile BM x BN x BK, warp tile WM x WN (1-8 warps),
  ``stages``-deep cp.async ring, decode vector width; the plan is symbolic in M for a dynamic
  config (one kernel serves every m of the bucket) and static for an int M > 16;
* GEMV (:class:`GEMVHint`, buckets of 1..16 rows where the template applies; 17..64 rows: only the
  tensor-core variants, in chunks of 16 rows): output channels
  per warp, warps per block, loads in flight (unroll), weight vector width, k-split and tensor-core
  variants (float16/bfloat16 activations; int8 ones take the rows and tensor-core kernels); plan rows = ``b``;
* Hopper wgmma (:class:`WGMMAHint`, sm_90 plans whose weights need no decode, see
  :func:`wgmma_unsupported`): BN in {64, 128, 192, 256} (int8: those in the s8 wgmma table),
  1 or 2 consumer warpgroups (BM = 64 or 128), every ring depth from 2 to 8 stages that fits the
  device's shared memory per block, persistent or one CTA per tile, grouped raster of 8 row
  tiles; plan rows as for the mma.sync kernels;
* the simple schedule (threads per block) where none applies.

On the CPU: :class:`CPUGemvHint` where it applies (float activations, [N, K] weights: channels per
thread task, channels per one-row micro-kernel, rows x channels per many-row micro-kernel, steps
unrolled), else :class:`CPUHint` (N tile, K vector width). Hints are filtered by the template's own
checks (tile geometry, vector alignment) and by the device's shared memory per block.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import List, Optional

from ..config import MatmulConfig
from ..plan import make_plan
from ..schedule import (CPUGemvHint, CPUHint, GEMVHint, MMAHint, SimpleCUDAHint, WGMMAHint, cpu_gemv_unsupported,
                        gemv_unsupported, hint_to_dict, wgmma_unsupported)
from ..schedule import cuda_mma, gemv

__all__ = ["Candidate", "candidates", "mma_rows"]

# Largest warp tile (accumulator registers: WM * WN / 32 floats per thread).
_MAX_WARP_TILE = 64 * 64


@dataclass(frozen=True)
class Candidate:
    plan_m: Optional[int]        # rows of the kernel's plan (None: symbolic in M)
    hint: object
    cost: float = float("nan")   # cost model estimate in seconds (see cost.py)

    def to_dict(self) -> dict:
        return {"m": self.plan_m, "hint": hint_to_dict(self.hint), "cost": self.cost}


def mma_rows(config: MatmulConfig) -> Optional[int]:
    """Plan rows of the tensor-core kernels of a config: static for an int M > 16, else symbolic."""
    M = config.M
    return M if isinstance(M, int) and M > cuda_mma.MIN_ROWS else None


def _mma(config, spec) -> List[Candidate]:
    rows = mma_rows(config)
    plan = make_plan(config, "cuda", rows)
    if cuda_mma.mma_reason(plan, spec.cc if spec is not None else None) is not None:
        return []                         # fp16/bf16, int8 or (sm_89+) float8 activations only
    if spec is not None and spec.cc < 80:
        return []
    smem_limit = spec.smem_per_block if spec is not None else 49152
    quantized = plan.w.kind != "float"
    out = []
    for BM, BN, WM, WN, BK, stages in itertools.product((16, 32, 64, 128, 256), (32, 64, 128, 256),
                                                        (16, 32, 64), (16, 32, 64), (32, 64, 128), (2, 3, 4, 5)):
        if WM > BM or WN > BN or BM % WM or BN % WN or WM * WN > _MAX_WARP_TILE:
            continue
        if (BM // WM) * (BN // WN) not in (1, 2, 4, 8):
            continue
        if plan.w.kind == "float" and stages < 3 and BK // 16 > 1:
            continue                      # the float-weight inner pipeline wants >= 3 stages
        for vec in ((8, 4) if quantized else (8,)):
            hint = MMAHint(BM=BM, BN=BN, BK=BK, WM=WM, WN=WN, stages=stages, vec_decode=vec)
            try:
                hint.check()
            except ValueError:
                continue
            if cuda_mma.copy_plan(plan, hint) is None or hint.smem_bytes(plan) > smem_limit:
                continue
            out.append(Candidate(rows, hint))
    return out


def _wgmma(config, spec) -> List[Candidate]:
    if spec is None:
        return []                         # the arch decides: not assumed
    rows = mma_rows(config)
    plan = make_plan(config, "cuda", rows)
    if wgmma_unsupported(plan, spec.cc) is not None:
        return []
    out = []
    for BN, consumers, stages, persistent in itertools.product((64, 128, 192, 256), (1, 2), range(2, 9),
                                                               (True, False)):
        hint = WGMMAHint(BN=BN, stages=stages, consumers=consumers, persistent=persistent, group_m=8)
        if hint.smem_bytes(plan) > spec.smem_per_block:
            continue
        try:
            hint.check(plan)              # int8: BN in the s8 wgmma table; the ring within sm_90's limit
        except ValueError:
            continue
        out.append(Candidate(rows, hint))
    return out


def _gemv(config, bucket, spec) -> List[Candidate]:
    out = _gemv_shapes(config, bucket, spec)
    if spec is not None and spec.cc >= 90:    # programmatic dependent launch, as the default kernels
        out = [dataclasses.replace(c, hint=dataclasses.replace(c.hint, pdl=True)) for c in out]
    return out


def _gemv_shapes(config, bucket, spec) -> List[Candidate]:
    if bucket > gemv.GEMV_MMA_MAX_ROWS:
        return []
    plan = make_plan(config, "cuda", bucket)
    if gemv_unsupported(plan) is not None:
        return []
    out = []
    if bucket > gemv.GEMV_MAX_ROWS:      # 17..64 rows: only the tensor-core kernels (chunks of 16 rows)
        return _gemv_mma_shapes(plan, bucket, spec)
    vbs = [vb for vb in (16, 8, 4) if gemv.vec_bytes(plan, vb) is not None]
    for R, warps, unroll, vb in itertools.product((1, 2, 4), (2, 4, 8), (1, 2, 4, 8), vbs):
        out.append(Candidate(bucket, GEMVHint(rows_per_warp=R, warps=warps, unroll=unroll, vec_bytes=vb)))
    # launch bounds of 8 blocks per SM (more registers for loads in flight), next step in flight
    for R, warps in itertools.product((2, 4, 8), (1, 2)):
        out.append(Candidate(bucket, GEMVHint(rows_per_warp=R, warps=warps, unroll=4, stages=2, min_blocks=8)))
    if bucket == 1:                           # the activation row staged in shared memory, 4 blocks per SM
        for R, warps, stages in itertools.product((2, 4, 8), (4, 8), (2, 3, 4)):
            hint = GEMVHint(rows_per_warp=R, warps=warps, unroll=1, stages=stages, min_blocks=4, act_smem=True)
            if gemv.gemv_hint_unsupported(plan, hint) is None:
                out.append(Candidate(bucket, hint))
    if plan.float_acts:                       # the k-split variant (float activations only): k_warps warps
        sms = spec.sm_count if spec is not None else 108     # share K, persistent grid of a few blocks per SM
        for R, kw, per_sm, vb in itertools.product((1, 2, 4, 8), (2, 4, 8), (2, 4, 8), vbs):
            if R * bucket > 32 * kw:
                continue
            out.append(Candidate(bucket, GEMVHint(rows_per_warp=R, k_warps=kw, grid=per_sm * sms, vec_bytes=vb)))
    return out + _gemv_mma_shapes(plan, bucket, spec)


def _gemv_mma_shapes(plan, bucket, spec) -> List[Candidate]:
    """The tensor-core GEMV kernels (m16n8k16 for float activations, m16n8k32 for int8 ones; sm_80+):
    16-channel mma tiles, k_warps warps splitting K; the ones the plan's format or group size
    refuses left out. Each with the next step in flight or not, and under launch bounds of 2 blocks
    per SM or none (the default tiles are such variants: GEMVHint._float_mma_tile / _int8_mma_tile
    / _chunk_tile)."""
    out = []
    if spec is not None and spec.cc < 80:
        return out
    for R, kw, unroll, stages, mb in itertools.product((16, 32, 64), (1, 2, 4, 8), (2, 4), (2, 1), (0, 2)):
        hint = GEMVHint(rows_per_warp=R, k_warps=kw, unroll=unroll, stages=stages, mma=True, min_blocks=mb)
        if gemv.gemv_hint_unsupported(plan, hint) is None:
            out.append(Candidate(bucket, hint))
    if bucket >= gemv.WGMMA_GEMV_MIN_ROWS and spec is not None and spec.cc >= 90:
        # the wgmma GEMV (gemv/wgmma.py): 64 or 128 channels per warpgroup, 1 / 2 / 4 warpgroups splitting K
        for R, kw, stages in itertools.product((16, 32), (1, 2, 4), (2, 4)):
            hint = GEMVHint(rows_per_warp=R, k_warps=kw, unroll=1, stages=stages, mma=True, wgmma=True)
            if gemv.gemv_hint_unsupported(plan, hint) is None:
                out.append(Candidate(bucket, hint))
    if bucket > gemv.GEMV_MAX_ROWS:      # the chunk loop: weights decoded once for every 16-row chunk
        # float activations also with vectors whose activations span 32 bytes (GEMVHint._chunk_tile),
        # as many of them per step as of the default vectors
        span = gemv.span_vectors(plan)
        vbs = [(0, 1)] + ([span] if span else [])
        for R, kw, unroll, stages, (vb, f) in itertools.product((16, 32, 64), (2, 4), (1, 2), (1, 2), vbs):
            hint = GEMVHint(rows_per_warp=R, k_warps=kw, unroll=unroll * f, stages=stages, vec_bytes=vb, mma=True,
                            min_blocks=1, chunk_loop=True)
            if gemv.gemv_hint_unsupported(plan, hint) is None:
                out.append(Candidate(bucket, hint))
    return out


def _cpu(config) -> List[Candidate]:
    rows = config.M if isinstance(config.M, int) else None
    plan = make_plan(config, "cpu", rows)
    if cpu_gemv_unsupported(plan) is None:
        out = []
        for block, ch, (r, rc), unroll, pf in itertools.product((8, 16, 32), (2, 4, 8),
                                                               ((4, 2), (2, 4), (6, 2), (8, 1)), (1, 4), (0, 16384)):
            hint = CPUGemvHint(block=block, channels=ch, rows=r, row_channels=rc, unroll=unroll, prefetch=pf)
            if hint.check(plan) is None:
                out.append(Candidate(rows, hint))
        return out
    ks = [k for k in (1, 4, 8, 16, 32, 64) if config.K % k == 0]
    return [Candidate(rows, CPUHint(n_tile=n, k_vec=k)) for n in (4, 8, 16, 32, 64, 128) for k in ks]


def candidates(config: MatmulConfig, kind: str, bucket: int, spec=None) -> List[Candidate]:
    """Every valid candidate for ``bucket`` (unranked). ``spec``: the DeviceSpec (CUDA)."""
    if kind == "cpu":
        return _cpu(config)
    if kind != "cuda":
        raise ValueError(f"kind={kind!r} is invalid; accepted: 'cpu', 'cuda'")
    out = _gemv(config, bucket, spec) + _mma(config, spec) + _wgmma(config, spec)
    if not out:
        rows = config.M if isinstance(config.M, int) else None
        out = [Candidate(rows, SimpleCUDAHint(threads=t)) for t in (64, 128, 256, 512)]
    return out
