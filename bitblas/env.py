"""Every environment variable bitblas reads, in one place."""
from __future__ import annotations

import os

__all__ = ["LOG_LEVEL", "TARGET", "CUDA_HOME", "database_path"]

# BITBLAS_LOG_LEVEL: level name for the "bitblas" logger (default WARNING); see bitblas.set_log_level.
LOG_LEVEL = os.environ.get("BITBLAS_LOG_LEVEL", "WARNING")
# TVM_TARGET (BitBLAS's name) or BITBLAS_TARGET: the CUDA target used when Matmul(target=None).
TARGET = os.environ.get("BITBLAS_TARGET") or os.environ.get("TVM_TARGET")
# CUDA toolkit used to compile generated CUDA with nvcc (tests, get_source checks).
CUDA_HOME = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")


def database_path() -> str:
    """BITBLAS_DATABASE_PATH, default ~/.cache/bitblas (kernel and tuning cache)."""
    return os.environ.get("BITBLAS_DATABASE_PATH") or os.path.join(os.path.expanduser("~"), ".cache", "bitblas")
