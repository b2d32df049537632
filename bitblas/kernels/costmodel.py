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
  the SM's L2 bandwidth)`` plus a fixed per-tile epilogue; see :func:`wgmma_cost` for the
  constants, fitted to an H200 tile table (the MEASURED table of testing/test_tune_wgmma.py);
* GEMV: weight bytes over DRAM bandwidth, scaled by bytes in flight per SM (warps x lanes x
  vector x unroll x rows) against latency, SM imbalance for few blocks, and ALU cycles for decode
  and the m-row dot products.

Estimates only rank candidates; the tuner measures the top-k on the device. Each template's
``cost`` (``bitblas/kernels/<family>.py``) calls its function here; ``bitblas.tune.space.estimate``
asks the hint's template.
"""
from __future__ import annotations

import math

from ..schedule import CPUGemvHint, CPUHint, GEMVHint, MMAHint, SimpleCUDAHint, WGMMAHint
from ..schedule import cuda_mma, cuda_wgmma, gemv
from ..schedule.gemv import chunk_loop

__all__ = ["mma_cost", "wgmma_cost", "gemv_cost", "simple_cost", "cpu_cost", "cpu_gemv_cost", "DRAM_LATENCY_S"]

DRAM_LATENCY_S = 1.0e-6      # loaded DRAM latency the in-flight bytes must cover
L1_WAVEFRONTS_PER_CLK = 1.0  # L1 load wavefronts per SM and clock (one 128-byte line of one load each)
_LAUNCH_S = 2.0e-6
_SYNC_CLK = 60               # cycles per k step for barriers and address arithmetic
_PROLOGUE_CLK = 1500         # pipeline fill + epilogue store latency per block (not overlapped)

# wgmma (fitted to H200 runs of the wgmma GEMM; the DeviceSpec's tc_flops_per_sm_clk
# is the mma.sync rate, so the wgmma rate is a constant here, scaled by SM count and clock):
# dense fp16/bf16 ~650 TFLOP/s (cuBLAS 646 at 4096^3) over 132 SMs at the 1.98 GHz the driver
# reports; 8-bit inputs (k32 instructions) twice that (~1300; measured 1110 for int8 and fp8).
_WG_FLOPS_PER_SM_CLK = 650e12 / (132 * 1.98e9)
_WG_ONE_CONSUMER = 0.75      # one consumer warpgroup: tensor-core rate vs two (64 x 128 vs 128 x 128 tiles)
_WG_TILE_S = 3.0e-6          # per tile: accumulator epilogue (scales, bias, stores) + ring drain / refill
_WG_FILL_S = 1.0e-6          # of which a persistent CTA hides this much on each tile after its first


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
    ops = 4.0 + (4.0 if w.kind == "table" and not cuda_mma.is_fp8(plan) else 0.0)   # fp8 mma: a copy
    ops += 2.0 if c.with_scaling else 0.0
    ops += 2.0 if c.with_zeros else 0.0
    return ops


def mma_cost(plan, hint: MMAHint, m: int, spec) -> float:
    c, w = plan.config, plan.w
    N, K = c.N, c.K
    BM, BN, BK, WM, WN = hint.BM, hint.BN, hint.BK, hint.WM, hint.WN
    Kp = math.ceil(K / BK) * BK
    eight = cuda_mma.is_eight_bit(plan)       # int8 / float8 mma: 1-byte tiles, k32 steps, 2x the rate
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
    tiles_m, tiles_n = math.ceil(m / BM), math.ceil(N / BN)
    tiles = tiles_m * tiles_n
    per_sm = math.ceil(tiles / spec.sm_count)            # tiles on the busiest SM
    rate = _WG_FLOPS_PER_SM_CLK * spec.clock_hz * (2.0 if eb == 1.0 else 1.0)
    rate *= 1.0 if hint.consumers == 2 else _WG_ONE_CONSUMER
    Kp = math.ceil(K * eb / cuda_wgmma.ROW_BYTES) * cuda_wgmma.ROW_BYTES / eb
    t_tc = 2.0 * BM * BN * Kp / rate
    sm_bw = spec.l2_bandwidth / spec.sm_count
    stage_bytes = (BM + BN) * cuda_wgmma.ROW_BYTES
    ahead = max(1, hint.stages - 2) * stage_bytes
    t_mem = (BM + BN) * Kp * eb / sm_bw / min(1.0, ahead / (sm_bw * DRAM_LATENCY_S))
    t_tile = t_tc + t_mem if hint.stages < 3 else max(t_tc, t_mem)
    t = per_sm * (t_tile + _WG_TILE_S)
    if hint.persistent:
        t -= (per_sm - 1) * _WG_FILL_S
    a_bytes, w_bytes = m * K * eb, N * K * eb
    w_reads = 1 if w_bytes + a_bytes <= 0.6 * spec.l2_bytes else math.ceil(tiles_m / hint.group_m)
    t_dram = (a_bytes + w_bytes * w_reads + m * N * out_b) / spec.dram_bandwidth
    return max(t, t_dram) + _LAUNCH_S


def gemv_cost(plan, hint: GEMVHint, m: int, spec) -> float:
    c, w = plan.config, plan.w
    N, K = c.N, c.K
    vb = gemv.vec_bytes(plan, hint.vec_bytes)
    if vb is None or gemv.gemv_hint_unsupported(plan, hint) is not None:
        return math.inf
    if hint.wgmma:
        return _wgmma_gemv_cost(plan, hint, m, spec)
    vals = vb * 8 // w.bits
    vectors = math.ceil(K / vals)                      # weight vectors per output channel
    R = hint.rows_per_warp
    kw = hint.k_warps
    chunks = 1                                         # blocks that stream the same weights
    if hint.mma:
        # tensor cores: kw warps split K over blocks of R channels; a lane streams channels g and
        # g + 8 of each 16-channel tile (2 * R / 16 vectors per unroll step, two register slots)
        # (17..64 rows: one block per 16-row chunk and channel tile; the chunks' weight re-reads hit L2)
        tiles, U = R // 16, hint.unroll
        warps = max(1, kw)
        loads = 2 * tiles * U
        slots = 2 if hint.stages >= 2 else 1          # register slots of weights (the next step in flight)
        w_regs = slots * loads * vb // 4
        if chunk_loop(hint, m):
            # the chunk loop: one block streams and decodes its weights once for all 2 * chunks token
            # tiles (decoded words of every tile held, one accumulator chain each; H200: 32 channels
            # x 4 K warps take 255 registers without spills)
            tt, chunks = 2 * -(-m // 16), 1
            regs = 40 + w_regs + 2 * tiles * vals // 2 + 3 * vals // 2 + 4 * tiles * tt
        else:
            tt, chunks = (1 if m <= 8 else 2), -(-m // 16)
            regs = 48 + w_regs + (tt + 2) * vals // 2 + 8 * tiles * tt
        blocks = math.ceil(N / R) * chunks
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
    if hint.min_blocks:
        # launch bounds: ptxas fits the registers of min_blocks blocks per SM and at most 255 per
        # thread (fewer loads held at once beyond that; spills not modelled)
        cap = min(255, spec.regs_per_sm // (hint.min_blocks * threads))
        if regs > cap:
            loads = max(1, loads * cap // regs)
            regs = cap
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
    sm_bytes = w_bytes * chunks * per_sm / blocks       # bytes the busiest SM streams
    # a busy SM pulls at most ~3x its fair share of DRAM bandwidth
    t_mem = max(w_bytes / spec.dram_bandwidth, sm_bytes / (3.0 * spec.dram_bandwidth / spec.sm_count))
    t_mem /= mem_eff
    if hint.mma:
        # decode + scale per weight pair (once per block that streams the weights), activation
        # fragments once per 2 * R / 16 vectors and token tile; the mma run on the tensor pipe
        ops = chunks * (N * K * (gemv.decode_ops_per_weight(plan) + 0.2) + N * K * tt * 2.0 * 16 / R)
    else:
        ops = N * K * (gemv.decode_ops_per_weight(plan) + 0.5 * m) + N * m * 10 * max(1, kw)
    t_alu = ops / (spec.alu_ops_per_sm_clk * 2 * spec.sm_count * spec.clock_hz) + sync_clk / spec.clock_hz
    if hint.mma:
        # L1 stays busy with 8+ warps of loads per SM; fewer leave it waiting on latency (measured on
        # the H200: 4 warps of 64 channels per SM lost clearly to 8 warps of 32)
        t_l1 = _mma_l1_wavefronts(plan, hint, vb, vals, vectors, chunks, tt) / (
            L1_WAVEFRONTS_PER_CLK * spec.sm_count * spec.clock_hz)
        t_alu = max(t_alu, t_l1 * max(1.0, 8 / (resident * warps)))
    return max(t_mem, t_alu) + 0.1 * min(t_mem, t_alu) + _LAUNCH_S


def _wgmma_gemv_cost(plan, hint: GEMVHint, m: int, spec) -> float:
    """The wgmma GEMV (gemv/wgmma.py): bound by its count of m64nNk16 instructions, N x K / (64 x 16)
    whatever the rows, each taking ~44 + 0.83 N cycles of an SM's tensor cores with the A operand
    in registers (fitted to H200 runs of W4A16 at K=8192: ~64 cycles at N=24, ~97 at N=64), over
    the warpgroups an SM holds; at least a lone warpgroup's chain of slabs (decode, wgmma, wait:
    ~1100 cycles per slab and 64-channel tile); or the weight bytes at the DRAM rate if that is
    longer; plus the permute kernel. Register-bound occupancy beyond one wave counts whole waves."""
    from ..schedule.gemv import slab_codes, wgmma_rows
    c, w = plan.config, plan.w
    R, KW = hint.rows_per_warp // 16, max(1, hint.k_warps)
    NT = wgmma_rows(m)
    blocks = math.ceil(c.N / (64 * R))
    # nvcc: 105 registers at R=1, N=24, 4 slots; 191 at R=2, N=64, 2 slots
    regs = 8 * math.ceil((40 + hint.stages * R * 8 + R * 24 + R * NT // 2) / 8)
    bps = min(spec.max_blocks_per_sm, spec.max_threads_per_sm // (128 * KW), spec.regs_per_sm // (regs * 128 * KW))
    if bps < 1:
        return math.inf
    per_sm = blocks / spec.sm_count                   # blocks an SM runs (all of them when they fit at once)
    if per_sm > bps:
        per_sm = math.ceil(per_sm / bps) * bps
    slabs = c.K // slab_codes(w.bits) // KW           # per warpgroup
    inst = per_sm * KW * slabs * (slab_codes(w.bits) // 16) * R     # m64nNk16 per tile and slab
    t_tensor = inst * (44 + 0.83 * NT) / spec.clock_hz
    t_chain = math.ceil(per_sm / bps) * slabs * 1100 * R / spec.clock_hz
    w_bytes = c.N * c.K * (_elem_bytes(w) + _scale_bytes_per_weight(plan))
    return max(t_tensor, t_chain, w_bytes / spec.dram_bandwidth) + 1.2e-6 + _LAUNCH_S


def _mma_l1_wavefronts(plan, hint, vb, vals, vectors, chunks, tt) -> float:
    """L1 load wavefronts of the tensor-core GEMV (one per 128-byte line a load touches; what bounds
    the chunk loop: ncu, W4A16 64x8192^2, 94% of peak). Per warp and lane vector: the activations
    of each token tile (8 rows; the four lanes of a row read 4 x ``span`` contiguous bytes, 16 per
    lane and load), the weights of 2 x tiles channel rows of 8 (4 x ``vb`` bytes each) and their
    group scales / zeros (one line per channel)."""
    span = vals * (2 if plan.float_acts else 1)          # activation bytes of one lane vector
    lines = max(1, 4 * span // 128)
    rows = 2 * (hint.rows_per_warp // 16)                # weight loads (channels g, g + 8 per tile)
    per = tt * (span // 16) * 8 * lines + rows * 8 * max(1, 4 * vb // 128)
    if plan.groups > 1:
        per += rows * 8 * (int(plan.config.with_scaling) + int(plan.config.with_zeros))
    return math.ceil(plan.config.N / hint.rows_per_warp) * chunks * math.ceil(vectors / 4) * per


def simple_cost(plan, hint: SimpleCUDAHint, m: int, spec) -> float:
    c = plan.config
    work = 2.0 * m * c.N * c.K
    occupancy = min(1.0, spec.max_threads_per_sm / hint.threads / spec.max_blocks_per_sm * 4)
    return work / (spec.sm_count * spec.clock_hz * 64 * occupancy) + _LAUNCH_S


def cpu_cost(plan, hint: CPUHint, m: int, cores: int) -> float:
    c = plan.config
    tiles = math.ceil(c.N / hint.n_tile)
    waves = math.ceil(tiles / cores)
    par_eff = tiles / (waves * cores)
    simd_eff = min(hint.k_vec, 16) / 16.0
    cache_pen = 1.0 + max(0.0, hint.n_tile * c.K * 4 / (1 << 20) - 1.0)   # decoded tile beyond ~1 MB
    decode = c.N * c.K * 4.0
    flops = 2.0 * m * c.N * c.K
    return (flops / simd_eff + decode) * cache_pen / (par_eff * cores * 8e9)


def cpu_gemv_cost(plan, hint: CPUGemvHint, m: int, cores: int) -> float:
    """schedule/cpu_gemv.py: per step (``lanes`` weight bytes of a channel) a micro-kernel of nc
    channels x R rows decodes nc x cpb vectors (~3 SIMD ops each: shift/mask, widen, convert) and
    issues nc x cpb x R FMAs and cpb x R activation loads; ~2 SIMD ops, 1 FMA and 2 loads per
    cycle at ~3 GHz. Rows run in blocks of ``rows`` and one at a time for the rest. Thread tasks
    of ``block`` channels in whole waves over the cores; the packed weights stream once per row
    block at ~12 GB/s per core with the software prefetch, ~6 without (measured, W4A16 4096^2)."""
    from ..schedule.cpu_gemv import step_lanes, vector_lanes
    c = plan.config
    cpb = plan.w.codes_per_byte
    L = step_lanes(plan, min(hint.lanes, vector_lanes()) if hint.lanes else vector_lanes()) or 4
    steps = c.K / (L * cpb)

    def pass_cycles(nc, R):
        ops = nc * cpb * 3 + nc * cpb * R + cpb * R
        cyc = max(ops / 2.0, nc * cpb * R / 1.0, (nc + cpb * R) / 2.0)
        return steps * cyc * (c.N / nc)

    R = max(1, hint.rows)
    full, rest = (m // R, m % R) if R > 1 else (0, m)
    cycles = full * pass_cycles(hint.row_channels, R) + rest * pass_cycles(hint.channels, 1)
    tasks = c.N // hint.block
    waves = math.ceil(tasks / cores)
    par_eff = tasks / (waves * cores)
    wbytes = c.N * c.K / cpb * (full + (1 if rest else 0))
    bw = 12e9 if hint.prefetch else 6e9
    return max(cycles / 3e9, wbytes / bw) / (par_eff * cores) + 5e-6 * waves
