"""CUDA code generation without a GPU: the generated source of representative configs compiles
to a cubin with nvcc for sm_80 and sm_90 (tvm.compile alone returns source only without libcuda)."""
import pytest

import bitblas
from bitblas.build import cuda_source, find_nvcc, nvcc_compile
from bitblas.plan import make_plan

pytestmark = pytest.mark.nvcc

C = bitblas.MatmulConfig
CONFIGS = {
    "f16xf16": C(M=None, N=256, K=512),
    "bf16xbf16_nn": C(M=64, N=256, K=512, A_dtype="bfloat16", layout="nn", out_dtype="float32"),
    "f16xuint4_g128_zorig_bias": C(M=None, N=256, K=512, W_dtype="uint4", group_size=128, with_scaling=True,
                                   with_zeros=True, with_bias=True),
    "f16xuint4_g128_zquant": C(M=1, N=256, K=512, W_dtype="uint4", group_size=128, with_scaling=True,
                               with_zeros=True, zeros_mode="quantized"),
    "bf16xint2_g64_zresc": C(M=None, N=256, K=512, A_dtype="bfloat16", W_dtype="int2", group_size=64,
                             with_scaling=True, with_zeros=True, zeros_mode="rescale"),
    "f16xuint1": C(M=None, N=256, K=512, W_dtype="uint1", with_scaling=True),
    "f16xnf4_g128": C(M=16, N=256, K=512, W_dtype="nf4", group_size=128, with_scaling=True),
    "f16xfp4": C(M=None, N=256, K=512, W_dtype="fp4_e2m1", group_size=32, with_scaling=True),
    "f16xnvfp4": C(M=None, N=256, K=512, W_dtype="nvfp4", group_size=16, with_scaling=True),
    "f16xe4m3": C(M=None, N=256, K=512, W_dtype="float8_e4m3", with_scaling=True),
    "i8xi8_chan_tok": C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int8", with_scaling=True,
                        with_act_scaling=True, out_dtype="bfloat16"),
    "i8xi8_int32": C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int8", out_dtype="int32"),
    "i8xi4_g128": C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True),
    "i4xi2": C(M=None, N=256, K=512, A_dtype="int4", W_dtype="int2", out_dtype="int32"),
    # weights in BitBLAS's fast-decoding order (the default above for int / uint 1-4 bits with float16
    # or int8 activations): the int8 GEMVs' gathers, and the natural order kept with fast_decoding=False
    "i8xu1_gemv_order": C(M=1, N=256, K=512, A_dtype="int8", W_dtype="uint1", with_scaling=True),
    "i8xi2_mma_gemv_order": C(M=16, N=256, K=512, A_dtype="int8", W_dtype="int2", with_scaling=True),
    "f16xuint4_natural": C(M=1, N=256, K=512, W_dtype="uint4", group_size=128, with_scaling=True,
                           fast_decoding=False),
    "e4m3xe5m2": C(M=None, N=256, K=512, A_dtype="float8_e4m3", W_dtype="float8_e5m2", with_scaling=True,
                   with_act_scaling=True),
}


@pytest.fixture(scope="module", autouse=True)
def _need_nvcc():
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_cuda_source_compiles(name, arch):
    cfg = CONFIGS[name]
    plan = make_plan(cfg, "cuda", cfg.M if isinstance(cfg.M, int) else None)
    src = cuda_source(plan, arch)
    assert "__global__" in src and "extern \"C\"" in src
    cubin = nvcc_compile(src, arch)
    assert cubin[:4] == b"\x7fELF", "nvcc did not produce an ELF cubin"


def test_nvcc_reports_errors():
    with pytest.raises(RuntimeError, match="nvcc failed"):
        nvcc_compile("__global__ void broken( { }", "sm_90")


def test_get_source_without_gpu():
    op = bitblas.Matmul(CONFIGS["f16xuint4_g128_zorig_bias"], target="sm_90")
    src = op.get_source()
    assert "__global__" in src
    assert nvcc_compile(src, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.nvcc
def test_get_source_is_the_kernel_the_call_runs():
    """get_source(m=...) gives what a call with m rows runs: the GEMV rows kernel at 1 row, the
    tensor-core GEMV of the row class (its run-time row count), the tuned hint of the bucket, past
    the GEMV's rows the fused wgmma GEMM, then the decode kernel plus the dense wgmma GEMM (Hopper); the symbolic kernel
    without m for a dynamic M; a bad m is refused by name."""
    from bitblas.dispatch import BucketTable
    from bitblas.schedule import GEMVHint
    from kernel_helpers import TARGETS
    cfg = C(M=[1, 16, 256], N=256, K=512, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True)
    op = bitblas.Matmul(cfg, target=TARGETS["sm_90"])      # the sm_90 shared memory: wgmma
    rows1 = op.get_source(m=1)
    assert "bb_dec_" in rows1 and "mma.sync" not in rows1
    mma5 = op.get_source(m=5)
    assert "mma.sync" in mma5 and "int mv" in mma5 and mma5 == op.get_source(m=8)
    fused = op.get_source(m=200)                             # the fused wgmma GEMM (its default rows)
    assert "wgmma" in fused and "dense GEMM" not in fused
    big = op.get_source(m=2000)                              # past them (N < 8192): decode + dense GEMM
    assert "dense GEMM on the decoded weights" in big and "wgmma" in big
    assert "dense GEMM" not in op.get_source()              # no m: the symbolic-M kernel
    h = GEMVHint(rows_per_warp=2, warps=4, unroll=2)
    op._buckets = BucketTable((1, 16, 256))
    op._tuned["cuda"] = {1: (1, h)}
    tuned = op.get_source(m=1)
    assert tuned != rows1 and "__launch_bounds__(128)" in tuned     # 4 warps of the tuned hint
    static = bitblas.Matmul(C(M=3, N=256, K=512, A_dtype="float16", W_dtype="uint4", group_size=128,
                                         with_scaling=True), target=TARGETS["sm_90"])
    assert static.get_source() == mma5                       # M=3: the 8-row class kernel
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="m="):
            op.get_source(m=bad)
    for part in big.split("// ---- dense GEMM on the decoded weights ----"):    # two kernels, two sources
        assert nvcc_compile(part, "sm_90")[:4] == b"\x7fELF"
