"""Defects found by fuzzing (issue 26): the bias of integer-activation plans, a float bias for an
int32 output, the nvcc process group, and the test suite's own database. Cache faults:
testing/test_cache_faults.py; the fuzz itself: testing/test_fuzz.py.

    python -m pytest testing/test_reliability.py                 # CPU + nvcc codegen
    python -m pytest testing/test_reliability.py -m gpu          # the bias on every CUDA template
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import reference_matmul, relative_error, tolerance
from bitblas.tune.tuner import kernel_args
from kernel_helpers import TARGETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# integer activations, no scales, a float output: the sum is an int32 and the bias a float
BIAS_CASES = {
    "i8xi8-f32": dict(A_dtype="int8", W_dtype="int8", out_dtype="float32"),
    "i8xi4-f16": dict(A_dtype="int8", W_dtype="int4", out_dtype="float16"),
    "i4xi2-f32": dict(A_dtype="int4", W_dtype="int2", out_dtype="float32"),
    "i8xu4-bf16": dict(A_dtype="int8", W_dtype="uint4", out_dtype="bfloat16"),
    "i8xi8-i32": dict(A_dtype="int8", W_dtype="int8", out_dtype="int32"),
}


def _bias_inputs(cfg, m, device="cpu", seed=0):
    """Random codes, every other activation row zero (its outputs are exactly the bias), and a
    bias with fractions (.25, .5, .75, negative ones too) where the output is float."""
    from bitblas.formats import FORMATS
    g = torch.Generator().manual_seed(seed)
    a, w = FORMATS[cfg.A_dtype], FORMATS[cfg.W_dtype]
    A = torch.randint(a.code_range[0], a.code_range[1] + 1, (m, cfg.K), generator=g)
    A[::2] = 0
    codes = torch.randint(w.code_range[0], w.code_range[1] + 1, (cfg.N, cfg.K), generator=g)
    from bitblas.quantization.quantize import pack_weight
    from bitblas.quantization.utils import pack_codes
    W = pack_weight(cfg, codes.to(torch.int16))["W"]
    from bitblas.formats import code_storage
    A = pack_codes(A.to(torch.int32), a, code_storage(a, "A")) if a.packed else A.to(torch.int8)
    if cfg.out_dtype == "int32":
        bias = torch.randint(-1000, 1000, (cfg.N,), generator=g, dtype=torch.int32)
    else:
        bias = (torch.randint(-40, 40, (cfg.N,), generator=g) / 4 + 0.25).to(TORCH_DTYPES[cfg.out_dtype])
    return {"A": A.to(device), "W": W.to(device), "bias": bias.to(device)}


def _check_bias(cfg, out, inp):
    ref = reference_matmul(cfg, **{k: v.cpu() for k, v in inp.items()})
    out = out.cpu()
    zero_rows = out[::2]
    want = inp["bias"].cpu().expand_as(zero_rows)
    assert torch.equal(zero_rows, want), f"rows of zero activations: {zero_rows[0, :6].tolist()} != bias " \
                                         f"{want[0, :6].tolist()}"
    if cfg.out_dtype == "int32":
        assert torch.equal(out, ref)
    else:
        assert relative_error(out, ref) <= tolerance(cfg)


# -- item 1: the bias of integer-activation plans (CPU) ---------------------------------------------------
@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_integer_activation_bias_cpu(case):
    cfg = MatmulConfig(M=None, N=48, K=64, with_bias=True, **BIAS_CASES[case])
    op = bitblas.Matmul(cfg, target="llvm")
    inp = _bias_inputs(cfg, 6)
    _check_bias(cfg, op(**inp), inp)


def test_issue_example_bias_not_truncated():
    cfg = MatmulConfig(M=1, N=4, K=16, A_dtype="int8", W_dtype="int8", with_bias=True, out_dtype="float32")
    op = bitblas.Matmul(cfg, target="llvm")
    bias = torch.tensor([0.75, -0.75, 1.5, -2.25])
    out = op(torch.zeros(1, 16, dtype=torch.int8), op.transform_weight(torch.zeros(4, 16, dtype=torch.int8)),
             bias=bias)
    assert out.tolist() == [bias.tolist()]


def _cuda_kernels(cfg):
    """(name, plan, hint, arch) of every CUDA template that takes an integer-activation plan
    without scales: the GEMV's dp4a rows kernel and m16n8k32 kernel, the wgmma GEMM (int8 x int8),
    the mma.sync GEMM (sm_80) and the simple kernel."""
    from bitblas.build import cuda_target
    from bitblas.schedule import GEMVHint, MMAHint, SimpleCUDAHint, WGMMAHint
    from bitblas.kernels import default_hint
    out = []
    for m in (1, 16):
        plan = make_plan(cfg, "cuda", m)
        hint = default_hint(plan, cuda_target(TARGETS["sm_90"]))
        if isinstance(hint, GEMVHint):
            out.append((f"gemv-m{m}{'-mma' if hint.tensor_cores else ''}", plan, hint, "sm_90"))
    plan = make_plan(cfg, "cuda", None)
    wg = WGMMAHint.default(plan, cuda_target(TARGETS["sm_90"]))
    if wg is not None:
        out.append(("wgmma", plan, wg, "sm_90"))
    mma = MMAHint.default(plan, cuda_target(TARGETS["sm_80"]))
    if mma is not None:
        out.append(("mma", plan, mma, "sm_80"))
    out.append(("simple", plan, SimpleCUDAHint.default(plan), "sm_90"))
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["i8xi8-f32", "i8xi4-f16", "i4xi2-f32"])
def test_integer_activation_bias_codegen(case):
    """No CUDA template adds the float bias to the int32 sum as an int (the IR's epilogue, inlined by
    the mma and simple kernels; the hand-written GEMV and wgmma epilogues); each compiles."""
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    cfg = MatmulConfig(M=None, N=256, K=512, with_bias=True, **BIAS_CASES[case])
    kernels = _cuda_kernels(cfg)
    assert {"simple"} <= {k[0] for k in kernels}
    for name, plan, hint, arch in kernels:
        src = cuda_source(plan, TARGETS[arch], hint)
        body = src[src.index("__global__"):]
        assert "bias_ptr" in body, name
        assert "(int)bias_ptr" not in body and "(int)(bias" not in body, f"{name}: the bias is converted to int"
        if find_nvcc() is not None:
            assert nvcc_compile(src, arch)[:4] == b"\x7fELF", name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", list(BIAS_CASES))
def test_integer_activation_bias_gpu(case):
    """Every CUDA template (at its rows) and the operator's own choice at 1..200 rows: exact bias on
    zero rows, the reference elsewhere."""
    from bitblas.cache.kernels import get_kernel
    from bitblas.build import cuda_target
    cfg = MatmulConfig(M=None, N=256, K=512, with_bias=True, **BIAS_CASES[case])
    major, minor = torch.cuda.get_device_capability()
    for name, plan, hint, arch in _cuda_kernels(cfg):
        if int(arch[3:]) > major * 10 + minor:
            continue
        fn, _ = get_kernel(plan, hint, target=cuda_target(None))
        m = plan.m or 40
        inp = _bias_inputs(cfg, m, "cuda", seed=m)
        dt = TORCH_DTYPES[cfg.out_dtype]
        out = torch.full((m, cfg.N), float("nan") if dt.is_floating_point else -12345, dtype=dt, device="cuda")
        fn(*kernel_args(plan, inp, out))
        torch.cuda.synchronize()
        _check_bias(cfg, out, inp)
    op = bitblas.Matmul(cfg)
    for m in (1, 2, 5, 16, 17, 40, 64, 65, 200):
        inp = _bias_inputs(cfg, m, "cuda", seed=m)
        _check_bias(cfg, op(**inp), inp)


# -- item 3: an int32 output and a float bias -------------------------------------------------------------
def test_int32_output_refuses_fractional_bias(naming):
    cfg = MatmulConfig(M=None, N=4, K=16, A_dtype="int8", W_dtype="int8", with_bias=True, out_dtype="int32")
    op = bitblas.Matmul(cfg, target="llvm")
    w = torch.randint(-8, 8, (4, 16), dtype=torch.int8)
    with naming(ValueError, "bias"):
        op.transform_weight(w, bias=torch.tensor([1.0, -23.77, 3.0, 4.0]))
    with naming(ValueError, "bias"):
        op.transform_weight(w, bias=torch.tensor([1.0, float("nan"), 3.0, 4.0]))
    with naming(ValueError, "bias"):
        op.transform_weight(w, bias=torch.tensor([1.0, 2.0 ** 40, 3.0, 4.0]))
    # integer values in a float tensor are taken exactly
    W, bias = op.transform_weight(w, bias=torch.tensor([1.0, -23.0, 3.0, 4.0]))
    assert bias.dtype == torch.int32 and bias.tolist() == [1, -23, 3, 4]
    A = torch.randint(-8, 8, (3, 16), dtype=torch.int8)
    out = op(A, W, bias=bias)
    assert torch.equal(out, A.int() @ w.int().T + bias)
    # and the call itself takes only an int32 bias
    with naming(TypeError, "bias"):
        op(A, W, bias=torch.tensor([1.0, -23.0, 3.0, 4.0]))


# -- item 10: the nvcc process group ---------------------------------------------------------------------
def test_nvcc_timeout_kills_the_whole_group(tmp_path, monkeypatch):
    """A compiler that outlives its timeout is killed with its children (nvcc leaves cicc running
    when only nvcc is killed)."""
    import bitblas.build as b
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "nvcc"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(b, "find_nvcc", lambda: str(fake))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="process group"):
        b.nvcc_compile("__global__ void k() {}", "sm_90", timeout=1.0)
    assert time.monotonic() - t0 < 30
    child = int(pidfile.read_text())
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:          # reaped by init soon; a zombie counts as dead
            if f.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        pytest.fail(f"the compiler's child {child} outlived the timeout")


def test_nvcc_failure_names_the_error(tmp_path, monkeypatch):
    import bitblas.build as b
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'k.cu(1): error: bad kernel' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(b, "find_nvcc", lambda: str(fake))
    with pytest.raises(RuntimeError, match="bad kernel"):
        b.nvcc_compile("__global__ void k() {}", "sm_90")


# -- item 9: the suite never touches the user's database ------------------------------------------------------
def test_kernels_land_in_the_session_database():
    """Stores a CPU kernel through the default database: it must be the run's temporary one."""
    from bitblas.cache import kernels as km
    from bitblas.schedule import CPUHint
    cfg = MatmulConfig(M=None, N=32, K=64, A_dtype="float16", W_dtype="uint4", group_size=64, with_scaling=True)
    plan = make_plan(cfg, "cpu", None)
    km.get_kernel(plan, CPUHint(n_tile=8, k_vec=16), persist=True)
    key = km.kernel_key(plan, CPUHint(n_tile=8, k_vec=16), km.target_desc("cpu"))
    path = bitblas.cache.get_database_path()
    assert os.path.exists(bitblas.cache.get_database().record_path("kernel", key))
    assert os.environ.get("BITBLAS_DATABASE_PATH") == path
    assert not path.startswith(os.path.join(os.path.expanduser("~"), ".cache"))


def test_suite_never_writes_the_home_cache(tmp_path):
    """The test above, run by pytest in a fresh process with HOME at an empty folder and no
    BITBLAS_DATABASE_PATH: nothing appears under HOME/.cache/bitblas (conftest's session database)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("BITBLAS_DATABASE_PATH", "BITBLAS_DISABLE_CACHE")}
    env.update(HOME=str(home), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{os.path.abspath(__file__)}::test_kernels_land_in_the_session_database"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 passed" in r.stdout
    assert not (home / ".cache" / "bitblas").exists(), sorted(str(p) for p in (home / ".cache").rglob("*"))
