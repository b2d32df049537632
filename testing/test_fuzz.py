"""Fuzz: random valid configs against a float64 reference written here, from the format tables.

Each seed draws one config (every activation and weight format, scales, group sizes, every zero
mode, bias, per-token activation scales, N and K off any tile, layouts, a static or dynamic M) and
calls its operator with row counts from every class the dispatch knows: 1, 2..16 (the GEMV rows
kernel), 17..64 (the tensor-core / wgmma GEMV), more than 64 (decode-then-GEMM or the fused GEMM).
The reference decodes the codes it drew itself (int / uint values, table entries), applies scales,
zero points and the global scale as the config's docstring defines them, and multiplies in
float64; only the packing of the inputs goes through the library (``pack_weight``, ``pack_codes``).

Every call is counted as ok, wrong (relative error above ``tolerance(config)``, NaN, an int32
output that is not exact), refused (ValueError / TypeError / NotImplementedError: a clean refusal)
or crash (any other exception; on the GPU a worker process that dies). The counts are printed.

    python -m pytest testing/test_fuzz.py -s                 # CPU: FUZZ_CPU_SEEDS fixed seeds
    python -m pytest testing/test_fuzz.py -m gpu -s          # GPU: FUZZ_GPU_CONFIGS configs in worker processes
    python testing/test_fuzz.py --device cuda --seeds 0:50   # one worker by hand: a JSON line per seed
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
from collections import Counter
from typing import Dict, List

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:                    # run as a script (a GPU worker)
    sys.path.insert(0, ROOT)

# 100 seeds, and three that draw integer activations with a float bias and no scales (issue 26, item 1)
FUZZ_CPU_SEEDS = tuple(range(100)) + (238, 340, 553)
FUZZ_GPU_CONFIGS = int(os.environ.get("BITBLAS_FUZZ_CONFIGS", "300"))
ACTIVATIONS = ("float16", "bfloat16", "float32", "int8", "int4", "float8_e4m3", "float8_e5m2")
GROUPS = (-1, 16, 32, 64, 128)
ROW_CLASSES = ((1, 1), (2, 16), (17, 64), (65, 300))
_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int32": torch.int32,
          "int8": torch.int8, "float8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
          "float8_e5m2": torch.float8_e5m2}


# -- configs --------------------------------------------------------------------------------------------
def draw_config(rng: random.Random):
    """A random config that MatmulConfig accepts (draws that it refuses are drawn again)."""
    from bitblas import MatmulConfig
    from bitblas.config import ZEROS_MODES
    from bitblas.formats import FORMATS, WEIGHT_FORMATS
    while True:
        a = rng.choice(ACTIVATIONS)
        af = FORMATS[a]
        w = rng.choice(WEIGHT_FORMATS)
        wf = FORMATS[w]
        group = wf.group_size or rng.choice(GROUPS)
        scaling = wf.scale == "required" or (wf.scale == "optional" and rng.random() < 0.7)
        zeros = scaling and wf.zeros and af.kind == "float" and rng.random() < 0.6
        mode = rng.choice([z for z in ZEROS_MODES if z != "quantized" or wf.kind == "uint"])
        unit = math.lcm(wf.codes_per_byte, af.codes_per_byte, group if group > 0 and scaling else 1)
        K = unit * rng.randint(max(1, 16 // unit), max(1, 640 // unit))
        N = rng.choice([rng.randint(1, 40), rng.randint(41, 300), 256, 128 + rng.randint(1, 15)])
        integer_sum = af.integer and not scaling
        outs = ["float32", "bfloat16"] + (["int32"] if integer_sum else ["float16"])
        out = rng.choice(outs)
        act_scaling = af.kind != "float" and out != "int32" and rng.random() < 0.4
        M = rng.choice([None, None, None, rng.randint(1, 130)])
        layout = "nn" if wf.kind == "float" and rng.random() < 0.3 else "nt"
        try:
            return MatmulConfig(M=M, N=N, K=K, A_dtype=a, W_dtype=w, out_dtype=out, layout=layout,
                                with_bias=rng.random() < 0.5, group_size=group if scaling else -1,
                                with_scaling=scaling, with_zeros=zeros, zeros_mode=mode,
                                with_act_scaling=act_scaling)
        except (ValueError, NotImplementedError):
            continue


def row_counts(rng: random.Random, cfg) -> List[int]:
    rows = [rng.randint(lo, hi) for lo, hi in ROW_CLASSES]
    if isinstance(cfg.M, int):
        rows.append(cfg.M)
    return rows


# -- inputs and the reference ---------------------------------------------------------------------------------
def _codes(fmt, shape, g, limit: float = math.inf):
    """Random codes of ``fmt`` (table formats: indices of finite entries of magnitude <= ``limit``)
    and the values they stand for."""
    if fmt.kind == "table":
        finite = torch.tensor([i for i, v in enumerate(fmt.table) if math.isfinite(v) and abs(v) <= limit])
        codes = finite[torch.randint(0, len(finite), shape, generator=g)]
        return codes, torch.tensor(fmt.table, dtype=torch.float64)[codes]
    lo, hi = fmt.code_range
    codes = torch.randint(lo, hi + 1, shape, generator=g)
    return codes, codes.to(torch.float64)


def make_case(cfg, m: int, seed: int, device: str):
    """(operator keyword arguments, float64 reference [m, N], magnitude [m]) for ``m`` rows of
    ``cfg``. The magnitude of a row is the largest sum of absolute terms of its outputs
    (sum |a w| times the activation scale, plus |bias|): what the rounding errors scale with, so
    a row of zero activations (drawn now and then) is compared with its bias alone."""
    from bitblas.formats import FORMATS
    from bitblas.plan import make_plan
    from bitblas.quantization.quantize import pack_weight
    from bitblas.quantization.utils import pack_codes
    g = torch.Generator().manual_seed(seed)
    c = cfg
    af, wf = FORMATS[c.A_dtype], FORMATS[c.W_dtype]
    plan = make_plan(c)
    # activations (row 0 all zero now and then: its outputs are the bias)
    zero_row = torch.rand(1, generator=g).item() < 0.3
    if af.kind in ("float", "table"):         # float8: values near 1 (no output overflow)
        A = torch.randn(m, c.K, generator=g)
        if zero_row:
            A[0] = 0
        A = A.to(_TORCH[c.A_dtype])
        av = A.to(torch.float64)
    else:
        codes, av = _codes(af, (m, c.K), g)
        if zero_row:
            codes[0], av[0] = 0, 0
        # packed activations are stored as the plan says (int4: two's complement, unlike int4 weights)
        A = pack_codes(codes.to(torch.int32), af, plan.a_storage) if af.packed else codes.to(torch.int8)
    # weights: values wv [N, K]
    groups = 1 if c.group_size == -1 else c.K // c.group_size
    gsize = c.K // groups
    scale = zeros = gscale = None
    if wf.kind == "float":
        Wt = (torch.randn(c.N, c.K, generator=g) * 0.1).to(_TORCH[c.W_dtype])
        wv = Wt.to(torch.float64)
        packed = {"W": Wt.T.contiguous() if c.layout == "nn" else Wt}
    else:
        # unscaled float8 weights: values up to 16 (e5m2 reaches 57344: the output would overflow)
        codes, wv = _codes(wf, (c.N, c.K), g, math.inf if c.with_scaling else 16.0)
        if c.with_scaling:
            sdt = _TORCH[plan.arg("scale").user_dtype]
            scale = ((torch.rand(c.N, groups, generator=g) + 0.5) / wf.max_abs).to(sdt)
            sv = scale.to(torch.float64).repeat_interleave(gsize, dim=1)
            if c.with_zeros:
                lo, hi = wf.code_range
                if c.zeros_mode == "quantized":
                    zeros = torch.randint(lo, hi + 1, (c.N, groups), generator=g)
                    zv = zeros.to(torch.float64)
                elif c.zeros_mode == "original":
                    zeros = (torch.rand(c.N, groups, generator=g) * (hi - lo) + lo).to(sdt)
                    zv = zeros.to(torch.float64)
                else:                          # rescale: z in weight units, about the mid code times s
                    zeros = (scale.to(torch.float32) * (torch.rand(c.N, groups, generator=g) * (hi - lo) + lo)).to(sdt)
                    zv = zeros.to(torch.float64)
                zv = zv.repeat_interleave(gsize, dim=1)
                wv = wv * sv - zv if c.zeros_mode == "rescale" else (wv - zv) * sv
            else:
                wv = wv * sv
        if wf.global_scale and torch.rand(1, generator=g).item() < 0.7:
            gscale = torch.rand(1, generator=g) + 0.5
            wv = wv * float(gscale)
        packed = pack_weight(c, codes.to(torch.int16), scale, zeros, gscale)
    mag = av.abs() @ wv.abs().T
    if af.kind in ("float", "table") and c.out_dtype == "float16" and float(mag.max()) > 1e4:
        # keep a float16 output in range: scale the activations by a power of two (exact)
        f = 2.0 ** -math.ceil(math.log2(float(mag.max()) / 1e4))
        A = (A.to(torch.float32) * f).to(A.dtype)
        av = A.to(torch.float64)
        mag = av.abs() @ wv.abs().T
    out = av @ wv.T
    kw = dict(packed)
    if c.with_act_scaling:
        a_scale = torch.rand(m, generator=g) * 0.05 + 0.01
        out = out * a_scale.to(torch.float64)[:, None]
        mag = mag * a_scale.to(torch.float64)[:, None]
        kw["a_scale"] = a_scale
    if c.with_bias:
        if c.out_dtype == "int32":
            bias = torch.randint(-1000, 1000, (c.N,), generator=g, dtype=torch.int32)
        else:
            bias = (torch.randn(c.N, generator=g) * 0.5).to(_TORCH[c.out_dtype])
        out = out + bias.to(torch.float64)
        mag = mag + bias.to(torch.float64).abs()
        kw["bias"] = bias
    kw = {k: v.to(device) for k, v in kw.items()}
    kw["A"] = A.to(device)
    return kw, out, mag.amax(dim=1)


def tolerance_for(cfg, device: str) -> float:
    from bitblas.reference import tolerance
    tol = tolerance(cfg)
    if device == "cuda" and cfg.A_dtype.startswith("float8"):
        # fp8 tensor cores keep 13 mantissa bits in their accumulator (testing/kernel_helpers.py)
        tol = max(tol, cfg.K / 32 * 2.0 ** -13)
    return tol


def run_seed(seed: int, device: str) -> Dict:
    """The outcome of one seed: its config, and per row count: ok / wrong / refused / crash."""
    import bitblas
    rng = random.Random(seed)
    cfg = draw_config(rng)
    res = {"seed": seed, "config": cfg.to_dict(), "calls": []}
    try:
        op = bitblas.Matmul(cfg, target="llvm" if device == "cpu" else None)
    except (ValueError, TypeError, NotImplementedError) as e:
        res["calls"].append({"m": None, "status": "refused", "detail": f"{type(e).__name__}: {e}"[:300]})
        return res
    for i, m in enumerate(row_counts(rng, cfg)):
        call = {"m": m}
        try:
            kw, ref, mag = make_case(cfg, m, seed * 1000 + i, device)
            dt = _TORCH[cfg.out_dtype]
            out = torch.full((m, cfg.N), float("nan") if dt.is_floating_point else -12345, dtype=dt, device=device)
            got = op(**kw, output=out)
            if device == "cuda":
                torch.cuda.synchronize()
            got = got.cpu()
            if cfg.out_dtype == "int32":
                bad = int((got.to(torch.float64) != ref).sum())
                call.update(status="wrong" if bad else "ok", err=bad)
            else:
                o = got.to(torch.float64)
                if not bool(torch.isfinite(o).all()):
                    err = math.inf
                else:
                    err = float(((o - ref).abs().amax(dim=1) / mag.clamp(min=1e-30)).max())
                tol = tolerance_for(cfg, device)
                call.update(status="ok" if err <= tol else "wrong", err=err, tol=tol)
        except (ValueError, TypeError, NotImplementedError) as e:
            call.update(status="refused", detail=f"{type(e).__name__}: {e}"[:300])
        except Exception as e:  # noqa: BLE001 - counted as a crash
            call.update(status="crash", detail=f"{type(e).__name__}: {e}"[:300],
                        where=traceback.format_exc().splitlines()[-3][:200])
        res["calls"].append(call)
    return res


def summarize(results: List[Dict], crashed_seeds=()) -> Counter:
    counts = Counter()
    for r in results:
        for call in r["calls"]:
            counts[call["status"]] += 1
    counts["crash"] += len(crashed_seeds)
    return counts


def report(results: List[Dict], crashed_seeds=(), seconds: float = 0.0) -> str:
    counts = summarize(results, crashed_seeds)
    configs = Counter()
    for r in results:
        st = {c["status"] for c in r["calls"]}
        configs[next((s for s in ("crash", "wrong", "refused", "ok") if s in st), "ok")] += 1
    configs["crash"] += len(crashed_seeds)
    lines = [f"fuzz: {len(results) + len(crashed_seeds)} configs, {sum(counts.values())} calls in {seconds:.0f} s; "
             f"calls: {counts['ok']} ok, {counts['wrong']} wrong, {counts['refused']} refused, {counts['crash']} crash; "
             f"configs (worst call): {dict(configs)}"]
    formats = Counter(f"{r['config']['A_dtype']}x{r['config']['W_dtype']}" for r in results)
    lines.append(f"  formats: {dict(sorted(formats.items()))}")
    for r in results:
        for call in r["calls"]:
            if call["status"] != "ok":
                c = r["config"]
                lines.append(f"  {call['status']:7s} seed={r['seed']} m={call['m']} {c['A_dtype']}x{c['W_dtype']} "
                             f"N={c['N']} K={c['K']} g={c['group_size']} s={c['with_scaling']} z={c['with_zeros']}"
                             f"/{c['zeros_mode']} bias={c['with_bias']} as={c['with_act_scaling']} out={c['out_dtype']} "
                             f"M={c['M']} layout={c['layout']}: {call.get('detail') or call.get('err')}")
    for s in crashed_seeds:
        lines.append(f"  crash   seed={s}: the worker process died")
    return "\n".join(lines)


# -- tests ------------------------------------------------------------------------------------------------
def test_fuzz_cpu():
    t0 = time.time()
    results = [run_seed(s, "cpu") for s in FUZZ_CPU_SEEDS]
    text = report(results, seconds=time.time() - t0)
    print(text)
    counts = summarize(results)
    assert counts["crash"] == 0 and counts["wrong"] == 0, text


def test_reference_is_independent_and_exact():
    """The fuzz reference agrees with bitblas.reference on a few drawn configs (two references that
    share nothing but the format table), and a draw covers what the docstring says over 300 seeds."""
    from bitblas.reference import reference_matmul
    for seed in range(6):
        cfg = draw_config(random.Random(seed))
        kw, ref, _ = make_case(cfg, 3, seed, "cpu")
        theirs = reference_matmul(cfg, **{k: v for k, v in kw.items()}, cast=False)
        assert torch.allclose(theirs, ref, rtol=1e-9, atol=1e-9), (seed, cfg)
    drawn = [draw_config(random.Random(s)) for s in range(300)]
    from bitblas.formats import WEIGHT_FORMATS
    assert {c.W_dtype for c in drawn} == set(WEIGHT_FORMATS)
    assert {c.A_dtype for c in drawn} == set(ACTIVATIONS)
    assert {c.zeros_mode for c in drawn if c.with_zeros} == {"original", "rescale", "quantized"}
    assert any(c.with_bias for c in drawn) and any(c.with_act_scaling for c in drawn)
    assert any(c.K % 32 for c in drawn) and any(c.N % 8 for c in drawn)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fuzz_gpu():
    """FUZZ_GPU_CONFIGS seeds (BITBLAS_FUZZ_CONFIGS, default 300) over worker processes on the GPU."""
    n = FUZZ_GPU_CONFIGS
    workers = max(1, min(int(os.environ.get("BITBLAS_FUZZ_WORKERS", "12")), (os.cpu_count() or 2) - 2, n))
    base = 100000                                   # other seeds than the CPU run's
    shards = [list(range(base + i, base + n, workers)) for i in range(workers)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    results, crashed = [], []

    def run_shard(shard):
        """A worker over the shard; when it dies, the seed it died on is a crash and a new worker
        takes the rest."""
        todo = list(shard)
        while todo:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--device", "cuda",
                                "--seeds", ",".join(map(str, todo))], capture_output=True, text=True, env=env,
                               timeout=3600)
            done = set()
            for line in p.stdout.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    results.append(r)
                    done.add(r["seed"])
            todo = [s for s in todo if s not in done]
            if p.returncode != 0 and todo:
                crashed.append(todo.pop(0))
                print(f"fuzz worker died on seed {crashed[-1]} (exit {p.returncode}): {p.stderr[-1500:]}")

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run_shard, shards))
    text = report(sorted(results, key=lambda r: r["seed"]), crashed, time.time() - t0)
    print(text)
    counts = summarize(results, crashed)
    assert counts["crash"] == 0 and counts["wrong"] == 0, text


def main(argv=None):
    p = argparse.ArgumentParser(description="run fuzz seeds, one JSON line per seed")
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--seeds", required=True, help="a,b,c or start:stop")
    args = p.parse_args(argv)
    if ":" in args.seeds:
        lo, hi = map(int, args.seeds.split(":"))
        seeds = range(lo, hi)
    else:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    for s in seeds:
        print(json.dumps(run_seed(s, args.device)), flush=True)


if __name__ == "__main__":
    main()
