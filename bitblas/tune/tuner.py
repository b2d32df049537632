"""The tuner: candidates -> Roller-style ranking -> parallel compile -> reference check -> measure.

For each M bucket of an operator (see :mod:`bitblas.dispatch`):

1. every valid candidate of the templates that apply (:mod:`bitblas.tune.space`) is scored by the
   cost model (:mod:`bitblas.kernels.costmodel`, through each template) on the device's :class:`~bitblas.hardware.DeviceSpec`;
2. the ``topk`` best are kept, at most two per tile shape (so knobs such as stages and vector
   widths do not crowd out other tiles) and at least a quarter from each template when several
   apply (GEMV, mma.sync, wgmma); the default kernel of the bucket (the one an untuned operator
   runs for its rows) is always added;
3. they compile in spawned worker processes (:mod:`bitblas.tune.workers`), each to a shared library;
4. each is run once on random inputs of ``bucket`` rows and compared with the torch reference
   (tolerance table of :mod:`bitblas.reference`); wrong ones are dropped with a warning;
5. the rest are timed (:func:`~bitblas.tune.measure.time_kernel`: warm-up, batches of launches,
   median; weight copies cycled to exceed the L2) and the fastest is kept.

Bounds (the CPU is slow to measure and compile on): candidates are compiled, checked and measured
in rank order, a worker's batch at a time, and a bucket stops taking new batches once it has used
``time_budget_s`` (the default kernel is always measured; default budget: CPU
``CPU_TIME_BUDGET_S`` per bucket, CUDA none); the candidates it did not reach are listed as
such. On the CPU every candidate is symbolic in M, so a tuning run compiles each once for all its
buckets, and kernels are measured on at most ``max_measure_rows`` rows (default
``CPU_MEASURE_ROWS``; the time of these kernels grows linearly past a few row blocks, so their
order does not change): buckets above it share one measurement. ``TuneResult.measured_rows``
says on how many rows a bucket was timed.

Buckets past the GEMV whose rows an untuned operator runs as decode + wgmma GEMM or the fused
wgmma GEMM (quantized weights on sm_90, see :func:`composite_serves`) are tuned over the fused
GEMM's tiles only (the mma.sync tiles are several times slower there), against that untuned
choice, measured the same way: a fused tile is kept only where it measures faster. Where the
decode-then-GEMM path stays fastest, or no fused tile takes the config, the result carries
``skipped`` (the reason, with both times where measured) and no hint, and the rows keep the
untuned choice.

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
from ..dispatch import BucketTable
from ..plan import make_plan
from ..kernels import template_of
from ..kernels.select import DEQUANT_GEMM, composite_serves as _composite_serves, row_class, select
from ..schedule import hint_from_dict, hint_to_dict
from .space import estimate
from .measure import time_kernel
from .space import Candidate, candidates

logger = logging.getLogger(__name__)
_FUSED = "fused-wgmma"       # the template tuned past the GEMV (kernels/fused_wgmma.py)

__all__ = ["TuneResult", "tune", "tune_bucket", "select_topk", "device_desc", "tuning_key", "kernel_args",
           "composite_serves", "CPU_TIME_BUDGET_S", "CPU_MEASURE_ROWS"]

CPU_TIME_BUDGET_S = 60.0     # default time budget of a bucket on the CPU (seconds; None / 0: unbounded)
CPU_MEASURE_ROWS = 64        # CPU kernels (symbolic in M) are timed on at most this many rows


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
    measured_rows: Optional[int] = None  # rows the latencies were measured on (the bucket, or fewer on CPU)

    @property
    def speedup(self) -> Optional[float]:
        if not self.default_latency_ms or not self.latency_ms:
            return None
        return self.default_latency_ms / self.latency_ms

    def payload(self) -> dict:
        return {"bucket": self.bucket, "m": self.plan_m, "hint": None if self.hint is None else hint_to_dict(self.hint),
                "latency_ms": self.latency_ms, "default_latency_ms": self.default_latency_ms,
                "tune_seconds": self.seconds, "candidates": self.candidates, "skipped": self.skipped,
                "measured_rows": self.measured_rows if self.measured_rows is not None else self.bucket}


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
            "flags": _kernels.compile_flags(), "versions": _dbmod.versions()}


# -- ranking -------------------------------------------------------------------------------------
def _shape_key(hint):
    """The tile shape of a hint (its template's ``shape_key``; else the class and first field)."""
    t = template_of(hint)
    if hasattr(t, "shape_key"):
        return t.shape_key(hint)
    d = hint_to_dict(hint)
    return (d.pop("class"),) + tuple(sorted(d.items()))[:1]


def _family(hint) -> str:
    """The tuner family of a hint: its template's ``tune_family`` (the GEMV kernels: one family, the
    wgmma GEMV and the staged activation row each their own), else its class name."""
    try:
        t = template_of(hint)
    except TypeError:             # a hint of no registered template (a caller's own)
        return type(hint).__name__
    return t.tune_family(hint) if hasattr(t, "tune_family") else type(hint).__name__


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
        families.setdefault(_family(c.hint), []).append(c)
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
            args.append(torch.tensor(plan.table_values(spec.name), dtype=torch.float32, device=dev))
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


def cycled_copies(base: list, weights, spec, cuda: bool, flush: bool = True) -> List[list]:
    """Argument sets ``base`` with its tensors at positions ``weights`` (weights, scales, zeros)
    cloned often enough to exceed twice the L2 of ``spec`` (CUDA) or the CPU's last-level cache (at
    most 16 sets): cycled through, they make a timed kernel read its weights from memory (``flush``
    False, or no ``spec`` on CUDA: one set)."""
    if not flush or (cuda and spec is None):
        return [base]
    if cuda:
        cache = spec.l2_bytes
    else:
        from ..build import cpu_llc_bytes
        cache = cpu_llc_bytes()
    wbytes = sum(base[i].numel() * base[i].element_size() for i in weights)
    n = max(1, min(16, math.ceil(2 * cache / max(wbytes, 1))))
    return [base] + [[t.clone() if i in weights else t for i, t in enumerate(base)] for _ in range(n - 1)]


def weight_copies(plan, inputs, out, spec, cuda: bool, flush: bool = True) -> List[list]:
    """The kernel's argument sets (:func:`kernel_args`) cycling through copies of the weights
    (:func:`cycled_copies`)."""
    return cycled_copies(kernel_args(plan, inputs, out),
                         {i for i, s in enumerate(plan.args) if s.name in ("W", "scale", "zeros")}, spec, cuda, flush)


# -- one bucket ------------------------------------------------------------------------------------
def _compile_all(config, kind, cands, target, parallel, bar, workdir, first_index: int = 0) -> List[dict]:
    """Compile each candidate; returns one dict per candidate: ok, error, seconds, entry (module, fn).
    Worker-built libraries are ``workdir/cand<first_index + i>.so``."""
    tasks = []
    tgt_dict = target.export() if (target is not None and kind == "cuda") else None
    for i, c in enumerate(cands):
        tasks.append({"config": config.to_dict(), "kind": kind, "m": c.plan_m, "hint": hint_to_dict(c.hint),
                      "target": tgt_dict, "out": os.path.join(workdir, f"cand{first_index + i}.so")})
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
                parallel: bool = True, bar=None, time_budget_s: Optional[float] = None,
                measure_rows: Optional[int] = None, built: Optional[dict] = None,
                workdir: Optional[str] = None, past_gemv: Optional[str] = None) -> TuneResult:
    """Tune one bucket (no database access); the result carries the winner's kernel (``entry``)
    and, when a worker compiled it, a copy of its library (``path``).

    ``past_gemv``: the bucket's rows run past the GEMV (:func:`composite_serves`'s reason): only the
    fused wgmma GEMM's tiles are candidates, and the default measured is the untuned choice of the
    rows (the fused GEMM's default tile, or decode + wgmma GEMM). Where that decode-then-GEMM path
    measures fastest, or no fused tile takes the config, the result is ``skipped`` (no hint).

    ``time_budget_s``: stop taking new candidates (a worker's batch at a time, best ranked first,
    the default kernel always) once this many seconds have passed. ``measure_rows``: rows the
    candidates are checked and timed on (default ``bucket``; fewer only for kernels symbolic in M).
    ``built``: {(plan rows, hint): compile result} shared by the buckets of one run (``workdir``
    holds their libraries), so a candidate another bucket compiled is not compiled again."""
    from ..build import cpu_target, cuda_target
    from ..reference import random_inputs, reference_matmul, relative_error, tolerance
    t_start = time.perf_counter()
    cuda = kind == "cuda"
    tgt = cuda_target(target) if cuda else cpu_target()
    cores = os.cpu_count() or 1
    rows = bucket if measure_rows is None else measure_rows
    ranked = []
    for c in candidates(config, kind, bucket, spec):
        if past_gemv and template_of(c.hint).name != _FUSED:
            continue
        if c.plan_m is not None and rows != bucket:
            raise ValueError(f"measure_rows={measure_rows} != bucket {bucket} for a kernel of static rows")
        try:
            cost = estimate(make_plan(config, kind, c.plan_m), c.hint, rows, spec, cores)
        except (ArithmeticError, ValueError):
            cost = math.inf
        if math.isfinite(cost):
            ranked.append(Candidate(c.plan_m, c.hint, cost))
    ranked.sort(key=lambda c: c.cost)
    chosen = select_topk(ranked, topk) if ranked else []
    # what an untuned operator runs for these rows (bitblas.kernels.select; past the GEMV the fused
    # GEMM's default tile or decode + wgmma GEMM): e.g. a symbolic wgmma kernel with the tile class
    # of the row count, not the 128 x 256 tile of a symbolic plan
    from ..arch import arch_of
    if past_gemv and not ranked:
        return TuneResult(bucket, None, None, None, None, time.perf_counter() - t_start, False,
                          skipped=f"{past_gemv}; no fused wgmma tile takes this config")
    d_choice = select(config, kind, bucket, arch_of(tgt) if cuda else None, composite=bool(past_gemv))
    d_rows, d_hint = d_choice.rows, d_choice.hint
    d_plan = make_plan(config, kind, d_rows)
    dq = d_choice.template == DEQUANT_GEMM          # the default is decode + the dense wgmma GEMM
    default = Candidate(d_rows, d_hint, math.nan if dq else
                        estimate(d_plan, d_hint, rows, spec, cores) if (spec or not cuda) else 0.0)
    chosen = [c for c in chosen if (c.plan_m, c.hint) != (default.plan_m, default.hint)]
    chosen.insert(0, default)                     # measured first: a budget never leaves it out
    logger.info("bucket %d: %d candidates, measuring up to %d on %d rows%s", bucket, len(ranked), len(chosen), rows,
                f" (time budget {time_budget_s:g} s)" if time_budget_s else "")
    if bar is not None:
        bar.total = (bar.total or 0) + len(chosen)
        bar.set_postfix_str(f"m={bucket}")
    own_dir = workdir is None
    workdir = tempfile.mkdtemp(prefix="bitblas_tune_") if own_dir else workdir
    built = {} if built is None else built
    try:
        device = "cuda" if cuda else "cpu"
        inputs = ref = None              # made after the first compile (a compile failure needs no device)
        tol = tolerance(config)
        table = [{**c.to_dict(), "default": i == 0, "compile_s": None, "ok": False, "ms": None,
                  "error": "not measured: time budget"} for i, c in enumerate(chosen)]
        if dq:
            table[0]["template"] = DEQUANT_GEMM

        def key(i):
            c = chosen[i]
            return (DEQUANT_GEMM, c.plan_m, c.hint) if dq and i == 0 else (c.plan_m, c.hint)
        results: List[Optional[dict]] = [None] * len(chosen)
        best, best_i = None, None
        # without a budget: one batch (every candidate compiled at once); with one: the default
        # alone, then a worker's batch at a time
        step = len(chosen) if not time_budget_s else (max(1, _tune_workers()) if parallel else 1)
        done = 0
        while done < len(chosen):
            if done and time_budget_s and time.perf_counter() - t_start >= time_budget_s:
                logger.info("bucket %d: time budget of %g s reached after %d of %d candidates", bucket,
                            time_budget_s, done, len(chosen))
                if bar is not None:
                    bar.update(len(chosen) - done)
                break
            batch = list(range(done, min(len(chosen), done + (1 if done == 0 and time_budget_s else step))))
            done = batch[-1] + 1
            todo = [i for i in batch if key(i) not in built]
            if dq and 0 in todo:                      # decode + GEMM: two kernels, built here
                todo.remove(0)
                built[key(0)] = _dequant_gemm_entry(config, d_rows, d_hint, tgt)
            for i, r in zip(todo, _compile_all(config, kind, [chosen[i] for i in todo], tgt, parallel, None, workdir,
                                               len(built))):
                built[key(i)] = r
            for i in batch:
                c, row = chosen[i], table[i]
                r = results[i] = built[key(i)]
                row.update(compile_s=round(r["seconds"], 3) if i in todo else 0.0, error=r.get("error"))
                if bar is not None:
                    bar.update(1)
                if not r["ok"]:
                    logger.info("candidate %s did not build: %s", c.hint, r["error"])
                    continue
                plan = make_plan(config, kind, c.plan_m)
                fn = r["entry"][1]
                if inputs is None:
                    inputs = random_inputs(config, rows, device=device, seed=1234)
                    ref = reference_matmul(config, **inputs, cast=True, device=device)
                out_dtype = ref.dtype
                out = torch.full((rows, config.N), float("nan"), device=device).to(out_dtype) \
                    if out_dtype.is_floating_point else torch.full((rows, config.N), -12345, dtype=out_dtype,
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
                sets = weight_copies(plan, inputs, out, spec, cuda)
                ms = time_kernel(fn, sets, cuda, samples=15 if cuda else 5)
                row.update(ok=True, ms=ms, error=None)
                if best is None or ms < best:
                    best, best_i = ms, i
                if bar is not None:
                    bar.set_postfix_str(f"m={bucket} best={best * 1e3:.1f}us")
        if best_i is None:
            raise RuntimeError(f"tuning bucket m={bucket} of {config}: no candidate built and passed the check "
                               f"(first error: {next((r['error'] for r in table if r['error']), None)})")
        d_row = table[0]
        win = chosen[best_i]
        if dq and best_i == 0:
            fused = [r["ms"] for r in table[1:] if r["ok"]]
            why = (f"{past_gemv}; decode + wgmma GEMM measured fastest ({best * 1e3:.1f} us"
                   + (f", the best fused tile {min(fused) * 1e3:.1f} us)" if fused else ", no fused tile ran)"))
            logger.info("bucket %d: %s", bucket, why)
            return TuneResult(bucket, None, None, best, best, time.perf_counter() - t_start, False, table,
                              skipped=why, measured_rows=rows)
        res = TuneResult(bucket, win.plan_m, win.hint, best, d_row["ms"], time.perf_counter() - t_start, False, table,
                         entry=results[best_i]["entry"], measured_rows=rows)
        if results[best_i].get("path") and os.path.exists(results[best_i]["path"]):
            keep = tempfile.mkdtemp(prefix="bitblas_best_")
            res.path = shutil.copy(results[best_i]["path"], os.path.join(keep, "kernel.so"))
        logger.info("bucket %d: best %s %.4f ms, default %.4f ms (%.2fx), %d/%d candidates ok, %.1f s", bucket,
                    win.hint, best, d_row["ms"] or float("nan"), res.speedup or float("nan"),
                    sum(r["ok"] for r in table), len(table), res.seconds)
        return res
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)


