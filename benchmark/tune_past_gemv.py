"""Tuning past the GEMV on sm_90: what the tuner finds for the rows that run as the fused wgmma GEMM
or decode + wgmma GEMM (bitblas.tune.tuner.tune_bucket's ``past_gemv``), beside the untuned choice
and cuBLAS fp16 (benchmark/tuning.py's ``torch_fp16_ms``; int8 activations: ``torch._int_mm``, float8
ones: ``torch._scaled_mm``, benchmark/matmul.py's CUDA-graph timing), all in the same run, ours with the tuner's own timer
(bitblas.tune.measure.time_kernel: batches of launches, weight copies cycled past the L2); then the
tuned operator's output on fresh data (output poisoned first) against the reference.

    python -m benchmark.tune_past_gemv --formats w4a16-g128 --rows 128,256,1024,4096 --topk 12 --json out.json

Formats are benchmark.matmul's names; the operator is dynamic in M with the given rows as its buckets,
N = K = 8192 unless --shape says otherwise. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _short(h) -> str:
    if h is None:
        return "-"
    d = {k: v for k, v in vars(h).items() if k not in ("pdl", "raster_rows")}
    return type(h).__name__.replace("Hint", "") + str(tuple(d.values()))


def main(argv=None) -> int:
    from benchmark.matmul import FORMATS, bench_int_mm, bench_scaled_mm
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default="w4a16-g128", help=f"comma list of: {', '.join(FORMATS)}")
    ap.add_argument("--rows", default="128,256,1024,4096", help="the operator's M buckets")
    ap.add_argument("--shape", default="8192x8192", help="N x K")
    ap.add_argument("--topk", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch
    import bitblas
    from bitblas import MatmulConfig
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    from bitblas.hardware import query_device
    from benchmark.tuning import torch_fp16_ms
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    fmts = args.formats.split(",")
    unknown = [f for f in fmts if f not in FORMATS]
    if unknown:
        ap.error(f"unknown formats {unknown}")
    rows = [int(x) for x in args.rows.split(",")]
    N, K = (int(x) for x in args.shape.lower().split("x"))
    logging.getLogger("bitblas").setLevel(logging.WARNING)
    bitblas.set_database_path(tempfile.mkdtemp())          # tune afresh, not from a stored result
    spec = query_device()
    print(torch.cuda.get_device_name(), "commit", os.environ.get("BITBLAS_COMMIT"), "topk", args.topk, flush=True)

    out = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("BITBLAS_COMMIT"),
           "argv": sys.argv[1:] if argv is None else argv, "rows": []}
    for fname in fmts:
        cfg = MatmulConfig(M=rows, N=N, K=K, **FORMATS[fname])
        op = bitblas.Matmul(cfg)
        t0 = time.time()
        res = op.hardware_aware_finetune(topk=args.topk, progress=False)
        print(f"== {fname}: {len(rows)} buckets tuned in {time.time() - t0:.0f} s", flush=True)
        for b, r in sorted(res.items()):
            if cfg.A_dtype == "int8":           # int8 activations: torch._int_mm (CUDA graphs over weight copies)
                base_name, cub = "int_mm", bench_int_mm(N, K, b).get("us", float("nan"))
            elif cfg.A_dtype == "float8_e4m3":  # float8 activations: torch._scaled_mm (row-wise scales)
                base_name, cub = "scaled_mm", bench_scaled_mm(N, K, b).get("us", float("nan"))
            else:
                base_name, cub = "cuBLAS", 1e3 * torch_fp16_ms(b, N, K, spec)
            ok = sorted([x for x in r.candidates if x.get("ok")], key=lambda x: x["ms"])
            d = r.default_latency_ms * 1e3 if r.default_latency_ms else float("nan")
            t = r.latency_ms * 1e3 if r.latency_ms else float("nan")
            untuned = r.candidates[0].get("template", "fused-wgmma") if r.candidates else None
            print(f"{fname} m={b}: {'SKIPPED' if r.skipped else 'tuned'} {_short(r.hint)} {t:.1f} us | untuned "
                  f"({untuned}) {d:.1f} us | {base_name} {cub:.1f} us | tuned/{base_name} {cub / t:.2f}x, "
                  f"untuned/{base_name} {cub / d:.2f}x | {len(ok)} of {len(r.candidates)} ran | {r.seconds:.0f} s", flush=True)
            for x in ok[:4]:
                print(f"     {x['ms'] * 1e3:8.1f} us {x.get('template', '')} {x['hint']}", flush=True)
            out["rows"].append({"format": fname, "N": N, "K": K, "bucket": b, "tuned_us": t, "untuned_us": d,
                                "untuned": untuned, "baseline": base_name, "baseline_us": cub, "hint": r.hint and vars(r.hint),
                                "skipped": r.skipped, "candidates": r.candidates})
        for m in sorted({max(1, rows[0] - 28), rows[0] + 72, 1000, 3000, max(rows) + 904}):
            inp = random_inputs(cfg, m, device="cuda", seed=m)
            y = torch.full((m, N), float("nan"), dtype=getattr(torch, cfg.out_dtype), device="cuda")
            op(**inp, output=y)
            e = relative_error(y, reference_matmul(cfg, **inp))
            c = op.choice("cuda", m)
            print(f"   check m={m}: {c.template} tuned={c.tuned} rel err {e:.2e} (tol {tolerance(cfg):g}) "
                  f"{'OK' if e <= tolerance(cfg) else 'WRONG'}", flush=True)
            out["rows"].append({"format": fname, "check_rows": m, "kernel": c.template, "rel_err": e,
                                "ok": e <= tolerance(cfg)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
