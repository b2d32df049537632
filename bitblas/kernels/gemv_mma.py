"""Template "gemv-mma": the mma GEMV (schedule/gemv/mma.py for float activations, m16n8k16;
mma_int8.py for int8 ones, m16n8k32; :class:`GEMVMmaHint`), sm_80+, 1..64 rows in classes of
rows (one kernel per class, its row count given at run time); 17..64 rows in chunks of 16, with
``chunk_loop`` one block serving every chunk of its channel tile."""
from __future__ import annotations

import itertools
import math
from typing import List

from ..schedule import gemv as gemv_schedule
from ..schedule.gemv import GEMVMmaHint, chunk_loop
from ._gemv import GEMVTemplate, cost_inputs, space_plan
from .base import Candidate
from .costmodel import L1_WAVEFRONTS_PER_CLK, gemv_alu_s, gemv_stream, gemv_total


class GEMVMma(GEMVTemplate):
    name = "gemv-mma"
    Hint = GEMVMmaHint

    def space(self, plan, rows, arch) -> List[Candidate]:
        """16-channel mma tiles, k_warps warps splitting K, the ones the plan's format or group size
        refuses left out; each with the next step in flight or not, and under launch bounds of 2
        blocks per SM or none (the default tiles are such variants: gemv/template.py's
        float_mma_tile / int8_mma_tile / chunk_tile). 17..64 rows also the chunk loop."""
        p = space_plan(plan.config, rows)
        if p is None or (arch is not None and not arch.mma) or self.reason(p, arch) is not None:
            return []
        bucket, out = rows, []
        for R, kw, unroll, stages, mb in itertools.product((16, 32, 64), (1, 2, 4, 8), (2, 4), (2, 1), (0, 2)):
            hint = GEMVMmaHint(rows_per_warp=R, k_warps=kw, unroll=unroll, stages=stages, min_blocks=mb)
            if gemv_schedule.gemv_hint_unsupported(p, hint) is None:
                out.append(Candidate(bucket, hint))
        if bucket > gemv_schedule.GEMV_MAX_ROWS:      # the chunk loop: weights decoded once for every 16-row chunk
            # float activations also with vectors whose activations span 32 bytes (chunk_tile), as
            # many of them per step as of the default vectors
            span = gemv_schedule.span_vectors(p)
            vbs = [(0, 1)] + ([span] if span else [])
            for R, kw, unroll, stages, (vb, f) in itertools.product((16, 32, 64), (2, 4), (1, 2), (1, 2), vbs):
                hint = GEMVMmaHint(rows_per_warp=R, k_warps=kw, unroll=unroll * f, stages=stages, vec_bytes=vb,
                                   min_blocks=1, chunk_loop=True)
                if gemv_schedule.gemv_hint_unsupported(p, hint) is None:
                    out.append(Candidate(bucket, hint))
        return self.with_pdl(out, arch)

    def tune_rank(self, hint) -> int:
        """Where a candidate stands among those of equal tune_order (cost ties keep the order):
        the chunk loop after the wgmma GEMV's candidates (the order of the tuner's lists since the
        GEMV kernels had one template)."""
        return 1 if hint.chunk_loop else 0

    def kernel_rows(self, config, rows: int, hint) -> int:
        """The top of the class of ``rows`` (``gemv.row_class``: 8, 16, 32, 48, 64) where the
        kernel builds for it: one kernel serves every row count of its class."""
        return self.class_rows(config, rows, hint, gemv_schedule.row_class(rows))

    def shape_key(self, hint):
        return ("gemv-mma", hint.rows_per_warp, hint.k_warps)

    def cost(self, plan, hint, rows, arch) -> float:
        """kw warps split K over blocks of R channels; a lane streams channels g and g + 8 of each
        16-channel tile (2 * R / 16 vectors per unroll step, two register slots); 17..64 rows: one
        block per 16-row chunk and channel tile (the chunks' weight re-reads hit L2), or with the
        chunk loop one block streams and decodes its weights once for all 2 * chunks token tiles
        (decoded words of every tile held, one accumulator chain each; H200: 32 channels x 4 K
        warps take 255 registers without spills). Decode and scale per weight pair, activation
        fragments once per 2 * R / 16 vectors and token tile (the mma on the tensor pipe); L1's
        load wavefronts, which keep L1 busy with 8+ warps of loads per SM (measured on the H200:
        4 warps of 64 channels per SM lost clearly to 8 warps of 32)."""
        x = cost_inputs(plan, hint, arch)
        if x is None:
            return math.inf
        spec, vb, vals, vectors, N, K = x
        m, R, kw = rows, hint.rows_per_warp, hint.k_warps
        tiles, U = R // 16, hint.unroll
        warps = max(1, kw)
        loads = 2 * tiles * U
        slots = 2 if hint.stages >= 2 else 1          # register slots of weights (the next step in flight)
        w_regs = slots * loads * vb // 4
        if chunk_loop(hint, m):
            tt, chunks = 2 * -(-m // 16), 1
            regs = 40 + w_regs + 2 * tiles * vals // 2 + 3 * vals // 2 + 4 * tiles * tt
        else:
            tt, chunks = (1 if m <= 8 else 2), -(-m // 16)
            regs = 48 + w_regs + (tt + 2) * vals // 2 + 8 * tiles * tt
        blocks = math.ceil(N / R) * chunks
        sync_clk = 200 if warps > 1 else 0
        st = gemv_stream(plan, spec, vb=vb, warps=warps, loads=loads, regs=regs, blocks=blocks, chunks=chunks,
                         min_blocks=hint.min_blocks)
        if st is None:
            return math.inf
        t_mem, resident = st
        ops = chunks * (N * K * (gemv_schedule.decode_ops_per_weight(plan) + 0.2) + N * K * tt * 2.0 * 16 / R)
        t_alu = gemv_alu_s(ops, sync_clk, spec)
        t_l1 = _l1_wavefronts(plan, hint, vb, vals, vectors, chunks, tt) / (
            L1_WAVEFRONTS_PER_CLK * spec.sm_count * spec.clock_hz)
        t_alu = max(t_alu, t_l1 * max(1.0, 8 / (resident * warps)))
        return gemv_total(t_mem, t_alu)


def _l1_wavefronts(plan, hint, vb, vals, vectors, chunks, tt) -> float:
    """L1 load wavefronts of the mma GEMV (one per 128-byte line a load touches; what bounds the
    chunk loop: ncu, W4A16 64x8192^2, 94% of peak). Per warp and lane vector: the activations of
    each token tile (8 rows; the four lanes of a row read 4 x ``span`` contiguous bytes, 16 per
    lane and load), the weights of 2 x tiles channel rows of 8 (4 x ``vb`` bytes each) and their
    group scales / zeros (one line per channel)."""
    span = vals * (2 if plan.float_acts else 1)          # activation bytes of one lane vector
    lines = max(1, 4 * span // 128)
    rows = 2 * (hint.rows_per_warp // 16)                # weight loads (channels g, g + 8 per tile)
    per = tt * (span // 16) * 8 * lines + rows * 8 * max(1, 4 * vb // 128)
    if plan.groups > 1:
        per += rows * 8 * (int(plan.config.with_scaling) + int(plan.config.with_zeros))
    return math.ceil(plan.config.N / hint.rows_per_warp) * chunks * math.ceil(vectors / 4) * per


TEMPLATE = GEMVMma()
