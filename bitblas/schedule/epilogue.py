"""The integer / float8 GEMM epilogue as TVMScript text, shared by the hand-written kernels (the
GEMV template's int8 kernels, gemv/; the Hopper wgmma template, cuda_wgmma), in the TensorIR's
order (bitblas/ir.py): the sum in float32, times the per-channel scale where the plan applies it
at the epilogue, times the per-token activation scale, plus the bias; an int32 output is the exact
sum plus the int32 bias.
"""
from __future__ import annotations


def scaled_sum(plan, val: str, val_dtype: str, row: str, col: str):
    """(expression, dtype) of output element (``row``, ``col``) from its sum ``val`` (TVMScript text
    of dtype ``val_dtype``: ``"int32"`` or ``"float32"``); the caller casts to the output dtype."""
    c = plan.config
    if c.out_dtype == "int32":
        return (f"{val} + bias[{col}]" if c.with_bias else val), "int32"
    v = val if val_dtype == "float32" else f"T.Cast('float32', {val})"
    if plan.scale_in_epilogue:
        v = f"{v} * T.Cast('float32', scale[{col}, 0])"
    if c.with_act_scaling:
        v = f"{v} * a_scale[{row}]"
    if c.with_bias:
        v = f"{v} + T.Cast('float32', bias[{col}])"
    return v, "float32"
