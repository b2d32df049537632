"""The float8 tensor-core path of bitblas/schedule/cuda_mma.py: float8_e4m3 / float8_e5m2 activations
and weights (any pairing), ``mma.sync.m16n8k32.row.col.f32.<a>.<b>.f32`` on sm_89+, fp32 accumulate,
per-channel weight scale x per-token activation scale, bias and the output cast in the epilogue.
The default for such plans with rows > 16 (or symbolic M) on an sm_89+ target; sm_80 and unknown
targets keep the simple schedule.

    python -m pytest testing/test_mma_fp8.py -m "not gpu"     # CI: dispatch + nvcc codegen
    python -m pytest testing/test_mma_fp8.py -m gpu           # GPU (sm_89+): kernels vs reference
"""
from __future__ import annotations

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_source, cuda_target, find_nvcc, lower_plan, nvcc_compile
from bitblas.ir.matmul import emit_matmul
from bitblas.plan import make_plan
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import MMAHint, SimpleCUDAHint, WGMMAHint
from bitblas.kernels import default_hint
from kernel_helpers import A100_SPEC, H200_SPEC, TARGETS, check_kernel, fp8_mma_tolerance
from bitblas.schedule.cuda_mma import mma_fp8_unsupported_reason, mma_reason

C = MatmulConfig
E4, E5 = "float8_e4m3", "float8_e5m2"
SCALED = dict(with_scaling=True, with_act_scaling=True)
PTX = {E4: "e4m3", E5: "e5m2"}


def _plan(cfg, m=None):
    return make_plan(cfg, "cuda", cfg.M if isinstance(cfg.M, int) else m)


def _mma_name(cfg):
    # integer codes with float8_e4m3 activations (W4A-fp8) are decoded to e4m3
    return f"mma.sync.aligned.m16n8k32.row.col.f32.{PTX[cfg.A_dtype]}.{PTX.get(cfg.W_dtype, 'e4m3')}.f32"


# -- dispatch (CPU only) --------------------------------------------------------------------------
DISPATCH = {
    "e4m3xe4m3-dyn-bf16": C(M=None, N=1000, K=512, A_dtype=E4, W_dtype=E4, out_dtype="bfloat16", **SCALED),
    "e5m2xe4m3-M17": C(M=17, N=256, K=512, A_dtype=E5, W_dtype=E4, **SCALED),
    "e4m3xe5m2-M128-f32-bias": C(M=128, N=256, K=512, A_dtype=E4, W_dtype=E5, out_dtype="float32", with_bias=True,
                                 **SCALED),
    "e4m3xe4m3-noscale": C(M=None, N=256, K=512, A_dtype=E4, W_dtype=E4, out_dtype="float32"),
}


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("name", list(DISPATCH))
def test_fp8_default(name, arch):
    plan = _plan(DISPATCH[name])
    target = cuda_target(TARGETS[arch])
    hint = MMAHint.default(plan, target)
    assert isinstance(hint, MMAHint) and hint.BK % 32 == 0
    assert hint.smem_bytes(plan) <= TARGETS[arch]["max_shared_memory_per_block"]
    wgmma = arch == "sm_90"      # Hopper: wgmma (test_wgmma)
    assert default_hint(plan, target) == (WGMMAHint.default(plan, target) if wgmma else hint)
    assert mma_reason(plan, int(arch[3:])) is None


@pytest.mark.parametrize("target", [TARGETS["sm_80"], "sm_75", None], ids=["sm80", "sm75", "unknown"])
def test_fp8_falls_back_below_sm89(target):
    plan = _plan(DISPATCH["e4m3xe4m3-dyn-bf16"])
    t = cuda_target(target) if target is not None else None
    assert isinstance(default_hint(plan, t), SimpleCUDAHint)
    assert MMAHint.default(plan, t) is None
    assert "sm_89" in mma_fp8_unsupported_reason(plan, 80 if target else None)


