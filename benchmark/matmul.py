"""Benchmark bitblas.Matmul against torch baselines on LLM layer shapes (needs a CUDA GPU).

    python -m benchmark.matmul --formats w4a16-g128,w4a16-g128-zeros --shapes brief --m 1,16 \
        --json out.json --plot out.png

Each (format, shape, m) row times our kernel and the baselines with CUDA-graph replays that cycle
over enough weight copies to exceed the L2 (see benchmark/timing.py), and reports µs, achieved
TB/s (bytes: packed weights + scales + zeros + activations + output [+ bias]), TFLOP/s, and the
speed-up over fp16 cuBLAS (``torch.nn.functional.linear`` on a float16 [N, K] weight). 4-bit
formats also get ``torch._weight_int4pack_mm`` (bfloat16 activations, group 128) as a baseline;
``w8a8`` is compared with ``torch._int_mm`` and ``fp8`` with ``torch._scaled_mm`` (row-wise
scales) in the ``vs base`` column. Each row is printed as it finishes, under a progress bar, and
the rows so far are written to ``--json`` (default benchmark_matmul.json) after every row, so a run
cut short (Ctrl-C) keeps what it finished. ``--plot FILE.png`` draws time per call, grouped by layer
and m, with matplotlib (``pip install -e ".[plot]"``).
Inputs are random bit patterns / values on the GPU; ``--check`` (default on) compares our output
with bitblas.reference.reference_matmul (float64 dequantization, float32 product on the GPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmark.timing import copies_for, copy_bandwidth, time_graph, time_host  # noqa: E402

# Named formats: MatmulConfig fields (N, K, M are filled in per row).
FORMATS = {
    "fp16": dict(A_dtype="float16", W_dtype="float16"),
    "w8a16-chan": dict(A_dtype="float16", W_dtype="int8", with_scaling=True),
    "w8bf16-chan": dict(A_dtype="bfloat16", W_dtype="int8", with_scaling=True, out_dtype="bfloat16"),
    "fp8w-a16-chan": dict(A_dtype="float16", W_dtype="float8_e4m3", with_scaling=True),
    "w4a16-g128": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True),
    "w4a16-g128-zeros": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True,
                             with_zeros=True),
    "w4a16-int4-g128": dict(A_dtype="float16", W_dtype="int4", group_size=128, with_scaling=True),
    "w4a16-g128-qzeros": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True,
                              with_zeros=True, zeros_mode="quantized"),
    "w4bf16-g128-zeros": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=128, with_scaling=True,
                              with_zeros=True, out_dtype="bfloat16"),
    "w2a16-g128": dict(A_dtype="float16", W_dtype="int2", group_size=128, with_scaling=True),
    "w2a16-uint2-g128": dict(A_dtype="float16", W_dtype="uint2", group_size=128, with_scaling=True),
    # the int / uint formats above with float16 / int8 activations take Microsoft BitBLAS's
    # fast-decoding weight order (its default, Plan.w_order); these take the natural order, for the A/B
    "w4a16-g128-natural": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True,
                               fast_decoding=False),
    "w2a16-uint2-g128-natural": dict(A_dtype="float16", W_dtype="uint2", group_size=128, with_scaling=True,
                                     fast_decoding=False),
    "w1a16-g128": dict(A_dtype="float16", W_dtype="uint1", group_size=128, with_scaling=True, with_zeros=True,
                       zeros_mode="rescale"),
    "nf4-g128": dict(A_dtype="float16", W_dtype="nf4", group_size=128, with_scaling=True),
    "fp4-g128": dict(A_dtype="float16", W_dtype="fp4_e2m1", group_size=128, with_scaling=True),
    "nvfp4": dict(A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True, out_dtype="bfloat16"),
    "nvfp4-f16": dict(A_dtype="float16", W_dtype="nvfp4", group_size=16, with_scaling=True),
    "w8a8": dict(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True),
    "fp8": dict(A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True, with_act_scaling=True,
                out_dtype="bfloat16"),
    "w8a8-g128": dict(A_dtype="int8", W_dtype="int8", group_size=128, with_scaling=True, with_act_scaling=True),
    "w4a8-g128": dict(A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True),
    "w4a8-chan": dict(A_dtype="int8", W_dtype="int4", with_scaling=True, with_act_scaling=True),
    "w2a8-g128": dict(A_dtype="int8", W_dtype="int2", group_size=128, with_scaling=True, with_act_scaling=True),
    "w2a8-chan": dict(A_dtype="int8", W_dtype="int2", with_scaling=True, with_act_scaling=True),
    "fp8-g128": dict(A_dtype="float8_e4m3", W_dtype="float8_e4m3", group_size=128, with_scaling=True,
                     with_act_scaling=True, out_dtype="bfloat16"),
    # float8_e4m3 activations x integer codes (W4A-fp8, W2A-fp8)
    "w4afp8-g128": dict(A_dtype="float8_e4m3", W_dtype="int4", group_size=128, with_scaling=True,
                        with_act_scaling=True, out_dtype="bfloat16"),
    "w4afp8-chan": dict(A_dtype="float8_e4m3", W_dtype="int4", with_scaling=True, with_act_scaling=True,
                        out_dtype="bfloat16"),
    "w2afp8-chan": dict(A_dtype="float8_e4m3", W_dtype="int2", with_scaling=True, with_act_scaling=True,
                        out_dtype="bfloat16"),
}
# the torch baseline a format is compared with (ratio column): torch._int_mm for int8 activations,
# torch._scaled_mm for float8 ones, cuBLAS fp16 otherwise
BASELINE = {f: "int_mm" if kw["A_dtype"] == "int8" else "scaled_mm"
            for f, kw in FORMATS.items() if kw["A_dtype"] in ("int8", "float8_e4m3")}

# Named shape sets: (layer name, N, K) of LLM linear layers (N = output features).
SHAPES = {
    "brief": [("square-8k", 8192, 8192), ("mlp-up-70b", 28672, 8192)],
    "square8k": [("square-8k", 8192, 8192)],
    "up70b": [("mlp-up-70b", 28672, 8192)],
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
    "llama3-70b": [("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 57344, 8192), ("down", 8192, 28672)],
    "small": [("odd", 1000, 1536), ("4k", 4096, 4096)],
    "gemm4k": [("4k", 4096, 4096)],
    "n-sweep": [("n10240", 10240, 4096), ("n14336", 14336, 4096), ("n20480", 20480, 4096)],  # N between 8k and 28k
    "square-8k": [("square-8k", 8192, 8192)],
    "tiny": [("tiny", 256, 256)],        # the CPU smoke run (tests)
}


def _rand_arg(spec, rows, gen_dtype, device="cuda"):
    """A random tensor for one ArgSpec (plausible magnitudes; bit patterns for packed codes)."""
    from bitblas.plan import M_VAR
    from bitblas.quantization.quantize import TORCH_DTYPES
    shape = [rows if s == M_VAR else s for s in spec.shape]
    dt = TORCH_DTYPES[spec.user_dtype]
    if spec.name == "A":
        if dt.is_floating_point:
            return torch.randn(shape, device=device).to(dt)
        return torch.randint(-127, 128, shape, dtype=torch.int8, device=device)
    if spec.name == "W":
        if dt in (torch.float16, torch.bfloat16):
            return (torch.randn(shape, device=device) * 0.05).to(dt)
        if dt.is_floating_point:      # float8
            return (torch.randn(shape, device=device)).to(dt)
        return torch.randint(-128, 128, shape, dtype=torch.int8, device=device)
    if spec.name == "scale":
        if dt.is_floating_point and dt.itemsize == 1:
            return (torch.rand(shape, device=device) + 0.5).to(dt)
        return (torch.rand(shape, device=device) * 0.01 + 0.001).to(dt)
    if spec.name == "zeros":
        if dt == torch.int8:
            return torch.randint(-128, 128, shape, dtype=torch.int8, device=device)
        return (torch.rand(shape, device=device) * 4).to(dt)
    if spec.name == "bias":
        return (torch.randn(shape, device=device) * 0.1).to(dt)
    if spec.name == "a_scale":
        return torch.rand(shape, device=device) * 0.01 + 0.001
    if spec.name == "global_scale":
        return torch.ones(shape, device=device)
    raise KeyError(spec.name)


def _nbytes(t):
    return t.numel() * t.element_size()


def row_plan(op, device: str, m: int):
    """The plan a row's kernels are built on: the operator's own where it is symbolic in M (a dynamic-M
    operator's bucket kernels past the GEMV), so that a ``--hints`` row times the same kind of kernel
    as the default row beside it (a kernel built for exactly m rows can differ by several percent:
    W4A8 g128's fused tile with 6 weight slots at 128 rows, H200, 1.05x faster static, 0.94x
    symbolic); else the plan for exactly ``m`` rows (the GEMV's rows, a static-M operator)."""
    from bitblas.plan import make_plan
    own = op.plan(device, m)
    return own if own.m is None else make_plan(op.config, device, m)


def bench_row(fmt: str, layer: str, N: int, K: int, m: int, check: bool = True, hint=None, device: str = "cuda",
              graph_ms=None):
    import bitblas
    from bitblas.quantization.quantize import TORCH_DTYPES
    kw = FORMATS[fmt]
    cfg = bitblas.MatmulConfig(N=N, K=K, **kw)
    op = bitblas.Matmul(cfg)
    plan = row_plan(op, device, m)
    weight_names = {"W", "scale", "zeros", "bias"}
    inputs = [s for s in plan.args if s.role == "input"]
    shared = {s.name: _rand_arg(s, m, None, device) for s in inputs if s.name not in weight_names}
    first = {s.name: _rand_arg(s, m, None, device) for s in inputs if s.name in weight_names}
    wbytes = sum(_nbytes(t) for t in first.values())
    ncopy = copies_for(wbytes)
    copies = [first] + [{k: torch.empty_like(v).copy_(v.flip(0)) for k, v in first.items()} for _ in range(ncopy - 1)]
    out = torch.empty(m, N, dtype=TORCH_DTYPES[cfg.out_dtype], device=device)
    t0 = time.perf_counter()
    if device == "cpu" and hint is not None:
        raise ValueError("--hints / --gemv-hints are CUDA kernels; not with --device cpu")
    if isinstance(hint, DefaultVariant):
        hint = hint.resolve(op, device, m)
    if hint is None:
        op(**shared, **first, output=out)
        kern = op._kernel(device, m)                      # (plan, fn) of the kernel that served the call
        fn = None
    elif isinstance(hint, DequantGemmSpec):
        fn = hint.build(plan, op.target)
    else:
        from bitblas.build import build_plan
        fn = build_plan(plan, target=op.target, hint=hint)
    _sync(device)
    build_s = time.perf_counter() - t0
    if fn is None and device == "cpu":
        kname = "cpu-llvm"
        calls = [lambda c=c: op(**shared, **c, output=out) for c in copies]
    elif fn is None:
        from bitblas.kernels import default_hint
        from bitblas.dequant_gemm import DequantGemm
        chosen = op.choice(device, m).hint                # the hint that served the call (None: the plan's default)
        if isinstance(kern[1], DequantGemm):
            kname = "Dequant+WGMMA"
        else:
            dh = chosen if chosen is not None else default_hint(kern[0], op.target)
            from bitblas.schedule import GEMVHint, GEMVMmaHint, GEMVWgmmaHint
            # the GEMV kernels as before they had a hint each: GEMV (rows / k-split), GEMV-mma, GEMV-wgmma
            kname = ("GEMV" + {GEMVMmaHint: "-mma", GEMVWgmmaHint: "-wgmma"}.get(type(dh), "")
                     if isinstance(dh, GEMVHint) else type(dh).__name__.replace("Hint", ""))
        calls = [lambda c=c: op(**shared, **c, output=out) for c in copies]
    else:
        kname = (hint.kernel_name if isinstance(hint, DequantGemmSpec) else
                 f"{type(hint).__name__.replace('Hint', '')}{tuple(hint.__dict__.values())}")

        def mk(c):
            args = [out if s.role == "output" else op._const(s.name, plan, out.device) if s.role == "table"
                    else shared.get(s.name, c.get(s.name)) for s in plan.args]
            # float8 tensors reach the kernel as their bits (int8), as Matmul passes them
            args = [t.view(torch.int8) if isinstance(t, torch.Tensor) and s.dtype == "int8" and t.dtype != torch.int8
                    else t for s, t in zip(plan.args, args)]
            return lambda: fn(*args)
        calls = [mk(c) for c in copies]
    err = None
    if check:
        out.fill_(float("nan")) if out.dtype.is_floating_point else out.fill_(0)
        calls[0]()
        _sync(device)
        from bitblas.reference import reference_matmul
        ref = reference_matmul(cfg, **shared, **first, cast=False, device=device).to(torch.float64)
        o = out.to(torch.float64)
        err = float("inf") if torch.isnan(o).any() else float((o - ref).abs().max() / ref.abs().max())
        del ref
    us = _time(calls, device, graph_ms)
    io = sum(_nbytes(t) for t in shared.values()) + _nbytes(out)
    nbytes = wbytes + io
    row = dict(format=fmt, layer=layer, N=N, K=K, m=m, kernel=kname, us=us, tbps=nbytes / us / 1e6,
               tflops=2 * m * N * K / us / 1e6, bytes=nbytes, build_s=build_s, rel_err=err)
    del copies, first
    return row


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _time(calls, device, graph_ms=None):
    """µs per call: CUDA-graph replays on the GPU, a host clock around back-to-back calls on the CPU."""
    if device == "cpu":
        return time_host(calls)
    return time_graph(calls, max_graph_ms=graph_ms)


def bench_cublas(N, K, m, dtype=torch.float16, device="cuda", graph_ms=None):
    """F.linear on a float16 [N, K] weight: cuBLAS on the GPU (the "cuBLAS fp16" baseline), ATen's CPU
    kernel with ``device="cpu"``."""
    nbytes_w = N * K * 2
    ws = [torch.randn(N, K, device=device).to(dtype) for _ in range(copies_for(nbytes_w))]
    x = torch.randn(m, K, device=device).to(dtype)
    us = _time([lambda w=w: torch.nn.functional.linear(x, w) for w in ws], device, graph_ms)
    del ws
    nbytes = nbytes_w + m * K * 2 + m * N * 2
    return dict(kernel="cublas-fp16" if device == "cuda" else "torch-linear-fp16", us=us,
                tbps=nbytes / us / 1e6, tflops=2 * m * N * K / us / 1e6)


def bench_int4pack(N, K, m, graph_ms=None):
    try:
        ncopy = copies_for(N * K // 2)
        packs = [torch._convert_weight_to_int4pack(
            torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda"), 8) for _ in range(ncopy)]
        sz = torch.rand(K // 128, N, 2, device="cuda").to(torch.bfloat16) * 0.01
        x = torch.randn(m, K, device="cuda").to(torch.bfloat16)
        us = time_graph([lambda w=w: torch._weight_int4pack_mm(x, w, 128, sz) for w in packs], max_graph_ms=graph_ms)
        del packs
    except Exception as e:  # not every torch build has it
        return dict(kernel="torch-int4pack", error=f"{type(e).__name__}: {str(e)[:120]}")
    nbytes = N * K // 2 + sz.numel() * 2 + m * K * 2 + m * N * 2
    return dict(kernel="torch-int4pack-bf16", us=us, tbps=nbytes / us / 1e6, tflops=2 * m * N * K / us / 1e6)


def bench_int_mm(N, K, m, graph_ms=None):
    """torch._int_mm (int8 x int8 -> int32, cuBLASLt) on weight copies; m must be > 16."""
    try:
        ws = [torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda") for _ in range(copies_for(N * K))]
        x = torch.randint(-128, 128, (m, K), dtype=torch.int8, device="cuda")
        us = time_graph([lambda w=w: torch._int_mm(x, w.t()) for w in ws], max_graph_ms=graph_ms)
        del ws
    except Exception as e:  # shapes cuBLASLt refuses (m <= 16), old builds
        return dict(kernel="torch-int_mm", error=f"{type(e).__name__}: {str(e)[:120]}")
    nbytes = N * K + m * K + m * N * 4
    return dict(kernel="torch-int_mm", us=us, tbps=nbytes / us / 1e6, tflops=2 * m * N * K / us / 1e6)


def bench_scaled_mm(N, K, m, graph_ms=None):
    """torch._scaled_mm (float8_e4m3 x float8_e4m3, row-wise float32 scales, bfloat16 out)."""
    try:
        f8 = torch.float8_e4m3fn
        ws = [torch.randn(N, K, device="cuda").to(f8) for _ in range(copies_for(N * K))]
        x = torch.randn(m, K, device="cuda").to(f8)
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, N, device="cuda") + 0.5
        us = time_graph([lambda w=w: torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                         for w in ws], max_graph_ms=graph_ms)
        del ws
    except Exception as e:
        return dict(kernel="torch-scaled_mm", error=f"{type(e).__name__}: {str(e)[:120]}")
    nbytes = N * K + m * K + m * N * 2
    return dict(kernel="torch-scaled_mm", us=us, tbps=nbytes / us / 1e6, tflops=2 * m * N * K / us / 1e6)


@dataclass(frozen=True)
class DequantGemmSpec:
    """``--hints 'DequantGemm(...)'``: the decode-then-GEMM path (``bitblas.dequant_gemm.DequantGemm``)
    whatever the default picks for the row, its dense GEMM with ``WGMMAHint(...)`` of the given
    fields (``dense`` None: the dense plan's default); to time it beside the fused kernel."""
    dense: Optional[object] = None

    def __repr__(self):
        return f"DequantGemm({'' if self.dense is None else self.dense})"

    @property
    def kernel_name(self) -> str:
        """The row's kernel column, as the default path's decode-then-GEMM rows name theirs."""
        return "Dequant+WGMMA" + ("" if self.dense is None else str(tuple(self.dense.__dict__.values())))

    def build(self, plan, target):
        """The callable (arguments in ``plan.args`` order); ValueError where the path does not take the plan."""
        from bitblas.build import cuda_target
        from bitblas.dequant_gemm import DequantGemm
        from bitblas.kernels.select import dequant_gemm_reason
        why = dequant_gemm_reason(plan, cuda_target(target))
        if why:
            raise ValueError(f"--hints {self!r}: decode-then-GEMM does not take {plan.config.W_dtype} x "
                             f"{plan.config.A_dtype} here: {why}")
        return DequantGemm(plan, target, hint=self.dense)


@dataclass(frozen=True)
class DefaultVariant:
    """``--hints 'Default(k_ctas=1,tail_box=false)'``: the hint of the kernel that serves the row by
    default (``op.choice``: what the operator's bucket runs) with these fields replaced; an A/B of
    one knob against the default at every row, beside the torch baselines of the same run."""
    fields: tuple = ()

    def __repr__(self):
        return "Default(" + ",".join(f"{k}={v}" for k, v in self.fields) + ")"

    def resolve(self, op, device: str, m: int):
        """The row's default hint with the fields replaced; ValueError where the row has no hint of
        its own (decode-then-GEMM) or the hint has no such field."""
        import dataclasses
        h = op.choice(device, m).hint
        if h is None or not dataclasses.is_dataclass(h):
            raise ValueError(f"--hints {self!r}: the default of m={m} is {type(h).__name__}, no hint fields to vary")
        names = {f.name for f in dataclasses.fields(h)}
        bad = [k for k, _ in self.fields if k not in names]
        if bad:
            raise ValueError(f"--hints {self!r}: {type(h).__name__} (the default of m={m}) has no field "
                             f"{', '.join(map(repr, bad))}; its fields: {', '.join(sorted(names))}")
        return dataclasses.replace(h, **dict(self.fields))


def parse_hints(text):
    """'R,W,U,VB[,WK[,GRID]];...' -> GEMV hints (the one-hint GEMV's field order: GEMVHint(...) gives the
    rows kernel's hint, with WK > 0 the k-split kernel's)."""
    from bitblas.schedule import GEMVHint
    return [GEMVHint(*(int(x) for x in part.split(","))) for part in filter(None, text.split(";"))]


def parse_hint_specs(text):
    """'WGMMAHint(BN=64,stages=8,consumers=1);MMAHint(BM=128,BN=128,WM=64,WN=64,BK=64,stages=3)' ->
    hint objects (class from bitblas.schedule.HINTS, int / true / false field values)."""
    import re
    from bitblas.schedule import HINTS
    out = []
    for part in filter(None, (x.strip() for x in text.split(";"))):
        mt = re.fullmatch(r"(\w+)\((.*)\)", part)
        if not mt or (mt.group(1) not in HINTS and mt.group(1) not in ("DequantGemm", "Default")):
            raise SystemExit(f"--hints: {part!r} is not Class(field=value,...) with Class in "
                             f"{sorted(HINTS) + ['DequantGemm', 'Default']}")
        kw = {}
        for item in filter(None, mt.group(2).split(",")):
            k, _, v = item.partition("=")
            v = v.strip()
            kw[k.strip()] = {"true": True, "false": False}.get(v.lower(), None)
            if kw[k.strip()] is None:
                kw[k.strip()] = int(v)
        if mt.group(1) == "DequantGemm":     # the dense GEMM's WGMMAHint fields
            out.append(DequantGemmSpec(HINTS["WGMMAHint"](**kw) if kw else None))
        elif mt.group(1) == "Default":       # fields of the row's default hint
            out.append(DefaultVariant(tuple(kw.items())))
        else:
            out.append(HINTS[mt.group(1)](**kw))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="w4a16-g128,w4a16-g128-zeros",
                    help=f"comma list of: {', '.join(FORMATS)}")
    ap.add_argument("--shapes", default="brief", help=f"comma list of shape sets: {', '.join(SHAPES)}")
    ap.add_argument("--m", default="1,16", help="comma list of row counts")
    ap.add_argument("--json", default="benchmark_matmul.json",
                    help="rows so far are written to this JSON file after every row ('' for none)")
    ap.add_argument("--plot", default=None, help="write a bar chart (µs per call) to this file (.png, .svg, .pdf; "
                                                 "needs matplotlib: pip install -e '.[plot]')")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 correctness check")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (rows are still printed)")
    ap.add_argument("--gemv-hints", default="", help="also time these GEMV hints: 'R,W,U,VB[,WK[,GRID]];...'")
    ap.add_argument("--hints", default="", help="also time these hints: 'WGMMAHint(BN=64,stages=8,consumers=1);...'; "
                                                "'DequantGemm()' (or with WGMMAHint fields for its dense GEMM): "
                                                "the decode-then-GEMM path; 'Default(k_ctas=1)': the row's default "
                                                "hint with those fields replaced; each built on the plan the default row "
                                                "runs (symbolic M past the GEMV: row_plan)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default): CUDA-graph timing against cuBLAS / torch kernels; cpu: the LLVM CPU "
                         "kernels against torch's CPU F.linear (a smoke run: host-clock timing)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the timed rows already in --json (a run cut short) and time only the rest")
    ap.add_argument("--graph-ms", type=float, default=100.0,
                    help="cap on one timed graph replay in ms (slow rows replay fewer calls; default 100)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    fmts = [f for f in args.formats.split(",") if f]
    for f in fmts:
        if f not in FORMATS:
            sys.exit(f"unknown format {f!r}; choose from {', '.join(FORMATS)}")
    shapes = []
    for s in args.shapes.split(","):
        if s not in SHAPES:
            sys.exit(f"unknown shape set {s!r}; choose from {', '.join(SHAPES)}")
        shapes += [(s, *x) for x in SHAPES[s]]
    ms = [int(x) for x in args.m.split(",") if x]
    hints = parse_hints(args.gemv_hints) + parse_hint_specs(args.hints)
    if args.plot:
        _matplotlib()                        # fail now, not after the run
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmark/matmul.py needs a CUDA GPU (--device cpu: the CPU smoke run)")
    if args.device == "cpu" and hints:
        sys.exit("--hints / --gemv-hints name CUDA kernels; not with --device cpu")
    device = torch.cuda.get_device_properties(0).name if args.device == "cuda" else _cpu_name()
    rows = []
    try:
        run(fmts, shapes, ms, hints, args, device, rows)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {len(rows)} rows finished" + (f" (saved in {args.json})" if args.json else ""))
    print()
    print_table(rows)
    if args.plot and rows:
        write_plot(rows, args.plot, title=device)
        print(f"plot: {args.plot}")


def _total_rows(fmts, shapes, ms, hints, args) -> int:
    per = len(fmts) * (1 + len(hints))
    if not args.no_baselines and getattr(args, "device", "cuda") == "cpu":
        per += 1
    elif not args.no_baselines:
        per += 1 + any(FORMATS[f].get("W_dtype") in ("uint4", "int4") for f in fmts)
        per += sum(any(BASELINE.get(f) == name for f in fmts) for name in ("int_mm", "scaled_mm"))
    return per * len(shapes) * len(ms)


def run(fmts, shapes, ms, hints, args, device: str, rows: list):
    """Time every row; each one is printed as it finishes (with a progress bar) and, with ``args.json``,
    the rows so far are written after every row, so an interrupted run keeps what it finished."""
    from tqdm import tqdm
    bar = tqdm(total=_total_rows(fmts, shapes, ms, hints, args), unit="row", disable=args.no_progress,
               dynamic_ncols=True, file=sys.stderr)
    out = sys.stdout
    kind = getattr(args, "device", "cuda")
    graph_ms = getattr(args, "graph_ms", None)
    meta = run_info(device, kind, getattr(args, "argv", sys.argv[1:]))

    # --resume: the rows of an earlier (cut) run in --json are kept and not timed again
    done = {}
    if getattr(args, "resume", False) and args.json and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as fh:
            rows.extend(json.load(fh).get("rows", []))
        done = {_row_key(r): r for r in rows if "us" in r}
        bar.write(f"# resuming {args.json}: {len(done)} timed rows kept", file=out)
    where = {_row_key(r): i for i, r in enumerate(rows)}

    def emit(r):
        k = _row_key(r)
        if k in where:                      # a row of the earlier run timed again (it had failed)
            rows[where[k]] = r
        else:
            where[k] = len(rows)
            rows.append(r)
        bar.write(_row_line(r), file=out)
        bar.update(1)
        if args.json:
            _save_json(args.json, dict(meta, rows=rows))

    def baseline(name, label, fn):
        prior = done.get((label, lname, m, None))
        if prior is not None:
            bar.update(1)
            return prior
        r = fn()
        emit(dict(format=label, layer=lname, N=N, K=K, m=m, **r))
        return r

    bar.write(f"# {device}, torch {torch.__version__}, formats={fmts}, m={ms}, "
              f"copy rate {meta['copy_tbps']:.3g} TB/s", file=out)
    bar.write(f"# {meta['command']}", file=out)
    try:
        for sset, layer, N, K in shapes:
            for m in ms:
                base = {}
                lname = f"{sset}/{layer}"
                if not args.no_baselines:
                    bar.set_description(f"{lname} m={m} cublas")
                    base["cublas"] = baseline("cublas", "fp16(torch)",
                                              lambda: bench_cublas(N, K, m, device=kind, graph_ms=graph_ms))
                    if kind == "cpu":
                        pass            # torch's int4 / int8 / float8 matmuls: CUDA kernels
                    elif any(FORMATS[f].get("W_dtype") in ("uint4", "int4") for f in fmts):
                        baseline("int4", "int4(torch)", lambda: bench_int4pack(N, K, m, graph_ms=graph_ms))
                    for name, fn in (("int_mm", bench_int_mm), ("scaled_mm", bench_scaled_mm)):
                        if kind == "cuda" and any(BASELINE.get(f) == name for f in fmts):
                            base[name] = baseline(name, f"{name}(torch)", lambda fn=fn: fn(N, K, m, graph_ms=graph_ms))
                for f in fmts:
                    for h in [None] + hints:
                        if (f, lname, m, None if h is None else str(h)) in done:
                            bar.update(1)
                            continue
                        bar.set_description(f"{lname} m={m} {f}")
                        try:
                            r = bench_row(f, lname, N, K, m, check=not args.no_check, hint=h, device=kind,
                                          graph_ms=graph_ms)
                        except KeyboardInterrupt:
                            raise
                        except Exception as e:  # report and go on
                            r = dict(format=f, layer=lname, N=N, K=K, m=m, kernel=str(h),
                                     error=f"{type(e).__name__}: {str(e)[:300]}")
                        r["hint"] = None if h is None else str(h)
                        if "cublas" in base and "us" in r:
                            r["vs_cublas"] = base["cublas"]["us"] / r["us"]
                        b = base.get(BASELINE.get(f, "cublas"), {})
                        if "us" not in b:           # torch._int_mm refuses <= 16 rows: cuBLAS fp16 instead
                            b = base.get("cublas", {})
                        if "us" in b and "us" in r:
                            r["vs_base"] = b["us"] / r["us"]
                            r["base"] = b["kernel"]
                            r["base_us"] = b["us"]
                        if "bytes" in r:
                            r["floor_us"] = r["bytes"] / (meta["copy_tbps"] * 1e6)
                        emit(r)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    finally:
        bar.close()


def _row_key(r) -> tuple:
    """(format, layer, m, hint): one row of a run (hint None: the default kernel, or a torch baseline)."""
    return r["format"], r["layer"], r["m"], r.get("hint")


def _cpu_name() -> str:
    import platform
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def _commit():
    if os.environ.get("BITBLAS_COMMIT"):      # a copy of the tree without its git history (the GPU host)
        return os.environ["BITBLAS_COMMIT"]
    import subprocess
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here,
                              timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git: no commit
        return None


def run_info(device_name: str, kind: str = "cuda", argv=None, module: str = "benchmark.matmul",
             copy_tbps: Optional[float] = None) -> dict:
    """What the JSON says about the run: device, versions, commit, date (UTC), the command line
    (``python -m module argv``) and the copy rate (TB/s, bytes read + written: the byte floor of a
    row is bytes / this), measured here unless ``copy_tbps`` gives it."""
    import datetime
    import shlex
    import bitblas
    if copy_tbps is None:
        copy_tbps = copy_bandwidth((1 << 30) if kind == "cuda" else (1 << 26), device=kind)
    return dict(device=device_name, kind=kind, torch=torch.__version__, bitblas=bitblas.__version__,
                commit=_commit(), date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                argv=argv, command=f"python -m {module} " + shlex.join(argv or []), copy_tbps=copy_tbps)


def _save_json(path, payload):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(tmp, path)


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        sys.exit("--plot needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_plot(rows, path, title=""):
    """A grouped bar chart (µs per call, log scale) of every timed row: one group per (layer, m), one bar per
    format / kernel (torch baselines by name), with matplotlib; the file type follows the extension."""
    plt = _matplotlib()
    timed = [r for r in rows if "us" in r]
    groups = list(dict.fromkeys((r["layer"], r["m"]) for r in timed))

    def label(r):
        return r["format"] if r["format"].endswith(")") else f"{r['format']} [{str(r['kernel'])[:16]}]"
    labels = list(dict.fromkeys(label(r) for r in timed))
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) + 3), 4.5))
    for li, lab in enumerate(labels):
        xs, ys = [], []
        for gi, g in enumerate(groups):
            for r in timed:
                if (r["layer"], r["m"]) == g and label(r) == lab:
                    xs.append(gi - 0.4 + (li + 0.5) * width)
                    ys.append(r["us"])
        ax.bar(xs, ys, width=width, label=lab)
    ax.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylabel("µs per call")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{layer}\nm={m}" for layer, m in groups], fontsize=8)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _row_line(r) -> str:
    if "error" in r:
        return f"  {r['format']} {r['layer']} m={r['m']} {r.get('kernel')}: ERROR {r['error']}"
    vs = f"  {r['vs_cublas']:.2f}x cuBLAS" if r.get("vs_cublas") else ""
    # the format's own baseline where it is another one than the fp16 one (torch._int_mm,
    # torch._scaled_mm, ...), the ratio docs/performance.md shows
    if r.get("vs_base") and r.get("base") and r["vs_base"] != r.get("vs_cublas"):
        vs += f"  {r['vs_base']:.2f}x {r['base']}"
    err = f"  rel.err {r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
    return (f"  {r['format']:18s} {r['layer']:22s} m={r['m']:<4d} {str(r.get('kernel'))[:28]:28s} "
            f"{r['us']:9.2f} µs  {r['tbps']:5.2f} TB/s{vs}{err}")


def print_table(rows):
    hdr = f"| {'format':18s} | {'layer':22s} | {'N':>6s} | {'K':>6s} | {'m':>3s} | {'kernel':28s} | {'µs':>8s} | " \
          f"{'TB/s':>5s} | {'TFLOP/s':>7s} | {'vs cuBLAS':>9s} | {'vs base':>7s} | {'rel.err':>8s} |"
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    for r in rows:
        if "us" not in r:
            print(f"| {r['format']:18s} | {r['layer']:22s} | {r['N']:6d} | {r['K']:6d} | {r['m']:3d} | "
                  f"{str(r.get('kernel'))[:28]:28s} | {'error':>8s} | {'':5s} | {'':7s} | {'':9s} | {'':7s} | {'':8s} |")
            continue
        vs = f"{r['vs_cublas']:.2f}x" if r.get("vs_cublas") else ""
        vb = f"{r['vs_base']:.2f}x" if r.get("vs_base") else ""
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
        print(f"| {r['format']:18s} | {r['layer']:22s} | {r['N']:6d} | {r['K']:6d} | {r['m']:3d} | "
              f"{str(r['kernel'])[:28]:28s} | {r['us']:8.2f} | {r['tbps']:5.2f} | {r['tflops']:7.2f} | "
              f"{vs:>9s} | {vb:>7s} | {err:>8s} |")


if __name__ == "__main__":
    main()
