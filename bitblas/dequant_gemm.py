"""Large-M path for quantized weights on Hopper: decode the weight once, then the dense wgmma GEMM.

With many rows a matmul is compute-bound, and the fused kernels that decode weights between the
shared-memory load and ``mma.sync`` (cuda_mma) reach a fraction of cuBLAS's rate on Hopper, where
the dense wgmma template comes close to it. So for rows >= ``DEQUANT_GEMM_MIN_ROWS`` on sm_90 a call
runs two kernels: the dequantize kernel (schedule/cuda_dequant.py) writes ``W_decoded[N, K]`` in
the activation dtype into a temporary buffer (torch's caching allocator: N*K*2 bytes for the
duration of the call, like AWQ's large-batch path), and the wgmma kernel of the plan with
unquantized weights multiplies it (bias and the output cast in its epilogue). The decode reads
the packed weight once per call and writes 2 bytes per weight. Measured on the H200, this path
beats the fused kernels several times over from 64 rows up, so it starts right above the GEMV's
rows: 1..16 for every plan the GEMV takes, 17..64 where its tensor-core kernel serves them (every
float-activation format, int8 activations with sub-byte codes: the GEMV reads each weight once
where this path writes and reads 2 bytes per weight; bitblas.schedule.gemv.gemv_default_takes).
Times: docs/performance.md.

int8 activations (W4A8 / W2A8 / W1A8: int4, uint4, int2, uint2, int1, uint1 weights, per-channel or
group scales): the decode writes the integer weight values as int8 (N*K bytes, exact), and the
GEMM is the int8 x int8 wgmma kernel with the plan's scales: per-channel ones in its epilogue,
group ones by promoting the int32 partial sums of each group to float32 (see cuda_wgmma).
float8_e4m3 activations (W4A-fp8 / W2A-fp8: int4, uint4, int2, uint2 weights): the same with the
values as e4m3 bit patterns (exact) and the float8 wgmma kernel; its lookup table (``w_table`` of
the float8 weights) is made here, once per device.

Values: the decoded weights are the fused kernel's (one shared expression), rounded once to the
activation dtype; the GEMM accumulates in float32. nvfp4's global scale is folded into the
decoded weights (see cuda_dequant for the rounding).
"""
from __future__ import annotations

import threading
from typing import Dict

import torch

from .kernels.select import dequant_gemm_plans
from .plan import Plan
from .quantization.quantize import TORCH_DTYPES

__all__ = ["DequantGemm"]


_DEQ: Dict[tuple, object] = {}
_LOCK = threading.Lock()


def _dequant_fn(deq_plan: Plan, target):
    """The compiled dequantize kernel of ``deq_plan`` (symbolic M), one per config and target."""
    from .build import cuda_target
    from .schedule.cuda_dequant import build_dequant
    tgt = cuda_target(target)
    key = (deq_plan.config.to_dict().__repr__(), str(tgt))
    with _LOCK:
        fn = _DEQ.get(key)
    if fn is None:
        fn = build_dequant(deq_plan, tgt)
        with _LOCK:
            fn = _DEQ.setdefault(key, fn)
    return fn


class DequantGemm:
    """A kernel-like callable for ``plan`` (arguments in ``plan.args`` order): dequantize into a
    temporary buffer, then the dense wgmma GEMM with ``hint`` (None: the dense plan's default)."""

    # both kernels check their arguments before launching, and the decode writes only its temporary:
    # a refused call has written nothing of the caller's (ops.matmul._checks_args)
    checks_args = True

    def __init__(self, plan: Plan, target, hint=None):
        from .cache.kernels import get_kernel
        from .schedule.cuda_dequant import weight_arg_names
        c = plan.config
        self.plan = plan
        deq_plan, self.dense_plan = dequant_gemm_plans(c, plan.m)
        self.gemm, self.hint = get_kernel(self.dense_plan, hint, target=target)
        self.dequant = _dequant_fn(deq_plan, target)
        names = [s.name for s in plan.args]
        deq_names = weight_arg_names(plan)
        self._deq_idx = [i for i, s in enumerate(plan.args) if s.name in deq_names]
        # the GEMM's arguments: the caller's by index, the decoded weight (None), or a lookup table of
        # the dense plan's own (its float8 weights' ``w_table``, by name: made once per device)
        self._gemm_idx = [None if s.name == "W" else names.index(s.name) if s.name in names else s.name
                          for s in self.dense_plan.args]
        self._tables: Dict[tuple, torch.Tensor] = {}
        self._shape = (c.N, c.K)
        self._dtype = TORCH_DTYPES[self.dense_plan.arg("W").dtype]    # float8: the kernels take the bits (int8)

    def _table(self, name: str, device) -> torch.Tensor:
        t = self._tables.get((name, device))
        if t is None:
            t = self._tables[(name, device)] = torch.tensor(self.dense_plan.table_values(name), dtype=torch.float32,
                                                            device=device)
        return t

    def __call__(self, *args):
        dev = args[0].device
        ws = torch.empty(self._shape, dtype=self._dtype, device=dev)
        self.dequant(*[args[i] for i in self._deq_idx], ws)
        self.gemm(*[ws if i is None else self._table(i, dev) if isinstance(i, str) else args[i]
                    for i in self._gemm_idx])

    def __repr__(self):
        return f"DequantGemm({self.plan.config.W_dtype} -> {self.plan.config.A_dtype}, {self.hint})"
