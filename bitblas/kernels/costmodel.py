"""A Roller-style cost model: estimated seconds of one kernel candidate on one device.

Roller (OSDI'22) ranks tile configurations by the memory traffic each tile implies at every level
of the memory hierarchy, under the occupancy the tile allows, and counts whole waves of blocks.
The model here does the same for the bitblas templates, from the :class:`~bitblas.hardware.DeviceSpec`
(SM count, shared memory and registers per SM, L2 size, DRAM bandwidth, clock) and the problem:

* occupancy: blocks per SM from threads, shared memory (the template's own accounting) and an
  estimate of registers per thread; none fits -> infinite cost;
* waves: the busiest SM runs ``ceil(blocks / SMs)`` blocks; a last partial wave costs a whole one;
* per block, on its SM: tensor-core cycles (padded tile work), shared-memory cycles (cp.async
  fills, ldmatrix reads, the decoded tile), decode ALU cycles (quantized weights are decoded once
  per block *row*, so small BM decodes W many times), and barrier overhead per k step;
  latency-bound when too few independent mma per SM are in flight;
* traffic: L2 -> SM bytes = every block's A and W tiles; DRAM bytes = unique A, W, scales and
  output, W re-read per row of blocks when it does not stay in L2; both slowed when the
  ``stages``-deep ring keeps too few bytes in flight per SM to cover DRAM latency (Little's law);
* Hopper wgmma (:class:`WGMMAHint`, one CTA per SM: its ring fills most of shared memory):
  ``waves = ceil(tiles / SMs)`` of per-tile time ``max(tensor-core time, A and W tile bytes over
  the SM's L2 bandwidth)`` plus a fixed per-tile epilogue; see kernels/wgmma.py's ``cost`` for the
  constants, fitted to an H200 tile table (the MEASURED table of testing/test_tune_wgmma.py);
* GEMV: weight bytes over DRAM bandwidth, scaled by bytes in flight per SM (warps x lanes x
  vector x unroll x rows) against latency, SM imbalance for few blocks, and ALU cycles for decode
  and the m-row dot products.

Estimates only rank candidates; the tuner measures the top-k on the device. Each template's
``cost`` lives next to it (``bitblas/kernels/<template>.py``); this module holds what they share:
the constants, the bytes of a weight and its scales, and the GEMV kernels' weight-stream model
(:func:`gemv_prelude`, :func:`gemv_stream`, :func:`gemv_alu_s`, :func:`gemv_total`).
``bitblas.tune.space.estimate`` asks the hint's template.
"""
from __future__ import annotations

import math

from ..schedule import gemv

__all__ = ["DRAM_LATENCY_S", "L1_WAVEFRONTS_PER_CLK", "LAUNCH_S", "WGMMA_RS_FIXED_CLK", "WGMMA_RS_PER_COL_CLK",
           "WGMMA_SLAB_CHAIN_CLK", "elem_bytes", "scale_bytes_per_weight",
           "gemv_prelude", "gemv_stream", "gemv_alu_s", "gemv_total"]

# an m64nNk16 wgmma with the A operand (decoded weights) in registers takes ~44 + 0.83 N cycles of an
# SM's tensor cores (fitted to H200 runs of the wgmma GEMV, W4A16 K=8192: ~64 cycles at N=24, ~97 at
# N=64; within ~15% of H100 runs of the fused GEMM at N=128 and 256); a lone warpgroup's slab
# without overlap (decode, wgmma, wait) ~1100 cycles per 64-channel tile. The wgmma GEMV's and the
# fused GEMM's costs share them.
WGMMA_RS_FIXED_CLK, WGMMA_RS_PER_COL_CLK = 44.0, 0.83
WGMMA_SLAB_CHAIN_CLK = 1100.0