def _dequant_gemm_entry(config, rows, hint, target) -> dict:
    """The decode-then-GEMM callable (``dequant_gemm.DequantGemm``) as a compile result."""
    from ..dequant_gemm import DequantGemm
    t0 = time.perf_counter()
    try:
        fn = DequantGemm(make_plan(config, "cuda", rows), target, hint=hint)
    except Exception as e:  # noqa: BLE001 - reported like a candidate that did not build
        msg = str(e).strip().splitlines()
        return {"ok": False, "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"[:500],
                "seconds": time.perf_counter() - t0, "path": None}
    return {"ok": True, "entry": (None, fn), "seconds": time.perf_counter() - t0, "error": None, "path": None}


def _tune_workers() -> int:
    from .. import env
    return env.tune_workers()


# -- an operator ---------------------------------------------------------------------------------
def composite_serves(config: MatmulConfig, kind: str, bucket: int, target=None) -> Optional[str]:
    """Why ``bucket``'s rows run past the GEMV (the fused wgmma GEMM or decode + wgmma GEMM), or None
    (:func:`bitblas.kernels.select.composite_serves`; ``target``: any target spelling, None: the
    local GPU / BITBLAS_TARGET). :func:`tune` tunes such a bucket over the fused GEMM's tiles only."""
    if kind != "cuda":
        return None
    from ..build import target_arch
    return _composite_serves(config, kind, bucket, target_arch(target))


