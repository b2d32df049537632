"""When the decode-then-GEMM path (bitblas.ops.dequant_gemm) serves a plan: the kernel-choice half of
it, below the operators, so that the tuner and ``Matmul`` ask the same rule without importing each other."""
from __future__ import annotations

from typing import Optional

from .config import MatmulConfig
from .plan import Plan, make_plan

__all__ = ["DEQUANT_GEMM_MIN_ROWS", "dense_config", "dequant_gemm_reason"]

DEQUANT_GEMM_MIN_ROWS = 17


def dense_config(config: MatmulConfig) -> MatmulConfig:
    """The config of the GEMM half: the same shape, activations, bias and output, float weights;
    for int8 activations int8 weights (the decoded integer values) with the original per-channel
    or group scales and activation scales."""
    if config.A_dtype == "int8":
        return MatmulConfig(M=config.M, N=config.N, K=config.K, A_dtype="int8", W_dtype="int8",
                            out_dtype=config.out_dtype, accum_dtype=config.accum_dtype, layout=config.layout,
                            with_bias=config.with_bias, with_scaling=config.with_scaling,
                            group_size=config.group_size, with_act_scaling=config.with_act_scaling)
    return MatmulConfig(M=config.M, N=config.N, K=config.K, A_dtype=config.A_dtype, W_dtype=config.A_dtype,
                        out_dtype=config.out_dtype, layout=config.layout, with_bias=config.with_bias)


def dequant_gemm_reason(plan: Plan, target) -> Optional[str]:
    """Why the decode-then-GEMM path does not take ``plan`` on ``target`` (None: it does)."""
    from .schedule import WGMMAHint, default_hint
    from .schedule.cuda_dequant import dequant_unsupported
    c = plan.config
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if plan.w.kind == "float" or (c.A_dtype == "int8" and c.W_dtype == "int8"):
        return f"W_dtype={c.W_dtype}: nothing to decode"
    why = dequant_unsupported(plan)
    if why:
        return why
    dense = make_plan(dense_config(c), "cuda", plan.m)
    if not isinstance(default_hint(dense, target), WGMMAHint):
        return "the dense GEMM of this target is not the wgmma template (sm_90 with its shared memory)"
    return None
