"""The tensor-core template (bitblas/schedule/cuda_mma.py): dispatch rules (CPU only), CUDA codegen
through nvcc for sm_80 / sm_90 (no GPU needed), and on a GPU: correctness of Matmul on CUDA tensors
for every weight family at row counts and N, K that are no tile multiples, and speed beside cuBLAS.

    python -m pytest testing/test_gpu_mma.py -m "not gpu"        # CI: dispatch + nvcc codegen
    python -m pytest testing/test_gpu_mma.py -m gpu -s           # GPU: correctness, then timings
    python testing/test_gpu_mma.py --sweep                       # GPU: time a few tile variants
"""
from __future__ import annotations

import logging
import random
import sys

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_source, cuda_target, find_nvcc, nvcc_compile
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from kernel_helpers import TARGETS
from bitblas.schedule import MMAHint, SimpleCUDAHint, WGMMAHint
from bitblas.schedule.gemv.hints import GEMVMmaHint
from bitblas.kernels import default_hint

C = MatmulConfig
G = 128


def _plan(cfg, m=None):
    return make_plan(cfg, "cuda", cfg.M if isinstance(cfg.M, int) else m)


# -- dispatch (CPU only) --------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,expect", [
    (C(M=None, N=1000, K=512), WGMMAHint),                         # sm_90: wgmma (test_wgmma)
    (C(M=17, N=256, K=512), WGMMAHint),
    (C(M=16, N=256, K=512), WGMMAHint),
    (C(M=65, N=256, K=512, W_dtype="uint4", group_size=G, with_scaling=True), MMAHint),   # past the GEMV
    (C(M=16, N=256, K=512, A_dtype="int8", W_dtype="int4", with_scaling=True), GEMVMmaHint),  # small M: int8 mma GEMV
    (C(M=None, N=256, K=512, A_dtype="bfloat16", W_dtype="nf4", group_size=G, with_scaling=True), MMAHint),
    (C(M=None, N=256, K=512, W_dtype="nvfp4", group_size=16, with_scaling=True), MMAHint),
    (C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int8"), WGMMAHint),       # sm_90: wgmma (test_wgmma)
    (C(M=65, N=256, K=512, A_dtype="int8", W_dtype="int4", with_scaling=True), MMAHint),  # int8 path past the GEMV
    (C(M=None, N=256, K=512, A_dtype="float32", W_dtype="float16", out_dtype="float32"), SimpleCUDAHint),
    (C(M=None, N=256, K=512, layout="nn"), SimpleCUDAHint),
    (C(M=None, N=256, K=36), SimpleCUDAHint),                       # rows of A not 16-byte aligned
    (C(M=None, N=256, K=520, W_dtype="uint1", with_scaling=True), SimpleCUDAHint),   # 65-byte W rows
], ids=["f16-dyn", "f16-M17", "f16-M16", "u4-M65", "w4a8-M16", "bf16-nf4", "nvfp4", "int8", "w4a8-M65", "f32", "nn", "K36", "uint1-K520"])
def test_dispatch(cfg, expect):
    assert type(default_hint(_plan(cfg), cuda_target(TARGETS["sm_90"]))) is expect


def test_dispatch_target_limits():
    plan = _plan(C(M=None, N=4096, K=4096))
    assert isinstance(default_hint(plan, cuda_target("sm_75")), SimpleCUDAHint)   # no cp.async / m16n8k16
    small = default_hint(plan, cuda_target("sm_90"))                              # 48 KB of shared memory
    assert isinstance(small, MMAHint) and small.smem_bytes(plan) <= 49152
    big = MMAHint.default(plan, cuda_target(TARGETS["sm_90"]))
    assert isinstance(big, MMAHint) and (big.BM, big.BN) == (128, 128)
    assert isinstance(default_hint(plan, cuda_target(TARGETS["sm_90"])), WGMMAHint)


def test_hint_check():
    with pytest.raises(ValueError, match="BK"):
        MMAHint(BK=24).check()
    with pytest.raises(ValueError, match="WM"):
        MMAHint(BM=64, WM=48).check()
    with pytest.raises(ValueError, match="stages"):
        MMAHint(stages=1).check()


