"""Template "cpu-gemv": the CPU default for float activations x [N, K] weights (schedule/cpu_gemv.py,
hand-written TIRx: decode in SIMD registers)."""
from __future__ import annotations

import math
import itertools
from typing import List, Optional

from ..plan import make_plan
from ..schedule.cpu_gemv import CPUGemvHint, cpu_gemv_unsupported, schedule_cpu_gemv
from ._common import not_nvfp4
from .base import Candidate


class CPUGemv:
    name = "cpu-gemv"
    kind = "cpu"
    Hint = CPUGemvHint
    needs_tir = False
    tune_order = 0
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return not_nvfp4(plan, "cpu") or cpu_gemv_unsupported(plan, None)

    def default(self, plan, arch, rows=None):
        if self.reason(plan, arch) is not None:
            return None
        return CPUGemvHint.default(plan, None if arch is None else arch.target)

    def space(self, plan, rows, arch) -> List[Candidate]:
        config = plan.config
        m = config.M if isinstance(config.M, int) else None
        plan = make_plan(config, "cpu", m)
        if cpu_gemv_unsupported(plan) is not None:
            return []
        out = []
        for block, ch, (r, rc), unroll, pf in itertools.product((8, 16, 32), (2, 4, 8),
                                                               ((4, 2), (2, 4), (6, 2), (8, 1)), (1, 4), (0, 16384)):
            hint = CPUGemvHint(block=block, channels=ch, rows=r, row_channels=rc, unroll=unroll, prefetch=pf)
            if hint.check(plan) is None:
                out.append(Candidate(m, hint))
        return out

    def cost(self, plan, hint, rows, arch) -> float:
        return cpu_gemv_cost(plan, hint, rows, arch.cores)

    def build(self, plan, hint, arch, func=None):
        return schedule_cpu_gemv(None, plan, hint, None if arch is None else arch.target)


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


TEMPLATE = CPUGemv()
