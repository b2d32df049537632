"""Template "wgmma": Hopper TMA + mbarrier ring + wgmma (schedule/cuda_wgmma.py) for plans whose
weights need no decode; the kernel is written directly (no TensorIR)."""
from __future__ import annotations

import math
import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule import cuda_wgmma
from ..schedule.cuda_wgmma import WGMMAHint, schedule_cuda_wgmma, wgmma_unsupported
from ._common import need_spec, not_nvfp4, spec_of
from .base import Candidate
from .costmodel import DRAM_LATENCY_S, LAUNCH_S
from .mma import mma_rows


class WGMMA:
    name = "wgmma"
    kind = "cuda"
    Hint = WGMMAHint
    needs_tir = False
    tune_order = 2
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cuda") or wgmma_unsupported(plan, arch)

    def default(self, plan, arch, rows=None):
        """The tile class of ``rows`` (a symbolic plan serves each row count with the tiles that fill
        the SMs), or of the plan's rows."""
        if plan.nvfp4_acts:
            return None
        return WGMMAHint.default(plan, arch, rows)

    def space(self, plan, rows, arch) -> List[Candidate]:
        spec = spec_of(arch)
        if spec is None:
            return []                         # the arch decides: not assumed
        m = mma_rows(plan.config)
        plan = make_plan(plan.config, "cuda", m)
        if wgmma_unsupported(plan, arch) is not None:
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
            out.append(Candidate(m, hint))
            if persistent and consumers == 2 and BN >= 192:
                # the same tile in CTA pairs sharing the weight tile by multicast: a fifth less L2
                # traffic, and neither faster nor slower than the single CTA throughout on an H100
                # (cuda_wgmma's docstring), so the tuner measures both
                out.append(Candidate(m, WGMMAHint(BN=BN, stages=stages, consumers=2, persistent=True, group_m=8,
                                                  cluster=2)))
        return out

    def shape_key(self, hint):
        return ("wgmma", hint.BM, hint.BN) + (("pair",) if hint.cluster == 2 else ())

    def cost(self, plan, hint, rows, arch) -> float:
        return wgmma_cost(plan, hint, rows, need_spec(arch))

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_wgmma(None, plan, hint, arch)


# wgmma (fitted to H200 runs of the wgmma GEMM; the DeviceSpec's tc_flops_per_sm_clk
# is the mma.sync rate, so the wgmma rate is a constant here, scaled by SM count and clock):
# dense fp16/bf16 ~650 TFLOP/s (cuBLAS 646 at 4096^3) over 132 SMs at the 1.98 GHz the driver
# reports; 8-bit inputs (k32 instructions) twice that (~1300; measured 1110 for int8 and fp8).
_WG_FLOPS_PER_SM_CLK = 650e12 / (132 * 1.98e9)
_WG_ONE_CONSUMER = 0.75      # one consumer warpgroup: tensor-core rate vs two (64 x 128 vs 128 x 128 tiles)
_WG_TILE_S = 3.0e-6          # per tile: accumulator epilogue (scales, bias, stores) + ring drain / refill
_WG_FILL_S = 1.0e-6          # of which a persistent CTA hides this much on each tile after its first


def wgmma_cost(plan, hint: WGMMAHint, m: int, spec) -> float:
    """Seconds of the wgmma kernel: one CTA per SM (the persistent grid has one per SM; the ring
    and the setmaxnreg split, 232 registers per consumer thread, are sized for a whole SM),
    ``ceil(tiles / SMs)`` tiles on the busiest SM, each ``max(tensor, memory) + epilogue``:

    * tensor: ``2 * BM * BN * K`` (padded rows included) at the SM's dense rate, x0.75 with one
      consumer warpgroup (fitted to H200 runs of 64 x 128 tiles in one and in four waves; the
      2-warpgroup tiles fit the full rate);
    * memory: the A and W tiles (``(BM + BN) * K`` elements) at 64 B per clock per SM (the model's
      L2 -> SM width), slowed when the ``stages - 2`` ring slots the producer can fill ahead (the
      consumers hold two: the one they read and the one the last wgmma group still reads) keep
      too few bytes in flight to cover DRAM latency (Little's law); with 2 stages the producer
      only refills the slot the consumers just released while they wait for it: one slot in
      flight, as with 3, but loads and math take turns (tensor + memory);
      A CTA pair (``cluster=2``) loads half the W tile per CTA and runs row tiles in pairs;
    * epilogue: ``_WG_TILE_S`` per tile (fitted: with full waves, m >= 1024, the estimates land
      within 5% of the H200 tile table in testing/test_tune_wgmma.py; a part-filled GPU runs each
      busy SM faster than the full-GPU rate, so 128-512 rows on big tiles are over-estimated by up
      to ~30%), ``_WG_FILL_S`` less per later tile of a persistent CTA, whose ring runs on into the
      next tile.

    A lower bound of unique DRAM bytes (A, W once per ``group_m`` band of row tiles when W does
    not stay in L2, output) over bandwidth. Reproduces the measured best tile classes (fp16,
    N=K=4096): 64 x 64 up to 128 rows, 128 x 128 at 512, 128 x 256 from 1024; at 256 rows it puts
    128 x 64 (not measured) ahead of the measured best 64 x 128, which comes next.
    """
    c = plan.config
    if cuda_wgmma.wgmma_unsupported(plan, spec.cc) or hint.smem_bytes(plan) > spec.smem_per_block:
        return math.inf
    N, K = c.N, c.K
    BM, BN = hint.BM, hint.BN
    eb = float(cuda_wgmma.elem_bytes(plan))
    out_b = 4.0 if c.out_dtype in ("float32", "int32") else 2.0
    CL = hint.cluster
    tiles_m, tiles_n = math.ceil(m / (BM * CL)) * CL, math.ceil(N / BN)     # a pair runs two row tiles
    tiles = tiles_m * tiles_n
    per_sm = math.ceil(tiles / spec.sm_count)            # tiles on the busiest SM
    rate = _WG_FLOPS_PER_SM_CLK * spec.clock_hz * (2.0 if eb == 1.0 else 1.0)
    rate *= 1.0 if hint.consumers == 2 else _WG_ONE_CONSUMER
    Kp = math.ceil(K * eb / cuda_wgmma.ROW_BYTES) * cuda_wgmma.ROW_BYTES / eb
    t_tc = 2.0 * BM * BN * Kp / rate
    sm_bw = spec.l2_bandwidth / spec.sm_count
    stage_bytes = (BM + BN) * cuda_wgmma.ROW_BYTES
    ahead = max(1, hint.stages - 2) * stage_bytes
    t_mem = (BM + BN / CL) * Kp * eb / sm_bw / min(1.0, ahead / (sm_bw * DRAM_LATENCY_S))
    t_tile = t_tc + t_mem if hint.stages < 3 else max(t_tc, t_mem)
    t = per_sm * (t_tile + _WG_TILE_S)
    if hint.persistent:
        t -= (per_sm - 1) * _WG_FILL_S
    a_bytes, w_bytes = m * K * eb, N * K * eb
    w_reads = 1 if w_bytes + a_bytes <= 0.6 * spec.l2_bytes else math.ceil(tiles_m / hint.group_m)
    t_dram = (a_bytes + w_bytes * w_reads + m * N * out_b) / spec.dram_bandwidth
    return max(t, t_dram) + LAUNCH_S


TEMPLATE = WGMMA()