def _load_cached(config, kind, rec, target) -> TuneResult:
    """The result of a tuning record, its kernel loaded into the kernel cache (rebuilt if its file is gone)."""
    hint = hint_from_dict(rec["hint"])
    plan = make_plan(config, kind, rec["m"])
    _kernels.get_kernel(plan, hint, target, persist=True)
    return TuneResult(rec["bucket"], rec["m"], hint, rec["latency_ms"], rec.get("default_latency_ms"),
                      rec.get("tune_seconds", 0.0), True, rec.get("candidates", []),
                      measured_rows=rec.get("measured_rows", rec["bucket"]))


def _from_database(config, kind, bucket, db, key, target) -> Optional[TuneResult]:
    """The stored result of ``bucket`` with its kernel loaded, or None (none stored, or it does not load)."""
    rec = db.get("tuning", key)
    if rec is None:
        return None
    if rec.get("skipped"):                 # measured: the untuned choice stays (no kernel to load)
        logger.info("bucket %d: from the database: %s", bucket, rec["skipped"])
        return TuneResult(rec["bucket"], None, None, rec["latency_ms"], rec.get("default_latency_ms"),
                          rec.get("tune_seconds", 0.0), True, rec.get("candidates", []), skipped=rec["skipped"],
                          measured_rows=rec.get("measured_rows", rec["bucket"]))
    try:
        res = _load_cached(config, kind, rec, target)
    except Exception as e:  # noqa: BLE001 - a broken entry is re-tuned, not fatal
        logger.warning("bitblas cache: tuning entry for m=%d does not load (%s); re-tuning", bucket, e)
        return None
    logger.info("bucket %d: %s from the database (%.4f ms)", bucket, res.hint, res.latency_ms)
    return res


