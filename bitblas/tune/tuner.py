"""The tuner: candidates -> Roller-style ranking -> parallel compile -> reference check -> measure.

For each M bucket of an operator (see :mod:`bitblas.dispatch`):

1. every valid candidate of the templates that apply (:mod:`bitblas.tune.space`) is scored by the
   cost model (:mod:`bitblas.tune.cost`) on the device's :class:`~bitblas.hardware.DeviceSpec`;
2. the ``topk`` best are kept, at most two per tile shape (so knobs such as stages and vector
   widths do not crowd out other tiles) and at least a quarter from each template when several
   apply (GEMV, mma.sync, wgmma); the default kernel of the bucket (the one an untuned operator
   runs for its rows) is always added;
3. they compile in spawned worker processes (:mod:`bitblas.tune.workers`), each to a shared library;
4. each is run once on random inputs of ``bucket`` rows and compared with the torch reference
   (tolerance table of :mod:`bitblas.reference`); wrong ones are dropped with a warning;
5. the rest are timed (:func:`~bitblas.tune.measure.time_kernel`: warm-up, batches of launches,
   median; weight copies cycled to exceed the L2) and the fastest is kept.

Buckets whose rows an untuned operator runs as decode + wgmma GEMM (quantized weights on sm_90,
see :func:`composite_serves`) are not tuned: a tuned entry would take their rows off that faster
path. Their results carry ``skipped`` (the reason) and no hint.

The winner (its hint, latency, the default's latency and the whole candidate table) is written
to the database under a key of (config, bucket, device, flags, versions), and its kernel under
its kernel key; a later call, in this or another process, loads both without compiling. A lock
per key makes a second process tuning the same operator wait for the first and reuse its result.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from ..cache import database as _dbmod
from ..cache import get_database
from ..cache import kernels as _kernels
from ..config import MatmulConfig
from ..dispatch import BucketTable, default_rows, gemv_kernel_rows, gemv_rows
from ..formats import FORMATS
from ..plan import make_plan
from ..schedule import GEMVHint, MMAHint, WGMMAHint, default_hint, hint_from_dict, hint_to_dict
from .cost import estimate
from .measure import time_kernel
from .space import Candidate, candidates

logger = logging.getLogger(__name__)

__all__ = ["TuneResult", "tune", "tune_bucket", "select_topk", "device_desc", "tuning_key", "kernel_args",
           "composite_serves"]


@dataclass
class TuneResult:
    bucket: int
    plan_m: Optional[int]
    hint: object
    latency_ms: Optional[float]          # None only for a skipped bucket
    default_latency_ms: Optional[float]
    seconds: float
    from_cache: bool
    candidates: List[dict] = field(default_factory=list)
    entry: object = field(default=None, repr=False)        # (module, fn) of the winner, when built here
    path: Optional[str] = field(default=None, repr=False)  # its exported library (worker-built), until stored
    skipped: Optional[str] = None      # why the bucket was not tuned (then no hint, no latencies)

    @property
    def speedup(self) -> Optional[float]:
        if not self.default_latency_ms or not self.latency_ms:
            return None
        return self.default_latency_ms / self.latency_ms

    def payload(self) -> dict:
        return {"bucket": self.bucket, "m": self.plan_m, "hint": hint_to_dict(self.hint),
                "latency_ms": self.latency_ms, "default_latency_ms": self.default_latency_ms,
                "tune_seconds": self.seconds, "candidates": self.candidates}


# -- keys ----------------------------------------------------------------------------------------
def device_desc(kind: str, target=None, spec=None) -> dict:
    """What a tuning result depends on: the GPU as read from the device (or the CPU)."""
    from ..build import cpu_target
    if kind == "cpu":
        return {"llvm": str(cpu_target()), "cores": os.cpu_count()}
    td = _kernels.target_desc("cuda", target)
    if spec is None:
        return {"target": td}
    return {"target": td, "name": spec.name, "arch": spec.arch, "sm_count": spec.sm_count,
            "smem_per_block": spec.smem_per_block, "l2_bytes": spec.l2_bytes, "source": spec.source}


def tuning_key(config: MatmulConfig, kind: str, bucket: int, ddesc: dict) -> dict:
    return {"type": "tuning", "config": config.to_dict(), "target_kind": kind, "bucket": bucket, "device": ddesc,
            "flags": _kernels._flags(), "versions": _dbmod.versions()}


# -- ranking -------------------------------------------------------------------------------------
def _shape_key(hint):
    if isinstance(hint, MMAHint):
        return ("mma", hint.BM, hint.BN, hint.BK, hint.WM, hint.WN)
    if isinstance(hint, WGMMAHint):
        return ("wgmma", hint.BM, hint.BN)
    if isinstance(hint, GEMVHint):
        return ("gemv", hint.mma, hint.wgmma, hint.act_smem, hint.rows_per_warp, hint.warps, hint.k_warps)
    d = hint_to_dict(hint)
    return (d.pop("class"),) + tuple(sorted(d.items()))[:1]


def select_topk(ranked: Sequence[Candidate], topk: int, per_shape: int = 2) -> List[Candidate]:
    """``topk`` of ``ranked`` (best first): at most ``per_shape`` per tile shape while others are
    left, and at least ``ceil(topk / 4)`` of each template family present (the wgmma GEMV counts as
    a family of its own, and so does the rows kernel with a staged activation row: the cost model
    does not see its saved activation traffic, so it ranks it below the register-bound rows tiles
    that it beat on the H200)."""
    if topk < 1:
        raise ValueError(f"topk={topk!r} is invalid; accepted: an int >= 1")
    families = {}
    for c in ranked:
        fam = type(c.hint).__name__ + ("-wgmma" if getattr(c.hint, "wgmma", False) else "") + (
            "-staged" if getattr(c.hint, "act_smem", False) else "")
        families.setdefault(fam, []).append(c)
    chosen, seen = [], {}

    def take(pool, limit):
        for c in pool:
            if len(chosen) >= limit:
                return
            k = _shape_key(c.hint)
            if c in chosen or seen.get(k, 0) >= per_shape:
                continue
            chosen.append(c)
            seen[k] = seen.get(k, 0) + 1

    if len(families) > 1:
        share = math.ceil(topk / 4)
        for pool in families.values():
            take(pool, len(chosen) + share)
    take(ranked, topk)
    if len(chosen) < topk:             # few shapes: fill with the next best of any shape
        for c in ranked:
            if len(chosen) >= topk:
                break
            if c not in chosen:
                chosen.append(c)
    return sorted(chosen[:topk], key=lambda c: c.cost)


# -- running kernels -----------------------------------------------------------------------------
def kernel_args(plan, inputs: Dict[str, torch.Tensor], out: torch.Tensor) -> list:
    """The argument list of a plan's kernel from operator inputs (as :func:`random_inputs` gives)."""
    rows = out.shape[0]
    dev = out.device
    args = []
    for spec in plan.args:
        if spec.role == "output":
            args.append(out)
            continue
        if spec.role == "table":
            vals = {"w_table": plan.w.table, "a_table": plan.a.table}.get(spec.name)
            if vals is None:
                vals = FORMATS[plan.scale_dtype].table
            args.append(torch.tensor(vals, dtype=torch.float32, device=dev))
            continue
        t = inputs.get(spec.name)
        if t is None:
            args.append(torch.ones(1, dtype=torch.float32, device=dev))   # optional global scale
            continue
        shape = (rows, *spec.shape[1:]) if spec.per_row else spec.shape
        if spec.dtype == "int8" and t.dtype != torch.int8:
            t = t.view(torch.int8)
        args.append(t.reshape(shape))
    return args


