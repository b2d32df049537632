"""Utilities under Microsoft BitBLAS's names: target detection."""
from __future__ import annotations

import logging

__all__ = ["auto_detect_nvidia_target", "DEFAULT_ARCH"]

logger = logging.getLogger(__name__)
DEFAULT_ARCH = "sm_80"


def auto_detect_nvidia_target(gpu_id: int = 0):
    """A CUDA tvm Target for GPU ``gpu_id``, its limits read from the device.

    Without a visible GPU it returns a generic sm_80 target (code generation still works) and logs
    that it did so; it never raises for a missing GPU. Honours BITBLAS_TARGET / TVM_TARGET.
    """
    from .. import env
    from .._tvm import tvm
    if env.target():
        from ..build import cuda_target
        return cuda_target(env.target())
    info = {"kind": "cuda", "arch": DEFAULT_ARCH, "max_shared_memory_per_block": 49152,
            "max_threads_per_block": 1024, "thread_warp_size": 32, "registers_per_block": 65536}
    try:
        import torch
        if torch.cuda.is_available() and gpu_id < torch.cuda.device_count():
            from ..arch import Arch
            arch = Arch.from_device(gpu_id)          # bitblas.hardware.query_device's DeviceSpec
            info["arch"] = f"sm_{arch.sm}"
            info["max_shared_memory_per_block"] = arch.smem_per_block or 49152
            info["registers_per_block"] = arch.regs_per_sm or 65536
            if arch.l2_bytes:
                info["l2_cache_size_bytes"] = arch.l2_bytes
            return tvm.target.Target(info)
    except Exception as e:  # a broken driver must not stop code generation
        logger.warning("could not query GPU %d (%s); using a generic %s target", gpu_id, e, DEFAULT_ARCH)
        return tvm.target.Target(info)
    logger.info("no CUDA GPU visible; using a generic %s target", DEFAULT_ARCH)
    return tvm.target.Target(info)
