"""Tuning on the GPU: tuning time, gain over the default hint, cache load in a second process,
dynamic-M dispatch. Writes JSON (stamped with commit and GPU) and prints markdown tables.

    python benchmark/tuning.py --out results/tuning.json [--topk 20] [--quick]

Shapes: W4A16 (uint4, group 128, fp16 scales and zeros, fp16 activations) N=K=4096 at
M = 1, 16, 128, 1024, 4096, and N=11008, K=4096 at M = 1. Beside each: torch fp16
``F.linear`` (cuBLAS) on the same shape from the same run. All times are medians of batches of
launches with weight copies cycled past the L2 (bitblas.tune.measure.time_kernel).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bitblas  # noqa: E402
from bitblas import MatmulConfig  # noqa: E402
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance  # noqa: E402
from bitblas.tune.measure import time_kernel  # noqa: E402

W4A16 = dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True)
SHAPES = [(m, 4096, 4096) for m in (1, 16, 128, 1024, 4096)] + [(1, 11008, 4096)]


def torch_fp16_ms(m, n, k, spec):
    a = torch.randn(m, k, dtype=torch.float16, device="cuda")
    w = torch.randn(n, k, dtype=torch.float16, device="cuda")
    out = torch.empty(m, n, dtype=torch.float16, device="cuda")
    copies = max(1, min(8, (2 * spec.l2_bytes) // (n * k * 2) + 1))
    sets = [[a, w if i == 0 else w.clone(), out] for i in range(copies)]
    return time_kernel(lambda a, w, o: torch.matmul(a, w.t(), out=o), sets, True)


_LOAD = """
    import json, time
    t_start = time.perf_counter()
    import bitblas, torch
    from bitblas import MatmulConfig
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    import bitblas.build as b
    calls = []
    orig = b.compile_plan
    b.compile_plan = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    torch.cuda.init()
    t_import = time.perf_counter() - t_start
    out = []
    for d in json.loads({cfgs!r}):
        cfg = MatmulConfig.from_dict(d)
        t0 = time.perf_counter()
        op = bitblas.Matmul(cfg, enable_tuning=True)
        dt = time.perf_counter() - t0
        m = cfg.M if isinstance(cfg.M, int) else 20
        inp = random_inputs(cfg, m, device="cuda")
        err = relative_error(op(**inp), reference_matmul(cfg, **inp))
        out.append({{"M": cfg.M, "N": cfg.N, "seconds": dt, "ok": err <= tolerance(cfg),
                     "cached": all(r.from_cache for r in op.tuning_results["cuda"].values() if r.skipped is None)}})
    print(json.dumps({{"import_s": t_import, "compiles": len(calls), "ops": out}}))
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="tuning.json")
    p.add_argument("--topk", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="two shapes, topk 6 (smoke test)")
    p.add_argument("--dynamic-topk", type=int, default=6)
    p.add_argument("--commit", default=None, help="commit to stamp (default: git rev-parse HEAD)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("bitblas.ops").setLevel(logging.WARNING)
    db = tempfile.mkdtemp(prefix="bitblas_bench_db_")
    bitblas.set_database_path(db)
    from bitblas.hardware import query_device
    spec = query_device()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=ROOT).stdout.strip()
    res = {"commit": commit, "gpu": spec.to_dict(), "torch": torch.__version__, "topk": args.topk, "shapes": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    shapes = SHAPES[:2] if args.quick else SHAPES
    topk = 6 if args.quick else args.topk
    t_first = None
    for m, n, k in shapes:
        cfg = MatmulConfig(M=m, N=n, K=k, **W4A16)
        op = bitblas.Matmul(cfg)
        row = {"M": m, "N": n, "K": k}
        try:
            t0 = time.perf_counter()
            r = op.hardware_aware_finetune(topk=topk)[m]
            row["tune_s"] = time.perf_counter() - t0
            t_first = t_first if t_first is not None else row["tune_s"]
            row.update(default_ms=r.default_latency_ms, tuned_ms=r.latency_ms, speedup=r.speedup,
                       hint=str(r.hint), candidates=len(r.candidates),
                       built=sum(1 for c in r.candidates if c["error"] is None or c["ok"]),
                       ok=sum(c["ok"] for c in r.candidates),
                       compile_s_max=max(c["compile_s"] for c in r.candidates))
            row["profile_ms"] = op.profile_latency(m=m, flush_l2=True)   # as the tuner times
            inp = random_inputs(cfg, m, device="cuda")
            row["rel_err"] = relative_error(op(**inp), reference_matmul(cfg, **inp, device="cuda"))
            row["torch_fp16_ms"] = torch_fp16_ms(m, n, k, spec)
        except Exception as e:  # noqa: BLE001 - keep going, report
            row["error"] = f"{type(e).__name__}: {e}"[:1000]
            logging.exception("shape %s failed", (m, n, k))
        res["shapes"].append(row)
        save()

    # dynamic M: default buckets
    try:
        cfg = MatmulConfig(M=None, N=4096, K=4096, **W4A16)
        op = bitblas.Matmul(cfg)
        t0 = time.perf_counter()
        rr = op.hardware_aware_finetune(topk=args.dynamic_topk)
        dyn = {"tune_s": time.perf_counter() - t0, "topk": args.dynamic_topk,
               "buckets": {b: {"hint": str(r.hint), "tuned_ms": r.latency_ms, "default_ms": r.default_latency_ms,
                               "skipped": r.skipped}
                           for b, r in rr.items()}}
        errs = {}
        for m in [1, 2, 3, 5, 8, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 256, 300, 512,
                  777, 1024, 1500, 2048, 3000, 4096, 4097, 5000]:
            inp = random_inputs(cfg, m, device="cuda")
            out = torch.full((m, cfg.N), float("nan"), dtype=torch.float16, device="cuda")
            op(**inp, output=out)
            errs[m] = relative_error(out, reference_matmul(cfg, **inp, device="cuda"))
        dyn["max_rel_err"] = max(errs.values())
        dyn["all_ok"] = all(e <= tolerance(cfg) for e in errs.values())
        # dispatch: op call (checks + dispatch + launch) vs the raw kernel, CPU time per call
        inp = random_inputs(cfg, 1, device="cuda")
        out = torch.empty(1, cfg.N, dtype=torch.float16, device="cuda")
        plan, fn = op._kernel("cuda", 1)
        from bitblas.tune.tuner import kernel_args
        args_ = kernel_args(plan, inp, out)
        for _ in range(50):
            op(**inp, output=out)
        torch.cuda.synchronize()
        import bitblas.build as bb
        orig, calls = bb.compile_plan, []
        bb.compile_plan = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
        op._by_rows.clear()
        t0 = time.perf_counter()
        for m in range(1, 5001):                  # first sight of every row count 1..5000
            op._kernel("cuda", m)
        dyn["first_sight_us"] = (time.perf_counter() - t0) / 5000 * 1e6
        dyn["compiles_for_m_1_to_5000"] = len(calls)
        bb.compile_plan = orig
        n = 20000
        t0 = time.perf_counter()
        for i in range(n):
            op._kernel("cuda", 1 + i % 5000)
        dyn["dispatch_us"] = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(n):
            op(**inp, output=out)
        torch.cuda.synchronize()
        dyn["op_call_us"] = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args_)
        torch.cuda.synchronize()
        dyn["raw_kernel_call_us"] = (time.perf_counter() - t0) / n * 1e6
        res["dynamic"] = dyn
    except Exception as e:  # noqa: BLE001
        res["dynamic"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
        logging.exception("dynamic failed")
    save()

    # a second process loads the tuned operators (no compile)
    try:
        cfgs = [MatmulConfig(M=r["M"], N=r["N"], K=r["K"], **W4A16).to_dict() for r in res["shapes"][:4]
                if "error" not in r]
        cfgs.append(MatmulConfig(M=None, N=4096, K=4096, **W4A16).to_dict())
        env = dict(os.environ, BITBLAS_DATABASE_PATH=db)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD.format(cfgs=json.dumps(cfgs)))],
                           capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
        res["reload"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else \
            {"error": r.stderr[-3000:]}
    except Exception as e:  # noqa: BLE001
        res["reload"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    res["database_entries"] = len(bitblas.cache.list_entries())
    save()
    print(report(res))


def report(res) -> str:
    g = res["gpu"]
    lines = [f"GPU: {g['name']} ({g['arch']}, {g['sm_count']} SMs, L2 {g['l2_bytes'] >> 20} MB, "
             f"{g['dram_bandwidth'] / 1e12:.2f} TB/s), commit {res['commit']}, topk={res['topk']}", "",
             "| M | N | K | tune s | default µs | tuned µs | gain | torch fp16 µs | tuned hint | rel. err |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["shapes"]:
        if "error" in r:
            lines.append(f"| {r['M']} | {r['N']} | {r['K']} | error: {r['error'][:120]} |")
            continue
        lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['tune_s']:.1f} | {r['default_ms'] * 1e3:.1f} | "
                     f"{r['tuned_ms'] * 1e3:.1f} | {r['speedup']:.2f}x | {r['torch_fp16_ms'] * 1e3:.1f} | "
                     f"`{r['hint']}` | {r['rel_err']:.1e} |")
    d = res.get("dynamic", {})
    if "error" not in d and d:
        lines += ["", f"Dynamic M (default buckets, topk={d['topk']}): tuned in {d['tune_s']:.1f} s; every m checked "
                      f"correct: {d['all_ok']} (max rel. err {d['max_rel_err']:.1e}); first sight of each m 1..5000 "
                      f"{d['first_sight_us']:.1f} µs with {d['compiles_for_m_1_to_5000']} compiles; "
                      f"dispatch {d['dispatch_us']:.2f} µs, "
                      f"op call {d['op_call_us']:.1f} µs vs raw kernel call {d['raw_kernel_call_us']:.1f} µs "
                      "(CPU time)",
                  "", "| bucket | default µs | tuned µs | hint |", "|---|---|---|---|"]
        for b, x in d["buckets"].items():
            lines.append(f"| {b} | {x['default_ms'] * 1e3:.1f} | {x['tuned_ms'] * 1e3:.1f} | `{x['hint']}` |")
    else:
        lines.append(f"dynamic: {d}")
    lines += ["", f"Second process: {json.dumps(res.get('reload'))}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