@pytest.mark.parametrize("kw,K", [(dict(), 64), (dict(), 16), (dict(A_dtype="int8", W_dtype="int8"), 64),
                                  (dict(W_dtype="uint4", group_size=32, with_scaling=True), 64)])
def test_short_k_stages(kw, K):
    """K of at most a few BK tiles (codegen fuzz seed 2784: N=138, K=56 on sm_80 / sm_89): the
    default tile keeps no more stages than K tiles + 1 (the ring's prologue loads stages - 1 tiles;
    with fewer, TVM left cp.async.wait_group a run-time operand and CUDA codegen failed), and
    copy_plan refuses such a tile for the tuner's space; the default lowers to CUDA."""
    from bitblas.schedule.cuda_mma import copy_plan
    plan = _plan(C(M=None, N=138, K=K, **kw))
    target = cuda_target(TARGETS["sm_80"])
    hint = default_hint(plan, target)
    assert isinstance(hint, MMAHint) and hint.stages - 1 <= -(-K // hint.BK), hint
    assert copy_plan(plan, MMAHint(BM=128, BN=128, WM=64, WN=64, BK=64, stages=3)) is None
    assert "mma.sync" in cuda_source(plan, target, hint)


# -- codegen through nvcc (no GPU) ---------------------------------------------------------------
CODEGEN = {
    "f16-dyn-N1000": C(M=None, N=1000, K=512, with_bias=True),
    "f16-M17-K520": C(M=17, N=256, K=520),
    "uint4-g128-zeros-dyn": C(M=None, N=1000, K=512, W_dtype="uint4", group_size=G, with_scaling=True,
                              with_zeros=True),
    "nvfp4-M1000": C(M=1000, N=256, K=512, W_dtype="nvfp4", group_size=16, with_scaling=True),
    "bf16-int2-zq": C(M=None, N=256, K=512, A_dtype="bfloat16", W_dtype="uint2", group_size=G, with_scaling=True,
                      with_zeros=True, zeros_mode="quantized", out_dtype="bfloat16"),
    "bf16-e4m3": C(M=None, N=256, K=512, A_dtype="bfloat16", W_dtype="float8_e4m3", with_scaling=True),
    # one weight row: TVM drops the row loop of the weight tile's copy (codegen fuzz seed 562 raised
    # a ScheduleError in the copy's loop fusion on sm_80 / sm_89)
    "uint8-g32-N1": C(M=None, N=1, K=640, W_dtype="uint8", group_size=32, with_scaling=True, out_dtype="float32"),
}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(CODEGEN))
def test_mma_codegen(name, arch):
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    cfg = CODEGEN[name]
    plan = _plan(cfg)
    target = cuda_target(TARGETS[arch])
    hint = MMAHint.default(plan, target)          # on sm_90 the default for float16 weights is wgmma
    assert isinstance(hint, MMAHint)
    src = cuda_source(plan, target, hint)
    dt = "bf16" if cfg.A_dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{dt}.{dt}.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4" in src
    assert "cp.async.cg.shared.global" in src and "cp.async.commit_group" in src
    assert nvcc_compile(src, arch)[:4] == b"\x7fELF"


# -- GPU: correctness -----------------------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

FAMILIES = {
    "f16-bias": dict(W_dtype="float16", with_bias=True),
    "uint4-g128-zeros": dict(W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
    "int4-g128": dict(W_dtype="int4", group_size=G, with_scaling=True),
    "int2-g128": dict(W_dtype="int2", group_size=G, with_scaling=True),
    "uint2-g128-zrescale": dict(W_dtype="uint2", group_size=G, with_scaling=True, with_zeros=True,
                                zeros_mode="rescale"),
    "uint1-chan": dict(W_dtype="uint1", with_scaling=True),
    "nf4-g128": dict(W_dtype="nf4", group_size=G, with_scaling=True),
    "fp4_e2m1-g128": dict(W_dtype="fp4_e2m1", group_size=G, with_scaling=True),
    "nvfp4": dict(W_dtype="nvfp4", group_size=16, with_scaling=True),
    "e4m3-chan": dict(W_dtype="float8_e4m3", with_scaling=True),
    "bf16": dict(A_dtype="bfloat16", W_dtype="bfloat16", out_dtype="bfloat16"),
    "bf16-uint4-g128-zquant": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=G, with_scaling=True,
                                   with_zeros=True, zeros_mode="quantized", out_dtype="bfloat16"),
    "bf16-e5m2-g128": dict(A_dtype="bfloat16", W_dtype="float8_e5m2", group_size=G, with_scaling=True,
                           out_dtype="float32"),
}
SHAPES = ((256, 512), (1000, 1536))
M_LIST = (17, 128, 1000, 1024)


