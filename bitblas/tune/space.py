"""Candidate kernels for one M bucket: (plan rows, hint) pairs, every one valid for the plan.

A bucket ``b`` of a config stands for the row counts it serves (see :mod:`bitblas.dispatch`);
its kernels are tuned at ``m = b``. On CUDA the candidates span both templates:

* tensor cores (:class:`MMAHint`): block tile BM x BN x BK, warp tile WM x WN (1-8 warps),
  ``stages``-deep cp.async ring, decode vector width; the plan is symbolic in M for a dynamic
  config (one kernel serves every m of the bucket) and static for an int M > 16;
* GEMV (a template per kernel: :class:`GEMVRowsHint`, :class:`GEMVKSplitHint`, :class:`GEMVMmaHint`,
  :class:`GEMVWgmmaHint`; buckets of 1..16 rows where they apply; 17..64 rows: only the
  tensor-core kernels, in chunks of 16 rows): output channels
  per warp, warps per block, loads in flight (unroll), weight vector width, k-split and tensor-core
  variants (float16/bfloat16 activations; int8 ones take the rows and tensor-core kernels); plan rows = ``b``;
* Hopper wgmma (:class:`WGMMAHint`, sm_90 plans whose weights need no decode, see
  :func:`wgmma_unsupported`): BN in {64, 128, 192, 256} (int8: those in the s8 wgmma table),
  1 or 2 consumer warpgroups (BM = 64 or 128), every ring depth from 2 to 8 stages that fits the
  device's shared memory per block, persistent or one CTA per tile, grouped raster of 8 row
  tiles; plan rows as for the mma.sync kernels;
* the simple schedule (threads per block) where none applies.

On the CPU: :class:`CPUGemvHint` where it applies (float activations, [N, K] weights: channels per
thread task, channels per one-row micro-kernel, rows x channels per many-row micro-kernel, steps
unrolled), else :class:`CPUHint` (N tile, K vector width). Hints are filtered by the template's own
checks (tile geometry, vector alignment) and by the device's shared memory per block.
"""
from __future__ import annotations

import functools
from typing import List

from ..config import MatmulConfig
from ..kernels import candidates as _registry_candidates
from ..kernels.base import Candidate
from ..kernels.mma import mma_rows
from ..plan import make_plan

__all__ = ["Candidate", "candidates", "estimate", "mma_rows"]


def candidates(config: MatmulConfig, kind: str, bucket: int, spec=None) -> List[Candidate]:
    """Every valid candidate for ``bucket`` (unranked): each kernel template's space
    (``bitblas/kernels/``), in the registry's tuning order. ``spec``: the DeviceSpec (CUDA; None:
    nothing is assumed about the device)."""
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"kind={kind!r} is invalid; accepted: 'cpu', 'cuda'")
    arch = None
    if kind == "cuda" and spec is not None:
        from ..arch import Arch
        arch = Arch.from_spec(spec)
    return _registry_candidates(make_plan(config, kind, None), kind, bucket, arch)


def estimate(plan, hint, m: int, spec=None, cores: int = 1) -> float:
    """Estimated seconds of ``hint`` on ``plan`` at ``m`` rows (``spec``: DeviceSpec for CUDA plans):
    the cost of the hint's template (``bitblas/kernels/``; TypeError for an unknown hint)."""
    from ..kernels import template_of
    t = template_of(hint)
    if t.kind == "cpu":
        from ..arch import cpu_arch
        return t.cost(plan, hint, m, cpu_arch(cores))
    return t.cost(plan, hint, m, None if spec is None else _spec_arch(spec))


@functools.lru_cache(maxsize=64)
def _spec_arch(spec):
    from ..arch import Arch
    return Arch.from_spec(spec)
