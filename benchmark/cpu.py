"""CPU benchmark: bitblas.Matmul against torch's F.linear (float32, and bfloat16) on the same machine.

    python -m benchmark.cpu                                   # W4A16 g128 (with and without zeros), 4096^2,
                                                              # m = 1, 4, 16, on 1 and 2 threads
    python -m benchmark.cpu --formats w4a16-g128,nf4-g128 --shapes 4096x4096,11008x4096 --m 1 \
        --threads 1 --rounds 9 --json cpu.json

For each thread count (``bitblas.set_cpu_threads`` and ``torch.set_num_threads``), each row times
our operator (``Matmul(M=None)`` bound to its weights, the call ``bitblas.Linear`` makes) and the
torch baselines *interleaved*: every round takes one sample of each, a sample being the mean of
enough back-to-back calls to last ~``--sample-ms``; the table shows the median over rounds. The
calls cycle over copies of each weight whose bytes together exceed twice the last-level cache
(``--hot``: one copy), so every implementation reads its weights from memory, as in a model whose
layers do not fit the cache. Shared machines are noisy: the load average at the start and end is
printed and saved; compare rows from one run only.

Formats are benchmark.matmul's names (``w4a16-g128``: float16 activations, uint4 weights, group 128,
scales; ``-zeros``: and zero points). Results: a table, and ``--json`` (default benchmark_cpu.json)
with the machine, versions, commit, load and every sample.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

__all__ = ["main", "bench_row", "llc_bytes"]

DEFAULT_FORMATS = "w4a16-g128,w4a16-g128-zeros"


def llc_bytes() -> int:
    """Size of the largest CPU cache (bitblas.build.cpu_llc_bytes)."""
    from bitblas.build import cpu_llc_bytes
    return cpu_llc_bytes()


def _copies(nbytes: int, llc: int, hot: bool) -> int:
    return 1 if hot else max(1, min(64, math.ceil(2 * llc / max(nbytes, 1))))


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def _sampler(fns, sample_ms: float):
    """A zero-argument function returning one sample (ms per call) of cycling through ``fns``."""
    n_f = len(fns)
    t0 = time.perf_counter()
    for f in fns:                       # warm up: every copy once
        f()
    one = (time.perf_counter() - t0) * 1e3 / n_f
    calls = max(n_f, min(2000, int(sample_ms / max(one, 1e-3))))

    def sample():
        t = time.perf_counter()
        for i in range(calls):
            fns[i % n_f]()
        return (time.perf_counter() - t) * 1e3 / calls
    return sample


def bench_row(fmt: str, N: int, K: int, m: int, rounds: int, sample_ms: float, llc: int, hot: bool,
              bf16: bool = True, check: bool = True) -> dict:
    """One (format, shape, m) row on the current thread settings: medians in ms over ``rounds``."""
    import bitblas
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    from benchmark.matmul import FORMATS
    if fmt not in FORMATS:
        raise SystemExit(f"--formats: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    cfg = bitblas.MatmulConfig(M=None, N=N, K=K, **FORMATS[fmt])
    op = bitblas.Matmul(cfg, target="llvm")
    inp = random_inputs(cfg, m, seed=0)
    A = inp.pop("A")
    a_scale = inp.pop("a_scale", None)
    wbytes = _nbytes(*inp.values())
    n_ours = _copies(wbytes, llc, hot)
    t0 = time.perf_counter()
    bound = [op.bind(**inp)] + [op.bind(**{k: v.clone() for k, v in inp.items()}) for _ in range(n_ours - 1)]
    out = bound[0](A, a_scale=a_scale) if a_scale is not None else bound[0](A)
    build_s = time.perf_counter() - t0
    err = None
    if check:
        err = relative_error(out, reference_matmul(cfg, A=A, a_scale=a_scale, **inp))
        if not err <= tolerance(cfg):
            raise RuntimeError(f"{fmt} {N}x{K} m={m}: relative error {err:.3g} > {tolerance(cfg):g}")
    if a_scale is not None:
        ours = [lambda b=b: b(A, a_scale=a_scale) for b in bound]
    else:
        ours = [lambda b=b: b(A) for b in bound]
    impls = {"bitblas": ours}
    gen = torch.Generator().manual_seed(1)
    base_dtypes = [("torch_fp32", torch.float32)] + ([("torch_bf16", torch.bfloat16)] if bf16 else [])
    for name, dt in base_dtypes:
        w = torch.randn(N, K, generator=gen).to(dt)
        ws = [w] + [w.clone() for _ in range(_copies(_nbytes(w), llc, hot) - 1)]
        a = torch.randn(m, K, generator=gen).to(dt)
        impls[name] = [lambda w=w, a=a: F.linear(a, w) for w in ws]
    samplers = {k: _sampler(v, sample_ms) for k, v in impls.items()}
    samples = {k: [] for k in impls}
    for _ in range(rounds):                     # interleaved: one sample of each per round
        for k, s in samplers.items():
            samples[k].append(s())
    med = {k: statistics.median(v) for k, v in samples.items()}
    row = dict(format=fmt, N=N, K=K, m=m, bitblas_ms=med["bitblas"], torch_fp32_ms=med["torch_fp32"],
               torch_bf16_ms=med.get("torch_bf16"), speedup_vs_fp32=med["torch_fp32"] / med["bitblas"],
               weight_copies=n_ours, build_s=round(build_s, 3), rel_err=err, samples=samples)
    return row


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _load() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _fmt(v, w=9):
    return f"{v:{w}.3f}" if isinstance(v, float) else f"{'-':>{w}}"


def _header():
    print(f"{'thr':>3} {'format':<20} {'N':>6} {'K':>6} {'m':>4} {'bitblas':>9} {'fp32':>9} {'bf16':>9} {'x fp32':>7}"
          "   (ms per call, median)", flush=True)


def print_table(rows):
    _header()
    for r in rows:
        _line(r)


def _ints(text, what):
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{what}: comma-separated ints expected, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise SystemExit(f"{what}: positive ints expected, got {text!r}")
    return vals


def _shapes(text):
    out = []
    for s in text.split(","):
        try:
            n, k = s.lower().split("x")
            out.append((int(n), int(k)))
        except ValueError:
            raise SystemExit(f"--shapes: NxK pairs expected (e.g. 4096x4096), got {s!r}") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.cpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=DEFAULT_FORMATS,
                    help=f"benchmark.matmul format names (default {DEFAULT_FORMATS})")
    ap.add_argument("--shapes", default="4096x4096", help="NxK,... (default 4096x4096)")
    ap.add_argument("--m", default="1,4,16", help="rows (default 1,4,16)")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved samples per implementation (default 7)")
    ap.add_argument("--sample-ms", type=float, default=40.0, help="length of one sample (default 40 ms)")
    ap.add_argument("--hot", action="store_true", help="one weight copy (cache-resident when it fits)")
    ap.add_argument("--no-bf16", action="store_true", help="no torch bfloat16 baseline")
    ap.add_argument("--no-check", action="store_true", help="skip the reference check of our output")
    ap.add_argument("--json", default="benchmark_cpu.json", help="results file ('' for none)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds: at least 1")
    import bitblas
    import tvm
    threads, ms, shapes = _ints(args.threads, "--threads"), _ints(args.m, "--m"), _shapes(args.shapes)
    fmts = [f for f in args.formats.split(",") if f]
    llc = llc_bytes()
    meta = dict(cpu=_cpu_name(), cores=os.cpu_count(), physical_cores=bitblas.build.physical_cores(),
                llvm_target=str(bitblas.build.cpu_target()), llc_bytes=llc, torch=torch.__version__,
                tvm=tvm.__version__, bitblas=bitblas.__version__, commit=_commit(), argv=sys.argv,
                hot=args.hot, rounds=args.rounds, load_start=_load())
    print(f"{meta['cpu']}, {meta['cores']} CPUs ({meta['physical_cores']} cores), LLC {llc >> 20} MB, "
          f"{'one weight copy' if args.hot else 'weights cycled past 2x the LLC'}; load {meta['load_start']}")
    rows = []
    _header()
    torch_threads = torch.get_num_threads()
    try:
        for n_thr in threads:
            bitblas.set_cpu_threads(n_thr)
            torch.set_num_threads(n_thr)
            for fmt in fmts:
                for N, K in shapes:
                    for m in ms:
                        r = bench_row(fmt, N, K, m, args.rounds, args.sample_ms, llc, args.hot, not args.no_bf16,
                                      not args.no_check)
                        r["threads"] = n_thr
                        rows.append(r)
                        _line(r)
                        if args.json:
                            _save(args.json, meta, rows)
    finally:                                    # the caller's thread counts (when called from Python)
        torch.set_num_threads(torch_threads)
        bitblas.set_cpu_threads(bitblas.env.cpu_threads() or bitblas.build.physical_cores())
    meta["load_end"] = _load()
    print()
    print_table(rows)
    print(f"load average: start {meta['load_start']}, end {meta['load_end']}")
    if args.json:
        _save(args.json, meta, rows)
        print(f"saved {args.json}")
    return 0


def _line(r):
    print(f"{r['threads']:>3} {r['format']:<20} {r['N']:>6} {r['K']:>6} {r['m']:>4} {_fmt(r['bitblas_ms'])} "
          f"{_fmt(r['torch_fp32_ms'])} {_fmt(r['torch_bf16_ms'])} {r['speedup_vs_fp32']:>6.2f}x", flush=True)


def _save(path, meta, rows):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
