"""Template "gemv-wgmma": the wgmma GEMV (schedule/gemv/wgmma.py, :class:`GEMVWgmmaHint`), sm_90a,
float activations x int/uint 2-, 4- and 8-bit codes, nf4, fp4_e2m1, nvfp4 and float8 weights, 9..64 rows
in classes of 8 rows (one kernel per class, its row count given at run time)."""
from __future__ import annotations

import itertools
import math
from typing import List

from ..schedule import gemv as gemv_schedule
from ..schedule.gemv import GEMVWgmmaHint, slab_codes, wgmma_rows
from ._gemv import GEMVTemplate, cost_inputs, space_plan
from .base import Candidate
from .costmodel import (LAUNCH_S, WGMMA_RS_FIXED_CLK, WGMMA_RS_PER_COL_CLK, WGMMA_SLAB_CHAIN_CLK, elem_bytes,
                        scale_bytes_per_weight)


class GEMVWgmma(GEMVTemplate):
    name = "gemv-wgmma"
    Hint = GEMVWgmmaHint

    def space(self, plan, rows, arch) -> List[Candidate]:
        """64 or 128 channels per warpgroup, 1 / 2 / 4 warpgroups splitting K, 2 or 4 slots."""
        if rows < gemv_schedule.WGMMA_GEMV_MIN_ROWS or arch is None or not (arch.mma and arch.wgmma):
            return []
        p = space_plan(plan.config, rows)
        if p is None:
            return []
        out = []
        for R, kw, stages in itertools.product((16, 32), (1, 2, 4), (2, 4)):
            hint = GEMVWgmmaHint(rows_per_warp=R, k_warps=kw, stages=stages)
            if gemv_schedule.gemv_hint_unsupported(p, hint) is None:
                out.append(Candidate(rows, hint))
        return self.with_pdl(out, arch)

    def kernel_rows(self, config, rows: int, hint) -> int:
        """The top of the class of ``rows`` (``gemv.wgmma_rows``: the B operand is 8 rows wide per
        step, so classes of 8 rows; a kernel built for more rows runs every step at its full width,
        so a wider class costs the smaller row counts in it) where the kernel builds for it."""
        return self.class_rows(config, rows, hint, wgmma_rows(rows))

    def shape_key(self, hint):
        return ("gemv-wgmma", hint.rows_per_warp, hint.k_warps)

    def tune_family(self, hint) -> str:
        return "gemv-wgmma"

    def cost(self, plan, hint, rows, arch) -> float:
        """Bound by its count of m64nNk16 instructions, N x K / (64 x 16) whatever the rows, each
        taking ~44 + 0.83 N cycles of an SM's tensor cores with the A operand in registers (fitted
        to H200 runs of W4A16 at K=8192: ~64 cycles at N=24, ~97 at N=64), over the warpgroups an
        SM holds; at least a lone warpgroup's chain of slabs (decode, wgmma, wait: ~1100 cycles per
        slab and 64-channel tile); or the weight bytes at the DRAM rate if that is longer; plus the
        permute kernel. Register-bound occupancy beyond one wave counts whole waves."""
        x = cost_inputs(plan, hint, arch)
        if x is None:
            return math.inf
        spec, m = x.spec, rows
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
        t_tensor = inst * (WGMMA_RS_FIXED_CLK + WGMMA_RS_PER_COL_CLK * NT) / spec.clock_hz
        t_chain = math.ceil(per_sm / bps) * slabs * WGMMA_SLAB_CHAIN_CLK * R / spec.clock_hz
        w_bytes = c.N * c.K * (elem_bytes(w) + scale_bytes_per_weight(plan))
        return max(t_tensor, t_chain, w_bytes / spec.dram_bandwidth) + 1.2e-6 + LAUNCH_S


TEMPLATE = GEMVWgmma()