def _store(config, kind, res, key, target, db) -> None:
    """Put the winner's kernel in the kernel cache (memory; disk when ``db``) and the result in ``db``
    (a skipped result only where it was measured: the others cost nothing to find again)."""
    from ..build import cpu_target, cuda_target
    if res.hint is None:
        if db is not None and res.latency_ms is not None:
            db.put("tuning", key, res.payload())
        return
    tgt = cuda_target(target) if kind == "cuda" else cpu_target()
    plan = make_plan(config, kind, res.plan_m)
    tdesc = _kernels.target_desc(kind, tgt)
    path, tmp = res.path, None
    try:
        _kernels.remember(plan, res.hint, tdesc, res.entry)
        if db is None:
            return
        if db.get("kernel", _kernels.kernel_key(plan, res.hint, tdesc)) is not None:
            path = None                            # stored already (another bucket of this run won with it)
        elif path is None:                         # built in this process: export it now
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


_DEFAULT = object()


def tune(config: MatmulConfig, kind: str, buckets: Sequence[int], target=None, topk: int = 20,
         parallel: bool = True, force: bool = False, progress: Optional[bool] = None,
         time_budget_s=_DEFAULT, max_measure_rows=_DEFAULT) -> Dict[int, TuneResult]:
    """Tune every bucket of an operator, or load the result from the database.

    Returns {bucket: TuneResult}; each result's kernel is in the kernel cache (memory and, where
    the host can export libraries, disk), so ``get_kernel(plan(result.plan_m), result.hint)``
    returns it without compiling. ``force``: tune even when the database has a result. A bucket
    past the GEMV (see :func:`composite_serves`) is tuned over the fused GEMM's tiles against its
    untuned choice; where that choice is decode + wgmma GEMM and stays fastest (or no fused tile
    takes the config) its result has ``skipped`` set (the reason) and no hint.

    ``time_budget_s``: seconds a bucket may spend on candidates before it stops taking new ones
    (default ``CPU_TIME_BUDGET_S`` on the CPU, unbounded on CUDA; None: unbounded).
    ``max_measure_rows``: kernels symbolic in M are timed on at most this many rows (default
    ``CPU_MEASURE_ROWS`` on the CPU, the bucket's rows on CUDA; None: the bucket's rows). Progress:
    a bar on a terminal (``progress`` None), else lines through the "bitblas.tune" logger.
    """
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"kind={kind!r} is invalid; accepted: 'cpu', 'cuda'")
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"topk={topk!r} is invalid; accepted: an int >= 1")
    if time_budget_s is _DEFAULT:
        time_budget_s = CPU_TIME_BUDGET_S if kind == "cpu" else None
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float))
                                      or not time_budget_s >= 0):
        raise ValueError(f"time_budget_s={time_budget_s!r} is invalid; accepted: seconds >= 0, or None (unbounded)")
    if max_measure_rows is _DEFAULT:
        max_measure_rows = CPU_MEASURE_ROWS if kind == "cpu" else None
    if max_measure_rows is not None and (isinstance(max_measure_rows, bool) or not isinstance(max_measure_rows, int)
                                         or max_measure_rows < 1):
        raise ValueError(f"max_measure_rows={max_measure_rows!r} is invalid; accepted: an int >= 1, or None")
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
    # CPU: every candidate is symbolic in M (static only for an int M): compile each once for the
    # whole run, and time buckets past max_measure_rows once
    shared = kind == "cpu" and not isinstance(config.M, int)
    built: Optional[dict] = {} if shared else None
    workdir = tempfile.mkdtemp(prefix="bitblas_tune_") if shared else None
    by_rows: Dict[int, TuneResult] = {}
    try:
        for b in buckets:
            past = composite_serves(config, kind, b, target)   # past the GEMV: the fused tiles against it
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
                            bar = _progress(progress, config, kind, len(buckets))
                        rows = min(b, max_measure_rows) if (shared and max_measure_rows) else b
                        if rows in by_rows:            # timed already (on the same rows): the same winner
                            prev = by_rows[rows]
                            res = TuneResult(b, prev.plan_m, prev.hint, prev.latency_ms, prev.default_latency_ms,
                                             0.0, False, prev.candidates, entry=prev.entry, measured_rows=rows)
                            logger.info("bucket %d: timed on %d rows like bucket %d: %s", b, rows, prev.bucket,
                                        res.hint)
                        else:
                            res = tune_bucket(config, kind, b, target, spec, topk, parallel, bar, time_budget_s,
                                              rows, built, workdir, past_gemv=past)
                            by_rows[rows] = res
                        _store(config, kind, res, key, target, db)
            results[b] = res
            if res.hint is None:                    # skipped: the rows keep the untuned choice
                continue
            if hasattr(template_of(res.hint), "kernel_rows") and config.dynamic:   # kernels per row class
                lo = table.range_of(b)[0]
                tops = {row_class(config, kind, r, res.hint) for r in range(lo, b)}
                _gemv_rows(config, kind, sorted(tops - {res.plan_m}), res.hint, target, parallel, db)
    finally:
        if bar is not None:
            bar.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
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


def _progress(progress, config, kind="cuda", n_buckets=0):
    """A bar on a terminal; else progress lines (INFO records of this module's logger, or stderr
    where INFO is off: see tune/progress.py)."""
    from .progress import progress_bar
    desc = f"tuning {config.A_dtype}x{config.W_dtype} N={config.N} K={config.K} ({kind}, {n_buckets} M buckets)"
    return progress_bar(enabled=progress, total=0, unit="kernel", leave=False, logger=logger, desc=desc)
