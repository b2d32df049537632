"""Operators (Microsoft BitBLAS's module paths)."""
from .matmul import Matmul, MatmulConfig
from .matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig

__all__ = ["Matmul", "MatmulConfig", "MatmulWeightOnlyDequantize", "MatmulWeightOnlyDequantizeConfig"]
