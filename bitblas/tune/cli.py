"""``python -m bitblas tune --workloads FILE --formats ...``: pre-tune every captured shape into the cache.

A workload file comes from :func:`bitblas.workload.capture` (torch) or
:func:`bitblas.workload.workload_from_module` (TVM). Each weight matmul (N, K, activation dtype,
bias) becomes one operator per ``--formats`` entry, its M buckets the row counts seen (``--buckets
default``: the default buckets); identical operators of several layers are tuned once. Results
land in the database (``--database`` or BITBLAS_DATABASE_PATH), so the operators load tuned later.

Format specs: ``W_dtype[:gN][:zeros[=original|rescale|quantized]][:noscale]``, e.g. ``uint4:g128:zeros``
(GPTQ-style W4A16), ``int4:g128``, ``int8``, ``nf4:g64``, ``float16`` (no quantization).
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import List, Optional

from ..config import MatmulConfig
from ..formats import FORMATS, WEIGHT_FORMATS

logger = logging.getLogger(__name__)

__all__ = ["parse_format", "configs_from_workload", "run_tune", "add_arguments"]


def parse_format(spec: str) -> dict:
    """MatmulConfig fields of a format spec (see the module docstring)."""
    parts = spec.split(":")
    w = parts[0]
    if w not in WEIGHT_FORMATS:
        raise ValueError(f"--formats: {spec!r}: unknown weight format {w!r}; accepted: {', '.join(WEIGHT_FORMATS)}")
    fmt = FORMATS[w]
    out = {"W_dtype": w, "with_scaling": fmt.scale in ("optional", "required") and fmt.kind != "float",
           "group_size": fmt.group_size or -1}
    for p in parts[1:]:
        if p.startswith("g") and p[1:].isdigit():
            out["group_size"] = int(p[1:])
        elif p == "zeros" or p.startswith("zeros="):
            out["with_zeros"] = True
            out["zeros_mode"] = p.split("=", 1)[1] if "=" in p else "original"
        elif p == "noscale":
            out["with_scaling"] = False
        else:
            raise ValueError(f"--formats: {spec!r}: unknown part {p!r}; accepted: gN, zeros[=mode], noscale")
    return out


def configs_from_workload(wl: dict, formats: List[str], a_dtype: str = "auto", buckets: str = "observed"):
    """([(MatmulConfig, format spec, [site names])], [skipped]) for every weight matmul of ``wl`` x
    format, deduplicated; a format a shape does not take (e.g. a group size not dividing K) is skipped."""
    fspecs = [(f, parse_format(f)) for f in formats]
    groups = {}
    for site in wl["workloads"]:
        if not site.get("weight") or not isinstance(site.get("N"), int) or not isinstance(site.get("K"), int):
            continue
        ad = site.get("A_dtype") if a_dtype == "auto" else a_dtype
        if ad not in ("float16", "bfloat16"):
            ad = "float16"                 # captured in float32 (e.g. on the CPU): tune for fp16 inference
        for fname, fields in fspecs:
            key = (site["N"], site["K"], ad, fname, bool(site.get("with_bias")))
            g = groups.setdefault(key, {"M": set(), "dynamic": False, "names": [], "fields": fields})
            ms = site.get("M")
            if ms is None:
                g["dynamic"] = True
            else:
                g["M"].update(int(m) for m in ms)
            g["names"].append(site["name"])
    out, skipped = [], []
    for (N, K, ad, fname, bias), g in groups.items():
        if buckets == "default" or g["dynamic"] or not g["M"]:
            M = None
        else:
            ms = sorted(g["M"])
            M = ms[0] if len(ms) == 1 else ms
        f = dict(g["fields"])
        if FORMATS[f["W_dtype"]].kind == "float" and f["W_dtype"] != ad:
            f["W_dtype"] = ad
        try:
            cfg = MatmulConfig(M=M, N=N, K=K, A_dtype=ad, out_dtype=ad, with_bias=bias, **f)
        except (ValueError, NotImplementedError) as e:
            skipped.append({"N": N, "K": K, "format": fname, "sites": g["names"], "reason": str(e)})
            continue
        out.append((cfg, fname, g["names"]))
    return out, skipped


def add_arguments(p) -> None:
    p.add_argument("--workloads", help="workload JSON file (bitblas.workload.capture / workload_from_module)")
    p.add_argument("--formats", nargs="+", default=["uint4:g128:zeros"],
                   help="weight format specs, e.g. uint4:g128:zeros int4:g128 int8 (default: uint4:g128:zeros)")
    p.add_argument("--a-dtype", default="auto", choices=["auto", "float16", "bfloat16"])
    p.add_argument("--topk", type=int, default=20)
    p.add_argument("--kind", choices=["cuda", "cpu"], default=None, help="default: cuda with a GPU, else cpu")
    p.add_argument("--buckets", choices=["observed", "default"], default="observed",
                   help="M buckets: the row counts seen (default), or bitblas's default buckets")
    p.add_argument("--database", default=None,
                   help="database folder (default: BITBLAS_DATABASE_PATH or ~/.cache/bitblas)")
    p.add_argument("--no-parallel", action="store_true", help="compile candidates in this process")
    p.add_argument("--force", action="store_true", help="re-tune entries already in the database")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="seconds per M bucket before it stops taking candidates (default: 60 on CPU, none on CUDA; "
                        "0: unbounded)")
    p.add_argument("--max-measure-rows", type=int, default=None, metavar="M",
                   help="CPU: time kernels on at most M rows (default 64)")
    p.add_argument("--json", default=None, help="also write the summary as JSON here")


def run_tune(args) -> int:
    import torch

    import bitblas
    from ..workload import load
    from .progress import progress_bar
    if not args.workloads:
        print("tune: --workloads FILE is required", file=sys.stderr)
        return 2
    if args.database:
        bitblas.set_database_path(args.database)
    try:
        wl = load(args.workloads)
        todo, skipped = configs_from_workload(wl, args.formats, args.a_dtype, args.buckets)
    except (OSError, ValueError, NotImplementedError) as e:
        print(f"tune: {e}", file=sys.stderr)
        return 2
    kind = args.kind or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"bitblas {bitblas.__version__}: tuning {len(todo)} operators from {args.workloads} for {kind} "
          f"(topk={args.topk}, database {bitblas.get_database_path()})")
    rows, failed = [], 0
    t_all = time.perf_counter()
    for cfg, fname, names in progress_bar(todo, desc="operators", unit="op"):
        t0 = time.perf_counter()
        try:
            op = bitblas.Matmul(cfg, target="llvm" if kind == "cpu" else None)
            bounds = {}
            if args.time_budget is not None:
                bounds["time_budget_s"] = args.time_budget or None
            if args.max_measure_rows is not None:
                bounds["max_measure_rows"] = args.max_measure_rows
            res = op.hardware_aware_finetune(topk=args.topk, parallel_build=not args.no_parallel, kind=kind,
                                             force=args.force, **bounds)
        except Exception as e:  # noqa: BLE001 - one operator failing does not stop the others
            failed += 1
            logger.error("tuning %s (%s) failed: %s", cfg, fname, e)
            rows.append({"N": cfg.N, "K": cfg.K, "format": fname, "bucket": None,
                         "error": f"{type(e).__name__}: {e}"[:300], "sites": names})
            continue
        for b, r in res.items():
            rows.append({"N": cfg.N, "K": cfg.K, "format": fname, "A_dtype": cfg.A_dtype, "bucket": b,
                         "hint": "Deq+WGMMA" if r.skipped else type(r.hint).__name__,
                         "default_ms": r.default_latency_ms, "tuned_ms": r.latency_ms,
                         "speedup": r.speedup, "cached": r.from_cache, "tune_s": r.seconds, "skipped": r.skipped,
                         "measured_rows": r.measured_rows,
                         "sites": names, "wall_s": time.perf_counter() - t0})
    _print_table(rows)
    if any(r.get("skipped") for r in rows):
        print("skipped buckets: their rows keep decode + wgmma GEMM (bitblas.dequant_gemm), which measured "
              "faster than every fused wgmma tile tried, or which no fused tile can replace (e.g. 8-bit codes with int8 "
              "activations)")
    for sk in skipped:
        print(f"skipped N={sk['N']} K={sk['K']} {sk['format']}: {sk['reason']}")
    print(f"{len(todo) - failed}/{len(todo)} operators tuned in {time.perf_counter() - t_all:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": kind, "workloads": args.workloads, "rows": rows, "skipped": skipped}, f, indent=1)
    return 1 if failed else 0


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _print_table(rows: List[dict]) -> None:
    head = f"{'N':>6} {'K':>6} {'format':<18} {'M bucket':>8} {'kernel':<10} {'default ms':>10} {'tuned ms':>9} " \
           f"{'speedup':>7} {'source':<7} sites"
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.get("error"):
            print(f"{r['N']:>6} {r['K']:>6} {r['format']:<18} {'-':>8} FAILED: {r['error']}")
            continue
        sites = ", ".join(r["sites"][:3]) + (f" (+{len(r['sites']) - 3})" if len(r["sites"]) > 3 else "")
        print(f"{r['N']:>6} {r['K']:>6} {r['format']:<18} {r['bucket']:>8} {r['hint'].replace('Hint', ''):<10} "
              f"{_fmt(r['default_ms'], '.4f'):>10} {_fmt(r['tuned_ms'], '.4f'):>9} {_fmt(r['speedup'], '.2f'):>7} "
              f"{'skipped' if r.get('skipped') else 'cache' if r['cached'] else 'tuned':<7} {sites}")


def main(argv: Optional[List[str]] = None) -> int:  # pragma: no cover - python -m bitblas tune
    import argparse
    p = argparse.ArgumentParser(prog="python -m bitblas tune")
    add_arguments(p)
    return run_tune(p.parse_args(argv))