DRAM_LATENCY_S = 1.0e-6      # loaded DRAM latency the in-flight bytes must cover
L1_WAVEFRONTS_PER_CLK = 1.0  # L1 load wavefronts per SM and clock (one 128-byte line of one load each)
LAUNCH_S = 2.0e-6            # a kernel launch


def elem_bytes(fmt) -> float:
    return fmt.bits / 8


def scale_bytes_per_weight(plan) -> float:
    c = plan.config
    if not c.with_scaling:
        return 0.0
    g = c.K if plan.groups == 1 else c.group_size
    per = 2.0 + (2.0 if c.with_zeros else 0.0)
    return per / g


# -- the GEMV kernels (kernels/gemv_*.py): weight bytes over DRAM bandwidth, scaled by the bytes in
# flight per SM (warps x lanes x vector x loads) against latency, SM imbalance for few blocks, and
# ALU cycles for decode and the m-row dot products ------------------------------------------------
def gemv_prelude(plan, hint):
    """(weight vector bytes, codes per vector, vectors per channel) of a GEMV ``hint`` on ``plan``,
    or None where the kernel does not take it (infinite cost)."""
    vb = gemv.vec_bytes(plan, hint.vec_bytes, blocks=gemv.vec_blocks(plan, hint))
    if vb is None or gemv.gemv_hint_unsupported(plan, hint) is not None:
        return None
    vals = vb * 8 // plan.w.bits
    return vb, vals, math.ceil(plan.config.K / vals)


def gemv_stream(plan, spec, *, vb, warps, loads, regs, blocks, chunks, min_blocks):
    """(seconds of the weight stream, blocks resident per SM) of a GEMV kernel of ``blocks``
    blocks of ``warps`` warps, ``regs`` registers per thread (estimated), ``loads`` weight vectors
    of ``vb`` bytes in flight per lane, ``chunks`` blocks streaming the same weights; None where
    it does not fit (infinite cost). ``min_blocks`` launch bounds: ptxas fits the registers of
    min_blocks blocks per SM and at most 255 per thread (fewer loads held at once beyond that;
    spills not modelled). A busy SM pulls at most ~3x its fair share of DRAM bandwidth."""
    threads = 32 * warps
    if min_blocks:
        cap = min(255, spec.regs_per_sm // (min_blocks * threads))
        if regs > cap:
            loads = max(1, loads * cap // regs)
            regs = cap
    if regs > 255 or threads > 1024:
        return None
    regs = 8 * math.ceil(regs / 8)
    bps = min(spec.max_blocks_per_sm, spec.max_threads_per_sm // threads, spec.regs_per_sm // (regs * threads))
    if bps < 1:
        return None
    per_sm = math.ceil(blocks / spec.sm_count)
    resident = min(bps, per_sm)
    inflight = resident * warps * 32 * vb * loads
    need = spec.dram_bandwidth / spec.sm_count * DRAM_LATENCY_S
    mem_eff = max(min(1.0, inflight / need), 1e-3)
    c = plan.config
    w_bytes = c.N * c.K * (elem_bytes(plan.w) + scale_bytes_per_weight(plan))
    sm_bytes = w_bytes * chunks * per_sm / blocks       # bytes the busiest SM streams
    t_mem = max(w_bytes / spec.dram_bandwidth, sm_bytes / (3.0 * spec.dram_bandwidth / spec.sm_count))
    t_mem /= mem_eff
    return t_mem, resident


def gemv_alu_s(ops, sync_clk, spec) -> float:
    """Seconds of ``ops`` ALU operations over the GPU plus ``sync_clk`` cycles of barriers."""
    return ops / (spec.alu_ops_per_sm_clk * 2 * spec.sm_count * spec.clock_hz) + sync_clk / spec.clock_hz


def gemv_total(t_mem, t_alu) -> float:
    """A GEMV kernel's estimate: the longer of memory and ALU time, a tenth of the other, a launch."""
    return max(t_mem, t_alu) + 0.1 * min(t_mem, t_alu) + LAUNCH_S
