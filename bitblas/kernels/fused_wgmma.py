"""Template "fused-wgmma": the fused mixed-input wgmma GEMM (schedule/fused_wgmma.py, hand-written
TIRx, no TensorIR) for rows past the GEMV on sm_90a. Never a plan's default hint: the selector
takes it (``for_rows``) where decode-then-GEMM would otherwise serve. The tuner searches its tiles
for the buckets past the GEMV (``space``), against the untuned choice of those rows (bitblas.tune)."""
from __future__ import annotations

import math
from typing import List, Optional

from ..plan import make_plan
from ..schedule.fused_wgmma import (FusedWgmmaHint, box_bytes, fused_default, fused_space, fused_wgmma_unsupported,
                                    register_words, ring_slots, schedule_fused_wgmma, tile_count, w_smem_words)
from ..schedule.gemv import GEMV_MMA_MAX_ROWS, slab_codes
from ._common import cuda_reason, need_spec
from .base import Candidate
from .costmodel import (LAUNCH_S, WGMMA_RS_FIXED_CLK, WGMMA_RS_PER_COL_CLK, WGMMA_SLAB_CHAIN_CLK, elem_bytes,
                        scale_bytes_per_weight)
from .mma import mma_rows

FUSED_MIN_ROWS = GEMV_MMA_MAX_ROWS + 1      # the tuner's space starts past the GEMV's rows


class FusedWgmma:
    name = "fused-wgmma"
    kind = "cuda"
    Hint = FusedWgmmaHint
    needs_tir = False
    tune_order = 5
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return cuda_reason(plan, arch, "wgmma", "wgmma needs sm_90", _unsupported)

    def default(self, plan, arch, rows=None):
        return None                   # never a plan's default (see for_rows)

    def for_rows(self, plan, rows: int, arch=None) -> Optional[FusedWgmmaHint]:
        """Its tile for ``rows`` rows of ``plan`` on ``arch`` (its SM count), which decode-then-GEMM
        would serve (the selector checks that), or None where decode-then-GEMM stays the default."""
        return fused_default(plan, rows, None if arch is None else arch.sm_count)

    def space(self, plan, rows, arch) -> List[Candidate]:
        """Every tile that takes the plan (``schedule.fused_wgmma.fused_space``), symbolic in M, for
        buckets past the GEMV (``FUSED_MIN_ROWS``) on an sm_90 arch with device facts."""
        if rows < FUSED_MIN_ROWS or arch is None or arch.spec is None or self.reason(plan, arch) is not None:
            return []
        m = mma_rows(plan.config)          # static for an int M (as the selector builds it), else symbolic
        return [Candidate(m, h) for h in fused_space(make_plan(plan.config, "cuda", m))]

    def tuned_rows(self, config, kind, rows: int, bucket: int, hint):
        """(whether a bucket's tuned ``hint`` serves ``rows``, the rows of its kernel): the rows of its
        range past the GEMV's (fewer stay with the untuned GEMV; the last bucket's range has every
        row count above it too); a static-rows kernel only its own."""
        m = mma_rows(config)
        return (rows >= FUSED_MIN_ROWS and (m is None or m == rows)), m

    def shape_key(self, hint):
        return ("fused-wgmma", hint.row_tile, hint.channel_tiles, hint.warpgroups, hint.split_k) + \
            ((("k_ctas", hint.k_ctas),) if hint.k_ctas > 1 else ())

    def tune_family(self, hint) -> str:
        return "fused-wgmma"

    def cost(self, plan, hint, rows, arch) -> float:
        return fused_cost(plan, hint, rows, need_spec(arch))

    def build(self, plan, hint, arch, func=None):
        return schedule_fused_wgmma(None, plan, hint, arch)


_TILE_S = 1.0e-6          # per tile: the accumulator epilogue (scales, bias, stores) and the ring's fill
# what the model above does not see, from H100 sweeps at 8192^2 and Llama shapes (the defaults'
# choices, fused_default): decoding slab s + 1 during slab s's wgmma is faster for 4- and 2-bit codes,
# and 4 weight slots beat 2 by 5-10% on split-K tiles; one slot leaves each slab's loads exposed;
# split-K tiles without overlap with their weights staged in shared memory (w_smem): 1.04-1.54x as fast
# as with them in registers (H200, 8192^2, 80..256 rows, schedule.fused_wgmma._staged)
_NO_OVERLAP, _ONE_SLOT, _FEW_SLOTS_SPLIT, _W_SMEM_SPLIT = 1.05, 1.05, 1.05, 0.9


