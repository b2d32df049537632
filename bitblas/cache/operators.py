"""``bitblas.cache.global_operator_cache``: Microsoft BitBLAS's in-memory operator cache, on top of
the database.

    global_operator_cache.add(config, op); global_operator_cache.get(config)   # -> op or None
    global_operator_cache.save_into_database(path, target)   # one "operator" record per operator
    global_operator_cache.load_from_database(path, target)   # rebuilds them (tuned dispatch included)

A saved operator is a record of its config, its target and, for each tuned kind (cpu / cuda),
the buckets and the chosen kernel hints; loading rebuilds the Matmul and its dispatch from that
record without tuning. Kernels come from the kernel cache (memory, then the database at the
current path), and are compiled on first use where they are not there. Records are keyed like
every database entry (config, target, versions): another bitblas or TVM version does not load.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Optional

from .database import Database, versions
from .paths import get_database_path

__all__ = ["OperatorCache", "global_operator_cache", "set_operator_class"]

logger = logging.getLogger(__name__)

_TYPE = "operator"


def _target_desc(target) -> str:
    """The CUDA arch an operator's kernels are built for ("" for a CPU-only operator)."""
    if isinstance(target, str) and target in ("llvm", "cpu", "c"):
        return ""
    from ..build import cuda_target
    t = cuda_target(target)
    return str(t.attrs["arch"]) if "arch" in t.attrs else str(t)


def _key(config, tdesc: str) -> dict:
    return {"type": _TYPE, "config": config.to_dict(), "target": tdesc, "versions": versions()}


class OperatorCache:
    """Operators by config (thread-safe). The operator class (``bitblas.Matmul``) is handed in by
    the package (:func:`set_operator_class`, in bitblas/__init__.py): the cache sits below the
    operators and does not import them."""

    operator_class: Optional[type] = None

    def __init__(self):
        self._ops: Dict[object, object] = {}
        self._lock = threading.RLock()

    def add(self, config, op) -> None:
        from ..config import MatmulConfig
        Matmul = _operator_class()
        if not isinstance(config, MatmulConfig):
            raise TypeError(f"config: expected a bitblas.MatmulConfig, got {type(config).__name__}")
        if not isinstance(op, Matmul):
            raise TypeError(f"op: expected a bitblas.Matmul, got {type(op).__name__}")
        with self._lock:
            self._ops[config] = op

    def get(self, config):
        with self._lock:
            return self._ops.get(config)

    def exist(self, config) -> bool:
        with self._lock:
            return config in self._ops

    def size(self) -> int:
        with self._lock:
            return len(self._ops)

    def clear(self) -> None:
        with self._lock:
            self._ops.clear()

    # -- database ------------------------------------------------------------------------
    def save_into_database(self, database_path: Optional[str] = None, target=None) -> int:
        """Write one record per cached operator (config, target, tuned buckets and hints) into the
        database at ``database_path`` (default: bitblas.cache.get_database_path()). ``target``
        is accepted for BitBLAS's signature; each record carries its own operator's target.
        Returns the number written."""
        from ..schedule import hint_to_dict
        db = Database(database_path or get_database_path())
        with self._lock:
            items = list(self._ops.items())
        n = 0
        for config, op in items:
            tdesc = "" if op._cpu_only else _target_desc(op._target_arg)
            tuned = {}
            for kind, table in op._tuned.items():
                tuned[kind] = {"buckets": list(op._buckets.buckets) if op._buckets is not None else sorted(table),
                               "choices": [[b, m, hint_to_dict(h)] for b, (m, h) in sorted(table.items())]}
            arg = op._target_arg
            payload = {"config": config.to_dict(), "cpu_only": op._cpu_only, "tuned": tuned,
                       # rebuilt with the same target: the string given, else its arch (None: detect again)
                       "target_arg": arg if isinstance(arg, str) or arg is None else tdesc}
            db.put(_TYPE, _key(config, tdesc), payload)
            n += 1
        return n

    def load_from_database(self, database_path: Optional[str] = None, target=None) -> int:
        """Rebuild the operators saved in the database at ``database_path`` for ``target`` (None:
        the local GPU, else a generic target; every record when it cannot be resolved) and add
        them; returns how many were added. Records of other versions are skipped."""
        from ..config import MatmulConfig
        import os
        path = database_path or get_database_path()
        if not os.path.isdir(path):
            return 0
        try:
            want = _target_desc(target)
        except (ValueError, TypeError) as e:
            raise ValueError(f"target={target!r} is not a valid target: {e}") from None
        n = 0
        for rec in Database(path).records(_TYPE):
            key = rec.get("key", {})
            if key.get("versions") != versions():
                continue
            tdesc = key.get("target", "")
            if tdesc and want and tdesc != want:
                continue
            try:
                config = MatmulConfig.from_dict(rec["config"])
                op = self._rebuild(config, rec)
            except Exception as e:  # noqa: BLE001 - a damaged record is skipped, never fatal
                logger.warning("bitblas cache: operator record %s does not load (%s); skipped",
                               rec.get("key_hash"), e)
                continue
            with self._lock:
                if config not in self._ops:
                    self._ops[config] = op
                    n += 1
        return n

    @staticmethod
    def _rebuild(config, rec):
        from ..dispatch import BucketTable
        from ..schedule import hint_from_dict
        op = _operator_class()(config, target="llvm" if rec.get("cpu_only") else rec.get("target_arg"))
        for kind, t in (rec.get("tuned") or {}).items():
            op._tuned[kind] = {int(b): (m, hint_from_dict(h)) for b, m, h in t["choices"]}
            op._buckets = BucketTable(sorted(int(b) for b in t["buckets"]))
            op._reset_dispatch(kind)
        return op


def set_operator_class(cls: type) -> None:
    """The class the cache holds and rebuilds (``bitblas.Matmul``; bitblas/__init__.py sets it)."""
    OperatorCache.operator_class = cls


def _operator_class() -> type:
    if OperatorCache.operator_class is None:
        raise RuntimeError("bitblas.cache.operators: no operator class set (import bitblas first)")
    return OperatorCache.operator_class


global_operator_cache = OperatorCache()
