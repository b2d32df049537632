"""CPU (LLVM) schedule: decode one N tile of weights once, then a k-vectorised dot product.

Loops: parallel over N tiles; per tile the decoded weight [n_tile, K] is computed once and reused
by every row of A; the reduction over K is split into ``k_vec`` lanes (rfactor) that run as SIMD
and are summed at the end, with the epilogue fused per output element.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._tvm import tvm

__all__ = ["CPUHint", "schedule_cpu"]


def largest_divisor(n: int, candidates) -> int:
    """The first of ``candidates`` that divides ``n`` (1 if none does)."""
    for c in candidates:
        if n % c == 0:
            return c
    return 1


@dataclass(frozen=True)
class CPUHint:
    n_tile: int = 32
    k_vec: int = 32

    @classmethod
    def default(cls, plan) -> "CPUHint":
        K = plan.config.K
        return cls(n_tile=32, k_vec=largest_divisor(K, (32, 16, 8, 4, 2)))


def schedule_cpu(func, plan, hint: CPUHint):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    B, C, D = sch.get_sblock("B_decode"), sch.get_sblock("C"), sch.get_sblock("D")
    i, j, k = sch.get_loops(C)
    jo, ji = sch.split(j, [None, hint.n_tile])
    k_vec = hint.k_vec if plan.config.K % hint.k_vec == 0 else 1
    ko, ki = sch.split(k, [None, k_vec])
    sch.reorder(jo, i, ji, ko, ki)
    rf = sch.rfactor(ki, 2)
    loops = sch.get_loops(rf)
    sch.compute_at(B, loops[0])
    sch.reverse_compute_at(C, loops[2])
    sch.reverse_compute_at(D, loops[2])
    sch.parallel(loops[0])
    if k_vec > 1:
        sch.vectorize(loops[-1])
        _, bv = sch.split(sch.get_loops(B)[-1], [None, k_vec])
        sch.vectorize(bv)
    return sch.mod
