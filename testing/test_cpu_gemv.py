"""The CPU GEMV kernel (bitblas/schedule/cpu_gemv.py): which plans take it, and its results for
every hint shape (row blocks and their tails, channel blocks, step widths: AVX-512, AVX2 and a
gather for table formats) against the float64 reference. The default hint is covered for every
format by test_matmul.py, which runs the CPU default kernel."""
from __future__ import annotations

import random

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.build import compile_plan, cpu_target
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import CPUGemvHint, CPUHint, cpu_gemv_unsupported, schedule_cpu_gemv
from bitblas.kernels import default_hint
from bitblas.tune.tuner import kernel_args


def _cfg(W_dtype, N=40, K=256, **kw):
    return MatmulConfig(M=None, N=N, K=K, W_dtype=W_dtype, **{"A_dtype": "float16", **kw})


@pytest.mark.parametrize("a_dtype", ["float16", "bfloat16", "float32"])
def test_float_activations_take_the_gemv_kernel(a_dtype):
    """Every weight format with float activations (group 128 and per channel, with the zero modes it
    takes) runs the GEMV kernel by default; nothing silently falls back to the tile schedule."""
    from bitblas.formats import FORMATS
    n = 0
    for name in bitblas.WEIGHT_FORMATS:
        f = FORMATS[name]
        kws = [{}]
        if f.kind == "float":
            if name != a_dtype and a_dtype != "float32":
                continue
        elif f.group_size is not None:
            kws = [dict(group_size=f.group_size, with_scaling=True)]
        else:
            kws += [dict(group_size=g, with_scaling=True) for g in (128, -1)]
            if f.zeros:
                kws += [dict(group_size=128, with_scaling=True, with_zeros=True, zeros_mode=z)
                        for z in ("original", "rescale", "quantized") if z != "quantized" or f.kind == "uint"]
        for kw in kws:
            cfg = _cfg(name, A_dtype=a_dtype, out_dtype=a_dtype, **kw)
            plan = make_plan(cfg, "cpu")
            assert cpu_gemv_unsupported(plan) is None, (cfg, cpu_gemv_unsupported(plan))
            assert isinstance(default_hint(plan), CPUGemvHint)
            n += 1
    assert n > 20


def test_other_plans_take_the_tile_schedule():
    cases = {
        "A_dtype": _cfg("int4", A_dtype="int8", with_scaling=True),               # integer activations
        "layout": _cfg("float16", layout="nn"),                                    # W is [K, N]
        "K=100": _cfg("uint4", K=100, with_scaling=True),                          # no whole step of codes
    }
    for word, cfg in cases.items():
        plan = make_plan(cfg, "cpu")
        why = cpu_gemv_unsupported(plan)
        assert why and word in why, (word, why)
        assert isinstance(default_hint(plan), CPUHint)
        with pytest.raises(ValueError, match="does not take"):
            schedule_cpu_gemv(None, plan, CPUGemvHint())


def _check(cfg, hint, ms):
    plan = make_plan(cfg, "cpu")
    fn = compile_plan(plan, None, hint)["main"]
    for m in ms:
        seed = random.randrange(2 ** 31)
        inp = random_inputs(cfg, m, seed=seed)
        out = torch.full((m, cfg.N), float("nan"), dtype=TORCH_DTYPES[cfg.out_dtype])
        fn(*kernel_args(plan, inp, out))
        err = relative_error(out, reference_matmul(cfg, **inp))
        assert err <= tolerance(cfg), f"{hint} m={m} seed={seed}: relative error {err:.3g} > {tolerance(cfg)}"


# (config, hints): every hint shape on a few formats; lanes 8 is the AVX2 step (and its two-permute
# table lookup), lanes 4 the SSE / NEON step (a gather for tables)
CASES = [
    pytest.param(_cfg("uint4", group_size=32, with_scaling=True, with_zeros=True), id="u4_g32_zorig"),
    pytest.param(_cfg("int4", group_size=128, with_scaling=True, with_bias=True), id="i4_g128_bias"),
    pytest.param(_cfg("nf4", group_size=64, with_scaling=True), id="nf4_g64"),
    pytest.param(_cfg("fp4_e2m1", group_size=128, with_scaling=True, A_dtype="bfloat16", out_dtype="bfloat16"),
                 id="bf16xfp4_g128"),
    pytest.param(_cfg("int2", group_size=128, with_scaling=True, with_zeros=True, zeros_mode="rescale"),
                 id="i2_g128_zresc"),
    pytest.param(_cfg("uint1", group_size=128, with_scaling=True, with_zeros=True, zeros_mode="quantized",
                      out_dtype="float32"), id="u1_g128_zquant_of32"),
    pytest.param(_cfg("int8", with_scaling=True, A_dtype="float32", out_dtype="float32"), id="f32xi8_gch"),
    pytest.param(_cfg("float8_e4m3", with_scaling=True), id="e4m3w_gch"),
    pytest.param(_cfg("float16"), id="f16xf16"),
]
HINTS = [
    CPUGemvHint(block=8, channels=4, rows=4, row_channels=2, lanes=16, unroll=4),
    CPUGemvHint(block=8, channels=8, rows=1, row_channels=1, lanes=8, unroll=1),
    CPUGemvHint(block=4, channels=2, rows=3, row_channels=4, lanes=4, unroll=2, prefetch=0),
]