def _weight_copies(plan, inputs, out, spec, cuda: bool) -> List[list]:
    """Argument sets cycling through enough copies of the weights to exceed the L2 (CUDA)."""
    base = kernel_args(plan, inputs, out)
    if not cuda or spec is None:
        return [base]
    names = [i for i, s in enumerate(plan.args) if s.name in ("W", "scale", "zeros")]
    wbytes = sum(base[i].numel() * base[i].element_size() for i in names)
    n = max(1, min(16, math.ceil(2 * spec.l2_bytes / max(wbytes, 1))))
    sets = [base]
    for _ in range(n - 1):
        s = list(base)
        for i in names:
            s[i] = base[i].clone()
        sets.append(s)
    return sets


# -- one bucket ------------------------------------------------------------------------------------
def _compile_all(config, kind, cands, target, parallel, bar, workdir) -> List[dict]:
    """Compile each candidate; returns one dict per candidate: ok, error, seconds, entry (module, fn)."""
    tasks = []
    tgt_dict = target.export() if (target is not None and kind == "cuda") else None
    for i, c in enumerate(cands):
        tasks.append({"config": config.to_dict(), "kind": kind, "m": c.plan_m, "hint": hint_to_dict(c.hint),
                      "target": tgt_dict, "out": os.path.join(workdir, f"cand{i}.so")})
    results: List[Optional[dict]] = [None] * len(tasks)
    if parallel and len(tasks) > 1:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool
        from .workers import compile_task, get_pool, no_main_reimport
        try:
            pool = get_pool()
            with no_main_reimport():          # workers start on submit
                futs = {pool.submit(compile_task, t): i for i, t in enumerate(tasks)}
            for f in as_completed(futs):
                results[futs[f]] = f.result()
                if bar is not None:
                    bar.update(1)
        except (BrokenProcessPool, RuntimeError, OSError) as e:
            logger.warning("tuning worker processes failed (%s); compiling in this process", e)
            from .workers import shutdown_pool
            shutdown_pool()
            results = [None] * len(tasks)
        if all(r is not None and not r["ok"] and r.get("stage") == "export" for r in results):
            logger.warning("workers could not export kernels; compiling in this process")
            results = [None] * len(tasks)
    for i, (t, c) in enumerate(zip(tasks, cands)):
        if results[i] is None:                       # serial: in this process, no export needed
            from ..build import compile_plan, kernel_callable
            t0 = time.perf_counter()
            try:
                ex = compile_plan(make_plan(config, kind, c.plan_m), target, c.hint)
                results[i] = {"ok": True, "entry": (ex, kernel_callable(ex)), "seconds": time.perf_counter() - t0,
                              "error": None, "path": None}
            except Exception as e:  # noqa: BLE001
                msg = str(e).strip().splitlines()
                results[i] = {"ok": False, "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"[:500],
                              "seconds": time.perf_counter() - t0, "path": None}
            if bar is not None:
                bar.update(1)
        elif results[i]["ok"]:
            try:
                results[i]["entry"] = _kernels.load_kernel_file(results[i]["path"])
            except Exception as e:  # noqa: BLE001
                results[i].update(ok=False, error=f"load: {e}"[:500])
    return results


