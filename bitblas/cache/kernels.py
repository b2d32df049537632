"""Compiled kernels: memory -> disk -> compile, keyed by everything that changes the binary.

The key of a kernel is (config, plan rows, hint, target, compile flags, versions). Every kernel is
written to the database when built (a compile costs a fraction of a second to seconds, a load
milliseconds; CPU kernels are linked by the host's C compiler, and are kept in memory only where
there is none). A kernel whose file fails to load is reported, dropped and rebuilt.
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from typing import Dict, Optional, Tuple

from .. import env
from ..plan import Plan
from . import database as _db
from .paths import get_database

logger = logging.getLogger(__name__)

__all__ = ["target_desc", "kernel_key", "get_kernel", "store_kernel_file", "store_built", "load_kernel_file", "export",
           "remember", "clear_memory"]

_MEM: Dict[str, Tuple[object, object]] = {}      # key hash -> (runtime module, "main")
_LOCK = threading.Lock()
_EXPORT_BROKEN: Dict[str, str] = {}               # target kind -> why export_library failed


def target_desc(kind: str, target=None) -> dict:
    """What the binary depends on about the target: the LLVM CPU target, or the CUDA arch
    compiled for (from the device when the target was detected)."""
    from ..build import cpu_target, cuda_target
    if kind == "cpu":
        return {"kind": "llvm", "target": str(cpu_target())}
    t = cuda_target(target)
    return {"kind": "cuda", "arch": str(t.attrs["arch"]) if "arch" in t.attrs else "",
            "compile_mode": env.cuda_compile_mode()}


def compile_flags() -> dict:
    from ..build import PASS_CONFIG
    return {k: v for k, v in sorted(PASS_CONFIG.items())}


def kernel_key(plan: Plan, hint, tdesc: dict) -> dict:
    from ..schedule import hint_to_dict
    return {"type": "kernel", "config": plan.config.to_dict(), "target_kind": plan.target_kind, "m": plan.m,
            "hint": hint_to_dict(hint), "target": tdesc, "flags": compile_flags(), "versions": _db.versions()}


def _database():
    return get_database()


def load_kernel_file(path: str):
    from .._tvm import tvm
    from ..build import kernel_callable
    mod = tvm.runtime.load_module(path)
    return mod, kernel_callable(mod)


def export(ex, path: str, kind: str) -> bool:
    """``ex.export_library(path)``; False (and a warning, once per kind) when the host cannot link."""
    if kind in _EXPORT_BROKEN:
        return False
    try:
        ex.export_library(path)
        return True
    except Exception as e:  # noqa: BLE001 - no C compiler, or a source-only module (no GPU)
        _EXPORT_BROKEN[kind] = str(e)
        logger.warning("cannot export compiled %s kernels (%s); they are not cached on disk", kind,
                       str(e).splitlines()[0] if str(e) else type(e).__name__)
        return False


def store_kernel_file(plan: Plan, hint, tdesc: dict, path: str) -> Optional[dict]:
    db = _database()
    if db is None:
        return None
    key = kernel_key(plan, hint, tdesc)
    return db.put("kernel", key, {"hint": key["hint"]}, {"kernel": path})   # None: not stored (warned)


def store_built(plan: Plan, hint, tdesc: dict, ex) -> None:
    """Write a kernel built in this process (tvm Executable ``ex``) to the database."""
    with tempfile.TemporaryDirectory(prefix="bitblas_export_") as d:
        so = os.path.join(d, "kernel.so")
        if export(ex, so, plan.target_kind):
            store_kernel_file(plan, hint, tdesc, so)


def _from_disk(db, key) -> Optional[Tuple[object, object]]:
    rec = db.get("kernel", key)
    if rec is None:
        return None
    path = db.file_path("kernel", rec, "kernel")
    try:
        return load_kernel_file(path)
    except Exception as e:  # noqa: BLE001 - a library that does not load is rebuilt
        logger.warning("bitblas cache: kernel %s does not load (%s); rebuilding", path, e)
        with contextlib.suppress(OSError):
            os.unlink(db.record_path("kernel", key))
        return None


def get_kernel(plan: Plan, hint=None, target=None, persist: Optional[bool] = None,
               default: Optional[bool] = None):
    """(runtime function, hint used) of ``plan`` built with ``hint`` (None: the default hint).

    Looked up in memory, then on disk; else compiled and, when ``persist`` (default yes, CUDA and
    CPU alike), written to the database. ``default`` (default: ``hint`` is None): ``hint`` is the
    untuned choice, so a failed build falls back to the last-resort template (build.compile_plan).
    """
    from ..build import compile_plan, cpu_target, cuda_target, kernel_callable
    from ..kernels import default_hint
    kind = plan.target_kind
    tgt = cpu_target() if kind == "cpu" else cuda_target(target)
    used = hint if hint is not None else default_hint(plan, tgt)
    tdesc = target_desc(kind, tgt)
    key = kernel_key(plan, used, tdesc)
    h = _db.key_hash(key)
    with _LOCK:
        hit = _MEM.get(h)
    if hit is not None:
        return hit[1], used
    if persist is None:
        persist = True
    db = _database()
    entry = _from_disk(db, key) if db is not None else None
    if entry is None:
        ex = compile_plan(plan, tgt, used, fallback=hint is None if default is None else default)
        entry = (ex, kernel_callable(ex))
        if persist and db is not None:
            store_built(plan, used, tdesc, ex)
    with _LOCK:
        _MEM.setdefault(h, entry)
        return _MEM[h][1], used


def in_memory(key: dict) -> bool:
    with _LOCK:
        return _db.key_hash(key) in _MEM


def remember(plan: Plan, hint, tdesc: dict, entry) -> None:
    """Put an already built (module, fn) in the memory cache under its kernel key."""
    with _LOCK:
        _MEM[_db.key_hash(kernel_key(plan, hint, tdesc))] = entry


def clear_memory() -> None:
    with _LOCK:
        _MEM.clear()
