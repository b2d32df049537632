"""bitblas: mixed-precision matrix multiplication for quantized LLM inference.

    op = bitblas.Matmul(bitblas.MatmulConfig(M=1, N=4096, K=4096, A_dtype="float16", W_dtype="uint4",
                                             group_size=128, with_scaling=True, with_zeros=True))
    out = op(A, **bitblas.quantization.quantize(weight, op.config))
"""
from __future__ import annotations

import logging

from ._tvm import check_versions as _check_versions

_check_versions()

from . import cache, formats, quantization  # noqa: E402
from .cache import get_database_path, set_database_path  # noqa: E402
from .config import MatmulConfig  # noqa: E402
from .formats import ACTIVATION_FORMATS, FORMATS, WEIGHT_FORMATS  # noqa: E402
from .ops.matmul import Matmul  # noqa: E402
from .ops.matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig  # noqa: E402
from .utils import auto_detect_nvidia_target  # noqa: E402
from . import nn, torch_op, workload  # noqa: E402
from .nn import Linear, QuantLinear, quantize_model  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Matmul", "MatmulConfig", "MatmulWeightOnlyDequantize", "MatmulWeightOnlyDequantizeConfig",
           "FORMATS", "WEIGHT_FORMATS", "ACTIVATION_FORMATS", "auto_detect_nvidia_target", "set_log_level",
           "quantization", "formats", "nn", "Linear", "QuantLinear", "quantize_model",
           "cache", "workload", "set_database_path", "get_database_path", "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())


def set_log_level(level) -> None:
    """Set the level of the "bitblas" logger (a logging level or its name, e.g. "INFO")."""
    if isinstance(level, str):
        name = level.upper()
        if name not in logging.getLevelNamesMapping():
            raise ValueError(f"level={level!r} is invalid; accepted: DEBUG, INFO, WARNING, ERROR, CRITICAL")
        level = logging.getLevelNamesMapping()[name]
    logging.getLogger(__name__).setLevel(level)
