"""Compile candidates in worker processes.

TVM is not fork-safe once initialised, so workers are *spawned*; each imports bitblas (and the
tensor-core intrinsics) once, then compiles the candidates it is given and writes each as a
shared library (``export_library``). Tasks and results are plain data (dicts of str / int), so
nothing TVM-specific crosses the process boundary. The pool lives for the process and is reused
by every tuning call (the CLI tunes many operators with one pool).
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import sys
import threading
import time
import types
from concurrent.futures import ProcessPoolExecutor
from typing import Optional

from .. import env

logger = logging.getLogger(__name__)

__all__ = ["compile_task", "get_pool", "shutdown_pool", "no_main_reimport"]

_POOL: Optional[ProcessPoolExecutor] = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def _init_worker():
    # import once per worker what every task uses, not per task
    from .. import build, config, plan, schedule  # noqa: F401
    from ..cache import kernels  # noqa: F401
    from .._tvm import tensor_intrin_cuda
    tensor_intrin_cuda()


def compile_task(task: dict) -> dict:
    """Build one candidate and export it to ``task["out"]``.

    task: {"config": MatmulConfig dict, "kind": "cpu" | "cuda", "m": plan rows or None,
    "hint": hint dict, "target": Target export dict or None, "out": path of the .so}.
    Returns {"ok": bool, "path", "seconds", "error"}.
    """
    t0 = time.perf_counter()
    try:
        from ..build import compile_plan
        from ..cache.kernels import export
        from ..config import MatmulConfig
        from ..plan import make_plan
        from ..schedule import hint_from_dict
        from .._tvm import tvm
        plan = make_plan(MatmulConfig.from_dict(task["config"]), task["kind"], task["m"])
        target = tvm.target.Target(task["target"]) if task.get("target") else None
        ex = compile_plan(plan, target, hint_from_dict(task["hint"]))
        if not export(ex, task["out"], task["kind"]):
            return {"ok": False, "path": None, "seconds": time.perf_counter() - t0,
                    "error": "export_library failed (no C compiler?)", "stage": "export"}
        return {"ok": True, "path": task["out"], "seconds": time.perf_counter() - t0, "error": None}
    except Exception as e:  # noqa: BLE001 - a candidate that does not build is reported, not fatal
        msg = str(e).strip().splitlines()
        return {"ok": False, "path": None, "seconds": time.perf_counter() - t0,
                "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"[:500], "stage": "compile"}


@contextlib.contextmanager
def no_main_reimport():
    """While workers start: a spawned child re-runs the parent's ``__main__`` *script* (not a
    ``python -m`` entry point) before it does anything else, so a user script without an
    ``if __name__ == "__main__"`` guard would run again in every worker. The workers need nothing
    from it; multiprocessing skips the re-import for entry points named ``*.__main__``, so for
    the duration __main__ carries such a spec."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    main.__spec__ = types.SimpleNamespace(name="bitblas.tune.workers.__main__")
    try:
        yield
    finally:
        main.__spec__ = None


def get_pool(workers: Optional[int] = None) -> ProcessPoolExecutor:
    """The shared spawn-context pool (created on first use, grown when more workers are asked for)."""
    global _POOL, _POOL_SIZE
    n = workers or env.tune_workers()
    with _POOL_LOCK:
        if _POOL is None or n > _POOL_SIZE:
            if _POOL is not None:
                _POOL.shutdown(wait=False, cancel_futures=True)
            ctx = multiprocessing.get_context("spawn")
            _POOL = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init_worker)
            _POOL_SIZE = n
            logger.info("started %d tuning worker processes", n)
        return _POOL


def shutdown_pool() -> None:
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL, _POOL_SIZE = None, 0


atexit.register(shutdown_pool)
