"""Shared by the template adapters: the nvfp4 split, and what the schedule / tune modules take."""
from __future__ import annotations

from typing import Callable, Optional

NVFP4_ONLY = "nvfp4 activations: the nvfp4 templates"


def not_nvfp4(plan, kind: str) -> Optional[str]:
    """Why a template of ``kind`` for non-nvfp4 plans does not take ``plan`` (None: it may)."""
    if plan.target_kind != kind:
        return f"not a {kind.upper()} plan"
    return "nvfp4 activations (the nvfp4 templates take them)" if plan.nvfp4_acts else None


def cuda_reason(plan, arch, feature: str, what: str, check: Callable[[object, object], Optional[str]]) -> Optional[str]:
    """``reason`` of a CUDA template for non-nvfp4 plans that needs an :class:`~bitblas.arch.Arch`
    feature: :func:`not_nvfp4`, then ``"{what} (target: {arch.name()})"`` where ``arch`` lacks
    ``feature`` (an Arch flag such as ``"mma"`` or ``"wgmma"``; None arch: not checked), then the
    template's own ``check(plan, arch)`` (None: the template may take the plan)."""
    why = not_nvfp4(plan, "cuda")
    if why:
        return why
    if arch is not None and not getattr(arch, feature):
        return f"{what} (target: {arch.name()})"
    return check(plan, arch)


def spec_of(arch):
    """The DeviceSpec of ``arch`` (None: the tuner has no device facts and assumes nothing)."""
    return None if arch is None else arch.spec


def target_of(arch):
    """What the schedule modules take as ``target``: the Arch itself (they read it through
    ``arch_of``), or for CPU templates its LLVM Target."""
    if arch is None:
        return None
    return arch.target if arch.kind == "cpu" else arch


def need_spec(arch):
    """The DeviceSpec a CUDA cost estimate needs (ValueError without one)."""
    if arch is None:
        raise ValueError("estimate: a DeviceSpec is needed for CUDA hints")
    return arch.spec
