"""Workloads from models: the matmul shapes a model runs, for pre-tuning (``python -m bitblas tune``).

* :func:`capture` records a torch model's Linear / matmul / bmm calls (M per call, N, K, dtypes);
* :func:`find_matmuls` / :class:`FindMatmuls` find the matmul blocks of a TVM Relax/TIR module
  (static extents and symbolic variables), :func:`workload_from_module` turns them into the same
  workload format. :func:`load` / :func:`save` read and write workload files.
"""
from .capture import SCHEMA, Workload, capture, load, save

__all__ = ["capture", "Workload", "load", "save", "SCHEMA", "find_matmuls", "FindMatmuls", "workload_from_module"]


def __getattr__(name):  # the TVM pass imports TVM: only when asked for
    if name in ("find_matmuls", "FindMatmuls", "workload_from_module"):
        from . import tir
        return getattr(tir, name)
    raise AttributeError(name)
