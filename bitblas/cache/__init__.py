"""bitblas.cache: the database of compiled kernels and tuning results (memory + disk).

    bitblas.cache.get_database_path()          # BITBLAS_DATABASE_PATH, default ~/.cache/bitblas
    bitblas.set_database_path("/fast/disk")    # or bitblas.cache.set_database_path
    bitblas.cache.list_entries()               # [{"type": "tuning", "config": ..., "latency_ms": ...}, ...]
    bitblas.cache.clear()                      # removes every entry, returns how many
    bitblas.cache.global_operator_cache        # Microsoft BitBLAS's operator cache (see .operators)

Keys, atomic writes and the handling of damaged entries: :mod:`bitblas.cache.database`.
BITBLAS_DISABLE_CACHE=1 keeps everything in memory.
"""
from __future__ import annotations

import os
from typing import List, Optional

from .database import Database, key_hash, versions
from .kernels import clear_memory
from .operators import OperatorCache, global_operator_cache
from .paths import get_database, get_database_path, set_path_override

__all__ = ["get_database_path", "set_database_path", "get_database", "list_entries", "clear", "Database",
           "key_hash", "versions", "OperatorCache", "global_operator_cache"]

def set_database_path(path: Optional[str]) -> None:
    """Use ``path`` as the database folder for this process (None: back to the default)."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike (or None), got {type(path).__name__}")
    set_path_override(os.path.abspath(os.path.expanduser(os.fspath(path))) if path is not None else None)
    clear_memory()


def _summary(rec: dict) -> dict:
    key = rec.get("key", {})
    cfg = key.get("config", {})
    out = {"type": rec.get("type"), "key": rec.get("key_hash"), "created": rec.get("created"),
           "config": cfg, "target": key.get("target") or key.get("device"),
           "m": key.get("m", key.get("bucket")), "hint": rec.get("hint")}
    for k in ("latency_ms", "default_latency_ms", "tune_seconds"):
        if k in rec:
            out[k] = rec[k]
    return out


def list_entries(type: Optional[str] = None) -> List[dict]:  # noqa: A002 - "type" reads best here
    """Summaries of the database's entries (``type``: "kernel", "tuning" or "operator" (saved by
    global_operator_cache); None: all), newest first."""
    if type not in (None, "kernel", "tuning", "operator"):
        raise ValueError(f"type={type!r} is invalid; accepted: 'kernel', 'tuning', 'operator' or None")
    return [_summary(r) for r in Database(get_database_path()).records(type)]


def clear() -> int:
    """Remove every entry of the database (and the in-memory kernels); returns the number removed."""
    clear_memory()
    return Database(get_database_path()).clear()
