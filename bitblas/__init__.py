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
from .build import set_cpu_threads  # noqa: E402
from .cache import get_database_path, set_database_path  # noqa: E402
from .cache.operators import set_operator_class  # noqa: E402
from .config import MatmulConfig  # noqa: E402
from .formats import ACTIVATION_FORMATS, FORMATS, WEIGHT_FORMATS  # noqa: E402
from .ops.matmul import Matmul  # noqa: E402
from .ops.matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig  # noqa: E402
from .utils import auto_detect_nvidia_target  # noqa: E402
from . import nn, torch_op, workload  # noqa: E402
from .nn import Linear, QuantLinear, quantize_model  # noqa: E402
from .nn.convert import set_hf_recorder  # noqa: E402
from .version import __version__  # noqa: E402

set_operator_class(Matmul)     # the operator cache sits below the operators: it is handed their class


def _record_hf_config(model) -> None:
    """Record a converted transformers model's quantization_config (bitblas.hf; imports transformers,
    so only on demand: nn.convert calls this only once transformers is imported)."""
    from .hf import record_config
    record_config(model)


set_hf_recorder(_record_hf_config)

__all__ = ["Matmul", "MatmulConfig", "MatmulWeightOnlyDequantize", "MatmulWeightOnlyDequantizeConfig",
           "FORMATS", "WEIGHT_FORMATS", "ACTIVATION_FORMATS", "auto_detect_nvidia_target", "set_log_level",
           "quantization", "formats", "nn", "Linear", "QuantLinear", "quantize_model",
           "cache", "workload", "set_database_path", "get_database_path", "tvm", "set_cpu_threads",
           "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())


class _StderrHandler(logging.StreamHandler):
    """The handler set_log_level / BITBLAS_LOG_LEVEL attach to the "bitblas" logger: it writes to
    stderr only while the root logger has no handler of its own, so an application that configures
    logging sees each record once (through its own handlers)."""

    def __init__(self):
        super().__init__()          # sys.stderr, looked up per record
        self.setFormatter(logging.Formatter("%(asctime)s [bitblas:%(levelname)s] %(message)s", "%H:%M:%S"))

    def emit(self, record):
        if not logging.getLogger().handlers:
            super().emit(record)


def _level_of(level, what: str) -> int:
    if isinstance(level, str):
        name = level.strip().upper()
        if name not in logging.getLevelNamesMapping():
            raise ValueError(f"{what}={level!r} is invalid; accepted: DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return logging.getLevelNamesMapping()[name]
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"{what}: expected a level name or a logging level int, got {type(level).__name__}")
    return level


def set_log_level(level) -> None:
    """Set the level of the "bitblas" logger (a logging level or its name, e.g. "INFO") and make its
    records visible: a stderr handler is attached to the "bitblas" logger (once), which prints while
    the application has not configured logging itself (records also propagate to the root logger)."""
    logger = logging.getLogger(__name__)
    logger.setLevel(_level_of(level, "level"))
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())


def _init_logging_from_env():
    from . import env
    if env.LOG_LEVEL_SET:
        try:
            set_log_level(env.LOG_LEVEL)
        except ValueError:
            raise ValueError(f"BITBLAS_LOG_LEVEL={env.LOG_LEVEL!r} is invalid; accepted: DEBUG, INFO, WARNING, "
                             "ERROR, CRITICAL") from None


_init_logging_from_env()


def __getattr__(name):
    # bitblas.tvm: the TVM bitblas uses (Microsoft BitBLAS's name), imported on first access
    if name == "tvm":
        from ._tvm import tvm
        return tvm
    raise AttributeError(f"module 'bitblas' has no attribute {name!r}")