def tune_bucket(config: MatmulConfig, kind: str, bucket: int, target=None, spec=None, topk: int = 20,
                parallel: bool = True, bar=None) -> TuneResult:
    """Tune one bucket (no database access); the result carries the winner's kernel (``entry``)
    and, when a worker compiled it, a copy of its library (``path``)."""
    from ..build import cpu_target, cuda_target
    from ..reference import random_inputs, reference_matmul, relative_error, tolerance
    t_start = time.perf_counter()
    cuda = kind == "cuda"
    tgt = cuda_target(target) if cuda else cpu_target()
    cores = os.cpu_count() or 1
    ranked = []
    for c in candidates(config, kind, bucket, spec):
        try:
            cost = estimate(make_plan(config, kind, c.plan_m), c.hint, bucket, spec, cores)
        except (ArithmeticError, ValueError):
            cost = math.inf
        if math.isfinite(cost):
            ranked.append(Candidate(c.plan_m, c.hint, cost))
    ranked.sort(key=lambda c: c.cost)
    chosen = select_topk(ranked, topk) if ranked else []
    d_rows = default_rows(config, kind, bucket, tgt if cuda else None)
    d_plan = make_plan(config, kind, d_rows)
    d_hint = default_hint(d_plan, tgt)
    if isinstance(d_hint, WGMMAHint) and d_rows is None:
        # what an untuned operator runs for these rows (Matmul._wgmma_for_rows): the symbolic
        # kernel with the tile class of the row count, not the 128 x 256 tile of a symbolic plan
        d_hint = WGMMAHint.default(make_plan(config, kind, bucket), tgt) or d_hint
    default = Candidate(d_rows, d_hint, estimate(d_plan, d_hint, bucket, spec, cores) if (spec or not cuda) else 0.0)
    if all((c.plan_m, c.hint) != (default.plan_m, default.hint) for c in chosen):
        chosen.append(default)
    logger.info("bucket %d: %d candidates, measuring %d", bucket, len(ranked), len(chosen))
    if bar is not None:
        bar.total = (bar.total or 0) + len(chosen)
        bar.set_postfix_str(f"m={bucket}")
    workdir = tempfile.mkdtemp(prefix="bitblas_tune_")
    try:
        built = _compile_all(config, kind, chosen, tgt, parallel, bar, workdir)
        device = "cuda" if cuda else "cpu"
        inputs = random_inputs(config, bucket, device=device, seed=1234)
        ref = reference_matmul(config, **inputs, cast=True, device=device)
        tol = tolerance(config)
        table, best, best_i = [], None, None
        out_dtype = ref.dtype
        for i, (c, r) in enumerate(zip(chosen, built)):
            is_default = (c.plan_m, c.hint) == (default.plan_m, default.hint)
            row = {**c.to_dict(), "default": is_default, "compile_s": round(r["seconds"], 3), "ok": False,
                   "ms": None, "error": r.get("error")}
            table.append(row)
            if not r["ok"]:
                logger.info("candidate %s did not build: %s", c.hint, r["error"])
                continue
            plan = make_plan(config, kind, c.plan_m)
            fn = r["entry"][1]
            out = torch.full((bucket, config.N), float("nan"), device=device).to(out_dtype) \
                if out_dtype.is_floating_point else torch.full((bucket, config.N), -12345, dtype=out_dtype,
                                                               device=device)
            try:
                fn(*kernel_args(plan, inputs, out))
                if cuda:
                    torch.cuda.synchronize()
                err = relative_error(out, ref)
            except Exception as e:  # noqa: BLE001 - a kernel that fails at run time is dropped
                row["error"] = f"run: {e}"[:500]
                logger.warning("candidate %s failed to run: %s", c.hint, e)
                continue
            if not err <= tol:
                row["error"] = f"wrong result: relative error {err:.3g} > {tol:g}"
                logger.warning("candidate %s gives a wrong result (relative error %.3g > %g); dropped",
                               c.hint, err, tol)
                continue
            sets = _weight_copies(plan, inputs, out, spec, cuda)
            ms = time_kernel(fn, sets, cuda, samples=15 if cuda else 5)
            row.update(ok=True, ms=ms, error=None)
            if best is None or ms < best:
                best, best_i = ms, i
            if bar is not None:
                bar.set_postfix_str(f"m={bucket} best={best * 1e3:.1f}us")
        if best_i is None:
            raise RuntimeError(f"tuning bucket m={bucket} of {config}: no candidate built and passed the check "
                               f"(first error: {next((r['error'] for r in table if r['error']), None)})")
        d_row = next(r for r in table if r["default"])
        win = chosen[best_i]
        res = TuneResult(bucket, win.plan_m, win.hint, best, d_row["ms"], time.perf_counter() - t_start, False, table,
                         entry=built[best_i]["entry"])
        if built[best_i].get("path"):
            keep = tempfile.mkdtemp(prefix="bitblas_best_")
            res.path = shutil.copy(built[best_i]["path"], os.path.join(keep, "kernel.so"))
        logger.info("bucket %d: best %s %.4f ms, default %.4f ms (%.2fx), %d/%d candidates ok, %.1f s", bucket,
                    win.hint, best, d_row["ms"] or float("nan"), res.speedup or float("nan"),
                    sum(r["ok"] for r in table), len(table), res.seconds)
        return res
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# -- an operator ---------------------------------------------------------------------------------
def composite_serves(config: MatmulConfig, kind: str, bucket: int, target=None) -> Optional[str]:
    """Why ``bucket`` is left to the decode-then-GEMM path (:mod:`bitblas.ops.dequant_gemm`), or None.

    An untuned operator runs rows >= ``DEQUANT_GEMM_MIN_ROWS`` of quantized weights on sm_90 (a
    kernel symbolic in M for them) as decode + dense wgmma GEMM, which is 2.5-6x faster than the
    fused kernels this tuner can pick from (H200, W4A16 4096^2: 27-67 µs vs 150-165 µs from 64 to
    1024 rows). A tuned entry takes priority in dispatch, so tuning such a bucket would replace the
    fast path with a slower kernel: the tuner leaves it untuned (Matmul._choose's rule)."""
    from ..build import cuda_target
    from ..ops.dequant_gemm import DEQUANT_GEMM_MIN_ROWS, dequant_gemm_reason
    if kind != "cuda" or bucket < DEQUANT_GEMM_MIN_ROWS:
        return None
    tgt = cuda_target(target)
    if gemv_rows(config, kind, bucket, tgt):  # the GEMV serves these rows (up to 64)
        return None
    m = default_rows(config, kind, bucket, tgt)
    if dequant_gemm_reason(make_plan(config, kind, m), tgt) is not None:
        return None
    return (f"rows {bucket} run as decode + wgmma GEMM (bitblas.ops.dequant_gemm), faster than the "
            "fused kernels the tuner searches; left untuned")