def test_fp8_explicit_hint_refused_below_sm89():
    plan = _plan(DISPATCH["e4m3xe4m3-dyn-bf16"])
    with pytest.raises(ValueError, match="does not apply.*sm_80"):
        lower_plan(plan, MMAHint(BK=32), cuda_target(TARGETS["sm_80"]))


@pytest.mark.parametrize("cfg,why", [
    (C(M=None, N=256, K=512, A_dtype=E4, W_dtype=E4, group_size=128, **SCALED), "group"),
    (C(M=16, N=256, K=512, A_dtype=E4, W_dtype=E4, **SCALED), "M=16"),
    (C(M=None, N=256, K=528, A_dtype=E4, W_dtype=E4, **SCALED), "K=528"),
    (C(M=None, N=256, K=512, A_dtype="bfloat16", W_dtype=E4, with_scaling=True), "A_dtype"),
], ids=["grouped", "M16", "K528", "bf16xe4m3"])
def test_fp8_unsupported(cfg, why):
    plan = _plan(cfg)
    assert why in mma_fp8_unsupported_reason(plan, 90)
    if cfg.A_dtype != "bfloat16":           # bf16 x e4m3 is the fp16/bf16 path's (decoded weights)
        target = cuda_target(TARGETS["sm_90"])
        # wgmma loads K tails through TMA (K % 16 suffices): it takes K=528 on sm_90 (and any
        # row count), and group scales of 128 (float32 promotion of each group's partial sums)
        assert isinstance(default_hint(plan, target), WGMMAHint)
        with pytest.raises(ValueError, match="does not apply"):
            lower_plan(plan, MMAHint(BK=32), target)


def test_fp8_bk_must_be_32():
    plan = _plan(DISPATCH["e4m3xe4m3-dyn-bf16"])
    with pytest.raises(ValueError, match="does not fit"):
        lower_plan(plan, MMAHint(BM=64, BN=64, WM=32, WN=32, BK=16), cuda_target(TARGETS["sm_90"]))


def test_fp8_ir_keeps_the_plan_signature():
    """The fp8_values IR multiplies reinterpreted float8 values, and keeps every argument of the plan
    (the unused code tables too), so callers pass the same arguments to either schedule."""
    plan = _plan(DISPATCH["e4m3xe4m3-dyn-bf16"])
    func = emit_matmul(plan, fp8_values=True)
    assert len(func.params) == len(plan.args)
    script = func.script()
    assert "reinterpret" in script and "float8_e4m3fn" in script
    mod = lower_plan(plan, None, cuda_target(TARGETS["sm_90"]))
    assert len(mod["main"].params) == len(plan.args)
    with pytest.raises(ValueError, match="fp8_values"):
        emit_matmul(_plan(C(M=None, N=256, K=512, A_dtype="bfloat16", W_dtype=E4, with_scaling=True)),
                    fp8_values=True)


def test_fp8_tuner_space():
    from bitblas.schedule import cuda_mma
    from bitblas.tune.space import candidates
    h200, a100 = H200_SPEC, A100_SPEC
    cfg = DISPATCH["e4m3xe4m3-dyn-bf16"]
    plan = _plan(cfg)
    all_cands = candidates(cfg, "cuda", 256, h200)
    assert {type(c.hint).__name__ for c in all_cands} == {"MMAHint", "WGMMAHint"}   # wgmma: test_tune_wgmma.py
    cands = [c for c in all_cands if isinstance(c.hint, MMAHint)]
    assert len(cands) > 50
    assert all(c.plan_m is None and c.hint.BK % 32 == 0 and cuda_mma.copy_plan(plan, c.hint) is not None
               for c in cands)
    assert {type(c.hint) for c in candidates(cfg, "cuda", 256, a100)} == {SimpleCUDAHint}


