"""The int8 tensor-core path of bitblas/schedule/cuda_mma.py (mma.sync m16n8k32 s8 x s8 -> s32):
W8A8, and W4A8 / W2A8 with the weights decoded to int8 in shared memory, per-channel weight scale x
per-token activation scale in the epilogue. The default for int8 activations with rows > 16 (or
symbolic M) where ``mma_int8_unsupported_reason`` is None (GPU tests passed on the H200, and a
compute-sanitizer memcheck run was clean, before it became the default).

    python -m pytest testing/test_mma_int8.py -m "not gpu"     # CI: dispatch + nvcc codegen
    python -m pytest testing/test_mma_int8.py -m gpu           # GPU: kernels vs reference
"""
from __future__ import annotations

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_source, cuda_target, find_nvcc, nvcc_compile
from bitblas.plan import make_plan
from bitblas.schedule import MMAHint, SimpleCUDAHint
from bitblas.kernels import default_hint
from kernel_helpers import TARGETS, check_kernel
from bitblas.schedule.cuda_mma import mma_int8_unsupported_reason

C = MatmulConfig
SCALED = dict(A_dtype="int8", with_scaling=True, with_act_scaling=True)


def _plan(cfg, m=None):
    return make_plan(cfg, "cuda", cfg.M if isinstance(cfg.M, int) else m)


# -- dispatch (CPU only): the default for int8 activations with rows > 16 ---------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cfg", [
    C(M=None, N=1000, K=512, W_dtype="int8", **SCALED),
    C(M=128, N=256, K=512, A_dtype="int8", W_dtype="int8", out_dtype="int32"),
    C(M=None, N=256, K=512, W_dtype="int4", **SCALED),
    C(M=65, N=256, K=512, W_dtype="int2", **SCALED),
], ids=["w8a8-dyn", "w8a8-int32", "w4a8", "w2a8-M65"])
def test_int8_default(cfg, arch):
    plan = _plan(cfg)
    target = cuda_target(TARGETS[arch])
    hint = MMAHint.default(plan, target)
    assert isinstance(hint, MMAHint) and hint.BK % 32 == 0
    from bitblas.schedule import WGMMAHint
    wgmma = arch == "sm_90" and cfg.W_dtype == "int8"   # test_wgmma
    assert default_hint(plan, target) == (WGMMAHint.default(plan, target) if wgmma else hint)


@pytest.mark.parametrize("cfg", [
    C(M=None, N=256, K=512, W_dtype="int4", group_size=128, **SCALED),          # grouped scales
    C(M=None, N=256, K=512, W_dtype="uint8", **SCALED),                         # values beyond int8
], ids=["grouped", "uint8"])
def test_int8_default_falls_back(cfg):
    plan = _plan(cfg)
    assert isinstance(default_hint(plan, cuda_target(TARGETS["sm_90"])), SimpleCUDAHint)
    assert isinstance(default_hint(plan, cuda_target("sm_75")), SimpleCUDAHint)


def test_int8_small_m_takes_gemv():
    """Static M up to 16 goes to the GEMV template's dp4a kernel (testing/test_gpu_gemv.py), not to mma."""
    from bitblas.schedule import GEMVHint
    plan = _plan(C(M=16, N=256, K=512, W_dtype="int4", **SCALED))
    assert isinstance(default_hint(plan, cuda_target(TARGETS["sm_90"])), GEMVHint)


@pytest.mark.parametrize("cfg,why", [
    (C(M=None, N=256, K=512, W_dtype="int4", group_size=128, **SCALED), "group"),
    (C(M=None, N=256, K=512, W_dtype="uint8", **SCALED), "W_dtype"),
    (C(M=16, N=256, K=512, W_dtype="int8", **SCALED), "M=16"),
    (C(M=None, N=256, K=528, W_dtype="int8", **SCALED), "K=528"),
    (C(M=None, N=256, K=512), "A_dtype"),
], ids=["grouped", "uint8", "M16", "K528", "f16"])
def test_int8_unsupported(cfg, why):
    plan = _plan(cfg)
    assert why in mma_int8_unsupported_reason(plan)
    if cfg.A_dtype == "int8":        # no default tile; an explicit hint is refused with the reason
        assert MMAHint.default(plan) is None
        from bitblas.build import lower_plan
        with pytest.raises(ValueError, match="does not apply"):
            lower_plan(plan, MMAHint(BK=32), cuda_target("sm_80"))


def test_int8_bk_must_be_32():
    from bitblas.build import lower_plan
    plan = _plan(C(M=None, N=256, K=512, W_dtype="int8", **SCALED))
    with pytest.raises(ValueError, match="does not fit"):
        lower_plan(plan, MMAHint(BM=64, BN=64, WM=32, WN=32, BK=16), cuda_target("sm_80"))


