"""Which kernel should serve 1..16 rows: the GEMV template or the tensor-core template?

For W4A16 (uint4, group 128, fp16 scales and zeros) it builds, per row count, the GEMV kernel
(static rows) and the tensor-core kernel (symbolic M, 32x128 tile), checks both against the
float64 reference, and times both beside fp16 cuBLAS with CUDA graphs over weight copies.

    python benchmark/small_m_routing.py --shapes 4096x4096,8192x8192 --m 1,4,8,12,16
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import copies_for, time_graph  # noqa: E402

import bitblas  # noqa: E402
from bitblas.build import build_plan  # noqa: E402
from bitblas.plan import make_plan  # noqa: E402
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance  # noqa: E402
from bitblas.schedule import MMAHint  # noqa: E402


def args_for(plan, inputs, out):
    return [out if s.role == "output" else inputs[s.name].view(torch.int8) if s.dtype == "int8" else inputs[s.name]
            for s in plan.args]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x4096,8192x8192")
    p.add_argument("--m", default="1,4,8,12,16")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rows_out = []
    print(f"{'N x K':>12} {'m':>3} {'gemv us':>8} {'mma us':>8} {'cublas us':>9} {'gemv err':>9} {'mma err':>9}")
    for shape in a.shapes.split(","):
        N, K = map(int, shape.split("x"))
        cfg = bitblas.MatmulConfig(M=None, N=N, K=K, W_dtype="uint4", group_size=128, with_scaling=True,
                                   with_zeros=True)
        mplan = make_plan(cfg, "cuda", None)
        mma = build_plan(mplan, hint=MMAHint(BM=32, BN=128, WM=32, WN=32, BK=32, stages=4))
        for m in map(int, a.m.split(",")):
            gplan = make_plan(cfg, "cuda", m)
            gemv = build_plan(gplan)
            inp = random_inputs(cfg, m, device="cuda", seed=m)
            ref = reference_matmul(cfg, **inp)
            errs = []
            for plan, fn in ((gplan, gemv), (mplan, mma)):
                out = torch.full((m, N), float("nan"), dtype=torch.float16, device="cuda")
                fn(*args_for(plan, inp, out))
                torch.cuda.synchronize()
                errs.append(relative_error(out.cpu(), ref))
            wbytes = inp["W"].numel() + inp["scale"].numel() * 2 + inp["zeros"].numel() * 2
            n = copies_for(wbytes)
            copies = [random_inputs(cfg, m, device="cuda", seed=100 + i) for i in range(n)]
            outs = [torch.empty(m, N, dtype=torch.float16, device="cuda") for _ in range(n)]
            t = {}
            for name, plan, fn in (("gemv", gplan, gemv), ("mma", mplan, mma)):
                calls = [(lambda c=c, o=o, plan=plan, fn=fn: fn(*args_for(plan, c, o))) for c, o in zip(copies, outs)]
                t[name] = time_graph(calls)
            wf = [torch.randn(N, K, dtype=torch.float16, device="cuda") for _ in range(copies_for(N * K * 2))]
            x = torch.randn(m, K, dtype=torch.float16, device="cuda")
            t["cublas"] = time_graph([(lambda w=w: torch.nn.functional.linear(x, w)) for w in wf])
            ok = all(e <= tolerance(cfg) for e in errs)
            print(f"{shape:>12} {m:>3} {t['gemv']:8.2f} {t['mma']:8.2f} {t['cublas']:9.2f} {errs[0]:9.1e} "
                  f"{errs[1]:9.1e} {'' if ok else 'WRONG'}")
            rows_out.append(dict(N=N, K=K, m=m, **{f"{k}_us": v for k, v in t.items()}, gemv_err=errs[0],
                                 mma_err=errs[1], ok=ok))
            del copies, outs, wf
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
