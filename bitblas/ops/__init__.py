"""Operators (Microsoft BitBLAS's module paths)."""
from .matmul import Matmul, MatmulConfig
from .matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig
from .nvfp4 import nvfp4_gemv

__all__ = ["Matmul", "MatmulConfig", "MatmulWeightOnlyDequantize", "MatmulWeightOnlyDequantizeConfig", "nvfp4_gemv"]
