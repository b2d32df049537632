"""The kernel-template protocol: what one template declares (TVM dlight's ``ScheduleRule`` with the
tuning space and cost model next to the kernel, as in TileLang's templates)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Protocol, runtime_checkable

__all__ = ["Template", "Candidate", "KernelChoice"]


@dataclass(frozen=True)
class Candidate:
    """One tuning candidate: the rows its plan is built for (None: symbolic in M) and its hint."""
    plan_m: Optional[int]
    hint: object
    cost: float = float("nan")   # the template's cost estimate in seconds (tuner ranking)

    def to_dict(self) -> dict:
        from ..schedule import hint_to_dict
        return {"m": self.plan_m, "hint": hint_to_dict(self.hint), "cost": self.cost}


@dataclass(frozen=True)
class KernelChoice:
    """Which kernel serves a row count: the template (a registry name, or ``"dequant-gemm"``: decode,
    then the dense wgmma GEMM), its hint, and the rows its plan is built for (None: symbolic in M;
    a GEMV class top serves the rows of its class). Frozen: the operator's kernel-cache key."""
    template: str
    hint: object
    rows: Optional[int]
    tuned: bool = field(default=False, compare=False)   # a tuned bucket's hint (not part of the key)


@runtime_checkable
class Template(Protocol):
    """A kernel template. ``arch``: a :class:`bitblas.arch.Arch` (its ``target`` the tvm Target).

    Optional members (the GEMV templates have them): ``tune_rank(hint)`` (a candidate's place among
    those of equal ``tune_order``), ``tune_family(hint)`` (the tuner's top-k share groups; default:
    the hint class), ``shape_key(hint)`` (tile shapes the top-k spreads over), ``kernel_rows`` /
    ``tuned_rows`` (the rows of the kernel that serves a row count: kernels/select.py)."""

    name: str            # registry name ("gemv")
    kind: str            # "cuda" | "cpu"
    Hint: type           # its frozen hint class
    needs_tir: bool      # build schedules emit_matmul's TensorIR (False: the kernel is written directly)
    tune_order: int      # where its candidates stand in the tuner's list (ties in cost keep this order)
    tune_fallback: bool  # the tuner lists its candidates only when no template before it has any

    def reason(self, plan, arch) -> Optional[str]:
        """Why the template does not take ``plan`` on ``arch`` (None: it does)."""

    def default(self, plan, arch, rows: Optional[int] = None):
        """The untuned hint for ``plan`` (``rows``: the call's row count on a symbolic plan), or
        None where the template is not the default for it."""

    def space(self, plan, rows: int, arch) -> List[Candidate]:
        """Every candidate for a bucket of ``rows`` rows of ``plan.config`` (unranked)."""

    def cost(self, plan, hint, rows: int, arch) -> float:
        """Estimated seconds of ``hint`` on ``plan`` at ``rows`` rows (``arch.spec``: the DeviceSpec)."""

    def build(self, plan, hint, arch, func=None):
        """The scheduled IRModule (``func``: ``emit_matmul``'s TensorIR, only when ``needs_tir``)."""
