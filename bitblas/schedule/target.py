"""The module attributes the schedules hand the build, and the host CPU's LLVM target (the GPU's
facts: :mod:`bitblas.arch`).

A leaf: imports nothing from bitblas but its TVM handle.
"""
from __future__ import annotations

import os

from .._tvm import tvm

__all__ = ["host_cpu_target", "TIRX_PIPELINE_ATTR", "WGMMA_ARCH_ATTR"]

TIRX_PIPELINE_ATTR = "bitblas.tir_pipeline"   # module attribute: compile with tir_pipeline="tirx"
WGMMA_ARCH_ATTR = "bitblas.arch"              # module attribute: compile for this arch (sm_90a)


def host_cpu_target():
    """LLVM target for this machine's CPU (its own instruction set extensions, all cores)."""
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": os.cpu_count() or 1})
