"""Facts of the target the schedules read, and the module attributes they hand the build.

A leaf: imports nothing from bitblas but its TVM handle.
"""
from __future__ import annotations

import os

from .._tvm import tvm

__all__ = ["target_info", "num_sms", "host_cpu_target", "TIRX_PIPELINE_ATTR", "WGMMA_ARCH_ATTR"]

TIRX_PIPELINE_ATTR = "bitblas.tir_pipeline"   # module attribute: compile with tir_pipeline="tirx"
WGMMA_ARCH_ATTR = "bitblas.arch"              # module attribute: compile for this arch (sm_90a)


def target_info(target):
    """(sm version or None, max shared memory per block or None) of a CUDA Target."""
    if target is None:
        return None, None
    attrs = target.attrs
    arch = str(attrs["arch"]) if "arch" in attrs else ""
    digits = "".join(ch for ch in arch[3:] if ch.isdigit()) if arch.startswith("sm_") else ""
    sm = int(digits) if digits else None
    smem = int(attrs["max_shared_memory_per_block"]) if "max_shared_memory_per_block" in attrs else None
    return sm, smem


_SMS = []      # the cached count (tests pin it with monkeypatch.setattr(target, "_SMS", [132]))


def num_sms() -> int:
    """Multiprocessors of the local GPU (132, an H100/H200, when none is visible)."""
    if not _SMS:
        n = 132
        try:
            import torch
            if torch.cuda.is_available():
                n = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        except Exception:  # noqa: BLE001 - a broken driver must not stop code generation
            pass
        _SMS.append(int(n))
    return _SMS[0]


def host_cpu_target():
    """LLVM target for this machine's CPU (its own instruction set extensions, all cores)."""
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": os.cpu_count() or 1})
