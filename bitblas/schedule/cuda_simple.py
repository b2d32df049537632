"""The simple CUDA schedule: one thread per output element, weights decoded in registers.

Correct for every plan and every M (predicated), compiled by nvcc in CI; it is the fallback that
gives every format a GPU kernel. It is not fast: the tensor-core and GEMV templates replace it
where they apply.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._tvm import tvm

__all__ = ["SimpleCUDAHint", "schedule_cuda_simple"]


@dataclass(frozen=True)
class SimpleCUDAHint:
    threads: int = 128

    @classmethod
    def default(cls, plan) -> "SimpleCUDAHint":
        return cls()


def schedule_cuda_simple(func, plan, hint: SimpleCUDAHint):
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    B, C, D = sch.get_sblock("B_decode"), sch.get_sblock("C"), sch.get_sblock("D")
    sch.compute_inline(B)
    i, j = sch.get_loops(D)
    fused = sch.fuse(i, j)
    bx, tx = sch.split(fused, [None, hint.threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(C, tx)
    sch.set_scope(C, 0, "local")
    return sch.mod
