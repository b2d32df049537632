"""Template "mma": tensor cores through mma.sync (schedule/cuda_mma.py), fp16/bf16 x every weight
format, int8 x int, float8 x float8; sm_80+ (float8: sm_89+)."""
from __future__ import annotations

import math
import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule import cuda_mma
from ..schedule.cuda_mma import MMAHint, ir_options, mma_reason, schedule_cuda_mma
from ._common import cuda_reason, need_spec, spec_of
from .base import Candidate
from .costmodel import DRAM_LATENCY_S, LAUNCH_S, elem_bytes, scale_bytes_per_weight

_MAX_WARP_TILE = 64 * 64          # largest warp tile (accumulator registers: WM * WN / 32 floats per thread)


def mma_rows(config) -> Optional[int]:
    """Plan rows of the tensor-core kernels of a config: static for an int M > 16, else symbolic."""
    M = config.M
    return M if isinstance(M, int) and M > cuda_mma.MIN_ROWS else None


class MMA:
    name = "mma"
    kind = "cuda"
    Hint = MMAHint
    needs_tir = True
    tune_order = 1
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return cuda_reason(plan, arch, "mma", "mma.sync needs sm_80+", mma_reason)

    def default(self, plan, arch, rows=None):
        if plan.nvfp4_acts:
            return None
        return MMAHint.default(plan, arch)

    def space(self, plan, rows, arch) -> List[Candidate]:
        spec = spec_of(arch)
        m = mma_rows(plan.config)
        plan = make_plan(plan.config, "cuda", m)
        if mma_reason(plan, spec.cc if spec is not None else None) is not None:
            return []                         # fp16/bf16, int8 or (sm_89+) float8 activations only
        if arch is not None and not arch.mma:
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
                out.append(Candidate(m, hint))
        return out

    def shape_key(self, hint):
        return ("mma", hint.BM, hint.BN, hint.BK, hint.WM, hint.WN)

    def cost(self, plan, hint, rows, arch) -> float:
        return mma_cost(plan, hint, rows, need_spec(arch))

    def ir_options(self, plan, hint) -> dict:
        return ir_options(plan, hint)

    def build(self, plan, hint, arch, func=None):
        return schedule_cuda_mma(func, plan, hint, arch)


_SYNC_CLK = 60               # cycles per k step for barriers and address arithmetic
_PROLOGUE_CLK = 1500         # pipeline fill + epilogue store latency per block (not overlapped)


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
    a_b, w_b = (1.0 if eight else 2.0), (2.0 if w.kind == "float" else elem_bytes(w))
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
    scale_b = scale_bytes_per_weight(plan)
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
    return parts[2] + 0.1 * (parts[0] + parts[1]) + LAUNCH_S


TEMPLATE = MMA()