def fused_cost(plan, hint: FusedWgmmaHint, rows: int, spec) -> float:
    """Estimated seconds of the fused GEMM with ``hint`` at ``rows`` rows, to rank the tuner's
    candidates (the tuner measures the top ones):

    * occupancy: blocks per SM from threads, registers (``register_words`` plus ~40 of addresses
      and indices) and the rings' shared memory; whole waves of blocks;
    * tensor: per SM, the wgmma its blocks issue (``K / 16`` per 64-channel tile and row tile; int8
      activations ``K / 32`` of k32, at the same rate) at
      ``44 + 0.83 * row_tile`` cycles each (the wgmma GEMV's fit, costmodel.py), shared by the
      warpgroups on the SM;
    * a lone warpgroup per SM without ``overlap`` waits for its wgmma before decoding the next
      slab: ``WGMMA_SLAB_CHAIN_CLK`` per slab and tile instead, if longer;
    * memory: the weights once and the activations three times (the permute pass reads and writes
      them, the kernel reads them; once with ``permute=False``) at the DRAM rate;
    plus the per-tile epilogue and two launches (one with ``permute=False``). The knobs the model
    does not see (``overlap``, weight slots, ``w_smem``) scale the tensor time by the factors
    above, so that of two tiles of one shape the tuner's top-k keeps the variants the H100 and H200
    sweeps favoured."""
    c, w = plan.config, plan.w
    if fused_wgmma_unsupported(make_plan(c, "cuda", None), hint) is not None:
        return math.inf
    RT, R = hint.row_tile, hint.channel_tiles
    KW = hint.warpgroups if hint.split_k else 1
    threads = 128 * hint.warpgroups
    regs = 8 * math.ceil((register_words(plan, hint) + 40) / 8)
    smem = KW * ring_slots(plan, hint) * box_bytes(hint) + 4 * w_smem_words(hint)
    bps = min(spec.max_blocks_per_sm, spec.max_threads_per_sm // threads, spec.regs_per_sm // (min(255, regs) * threads),
              spec.smem_per_sm // max(1, smem))
    if bps < 1:
        return math.inf
    KC = hint.k_ctas                                   # CTAs of a cluster splitting K
    blocks = tile_count(plan, hint, rows) * KC
    per_sm = math.ceil(blocks / (spec.sm_count * bps)) * bps if blocks > spec.sm_count * bps else \
        math.ceil(blocks / spec.sm_count)
    waves = math.ceil(per_sm / bps)
    ab = elem_bytes(plan.a)
    inst = per_sm * hint.warpgroups * R * (c.K // KW // KC // int(32 // ab))   # m64nRTk16 (int8: k32) per SM
    t_tensor = inst * (WGMMA_RS_FIXED_CLK + WGMMA_RS_PER_COL_CLK * RT) / spec.clock_hz
    lone = min(per_sm, bps) * hint.warpgroups == 1 and not hint.overlap
    slabs = c.K // KW // KC // slab_codes(w.bits)
    t_chain = waves * slabs * WGMMA_SLAB_CHAIN_CLK * R / spec.clock_hz if lone else 0.0
    a_bytes = rows * c.K * ab
    w_bytes = c.N * c.K * (elem_bytes(w) + scale_bytes_per_weight(plan))
    t_dram = (w_bytes + (3 if hint.permute else 1) * a_bytes + rows * c.N * 2) / spec.dram_bandwidth
    knobs = ((_NO_OVERLAP if w.bits < 8 and not hint.overlap else 1.0) * (_ONE_SLOT if hint.stages == 1 else 1.0)
             * (_FEW_SLOTS_SPLIT if hint.split_k and hint.stages < 4 else 1.0)
             * (_W_SMEM_SPLIT if hint.w_smem and hint.split_k else 1.0))
    return max(t_tensor * knobs, t_chain, t_dram) + per_sm * _TILE_S + (2 if hint.permute else 1) * LAUNCH_S


def _unsupported(plan, arch) -> Optional[str]:
    """Why the fused GEMM's default tile cannot take ``plan`` (the arch is checked before)."""
    return fused_wgmma_unsupported(plan, FusedWgmmaHint.default(plan))


TEMPLATE = FusedWgmma()