def _run_check(op, m):
    cfg = op.config
    seed = random.randrange(2 ** 31)
    inputs = random_inputs(cfg, m, device="cuda", seed=seed)
    out = torch.full((m, cfg.N), float("nan"), dtype=TORCH_DTYPES[cfg.out_dtype], device="cuda")
    op(**inputs, output=out)
    torch.cuda.synchronize()
    err = relative_error(out.cpu(), reference_matmul(cfg, **inputs))
    return None if err <= tolerance(cfg) else f"m={m} seed={seed}: rel. err {err:.3e} > {tolerance(cfg):.1e}"


def _assert_mma(op, m):
    """A tensor-core kernel serves ``m`` rows: the mma / wgmma GEMM, or, for 17..64 rows of a
    packed weight, the tensor-core GEMV (gemv/mma.py: chunks of 16 rows)."""
    plan = make_plan(op.config, "cuda", op._static_m(m))
    hint = default_hint(plan, op.target)
    ok = (MMAHint, WGMMAHint) + ((GEMVMmaHint,) if plan.m is not None and 17 <= plan.m <= 64 else ())
    assert isinstance(hint, ok), f"{op.config} m={m}: no tensor-core template ({hint})"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("fam", list(FAMILIES))
def test_mma_formats(fam, n, k, caplog):
    op = bitblas.Matmul(C(M=None, N=n, K=k, **FAMILIES[fam]))
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        errors = [e for e in (_run_check(op, m) for m in M_LIST) if e]
    _assert_mma(op, M_LIST[0])
    assert "failed to build" not in caplog.text, caplog.text
    assert not errors, f"{op.config}:\n" + "\n".join(errors)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fam,m,n,k", [
    ("f16-bias", 17, 1000, 520), ("f16-bias", 1000, 1000, 1536), ("uint4-g128-zeros", 1000, 1000, 1536),
    ("nvfp4", 33, 1000, 1536), ("nvfp4", 97, 1000, 1536),
    ("bf16", 100, 1000, 520), ("int2-g128", 1024, 256, 512),
])
def test_mma_static_m(fam, m, n, k, caplog):
    op = bitblas.Matmul(C(M=m, N=n, K=k, **FAMILIES[fam]))
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        err = _run_check(op, m)
    _assert_mma(op, m)
    assert "failed to build" not in caplog.text, caplog.text
    assert err is None, err


# -- GPU: speed beside cuBLAS -----------------------------------------------------------------------
def _bench(fn, iters=200):
    try:
        import triton.testing as tt
        return tt.do_bench(fn, warmup=50, rep=400, return_mode="median") * 1e3
    except ImportError:
        for _ in range(20):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / iters * 1e3


