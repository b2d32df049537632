"""Benchmark the NVFP4 x NVFP4 kernels of issue 25 on the GPU (H200 / H100), printing each row as
it finishes:

    python -m benchmark.nvfp4                 # the batched GEMV, its hint sweep, the GEMM and W-only rows
    python -m benchmark.nvfp4 --no-sweep --no-gemm --json out.json

* Batched GEMV, ``bitblas.ops.nvfp4_gemv`` on the issue's permuted layouts, shapes (M, K, L) =
  (7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4): µs per call with CUDA graphs over enough
  input copies (a, b, sfa, sfb, c) that they exceed the 60 MB L2 four times, the byte floor (bytes
  moved / 4.25 TB/s, the issue's H200 copy rate), our / floor, and ``here``: our / the floor at this
  GPU's copy rate, measured at the start (an H100's is lower than an H200's),
  and the torch baseline of the same run: decode a and b to float16, then ``torch.bmm``. The
  geometric mean of our / floor closes the table. ``--sweep`` (default on) also times a few GEMV
  hints per shape (NVFP4GemvHint fields in the row), so the default can be chosen from data.
* NVFP4 x NVFP4 GEMM, ``Matmul`` M=4096, N=K=8192 (decode both to float16, the wgmma GEMM) against
  cuBLAS float16 (``torch.mm``) on the same shape (``--gemm``, default on).
* NVFP4 weights x float16 activations, M=1, N=K=8192 (benchmark/matmul.py's row; floor 8.9 µs).

Every timed kernel's output is checked against the float32 torch reference first.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmark.timing import copies_for, copy_bandwidth, time_graph  # noqa: E402

SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)]
HBM_TBPS = 4.25                 # the measured copy rate (H200)
MEASURED_TBPS = HBM_TBPS        # this GPU's copy rate, measured by main()
SWEEP = [dict(rows_per_warp=4, warps=8, unroll=1, stages=3), dict(rows_per_warp=2, warps=4, unroll=2, stages=2),
         dict(rows_per_warp=1, warps=8, unroll=1, stages=4), dict(rows_per_warp=4, warps=4, unroll=1, stages=3),
         dict(rows_per_warp=2, warps=8, unroll=2, stages=2)]


def _inputs(M, K, L, gen):
    """One copy of the workload in the issue's layouts (permutes of [L, ., .] tensors, b / sfb padded
    to 128 rows), random codes, scales 2**-4 .. 2**2 (no overflow of the float16 output)."""
    dev = "cuda"
    a = torch.randint(0, 256, (L, M, K // 2), dtype=torch.uint8, device=dev, generator=gen).permute(1, 2, 0)
    b = torch.randint(0, 256, (L, 128, K // 2), dtype=torch.uint8, device=dev, generator=gen).permute(1, 2, 0)

    def scales(rows):
        s = torch.randint(0x18, 0x48, (L, rows, K // 16), dtype=torch.uint8, device=dev, generator=gen)
        return s.view(torch.float8_e4m3fn).permute(1, 2, 0)
    c = torch.empty((L, M, 1), dtype=torch.float16, device=dev).permute(1, 2, 0)
    return dict(a=a, b=b, sfa=scales(M), sfb=scales(128), c=c)


def gemv_bytes(M, K, L) -> int:
    """Bytes the batched GEMV must move: a and its scales, row 0 of b and its scales, c."""
    return L * (M * K // 2 + M * K // 16 + K // 2 + K // 16 + 2 * M)


def _torch_baseline(x):
    """Decode a and row 0 of b to float16 with torch ops, then torch.bmm."""
    from bitblas.quantization import nvfp4_decode
    af = nvfp4_decode(x["a"].permute(2, 0, 1), x["sfa"].permute(2, 0, 1), dtype=torch.float16)   # [L, M, K]
    bf = nvfp4_decode(x["b"][:1].permute(2, 0, 1), x["sfb"][:1].permute(2, 0, 1), dtype=torch.float16)
    return torch.bmm(af, bf.transpose(1, 2))                                                    # [L, M, 1]


def _err(out, ref) -> float:
    from bitblas.reference import relative_error
    return relative_error(out, ref)


def bench_gemv(M, K, L, sweep: bool, emit):
    from bitblas.ops import nvfp4_gemv
    from bitblas.ops.nvfp4_entry import _gemv_op
    from bitblas.reference import reference_nvfp4_gemv
    from bitblas.schedule.nvfp4 import NVFP4GemvHint
    gen = torch.Generator(device="cuda").manual_seed(M * 31 + K * 7 + L)
    nbytes = gemv_bytes(M, K, L)
    copies = [_inputs(M, K, L, gen) for _ in range(copies_for(nbytes))]
    floor_us = nbytes / (HBM_TBPS * 1e12) * 1e6
    x0 = copies[0]
    t0 = time.perf_counter()
    nvfp4_gemv(**x0)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    ref = reference_nvfp4_gemv(x0["a"], x0["b"], x0["sfa"], x0["sfb"])
    err = _err(x0["c"], ref)
    us = time_graph([lambda x=x: nvfp4_gemv(**x) for x in copies])
    base = _torch_baseline(x0)
    base_err = _err(base.permute(1, 2, 0), ref)
    base_us = time_graph([lambda x=x: _torch_baseline(x) for x in copies])
    from bitblas.kernels import default_hint
    op = _gemv_op(M, K, "float16", x0["a"].device)
    dh = default_hint(op._nv.gemv_plan(1), op.target)
    here_us = nbytes / (MEASURED_TBPS * 1e12) * 1e6
    emit(dict(kind="gemv", M=M, K=K, L=L, hint="default " + _hint_text(dh), us=us, floor_us=floor_us,
              ratio=us / floor_us, floor_here_us=here_us, ratio_here=us / here_us, tbps=nbytes / us / 1e6, torch_us=base_us, vs_torch=base_us / us, rel_err=err,
              torch_rel_err=base_err, build_s=build_s, copies=len(copies)))
    if not sweep:
        return us / floor_us
    v = lambda t: t.view(torch.int8).permute(2, 0, 1)        # noqa: E731 - the kernels' [L, rows, .] views
    for kw in SWEEP:
        h = NVFP4GemvHint(**kw, pdl=dh.pdl)
        if h == dh:
            continue

        def call(x, h=h):
            op._nv.launch(v(x["b"])[:, :1], v(x["a"]), v(x["sfa"]), v(x["sfb"])[:, :1], None, None,
                          x["c"].permute(2, 1, 0), hint=h)
        try:
            x0["c"].fill_(float("nan"))
            call(x0)
            torch.cuda.synchronize()
            e = _err(x0["c"], ref)
            hu = time_graph([lambda x=x: call(x) for x in copies])
        except Exception as ex:  # noqa: BLE001 - a hint that does not build: report and go on
            emit(dict(kind="gemv-hint", M=M, K=K, L=L, hint=_hint_text(h), error=str(ex).splitlines()[0][:160]))
            continue
        emit(dict(kind="gemv-hint", M=M, K=K, L=L, hint=_hint_text(h), us=hu, floor_us=floor_us, ratio=hu / floor_us,
                  rel_err=e))
    return us / floor_us


def _hint_text(h) -> str:
    return (f"R{h.rows_per_warp}W{h.warps}U{h.unroll}S{h.stages}" + (f"B{h.min_blocks}" if h.min_blocks else "")
            + (f"P{h.l2_prefetch}" if h.l2_prefetch else "") + ("+pdl" if h.pdl else ""))


def bench_gemm(M, N, K, emit):
    import bitblas
    from bitblas.reference import reference_matmul
    cfg = bitblas.MatmulConfig(M=None, N=N, K=K, A_dtype="nvfp4", W_dtype="nvfp4", group_size=16, with_scaling=True,
                               with_act_scaling=True)
    op = bitblas.Matmul(cfg)
    from bitblas.quantization import quantize_activation     # on the GPU: 8192^2 weights quantize in ms there
    W, sw, _ = quantize_activation(torch.randn(N, K, device="cuda") * 0.05, "nvfp4", global_scale=False)
    A, sa, _ = quantize_activation(torch.randn(M, K, device="cuda"), "nvfp4", global_scale=False)
    inp = dict(A=A, W=W, scale=sw, a_scale=sa)
    out = torch.empty(M, N, dtype=torch.float16, device="cuda")
    t0 = time.perf_counter()
    op(**inp, output=out)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    err = _err(out, reference_matmul(cfg, **inp, cast=False, device="cuda"))
    us = time_graph([lambda: op(**inp, output=out)], target_calls=20, trials=5)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randn(K, N, device="cuda", dtype=torch.float16)
    cu = time_graph([lambda: torch.mm(a, w)], target_calls=20, trials=5)
    # cuBLAS on the same values (the decoded operands, W as [N, K] like ours): the tensor cores' clock
    # depends on the data, so randn alone is not quite the same workload
    from bitblas.quantization import nvfp4_decode
    ad, wd = nvfp4_decode(A, sa, dtype=torch.float16), nvfp4_decode(W, sw, dtype=torch.float16)
    cu_same = time_graph([lambda: torch.mm(ad, wd.t())], target_calls=20, trials=5)
    emit(dict(kind="gemm", M=M, N=N, K=K, path="decode+wgmma" if op._nv.uses_gemm(M) else "gemv-chunks", us=us,
              cublas_fp16_us=cu, vs_cublas=cu / us, cublas_same_data_us=cu_same, vs_cublas_same_data=cu_same / us,
              tflops=2 * M * N * K / us / 1e6, rel_err=err, build_s=build_s))


def bench_wonly(emit):
    from benchmark.matmul import bench_row
    row = bench_row("nvfp4-f16", "square-8k", 8192, 8192, 1)
    floor_us = (8192 * 8192 // 2 + 8192 * 8192 // 16 + 2 * 8192 * 2) / (HBM_TBPS * 1e12) * 1e6
    here_us = floor_us * HBM_TBPS / MEASURED_TBPS
    emit(dict(kind="w-only", fmt="nvfp4 x float16", M=1, N=8192, K=8192, kernel=row["kernel"], us=row["us"],
              floor_us=floor_us, ratio=row["us"] / floor_us, floor_here_us=here_us, ratio_here=row["us"] / here_us,
              rel_err=row["rel_err"]))


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['kind']:<10} M={r['M']} K={r['K']} L={r['L']} {r['hint']}: FAILED {r['error']}"
    if r["kind"] in ("gemv", "gemv-hint"):
        s = (f"{r['kind']:<10} M={r['M']:<5} K={r['K']:<6} L={r['L']:<2} {r['hint']:<22} {r['us']:8.2f} us  "
             f"floor {r['floor_us']:6.2f} us  x{r['ratio']:.2f}  err {r['rel_err']:.1e}")
        if r["kind"] == "gemv":
            s += f"  here x{r['ratio_here']:.2f} (floor {r['floor_here_us']:.2f} us)"
            s += (f"  | torch decode+bmm {r['torch_us']:8.2f} us (ours {r['vs_torch']:.1f}x faster)  "
                  f"{r['tbps']:.2f} TB/s  build {r['build_s']:.1f} s")
        return s
    if r["kind"] == "gemm":
        return (f"gemm       M={r['M']} N={r['N']} K={r['K']} {r['path']}: {r['us']:.1f} us ({r['tflops']:.0f} TFLOP/s)"
                f"  cuBLAS fp16 {r['cublas_fp16_us']:.1f} us  ours/cuBLAS speed {r['vs_cublas']:.2f}x  "
                + (f"(cuBLAS on the decoded values {r['cublas_same_data_us']:.1f} us: "
                   f"{r['vs_cublas_same_data']:.2f}x)  " if "cublas_same_data_us" in r else "")
                + f"err {r['rel_err']:.1e}  build {r['build_s']:.1f} s")
    return (f"w-only     {r['fmt']} M=1 N=K=8192 {r['kernel']}: {r['us']:.2f} us  floor {r['floor_us']:.2f} us  "
            f"x{r['ratio']:.2f}  here x{r['ratio_here']:.2f}  err {r['rel_err']:.1e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="time only the default GEMV hint")
    ap.add_argument("--no-gemm", dest="gemm", action="store_false", help="skip the M=4096 GEMM row")
    ap.add_argument("--no-wonly", dest="wonly", action="store_false", help="skip the NVFP4-weight x fp16 row")
    ap.add_argument("--json", default="benchmark_nvfp4.json", help="rows so far, rewritten after each row")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmark.nvfp4 needs a CUDA GPU")
    from benchmark.matmul import run_info
    rows = []
    global MEASURED_TBPS
    MEASURED_TBPS = copy_bandwidth(1 << 29)
    # the run as benchmark.report lists it: device, versions, commit, date, command, copy rate
    meta = run_info(torch.cuda.get_device_name(), "cuda", list(sys.argv[1:] if argv is None else argv),
                    module="benchmark.nvfp4", copy_tbps=MEASURED_TBPS)

    def emit(r):
        rows.append(r)
        print(_line(r), flush=True)
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)

    print(f"{torch.cuda.get_device_name()}: measured copy rate {MEASURED_TBPS:.2f} TB/s "
          f"(floors use {HBM_TBPS} TB/s, the issue's H200 rate; 'here' uses this GPU's)", flush=True)
    ratios, ratios_here = [], []

    def guarded(what, fn, *a):
        """A row that fails (a kernel that does not build or run) is reported; the others still run."""
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001
            print(f"{what}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", flush=True)
            return None
    for M, K, L in SHAPES:
        r = guarded(f"gemv M={M} K={K} L={L}", bench_gemv, M, K, L, args.sweep, emit)
        if r is not None:
            ratios.append(r)
            ratios_here.append(r * MEASURED_TBPS / HBM_TBPS)     # time / (bytes / measured rate)
    if ratios:
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        gh = math.exp(sum(math.log(r) for r in ratios_here) / len(ratios_here))
        print(f"batched GEMV, default hint: geometric mean of time / floor over {len(ratios)} shapes = {gm:.3f} "
              f"at {HBM_TBPS} TB/s, {gh:.3f} at this GPU's measured {MEASURED_TBPS:.2f} TB/s (goal <= 1.15)",
              flush=True)
    if args.gemm:
        guarded("gemm", bench_gemm, 4096, 8192, 8192, emit)
    if args.wonly:
        guarded("w-only", bench_wonly, emit)


if __name__ == "__main__":
    main()