def _load_cached(config, kind, rec, target) -> TuneResult:
    """The result of a tuning record, its kernel loaded into the kernel cache (rebuilt if its file is gone)."""
    hint = hint_from_dict(rec["hint"])
    plan = make_plan(config, kind, rec["m"])
    _kernels.get_kernel(plan, hint, target, persist=True)
    return TuneResult(rec["bucket"], rec["m"], hint, rec["latency_ms"], rec.get("default_latency_ms"),
                      rec.get("tune_seconds", 0.0), True, rec.get("candidates", []))


def _from_database(config, kind, bucket, db, key, target) -> Optional[TuneResult]:
    """The stored result of ``bucket`` with its kernel loaded, or None (none stored, or it does not load)."""
    rec = db.get("tuning", key)
    if rec is None:
        return None
    try:
        res = _load_cached(config, kind, rec, target)
    except Exception as e:  # noqa: BLE001 - a broken entry is re-tuned, not fatal
        logger.warning("bitblas cache: tuning entry for m=%d does not load (%s); re-tuning", bucket, e)
        return None
    logger.info("bucket %d: %s from the database (%.4f ms)", bucket, res.hint, res.latency_ms)
    return res


def _store(config, kind, res, key, target, db) -> None:
    """Put the winner's kernel in the kernel cache (memory; disk when ``db``) and the result in ``db``."""
    from ..build import cpu_target, cuda_target
    tgt = cuda_target(target) if kind == "cuda" else cpu_target()
    plan = make_plan(config, kind, res.plan_m)
    tdesc = _kernels.target_desc(kind, tgt)
    path, tmp = res.path, None
    try:
        _kernels.remember(plan, res.hint, tdesc, res.entry)
        if db is None:
            return
        if path is None:                           # built in this process: export it now
            tmp = tempfile.mkdtemp(prefix="bitblas_export_")
            path = os.path.join(tmp, "kernel.so")
            if not _kernels.export(res.entry[0], path, kind):
                path = None
        if path is not None:
            _kernels.store_kernel_file(plan, res.hint, tdesc, path)
        db.put("tuning", key, res.payload())        # an unwritable database: warned once, kept in memory
    finally:
        for p in (tmp, os.path.dirname(res.path) if res.path else None):
            if p:
                shutil.rmtree(p, ignore_errors=True)