SPEED = {
    "f16-gemm": dict(W_dtype="float16"),
    "w4a16-uint4-g128-zeros": dict(W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
    "w4a16-int4-g128": dict(W_dtype="int4", group_size=G, with_scaling=True),
}


_SPEED_DATA = {}


def _speed_data(kw, M, N, K):
    """Inputs, a float32 GPU reference and a cuBLAS baseline for one speed config (cached)."""
    key = (tuple(sorted(kw.items())), M, N, K)
    if key not in _SPEED_DATA:
        from bitblas.quantization import dequantize
        cfg = C(M=M, N=N, K=K, **kw)
        inputs = random_inputs(cfg, M, device="cuda", seed=0)
        wf = dequantize(cfg, inputs["W"].cpu(), *(inputs[k].cpu() if k in inputs else None
                                                   for k in ("scale", "zeros", "global_scale")))
        a = inputs["A"]
        w16 = wf.to(a.dtype).cuda()                     # the dense weight cuBLAS multiplies by
        ref = a.float() @ wf.float().cuda().T
        _SPEED_DATA[key] = (cfg, inputs, ref, w16)
    return _SPEED_DATA[key]


def _time_config(kw, M=4096, N=4096, K=4096, hint=None):
    """(bitblas µs, cuBLAS µs, rel. err): the operator's default kernel (``hint`` None, called through
    Matmul) or the kernel of ``hint`` (called directly); cuBLAS: torch.matmul with the dequantized
    weight in the activation dtype."""
    cfg, inputs, ref, w16 = _speed_data(kw, M, N, K)
    out = torch.full((M, N), float("nan"), dtype=TORCH_DTYPES[cfg.out_dtype], device="cuda")
    op = bitblas.Matmul(cfg)
    if hint is None:
        _assert_mma(op, M)
        call = lambda: op(**inputs, output=out)  # noqa: E731
    else:
        plan = make_plan(cfg, "cuda", M)
        fn = build_plan(plan, op.target, hint)
        args = []
        for s in plan.args:
            if s.role == "output":
                args.append(out)
            elif s.name in inputs:
                t = inputs[s.name]
                args.append(t.view(torch.int8) if s.dtype == "int8" and t.dtype != torch.int8 else t)
            else:                                            # tables, default global scale
                args.append(op._const(s.name, plan, torch.device("cuda")))
        call = lambda: fn(*args)  # noqa: E731
    call()
    torch.cuda.synchronize()
    err = relative_error(out.float(), ref)
    t_ours = _bench(call)
    a = inputs["A"]
    t_cublas = _bench(lambda: torch.matmul(a, w16.T))
    return t_ours, t_cublas, err


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", list(SPEED))
def test_mma_speed_4096(name):
    t_ours, t_cublas, err = _time_config(SPEED[name])
    flops = 2 * 4096 ** 3
    print(f"\n[speed] {name} M=N=K=4096: bitblas {t_ours:.0f} us ({flops / t_ours / 1e6:.0f} TFLOP/s), "
          f"cuBLAS fp16 {t_cublas:.0f} us ({flops / t_cublas / 1e6:.0f} TFLOP/s), "
          f"cuBLAS/bitblas = {t_cublas / t_ours:.2f}x, rel. err {err:.1e}")
    assert err <= 4e-3


def _sweep():
    d = dict(BM=128, BN=128, WM=64, WN=64)
    variants = {
        "f16-gemm": [MMAHint(**d, BK=64, stages=3), MMAHint(**d, BK=32, stages=4), MMAHint(**d, BK=64, stages=4),
                     MMAHint(BM=256, BN=128, WM=64, WN=64, BK=64, stages=3),
                     MMAHint(BM=128, BN=256, WM=64, WN=64, BK=64, stages=3),
                     MMAHint(BM=256, BN=128, WM=64, WN=64, BK=32, stages=4)],
        "w4a16-uint4-g128-zeros": [MMAHint(**d, BK=64, stages=3, vec_decode=8), MMAHint(**d, BK=64, stages=3, vec_decode=2),
                                   MMAHint(**d, BK=32, stages=4, vec_decode=8),
                                   MMAHint(BM=256, BN=128, WM=64, WN=64, BK=32, stages=3, vec_decode=8),
                                   MMAHint(BM=256, BN=128, WM=64, WN=64, BK=64, stages=3, vec_decode=8),
                                   MMAHint(BM=256, BN=128, WM=64, WN=64, BK=64, stages=3, vec_decode=16),
                                   MMAHint(**d, BK=64, stages=3, vec_decode=8, inner_pipeline=True)],
    }
    for name in ("f16-gemm", "w4a16-uint4-g128-zeros"):
        for h in variants[name]:
            try:
                t, tc, err = _time_config(SPEED[name], hint=h)
                print(f"[sweep] {name} {h}: {t:.0f} us, cuBLAS {tc:.0f} us, ratio {tc / t:.2f}, err {err:.1e}",
                      flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"[sweep] {name} {h}: FAILED {type(e).__name__}: {str(e)[-300:]}", flush=True)


if __name__ == "__main__" and "--sweep" in sys.argv:
    _sweep()
