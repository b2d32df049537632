"""Microsoft BitBLAS's weight-only dequantize operator names, onto :class:`Matmul`.

``MatmulWeightOnlyDequantizeConfig(bit=4, source_format="uint", zeros_type="quantized", ...)``
builds the equivalent :class:`MatmulConfig` (``W_dtype = source_format + bit``, e.g. "uint4";
source_format "nf" -> "nf4", "fp" -> "fp4_e2m1", "fp_e4m3" -> "float8_e4m3").
"""
from __future__ import annotations

from typing import Optional

from ..config import MatmulConfig
from .matmul import Matmul

__all__ = ["MatmulWeightOnlyDequantizeConfig", "MatmulWeightOnlyDequantize"]

_SOURCE_FORMATS = {"int": "int{bit}", "uint": "uint{bit}", "nf": "nf{bit}", "fp": "fp{bit}_e2m1",
                   "fp_e4m3": "float8_e4m3", "fp_e5m2": "float8_e5m2", "af": "nf{bit}", "nvfp": "nvfp{bit}"}


def MatmulWeightOnlyDequantizeConfig(M=None, N: int = 1024, K: int = 1024, in_dtype: str = "float16",
                                     out_dtype: str = "float16", accum_dtype: Optional[str] = None,
                                     bit: int = 4, storage_dtype: str = "int8", source_format: str = "uint",
                                     with_scaling: bool = False, with_zeros: bool = False,
                                     group_size: int = -1, fast_decoding: Optional[bool] = None,
                                     with_bias: bool = False, propagate_a=None, propagate_b=None,
                                     layout: str = "nt", zeros_type: str = "original", zeros_mode=None) -> MatmulConfig:
    """A MatmulConfig from BitBLAS's weight-only-dequantize fields (propagate_* are layout hints
    that the plan decides by itself here, and are ignored)."""
    if source_format not in _SOURCE_FORMATS:
        raise ValueError(f"source_format={source_format!r} is invalid; accepted: {', '.join(_SOURCE_FORMATS)}")
    if isinstance(bit, bool) or not isinstance(bit, int):
        raise ValueError(f"bit={bit!r} is invalid; accepted: 1, 2, 4, 8")
    w = _SOURCE_FORMATS[source_format].format(bit=bit)
    return MatmulConfig(M=M, N=N, K=K, A_dtype=in_dtype, W_dtype=w, accum_dtype=accum_dtype, out_dtype=out_dtype,
                        layout=layout, with_bias=with_bias, group_size=group_size, with_scaling=with_scaling,
                        with_zeros=with_zeros, zeros_mode=zeros_mode or zeros_type, fast_decoding=fast_decoding,
                        storage_dtype=storage_dtype)


class MatmulWeightOnlyDequantize(Matmul):
    """The same operator as :class:`Matmul` (BitBLAS's class name)."""