def tune(config: MatmulConfig, kind: str, buckets: Sequence[int], target=None, topk: int = 20,
         parallel: bool = True, force: bool = False, progress: Optional[bool] = None) -> Dict[int, TuneResult]:
    """Tune every bucket of an operator, or load the result from the database.

    Returns {bucket: TuneResult}; each result's kernel is in the kernel cache (memory and, where
    the host can export libraries, disk), so ``get_kernel(plan(result.plan_m), result.hint)``
    returns it without compiling. ``force``: tune even when the database has a result. A bucket
    that the decode-then-GEMM path serves (see :func:`composite_serves`) is not tuned: its result
    has ``skipped`` set (the reason) and no hint.
    """
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"kind={kind!r} is invalid; accepted: 'cpu', 'cuda'")
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"topk={topk!r} is invalid; accepted: an int >= 1")
    spec = None
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("tuning CUDA kernels needs a visible GPU to measure on (none found); "
                               "tune on the GPU host, or pass kind='cpu' for the CPU backend")
        from ..hardware import query_device
        spec = query_device()
    ddesc = device_desc(kind, target, spec)
    db = get_database()
    table = BucketTable(sorted(buckets))
    results: Dict[int, TuneResult] = {}
    bar = None
    try:
        for b in buckets:
            why = composite_serves(config, kind, b, target)
            if why is not None:
                logger.info("bucket %d: %s", b, why)
                results[b] = TuneResult(b, None, None, None, None, 0.0, False, skipped=why)
                continue
            key = tuning_key(config, kind, b, ddesc)
            # a stored result is read without the lock (records are replaced atomically; a database
            # this process cannot write is still read); tuning holds the key's lock, and looks again
            # under it in case another process tuned the bucket meanwhile
            res = None if (force or db is None) else _from_database(config, kind, b, db, key, target)
            if res is None:
                with (db.lock("tuning", key) if db is not None else contextlib.nullcontext()):
                    res = None if (force or db is None) else _from_database(config, kind, b, db, key, target)
                    if res is None:
                        if bar is None:
                            bar = _progress(progress, config)
                        res = tune_bucket(config, kind, b, target, spec, topk, parallel, bar)
                        _store(config, kind, res, key, target, db)
            results[b] = res
            if isinstance(res.hint, GEMVHint) and config.dynamic:
                lo = table.range_of(b)[0]
                tops = {gemv_kernel_rows(config, kind, r, res.hint) for r in range(lo, b)}
                _gemv_rows(config, kind, sorted(tops - {res.plan_m}), res.hint, target, parallel, db)
    finally:
        if bar is not None:
            bar.close()
    return results


