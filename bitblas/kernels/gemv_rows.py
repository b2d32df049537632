"""Template "gemv-rows": the rows kernel of the GEMV (schedule/gemv/rows.py, :class:`GEMVRowsHint`),
1..16 rows, built per row count; with ``act_smem`` (one row) the activation row staged in shared
memory. The default GEMV kernel for one row and, without tensor cores, for 2..16."""
from __future__ import annotations

import itertools
import math
from typing import List

from ..schedule import gemv as gemv_schedule
from ..schedule.gemv import GEMVRowsHint
from ..schedule.gemv.template import NVFP4_WAVE_TILES
from ._gemv import GEMVTemplate, cost_inputs, space_plan
from .base import Candidate
from .costmodel import gemv_alu_s, gemv_stream, gemv_total


class GEMVRows(GEMVTemplate):
    name = "gemv-rows"
    Hint = GEMVRowsHint

    def space(self, plan, rows, arch) -> List[Candidate]:
        p = space_plan(plan.config, rows)
        if p is None or rows > gemv_schedule.GEMV_MAX_ROWS or (
                arch is not None and gemv_schedule.gemv_arch_unsupported(p, arch)):
            return []
        bucket, out = rows, []
        vbs = [vb for vb in (16, 8, 4) if gemv_schedule.vec_bytes(p, vb) is not None]
        for R, warps, unroll, vb in itertools.product((1, 2, 4), (2, 4, 8), (1, 2, 4, 8), vbs):
            out.append(Candidate(bucket, GEMVRowsHint(rows_per_warp=R, warps=warps, unroll=unroll, vec_bytes=vb)))
        # launch bounds of 8 blocks per SM (more registers for loads in flight), next step in flight
        for R, warps in itertools.product((2, 4, 8), (1, 2)):
            out.append(Candidate(bucket, GEMVRowsHint(rows_per_warp=R, warps=warps, unroll=4, stages=2, min_blocks=8)))
        if bucket == 1:                       # the activation row staged in shared memory, 4 blocks per SM
            for R, warps, stages in itertools.product((2, 4, 8), (4, 8), (2, 3, 4)):
                out.append(Candidate(bucket, GEMVRowsHint(rows_per_warp=R, warps=warps, unroll=1, stages=stages,
                                                          min_blocks=4, act_smem=True)))
            # 4 channels per warp under fewer blocks per SM (more registers): nvfp4 x float16 at 8192^2
            # on the H200, 12.55 -> 11.57 us (8 warps, 2 blocks per SM) and 11.58 (16 warps, 1)
            for warps, stages, mb in ((8, 3, 2), (16, 2, 1)):
                out.append(Candidate(bucket, GEMVRowsHint(rows_per_warp=4, warps=warps, unroll=1, stages=stages,
                                                          min_blocks=mb, act_smem=True)))
            # blocks that fill one wave (nvfp4 x float16's defaults where they do)
            out += [Candidate(bucket, tile) for tile in NVFP4_WAVE_TILES]
        # the kernel's own refusals (a staged row past shared memory)
        return self.with_pdl([c for c in out if gemv_schedule.gemv_hint_unsupported(p, c.hint) is None], arch)

    def shape_key(self, hint):
        return ("gemv-rows", hint.act_smem, hint.rows_per_warp, hint.warps)

    def tune_family(self, hint) -> str:
        return "gemv-staged" if hint.act_smem else "gemv"

    def cost(self, plan, hint, rows, arch) -> float:
        """Lanes walk K, ``unroll`` vectors per channel and step: the weight stream (costmodel's
        :func:`gemv_stream`) against the decode and the m-row dot products."""
        x = cost_inputs(plan, hint, arch)
        if x is None:
            return math.inf
        spec, vb, vals, vectors, N, _ = x
        m = rows
        R, warps, U = hint.rows_per_warp, hint.warps, hint.unroll
        loads = R * min(U, math.ceil(vectors / 32))
        regs = 40 + U * R * vb // 4 + R * m + R * vals // 2 + 3 * U * R
        blocks = math.ceil(N / (R * warps))
        st = gemv_stream(plan, spec, vb=vb, warps=warps, loads=loads, regs=regs, blocks=blocks, chunks=1,
                         min_blocks=hint.min_blocks)
        if st is None:
            return math.inf
        t_mem, _ = st
        K = plan.config.K
        ops = N * K * (gemv_schedule.decode_ops_per_weight(plan, hint) + 0.5 * m) + N * m * 10 * 1
        return gemv_total(t_mem, gemv_alu_s(ops, 0, spec))


TEMPLATE = GEMVRows()