@pytest.mark.parametrize("hint", HINTS, ids=["l16_r4", "l8_r1", "l4_r3"])
@pytest.mark.parametrize("cfg", CASES)
def test_gemv_hints(cfg, hint):
    _check(cfg, hint, (1, 3, 7))


@pytest.mark.parametrize("N", [37, 24])
def test_odd_n_and_nvfp4(N):
    """N without a power-of-two factor (a block of one channel), and nvfp4's 16-code groups (an
    8-byte step: AVX2-width vectors on any x86 target)."""
    cfg = _cfg("uint4", N=N, K=128, group_size=128, with_scaling=True, with_zeros=True)
    _check(cfg, CPUGemvHint.default(make_plan(cfg, "cpu")), (1, 5))
    nv = _cfg("nvfp4", N=N, K=128, group_size=16, with_scaling=True, A_dtype="bfloat16", out_dtype="bfloat16")
    _check(nv, CPUGemvHint.default(make_plan(nv, "cpu")), (1, 6))


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that starts one element past a 64-byte boundary."""
    buf = torch.empty(t.numel() + 64, dtype=t.dtype)
    off = (-buf.data_ptr() % 64) // t.element_size() + 1
    v = buf[off:off + t.numel()].view(t.shape)
    v.copy_(t)
    return v


@pytest.mark.parametrize("cfg", [_cfg("uint4", group_size=128, with_scaling=True, with_zeros=True, with_bias=True),
                                 _cfg("nf4", group_size=64, with_scaling=True),
                                 _cfg("float16", A_dtype="float16")], ids=["u4_zeros_bias", "nf4", "f16"])
def test_unaligned_tensors(cfg):
    """Every tensor (activations, codes, scales, zeros, bias, output) at an odd address, as views into
    a safetensors file are: the kernel's vector accesses assume no alignment (a crash before)."""
    plan = make_plan(cfg, "cpu")
    fn = compile_plan(plan)["main"]
    inp = random_inputs(cfg, 3, seed=1)
    out = _misaligned(torch.full((3, cfg.N), float("nan"), dtype=torch.float16))
    args = [_misaligned(a) if a.numel() > 1 else a for a in kernel_args(plan, inp, out)[:-1]] + [out]
    assert all(a.data_ptr() % 16 for a in args if a.numel() > 1)
    fn(*args)
    assert relative_error(out, reference_matmul(cfg, **inp)) <= tolerance(cfg)
    op = bitblas.Matmul(cfg, target="llvm")              # and through the operator
    res = op(_misaligned(inp["A"]), **{k: _misaligned(v) for k, v in inp.items() if k != "A"})
    assert relative_error(res, reference_matmul(cfg, **inp)) <= tolerance(cfg)


def test_hint_checks():
    plan = make_plan(_cfg("uint4", N=40, group_size=128, with_scaling=True), "cpu")
    for hint, word in [(CPUGemvHint(block=16), "block"), (CPUGemvHint(block=8, channels=3), "channels"),
                       (CPUGemvHint(rows=0), "rows"), (CPUGemvHint(block=8, lanes=32), "lanes"),
                       (CPUGemvHint(block=8, rows=8, row_channels=4), "accumulators")]:
        with pytest.raises(ValueError, match=word):
            schedule_cpu_gemv(None, plan, hint)


def test_table_lookup_is_a_register_permute():
    """nf4 on an AVX-512 host: the codes index the table with vpermps (an LLVM x86 permute
    intrinsic), not a gather."""
    import tvm
    if not tvm.target.codegen.target_has_features("avx512f", cpu_target()):
        pytest.skip("host without AVX-512")
    plan = make_plan(_cfg("nf4", group_size=128, with_scaling=True), "cpu")
    ll = compile_plan(plan).mod.inspect_source("ll")
    assert "llvm.x86.avx512.permvar.sf.512" in ll
    assert "masked.gather" not in ll


_THREADS = """
    import json, os, torch, bitblas
    from bitblas.reference import random_inputs
    cfg = bitblas.MatmulConfig(M=None, N=64, K=256, A_dtype="float16", W_dtype="uint4", group_size=128,
                               with_scaling=True)
    op = bitblas.Matmul(cfg, target="llvm")
    inp = random_inputs(cfg, 3, seed=0)
    outs = []
    for n in (2, 1):
        bitblas.set_cpu_threads(n)
        outs.append(op(**inp))
    print(json.dumps({"env": os.environ.get("TVM_NUM_THREADS"), "cores": bitblas.build.physical_cores(),
                      "same": bool(torch.equal(outs[0], outs[1]))}))
"""


def test_cpu_threads():
    """TVM's pool would take half the hardware threads on x86 (it assumes SMT): unless the user set
    TVM_NUM_THREADS / OMP_NUM_THREADS, bitblas sets the physical core count before the first CPU
    kernel; set_cpu_threads picks a count (results do not depend on it)."""
    import json
    import os
    import subprocess
    import sys
    import textwrap
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = root
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_THREADS)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["env"] == str(out["cores"]) and out["same"]
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_THREADS)], capture_output=True, text=True,
                       env=dict(env, TVM_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["env"] == "1"   # the user's value stays
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n="):
            bitblas.set_cpu_threads(bad)
