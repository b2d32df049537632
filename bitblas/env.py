"""Every environment variable bitblas reads, in one place."""
from __future__ import annotations

import os

__all__ = ["LOG_LEVEL", "LOG_LEVEL_SET", "TARGET", "target", "CUDA_HOME", "database_path", "cache_disabled", "tune_workers", "cuda_compile_mode",
           "cpu_threads", "set_default_cpu_threads"]

# BITBLAS_LOG_LEVEL: level name for the "bitblas" logger (default WARNING); when set, `import bitblas`
# calls bitblas.set_log_level with it (a stderr handler on the "bitblas" logger).
LOG_LEVEL = os.environ.get("BITBLAS_LOG_LEVEL", "WARNING")
LOG_LEVEL_SET = bool(os.environ.get("BITBLAS_LOG_LEVEL"))
# TVM_TARGET (BitBLAS's name) or BITBLAS_TARGET: the CUDA target used when Matmul(target=None).
TARGET = os.environ.get("BITBLAS_TARGET") or os.environ.get("TVM_TARGET")


def target():
    """BITBLAS_TARGET or TVM_TARGET as set now (integrations such as GPTQModel set TVM_TARGET after
    importing bitblas); TVM's older CLI form ("cuda -arch=sm_80") is accepted (bitblas.build.cuda_target)."""
    return os.environ.get("BITBLAS_TARGET") or os.environ.get("TVM_TARGET")
# CUDA toolkit used to compile generated CUDA with nvcc (tests, get_source checks).
CUDA_HOME = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")


def database_path() -> str:
    """BITBLAS_DATABASE_PATH, default ~/.cache/bitblas (kernel and tuning cache)."""
    return os.environ.get("BITBLAS_DATABASE_PATH") or os.path.join(os.path.expanduser("~"), ".cache", "bitblas")


def cache_disabled() -> bool:
    """BITBLAS_DISABLE_CACHE=1: neither read nor write the on-disk database (memory cache only)."""
    return os.environ.get("BITBLAS_DISABLE_CACHE", "0").lower() in ("1", "true", "yes", "on")


def tune_workers() -> int:
    """BITBLAS_TUNE_WORKERS: compile processes of the tuner (default: CPU cores, at most 32)."""
    v = os.environ.get("BITBLAS_TUNE_WORKERS")
    return max(1, int(v)) if v else max(1, min(32, os.cpu_count() or 1))


def cuda_compile_mode() -> str:
    """TVM_CUDA_COMPILE_MODE (read by TVM: "nvrtc" default, or "nvcc"); part of every CUDA cache key."""
    return os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc")


def cpu_threads():
    """TVM_NUM_THREADS, else OMP_NUM_THREADS (read by TVM's thread pool when it starts: the threads
    that run CPU kernels), as an int; None when neither is set (or not a positive int)."""
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(name, "").strip()
        if v:
            return int(v) if v.isdigit() and int(v) > 0 else None
    return None


def set_default_cpu_threads(n: int) -> None:
    """Set TVM_NUM_THREADS=n for TVM's pool unless TVM_NUM_THREADS or OMP_NUM_THREADS is set
    (bitblas.build: the physical cores, where TVM would take half the CPUs on x86)."""
    if not (os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")):
        os.environ["TVM_NUM_THREADS"] = str(n)
