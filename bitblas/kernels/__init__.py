"""Kernel templates: one ordered registry, one protocol (:class:`~bitblas.kernels.base.Template`).

Each file here adapts one template family of ``bitblas/schedule/`` (where the kernels are
written) to the protocol: its hint class, why it does not take a plan, its default hint, its
tuning space and cost estimate, and its build. The registry is tried in order, like TVM dlight's
schedule rules: a plan's default kernel is the first template whose ``default`` gives a hint.
The tuner (``tune/space.candidates``, ``tune/space.estimate``), the builder (``build.lower_plan``)
and the selector (:mod:`bitblas.kernels.select`) iterate it; none of them names a template.

Adding a template: one file here (a class with the protocol's members and ``TEMPLATE = ...``) and
one line in :data:`REGISTRY`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from . import cpu_gemv, cpu_tile, fused_wgmma, gemv_ksplit, gemv_mma, gemv_rows, gemv_wgmma, mma, nvfp4, simple, wgmma
from .base import Candidate, KernelChoice, Template

__all__ = ["REGISTRY", "Template", "Candidate", "KernelChoice", "templates", "template_of", "by_name",
           "default_hint", "lower", "candidates", "fallback_hint"]

# The default order: the first template whose ``default`` gives a hint builds the plan's kernel.
REGISTRY: Tuple[Template, ...] = (
    nvfp4.CPU,             # NVFP4 x NVFP4 on the CPU
    nvfp4.GEMV,            # NVFP4 x NVFP4 on CUDA (up to 8 rows a launch)
    cpu_gemv.TEMPLATE,     # CPU: float activations x [N, K] weights, SIMD decode
    cpu_tile.TEMPLATE,     # CPU: the rest
    gemv_rows.TEMPLATE,    # CUDA: the GEMV's rows kernel (1..16 static rows; the default GEMV decides which one)
    gemv_ksplit.TEMPLATE,  # CUDA: the GEMV's k-split kernel (the tuner's only)
    gemv_mma.TEMPLATE,     # CUDA sm_80+: the mma GEMV (classes of rows up to 64)
    gemv_wgmma.TEMPLATE,   # CUDA sm_90a: the wgmma GEMV (classes of 8 rows, 9..64)
    wgmma.TEMPLATE,        # CUDA sm_90: weights that need no decode
    fused_wgmma.TEMPLATE,  # CUDA sm_90: quantized weights past the GEMV (the selector's, never a plan default)
    mma.TEMPLATE,          # CUDA sm_80+: tensor cores, every weight format
    simple.TEMPLATE,       # CUDA: every plan (and the fallback of a default that fails to build)
)


def templates(kind: str) -> Tuple[Template, ...]:
    """The templates of a target kind ("cuda" / "cpu"), in registry order."""
    return tuple(t for t in REGISTRY if t.kind == kind)


def template_of(hint) -> Template:
    """The template a hint belongs to (TypeError for an object that is no registered hint)."""
    for t in REGISTRY:
        if type(hint) is t.Hint:
            return t
    raise TypeError(f"{type(hint).__name__} is not the hint of a registered kernel template")


def by_name(name: str) -> Template:
    for t in REGISTRY:
        if t.name == name:
            return t
    raise KeyError(name)


def default_hint(plan, arch=None, rows: Optional[int] = None):
    """The default hint of ``plan``: the first template (registry order) that gives one.
    ``arch``: an :class:`bitblas.arch.Arch` or a tvm Target (None: unknown CUDA arch / the host CPU);
    ``rows``: a call's row count on a symbolic plan (the wgmma tile class)."""
    arch = _arch(arch, plan.target_kind)
    for t in templates(plan.target_kind):
        hint = t.default(plan, arch, rows)
        if hint is not None:
            return hint
    raise ValueError(f"no kernel template takes this {plan.target_kind} plan")   # pragma: no cover


def lower(plan, hint, arch):
    """The scheduled IRModule of ``plan`` with ``hint``; ``emit_matmul``'s TensorIR is built only for
    templates that schedule it (``needs_tir``)."""
    t = template_of(hint)
    func = None
    if t.needs_tir:
        from ..ir.matmul import emit_matmul
        opts = t.ir_options(plan, hint) if hasattr(t, "ir_options") else {}
        func = emit_matmul(plan, **opts)
    return t.build(plan, hint, _arch(arch, plan.target_kind), func)


def fallback_hint(plan, failed):
    """The hint of the plan kind's ``last_resort`` template (the simple CUDA kernel, which takes
    every plan) for a default kernel (``failed``) that did not build; None where there is none or
    it is the one that failed."""
    for t in reversed(templates(plan.target_kind)):
        if getattr(t, "last_resort", False):
            if type(failed) is t.Hint or t.reason(plan, None) is not None:
                return None
            return t.default(plan, None)
    return None


def candidates(plan, kind: str, rows: int, arch) -> List[Candidate]:
    """Every tuning candidate of ``plan.config`` for a bucket of ``rows`` rows: the templates'
    spaces in their ``tune_order`` (equal orders in registry order; a template's optional
    ``tune_rank(hint)`` places a candidate after those of lower rank of the same order); a
    ``tune_fallback`` template only where none before it has any."""
    out: List[Tuple[int, int, Candidate]] = []
    for t in sorted(templates(kind), key=lambda t: t.tune_order):
        if t.tune_fallback and out:
            continue
        rank = getattr(t, "tune_rank", None)
        out += [(t.tune_order, rank(c.hint) if rank else 0, c) for c in t.space(plan, rows, arch)]
    return [c for _, _, c in sorted(out, key=lambda x: x[:2])]


def _arch(arch, kind):
    """An Arch for a plan of ``kind`` from an Arch, a tvm Target or None."""
    from ..arch import UNKNOWN, Arch, arch_of, cpu_arch
    if isinstance(arch, Arch) and (arch.kind == kind or kind == "cuda"):
        return arch
    if kind == "cpu":
        return cpu_arch() if arch is None or isinstance(arch, Arch) else arch_of(arch)
    return UNKNOWN if arch is None else arch_of(arch)