def _gemv_rows(config, kind, rows, hint, target, parallel, db) -> None:
    """The kernels with a GEMV bucket's hint for the other row counts of its range (``rows``: the
    rows kernel's row counts, or the tops of the tensor-core kernel's classes). Build them now (in
    the workers), so no call compiles."""
    from ..build import cpu_target, cuda_target
    tgt = cuda_target(target) if kind == "cuda" else cpu_target()
    tdesc = _kernels.target_desc(kind, tgt)
    todo = []
    for r in rows:
        plan = make_plan(config, kind, r)
        key = _kernels.kernel_key(plan, hint, tdesc)
        if _kernels.in_memory(key):
            continue
        rec = db.get("kernel", key) if db is not None else None
        if rec is not None:
            _kernels.get_kernel(plan, hint, target)          # a disk hit: loads, no compile
            continue
        todo.append(Candidate(r, hint))
    if not todo:
        return
    workdir = tempfile.mkdtemp(prefix="bitblas_rows_")
    try:
        for c, r in zip(todo, _compile_all(config, kind, todo, tgt, parallel, None, workdir)):
            if not r["ok"]:
                logger.warning("GEMV kernel for %d rows did not build (%s); that row count uses the default",
                               c.plan_m, r["error"])
                continue
            plan = make_plan(config, kind, c.plan_m)
            _kernels.remember(plan, hint, tdesc, r["entry"])
            if db is not None and r.get("path"):
                _kernels.store_kernel_file(plan, hint, tdesc, r["path"])
            elif db is not None:              # one kernel compiles in this process (no worker's file)
                _kernels.store_built(plan, hint, tdesc, r["entry"][0])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _progress(progress, config):
    from .progress import progress_bar
    return progress_bar(enabled=progress, total=0, unit="kernel", leave=False,
                        desc=f"tuning {config.A_dtype}x{config.W_dtype} N={config.N} K={config.K}")
