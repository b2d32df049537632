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
* GEMV: weight bytes over DRAM bandwidth, scaled by bytes in flight per SM (warps x lanes x
  vector x unroll x rows) against latency, SM imbalance for few blocks, and ALU cycles for decode
  and the m-row dot products.

Estimates only rank candidates; the tuner measures the top-k on the device.
"""
from __future__ import annotations

import math

from ..schedule import CPUHint, GEMVHint, MMAHint, SimpleCUDAHint
from ..schedule import cuda_gemv, cuda_mma

__all__ = ["estimate", "DRAM_LATENCY_S"]

DRAM_LATENCY_S = 1.0e-6      # loaded DRAM latency the in-flight bytes must cover
_LAUNCH_S = 2.0e-6
_SYNC_CLK = 60               # cycles per k step for barriers and address arithmetic
_PROLOGUE_CLK = 1500         # pipeline fill + epilogue store latency per block (not overlapped)


def _elem_bytes(fmt) -> float:
    return fmt.bits / 8


def _scale_bytes_per_weight(plan) -> float:
    c = plan.config
    if not c.with_scaling:
        return 0.0
    g = c.K if plan.groups == 1 else c.group_size
    per = 2.0 + (2.0 if c.with_zeros else 0.0)
    return per / g


def _decode_ops(plan) -> float:
    """ALU operations per decoded weight element in the generic TensorIR decode."""
    c, w = plan.config, plan.w
    if w.kind == "float":
        return 0.0
    ops = 4.0 + (4.0 if w.kind == "table" and not cuda_mma._fp8(plan) else 0.0)   # fp8 mma: a copy
    ops += 2.0 if c.with_scaling else 0.0
    ops += 2.0 if c.with_zeros else 0.0
    return ops


def _mma_cost(plan, hint: MMAHint, m: int, spec) -> float:
    c, w = plan.config, plan.w
    N, K = c.N, c.K
    BM, BN, BK, WM, WN = hint.BM, hint.BN, hint.BK, hint.WM, hint.WN
    Kp = math.ceil(K / BK) * BK
    eight = cuda_mma._eight_bit(plan)       # int8 / float8 mma: 1-byte tiles, k32 steps, 2x the rate
    a_b, w_b = (1.0 if eight else 2.0), (2.0 if w.kind == "float" else _elem_bytes(w))
    out_b = 4.0 if c.out_dtype == "float32" else 2.0
    tiles_m, tiles_n = math.ceil(m / BM), math.ceil(N / BN)
    grid = tiles_m * tiles_n
    warps, threads = hint.warps, hint.threads
    inner = hint.inner_pipeline if hint.inner_pipeline is not None else w.kind == "float"
    frag = ((WM // 16) + (WN // 16)) * 4 * (2 if inner else 1)
    regs = WM * WN // 32 + frag + 40
    if regs > 255:
        return math.inf
    regs = 8 * math.ceil(regs / 8)
    smem = hint.smem_bytes(plan) + 1024
    bps = min(spec.max_blocks_per_sm, spec.max_threads_per_sm // threads, spec.smem_per_sm // smem,
              spec.regs_per_sm // (regs * threads))
    if bps < 1:
        return math.inf
    per_sm = math.ceil(grid / spec.sm_count)            # blocks on the busiest SM
    resident = min(bps, per_sm)                          # blocks sharing an SM at a time
    # cycles of one block on its SM's pipes
    mma_clk = 2.0 * BM * BN * Kp / (spec.tc_flops_per_sm_clk * (2.0 if eight else 1.0))
    ksteps = Kp // (32 if eight else 16)
    ld_bytes = ksteps * warps * ((WM // 16) + (WN // 16)) * 512
    fill_bytes = BM * Kp * a_b + BN * Kp * w_b + (BN * Kp * a_b * 2 if w.kind != "float" else 0)
    smem_clk = (ld_bytes + fill_bytes) / 128.0
    dec_clk = BN * Kp * _decode_ops(plan) / spec.alu_ops_per_sm_clk
    pipes = sorted((mma_clk, smem_clk, dec_clk))
    blk_clk = pipes[2] + 0.3 * (pipes[0] + pipes[1])
    # latency bound: ~16 independent mma per SM keep the tensor pipes busy
    mma_inflight = resident * warps * (WM // 16) * (WN // 8)
    blk_clk *= max(1.0, 16.0 / mma_inflight)
    sm_clk = per_sm * blk_clk / 1.0 + math.ceil(per_sm / bps) * ((Kp // BK) * _SYNC_CLK + _PROLOGUE_CLK)
    t_sm = sm_clk / spec.clock_hz
    # memory traffic
    scale_b = _scale_bytes_per_weight(plan)
    A_bytes, W_bytes = m * K * a_b, N * K * (w_b + scale_b)
    l2_bytes = grid * (BM * Kp * a_b + BN * Kp * (w_b + scale_b)) + m * N * out_b
    w_reads = 1 if W_bytes + min(A_bytes, BM * K * a_b * spec.sm_count) <= 0.6 * spec.l2_bytes else tiles_m
    a_reads = 1 if A_bytes <= 0.6 * spec.l2_bytes else max(1.0, tiles_n / max(1, spec.sm_count * bps // tiles_m))
    dram_bytes = A_bytes * a_reads + W_bytes * w_reads + m * N * out_b
    inflight = resident * (hint.stages - 1) * (BM * BK * a_b + BN * BK * w_b)
    need = spec.dram_bandwidth / spec.sm_count * DRAM_LATENCY_S
    mem_eff = min(1.0, inflight / need) * min(1.0, min(grid, spec.sm_count) / spec.sm_count * 2.0)
    mem_eff = max(mem_eff, 1e-3)
    t_dram = dram_bytes / spec.dram_bandwidth / mem_eff
    t_l2 = l2_bytes / spec.l2_bandwidth / mem_eff
    parts = sorted((t_sm, t_dram, t_l2))
    return parts[2] + 0.1 * (parts[0] + parts[1]) + _LAUNCH_S


def _gemv_cost(plan, hint: GEMVHint, m: int, spec) -> float:
    c, w = plan.config, plan.w
    N, K = c.N, c.K
    vb = cuda_gemv._vec_bytes(plan, hint.vec_bytes)
    if vb is None:
        return math.inf
    vals = vb * 8 // w.bits
    vectors = math.ceil(K / vals)                      # weight vectors per output channel
    R = hint.rows_per_warp
    kw = hint.k_warps
    if hint.mma:
        # tensor cores: kw warps split K over blocks of R channels; a lane streams channels g and
        # g + 8 of each 16-channel tile (2 * R / 16 vectors per unroll step, two register slots)
        if cuda_gemv.mma_gemv_unsupported(plan, hint) is not None:
            return math.inf
        tiles, tt, U = R // 16, (1 if m <= 8 else 2), hint.unroll
        warps = max(1, kw)
        loads = 2 * tiles * U
        regs = 48 + 2 * loads * vb // 4 + (tt + 2) * vals // 2 + 8 * tiles * tt
        blocks = math.ceil(N / R)
        sync_clk = 200 if warps > 1 else 0
    elif kw:
        # k-split: kw warps share a row batch's K; each lane holds its vectors of all R rows
        warps, nj = kw, math.ceil(vectors / (32 * kw))
        rows_per_block = R
        loads = R * nj
        regs = 40 + R * nj * vb // 4 + m * nj * vals // 2 + 3 * R * nj + R * m
        batches = math.ceil(N / R)
        blocks = min(batches, hint.grid or batches)
        sync_clk = 200 * math.ceil(batches / blocks)       # one barrier + smem reduction per batch
    else:
        warps, U = hint.warps, hint.unroll
        rows_per_block = R * warps
        loads = R * min(U, math.ceil(vectors / 32))
        regs = 40 + U * R * vb // 4 + R * m + R * vals // 2 + 3 * U * R
        blocks = math.ceil(N / rows_per_block)
        sync_clk = 0
    threads = 32 * warps
    if regs > 255 or threads > 1024:
        return math.inf
    regs = 8 * math.ceil(regs / 8)
    bps = min(spec.max_blocks_per_sm, spec.max_threads_per_sm // threads, spec.regs_per_sm // (regs * threads))
    if bps < 1:
        return math.inf
    per_sm = math.ceil(blocks / spec.sm_count)
    resident = min(bps, per_sm)
    inflight = resident * warps * 32 * vb * loads
    need = spec.dram_bandwidth / spec.sm_count * DRAM_LATENCY_S
    mem_eff = max(min(1.0, inflight / need), 1e-3)
    w_bytes = N * K * (_elem_bytes(w) + _scale_bytes_per_weight(plan))
    sm_bytes = w_bytes * per_sm / blocks                # bytes the busiest SM streams
    # a busy SM pulls at most ~3x its fair share of DRAM bandwidth
    t_mem = max(w_bytes / spec.dram_bandwidth, sm_bytes / (3.0 * spec.dram_bandwidth / spec.sm_count))
    t_mem /= mem_eff
    if hint.mma:
        # decode + scale per weight pair, activation fragments once per 2 * R / 16 vectors;
        # the mma themselves run on the tensor pipe
        ops = N * K * (cuda_gemv.decode_ops_per_weight(plan) + 0.2) + N * K * (1 if m <= 8 else 2) * 2.0 * 16 / R
    else:
        ops = N * K * (cuda_gemv.decode_ops_per_weight(plan) + 0.5 * m) + N * m * 10 * max(1, kw)
    t_alu = ops / (spec.alu_ops_per_sm_clk * 2 * spec.sm_count * spec.clock_hz) + sync_clk / spec.clock_hz
    return max(t_mem, t_alu) + 0.1 * min(t_mem, t_alu) + _LAUNCH_S


def _simple_cost(plan, hint: SimpleCUDAHint, m: int, spec) -> float:
    c = plan.config
    work = 2.0 * m * c.N * c.K
    occupancy = min(1.0, spec.max_threads_per_sm / hint.threads / spec.max_blocks_per_sm * 4)
    return work / (spec.sm_count * spec.clock_hz * 64 * occupancy) + _LAUNCH_S


def _cpu_cost(plan, hint: CPUHint, m: int, cores: int) -> float:
    c = plan.config
    tiles = math.ceil(c.N / hint.n_tile)
    waves = math.ceil(tiles / cores)
    par_eff = tiles / (waves * cores)
    simd_eff = min(hint.k_vec, 16) / 16.0
    cache_pen = 1.0 + max(0.0, hint.n_tile * c.K * 4 / (1 << 20) - 1.0)   # decoded tile beyond ~1 MB
    decode = c.N * c.K * 4.0
    flops = 2.0 * m * c.N * c.K
    return (flops / simd_eff + decode) * cache_pen / (par_eff * cores * 8e9)


def estimate(plan, hint, m: int, spec=None, cores: int = 1) -> float:
    """Estimated seconds of ``hint`` on ``plan`` at ``m`` rows (``spec``: DeviceSpec for CUDA plans)."""
    if isinstance(hint, CPUHint):
        return _cpu_cost(plan, hint, m, cores)
    if spec is None:
        raise ValueError("estimate: a DeviceSpec is needed for CUDA hints")
    if isinstance(hint, MMAHint):
        return _mma_cost(plan, hint, m, spec)
    if isinstance(hint, GEMVHint):
        return _gemv_cost(plan, hint, m, spec)
    if isinstance(hint, SimpleCUDAHint):
        return _simple_cost(plan, hint, m, spec)
    raise TypeError(f"estimate: unknown hint type {type(hint).__name__}")
