"""Template "gemv-ksplit": the k-split kernel of the GEMV (schedule/gemv/ksplit.py,
:class:`GEMVKSplitHint`), float activations, 1..16 rows: warps split K, the activations held in
registers, a persistent grid. Never a default; the tuner's."""
from __future__ import annotations

import itertools
import math
from typing import List

from ..schedule import gemv as gemv_schedule
from ..schedule.gemv import GEMVKSplitHint
from ._common import spec_of
from ._gemv import GEMVTemplate, cost_inputs, space_plan
from .base import Candidate
from .costmodel import gemv_alu_s, gemv_stream, gemv_total


class GEMVKSplit(GEMVTemplate):
    name = "gemv-ksplit"
    Hint = GEMVKSplitHint

    def default(self, plan, arch, rows=None):
        return None               # no default GEMV kernel is the k-split one (a tuner candidate only)

    def space(self, plan, rows, arch) -> List[Candidate]:
        p = space_plan(plan.config, rows)
        if p is None or rows > gemv_schedule.GEMV_MAX_ROWS or not p.float_acts:
            return []
        spec, bucket, out = spec_of(arch), rows, []
        vbs = [vb for vb in (16, 8, 4) if gemv_schedule.vec_bytes(p, vb) is not None]
        sms = spec.sm_count if spec is not None else 108      # persistent grid of a few blocks per SM
        for R, kw, per_sm, vb in itertools.product((1, 2, 4, 8), (2, 4, 8), (2, 4, 8), vbs):
            if R * bucket > 32 * kw:
                continue
            out.append(Candidate(bucket, GEMVKSplitHint(rows_per_warp=R, k_warps=kw, grid=per_sm * sms, vec_bytes=vb)))
        return self.with_pdl(out, arch)

    def shape_key(self, hint):
        return ("gemv-ksplit", hint.rows_per_warp, hint.k_warps)

    def cost(self, plan, hint, rows, arch) -> float:
        """``k_warps`` warps share a channel batch's K; each lane holds its vectors of all
        ``rows_per_warp`` channels; one barrier and shared-memory reduction per batch."""
        x = cost_inputs(plan, hint, arch)
        if x is None:
            return math.inf
        spec, vb, vals, vectors, N, K = x
        m, R, kw = rows, hint.rows_per_warp, hint.k_warps
        warps, nj = kw, math.ceil(vectors / (32 * kw))
        loads = R * nj
        regs = 40 + R * nj * vb // 4 + m * nj * vals // 2 + 3 * R * nj + R * m
        batches = math.ceil(N / R)
        blocks = min(batches, hint.grid or batches)
        sync_clk = 200 * math.ceil(batches / blocks)
        st = gemv_stream(plan, spec, vb=vb, warps=warps, loads=loads, regs=regs, blocks=blocks, chunks=1,
                         min_blocks=hint.min_blocks)
        if st is None:
            return math.inf
        t_mem, _ = st
        ops = N * K * (gemv_schedule.decode_ops_per_weight(plan) + 0.5 * m) + N * m * 10 * max(1, kw)
        return gemv_total(t_mem, gemv_alu_s(ops, sync_clk, spec))


TEMPLATE = GEMVKSplit()