# -- codegen through nvcc (no GPU) ---------------------------------------------------------------
CODEGEN = {
    "e4m3xe4m3-dyn-N1000-bf16": C(M=None, N=1000, K=512, A_dtype=E4, W_dtype=E4, out_dtype="bfloat16", **SCALED),
    "e5m2xe4m3-M17-N256-f16": C(M=17, N=256, K=512, A_dtype=E5, W_dtype=E4, **SCALED),
    "e4m3xe5m2-M128-N1000-f32-bias": C(M=128, N=1000, K=512, A_dtype=E4, W_dtype=E5, out_dtype="float32",
                                       with_bias=True, **SCALED),
    "e5m2xe5m2-M256-N256-bf16": C(M=256, N=256, K=512, A_dtype=E5, W_dtype=E5, out_dtype="bfloat16", **SCALED),
    "e4m3xe4m3-dyn-N256-noscale-f32": C(M=None, N=256, K=512, A_dtype=E4, W_dtype=E4, out_dtype="float32"),
    # W4A-fp8 / W2A-fp8 per channel: the codes decoded to e4m3 bits in the shared tile
    "e4m3xint4-dyn-N1000-bf16": C(M=None, N=1000, K=512, A_dtype=E4, W_dtype="int4", out_dtype="bfloat16", **SCALED),
    "e4m3xuint2-M128-N256-f32-bias": C(M=128, N=256, K=512, A_dtype=E4, W_dtype="uint2", out_dtype="float32",
                                       with_bias=True, **SCALED),
}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("name", list(CODEGEN))
def test_fp8_mma_codegen(name, arch):
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    cfg = CODEGEN[name]
    plan = _plan(cfg)
    target = cuda_target(TARGETS[arch])
    hint = MMAHint.default(plan, target)          # on sm_90 the default is wgmma
    assert isinstance(hint, MMAHint)
    src = cuda_source(plan, target, hint)
    assert _mma_name(cfg) in src
    assert "ldmatrix.sync.aligned.m8n8.x4" in src
    assert "w_table" not in src and "a_table" not in src          # no table decode in the kernel
    if plan.m is not None and plan.m % hint.BM == 0 and cfg.N % hint.BN == 0:
        assert "cp.async.cg.shared.global" in src and "cp.async.commit_group" in src
    assert nvcc_compile(src, arch)[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_fp8_mma_codegen_small_tile():
    """A hand-made hint (64 x 64 blocks, 4 warps, BK=64, 2 stages) on a symbolic-M e4m3 kernel."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    cfg = CODEGEN["e4m3xe4m3-dyn-N1000-bf16"]
    src = cuda_source(_plan(cfg), cuda_target(TARGETS["sm_90"]), MMAHint(BM=64, BN=64, WM=32, WN=32, BK=64, stages=2))
    assert _mma_name(cfg) in src
    assert nvcc_compile(src, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_fp8_sm80_falls_back_to_simple_codegen():
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    plan = _plan(CODEGEN["e4m3xe4m3-dyn-N1000-bf16"])
    src = cuda_source(plan, cuda_target(TARGETS["sm_80"]))
    assert "mma.sync" not in src
    assert nvcc_compile(src, "sm_80")[:4] == b"\x7fELF"


# -- GPU (sm_89+): correctness --------------------------------------------------------------------
def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_gpu = pytest.mark.skipif(not _fp8_gpu(), reason="needs a CUDA GPU of sm_89+")

GPU_CONFIGS = {
    "e4m3xe4m3-bf16": dict(A_dtype=E4, W_dtype=E4, out_dtype="bfloat16", **SCALED),
    "e4m3xe4m3-f16": dict(A_dtype=E4, W_dtype=E4, out_dtype="float16", **SCALED),
    "e4m3xe4m3-f32-bias": dict(A_dtype=E4, W_dtype=E4, out_dtype="float32", with_bias=True, **SCALED),
    "e5m2xe4m3-bf16": dict(A_dtype=E5, W_dtype=E4, out_dtype="bfloat16", **SCALED),
    "e5m2xe4m3-f16-bias": dict(A_dtype=E5, W_dtype=E4, out_dtype="float16", with_bias=True, **SCALED),
    "e4m3xe5m2-f32": dict(A_dtype=E4, W_dtype=E5, out_dtype="float32", **SCALED),
    "e4m3xe4m3-noscale-f32": dict(A_dtype=E4, W_dtype=E4, out_dtype="float32"),
    "e4m3xint4-bf16": dict(A_dtype=E4, W_dtype="int4", out_dtype="bfloat16", **SCALED),
    "e4m3xuint2-f32-bias": dict(A_dtype=E4, W_dtype="uint2", out_dtype="float32", with_bias=True, **SCALED),
}
SHAPES = ((256, 512), (1000, 512), (1000, 1536))
M_LIST = (17, 128, 1000, 1024)


def _check(cfg, plan, fn, m):
    return check_kernel(cfg, plan, fn, m, tol=fp8_mma_tolerance(cfg), report=True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", list(GPU_CONFIGS))
def test_fp8_mma_dynamic(name, n, k):
    cfg = C(M=None, N=n, K=k, **GPU_CONFIGS[name])
    plan = make_plan(cfg, "cuda", None)
    target = cuda_target()
    hint = MMAHint.default(plan, target)          # the mma.sync kernel, also on sm_90 (wgmma: test_wgmma)
    assert isinstance(hint, MMAHint), f"{target}: {mma_reason(plan)}"
    fn = build_plan(plan, target, hint)
    errors = [e for e in (_check(cfg, plan, fn, m) for m in M_LIST) if e]
    assert not errors, f"{cfg} {hint}:\n" + "\n".join(errors)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name,m,n,hint", [
    ("e4m3xe4m3-bf16", 17, 1000, None), ("e4m3xe4m3-f32-bias", 128, 256, None),
    ("e5m2xe4m3-bf16", 1000, 1000, None), ("e4m3xe5m2-f32", 1024, 1000, None),
    ("e4m3xe4m3-f16", 1000, 1000, MMAHint(BM=64, BN=64, WM=32, WN=32, BK=64, stages=2)),
    ("e4m3xe4m3-bf16", 1024, 1000, MMAHint(BM=128, BN=128, WM=64, WN=64, BK=128, stages=3)),
    ("e5m2xe4m3-f16-bias", 1000, 256, MMAHint(BM=128, BN=128, WM=64, WN=64, BK=32, stages=4, vec_decode=4)),
])
def test_fp8_mma_static_m(name, m, n, hint):
    cfg = C(M=m, N=n, K=512, **GPU_CONFIGS[name])
    plan = make_plan(cfg, "cuda", m)
    target = cuda_target()
    hint = hint or MMAHint.default(plan, target)
    assert isinstance(hint, MMAHint)
    fn = build_plan(plan, target, hint)
    err = _check(cfg, plan, fn, m)
    assert err is None, f"{hint}: {err}"


@pytest.mark.gpu
@needs_gpu
def test_fp8_matmul_operator_uses_mma():
    """The user path: bitblas.Matmul on CUDA tensors picks the fp8 tensor-core kernel and matches the reference."""
    import bitblas
    cfg = C(M=None, N=1000, K=1536, **GPU_CONFIGS["e4m3xe4m3-bf16"])
    op = bitblas.Matmul(cfg, target="cuda")
    src = op.get_source()
    assert ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in src
            or "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" in src)      # sm_90: wgmma
    inputs = random_inputs(cfg, 300, device="cuda", seed=7)
    out = op(**inputs)
    assert relative_error(out.cpu(), reference_matmul(cfg, **inputs)) <= fp8_mma_tolerance(cfg)


def test_fp8_schedule_needs_fp8_values_ir():
    from bitblas.schedule import schedule_cuda_mma
    plan = _plan(DISPATCH["e4m3xe4m3-dyn-bf16"])
    target = cuda_target(TARGETS["sm_90"])
    with pytest.raises(ValueError, match="ir_options"):
        schedule_cuda_mma(emit_matmul(plan), plan, MMAHint.default(plan, target), target)
