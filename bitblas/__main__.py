"""`python -m bitblas`: the W4A16 demo (GPU if present, else CPU).

`python -m bitblas tune --workloads FILE --formats uint4:g128:zeros ...`: pre-tune every weight
matmul of a captured workload into the database (see bitblas.tune.cli).
"""
from __future__ import annotations

import argparse
import sys
import time


def demo(args) -> int:
    import torch

    import bitblas
    from bitblas.quantization import quantize
    from bitblas.reference import reference_matmul, relative_error, tolerance

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = bitblas.MatmulConfig(M=args.m, N=args.n, K=args.k, A_dtype="float16", W_dtype="uint4", group_size=128,
                               with_scaling=True, with_zeros=True, zeros_mode="original", out_dtype="float16")
    print(f"bitblas {bitblas.__version__}: W4A16 (uint4, group 128, fp16 scales and zeros), "
          f"M={args.m} N={args.n} K={args.k} on {device}")
    t0 = time.perf_counter()
    op = bitblas.Matmul(cfg)
    weight = torch.randn(args.n, args.k) * 0.05
    q = {k: v.to(device) for k, v in quantize(weight, cfg).items()}
    A = torch.randn(args.m, args.k, dtype=torch.float16, device=device)
    out = torch.full((args.m, args.n), float("nan"), dtype=torch.float16, device=device)
    op(A, **q, output=out)
    if device == "cuda":
        torch.cuda.synchronize()
    t_build = time.perf_counter() - t0
    ref = reference_matmul(cfg, A, **q)
    err = relative_error(out.cpu(), ref)
    w_err = (bitblas.quantization.dequantize(cfg, **{k: v.cpu() for k, v in q.items()}).float() - weight).abs().max()
    ms = op.profile_latency(m=args.m, device=device, flush_l2=True)
    ok = err <= tolerance(cfg)
    print(f"  first call (build + run): {t_build:.2f} s")
    print(f"  max |out - ref| / max |ref| = {err:.2e} (tolerance {tolerance(cfg):.0e}) -> {'OK' if ok else 'FAIL'}")
    print(f"  quantization max |w - dequant(w)| = {float(w_err):.2e}")
    print(f"  latency (median): {ms * 1e3:.1f} us")
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bitblas", description=__doc__)
    p.add_argument("command", nargs="?", default="demo", choices=["demo", "tune"])
    g = p.add_argument_group("demo")
    g.add_argument("--m", type=int, default=1)
    g.add_argument("--n", type=int, default=4096)
    g.add_argument("--k", type=int, default=4096)
    g.add_argument("--device", choices=["cpu", "cuda"], default=None)
    from bitblas.tune.cli import add_arguments, run_tune
    add_arguments(p.add_argument_group("tune"))
    args = p.parse_args(argv)
    if args.command == "tune":
        return run_tune(args)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