# -- codegen through nvcc (no GPU) ---------------------------------------------------------------
CODEGEN = {
    "w8a8-dyn-N1000-f16": C(M=None, N=1000, K=512, W_dtype="int8", **SCALED),
    "w8a8-M17-N256-bf16": C(M=17, N=256, K=512, W_dtype="int8", out_dtype="bfloat16", **SCALED),
    "w8a8-M128-N1000-f32-bias": C(M=128, N=1000, K=512, W_dtype="int8", out_dtype="float32", with_bias=True,
                                  **SCALED),
    "w8a8-M128-N256-int32": C(M=128, N=256, K=512, A_dtype="int8", W_dtype="int8", out_dtype="int32"),
    "w8a8-dyn-N1000-int32": C(M=None, N=1000, K=512, A_dtype="int8", W_dtype="int8", out_dtype="int32"),
    "w4a8-dyn-N256-f16": C(M=None, N=256, K=512, W_dtype="int4", **SCALED),
    "w2a8-M17-N1000-f16": C(M=17, N=1000, K=512, W_dtype="int2", **SCALED),
    "uint4a8-M128-N256-int32": C(M=128, N=256, K=512, A_dtype="int8", W_dtype="uint4", out_dtype="int32"),
}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(CODEGEN))
def test_int8_mma_codegen(name, arch):
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    cfg = CODEGEN[name]
    plan = _plan(cfg)
    target = cuda_target(TARGETS[arch])
    hint = MMAHint.default(plan, target)
    assert hint is not None
    src = cuda_source(plan, target, hint)
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4" in src
    if plan.m is not None and plan.m % hint.BM == 0 and cfg.N % hint.BN == 0:
        # no edge tiles: every global -> shared copy is a cp.async (TVM 0.27 makes predicated
        # zero-filling cp.async only for float tiles: int8 edge tiles load synchronously)
        assert "cp.async.cg.shared.global" in src and "cp.async.commit_group" in src
    assert nvcc_compile(src, arch)[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_int8_mma_codegen_small_tile():
    """A hand-made hint (64 x 64 blocks, 4 warps, BK=64, 2 stages) on a symbolic-M W8A8 kernel."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    plan = _plan(CODEGEN["w8a8-dyn-N1000-f16"])
    src = cuda_source(plan, cuda_target(TARGETS["sm_80"]), MMAHint(BM=64, BN=64, WM=32, WN=32, BK=64, stages=2))
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in src
    assert nvcc_compile(src, "sm_80")[:4] == b"\x7fELF"


# -- GPU: correctness of the default and of hand-made hints ---------------------------------------
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GPU_CONFIGS = {
    "w8a8-f16": dict(W_dtype="int8", **SCALED),
    "w8a8-bf16": dict(W_dtype="int8", out_dtype="bfloat16", **SCALED),
    "w8a8-f32-bias": dict(W_dtype="int8", out_dtype="float32", with_bias=True, **SCALED),
    "w8a8-int32": dict(A_dtype="int8", W_dtype="int8", out_dtype="int32"),
    "w4a8-f16": dict(W_dtype="int4", **SCALED),
    "w2a8-f16": dict(W_dtype="int2", **SCALED),
    "uint4a8-int32": dict(A_dtype="int8", W_dtype="uint4", out_dtype="int32"),
}
SHAPES = ((256, 512), (1000, 512), (1000, 1536))
M_LIST = (17, 128, 1000, 1024)


def _check(cfg, plan, fn, m):
    return check_kernel(cfg, plan, fn, m)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", list(GPU_CONFIGS))
def test_int8_mma_dynamic(name, n, k):
    cfg = C(M=None, N=n, K=k, **GPU_CONFIGS[name])
    plan = make_plan(cfg, "cuda", None)
    target = cuda_target()
    hint = MMAHint.default(plan, target)
    assert hint is not None
    fn = build_plan(plan, target, hint)
    errors = [e for e in (_check(cfg, plan, fn, m) for m in M_LIST) if e]
    assert not errors, f"{cfg} {hint}:\n" + "\n".join(errors)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name,m,n,hint", [
    ("w8a8-f16", 17, 1000, None), ("w8a8-int32", 128, 256, None), ("w8a8-bf16", 1000, 1000, None),
    ("w4a8-f16", 128, 1000, None), ("w2a8-f16", 17, 256, None),
    ("w8a8-int32", 1000, 1000, MMAHint(BM=64, BN=64, WM=32, WN=32, BK=64, stages=2)),
    ("w8a8-f16", 1024, 1000, MMAHint(BM=128, BN=128, WM=64, WN=64, BK=128, stages=3)),
    ("w4a8-f16", 1000, 256, MMAHint(BM=128, BN=128, WM=64, WN=64, BK=32, stages=4, vec_decode=4)),
])
def test_int8_mma_static_m(name, m, n, hint):
    cfg = C(M=m, N=n, K=512, **GPU_CONFIGS[name])
    plan = make_plan(cfg, "cuda", m)
    target = cuda_target()
    hint = hint or MMAHint.default(plan, target)
    fn = build_plan(plan, target, hint)
    err = _check(cfg, plan, fn, m)
    assert err is None, f"{hint}: {err}"
