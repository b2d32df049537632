"""Operators (Microsoft BitBLAS's module paths)."""
from .compat import TransformKind
from .layout_ops import (LadderPermutate, LadderPermutateConfig, LOP3Permutate, LOP3PermutateConfig, QuantCompress,
                         QuantCompressConfig)
from .matmul import Matmul, MatmulConfig
from .matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig
from .nvfp4_entry import nvfp4_gemv

__all__ = ["Matmul", "MatmulConfig", "MatmulWeightOnlyDequantize", "MatmulWeightOnlyDequantizeConfig",
           "TransformKind", "QuantCompressConfig", "QuantCompress", "LOP3PermutateConfig", "LOP3Permutate",
           "LadderPermutateConfig", "LadderPermutate", "nvfp4_gemv"]
