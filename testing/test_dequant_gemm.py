"""Decode-then-GEMM for quantized weights with many rows on Hopper (bitblas/dequant_gemm.py).

    python -m pytest testing/test_dequant_gemm.py -m "not gpu"     # CI: dispatch and argument wiring
    python -m pytest testing/test_dequant_gemm.py -m gpu           # H100/H200: Matmul vs reference
"""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.kernels.select import DEQUANT_GEMM_MIN_ROWS, dense_config, dequant_gemm_reason, gemv_serves
from bitblas.plan import make_plan
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import WGMMAHint
from bitblas.schedule.gemv import GEMV_MMA_MAX_ROWS
from bitblas.schedule.gemv.mma import row_class
from kernel_helpers import TARGETS, choose, past_gemv

C = MatmulConfig
G = 128
FORMATS = {
    "uint4-g128-zeros": dict(W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
    "int4-g128-bias": dict(W_dtype="int4", group_size=G, with_scaling=True, with_bias=True),
    "uint4-qzeros": dict(W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True, zeros_mode="quantized"),
    "int2-g128": dict(W_dtype="int2", group_size=G, with_scaling=True),
    "uint1-rescale": dict(W_dtype="uint1", group_size=G, with_scaling=True, with_zeros=True, zeros_mode="rescale"),
    "int8-chan": dict(W_dtype="int8", with_scaling=True),
    "nf4-g128": dict(W_dtype="nf4", group_size=G, with_scaling=True),
    "fp4-g128": dict(W_dtype="fp4_e2m1", group_size=G, with_scaling=True),
    "e4m3-w": dict(W_dtype="float8_e4m3", with_scaling=True),
    "nvfp4-bf16": dict(A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True, out_dtype="bfloat16"),
    "uint4-bf16": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True,
                       out_dtype="bfloat16"),
    # int8 activations: int8 codes, then the int8 wgmma (group scales by float32 promotion)
    "w4a8-g128": dict(A_dtype="int8", W_dtype="int4", group_size=G, with_scaling=True, with_act_scaling=True),
    "w2a8-chan-bias": dict(A_dtype="int8", W_dtype="uint2", with_scaling=True, with_act_scaling=True,
                           with_bias=True, out_dtype="bfloat16"),
    "w4a8-g256-u4": dict(A_dtype="int8", W_dtype="uint4", group_size=256, with_scaling=True),
    # float8_e4m3 activations (W4A-fp8): e4m3 codes of the integer values, then the float8 wgmma
    "w4afp8-g128": dict(A_dtype="float8_e4m3", W_dtype="int4", group_size=G, with_scaling=True,
                        with_act_scaling=True),
    "w2afp8-chan-bias": dict(A_dtype="float8_e4m3", W_dtype="uint2", with_scaling=True, with_act_scaling=True,
                             with_bias=True, out_dtype="bfloat16"),
    "w4afp8-u4-g256": dict(A_dtype="float8_e4m3", W_dtype="uint4", group_size=256, with_scaling=True),
}
CODES = [f for f in FORMATS if FORMATS[f].get("A_dtype") in ("int8", "float8_e4m3")]   # decoded to codes


def test_dense_config_keeps_shape_bias_output():
    c = C(M=None, N=1000, K=512, A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True,
          with_bias=True, out_dtype="float32")
    d = dense_config(c)
    assert (d.N, d.K, d.A_dtype, d.W_dtype, d.out_dtype, d.with_bias) == (1000, 512, "bfloat16", "bfloat16", "float32", True)
    assert not d.with_scaling and not d.with_zeros


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dispatch_on_sm90(fmt):
    op = bitblas.Matmul(C(N=1024, K=1024, **FORMATS[fmt]), target=TARGETS["sm_90"])
    assert dequant_gemm_reason(op._base_plan("cuda"), op.target) is None
    m, choice = choose(op, "cuda", 4096)
    assert m is None and choice[0] == "dequant-gemm" and isinstance(choice[1], WGMMAHint)
    few = choose(op, "cuda", DEQUANT_GEMM_MIN_ROWS - 1)[1]
    assert few is None                                                  # fewer rows: the GEMV
    # 17..64 rows: the tensor-core GEMV (the kernel of the rows' class) where it takes the plan, else this path
    for rows in (DEQUANT_GEMM_MIN_ROWS, GEMV_MMA_MAX_ROWS):
        expect = (row_class(rows), None) if gemv_serves(op._kc, "cuda", rows, op.arch) else None
        got = choose(op, "cuda", rows)
        assert got == expect if expect else past_gemv(got[1]), (rows, got)
    m, choice = choose(op, "cuda", GEMV_MMA_MAX_ROWS + 1)
    assert m is None and past_gemv(choice)            # the fused wgmma GEMM where it is the default


@pytest.mark.parametrize("target", [TARGETS["sm_80"], TARGETS["sm_89"], "sm_90"], ids=["sm80", "sm89", "sm90-48KB"])
def test_not_without_wgmma(target):
    op = bitblas.Matmul(C(N=1024, K=1024, **FORMATS["uint4-g128-zeros"]), target=target)
    assert "wgmma" in dequant_gemm_reason(op._base_plan("cuda"), op.target)
    assert choose(op, "cuda", 4096) == (None, None)


def test_reasons():
    t = bitblas.build.cuda_target(TARGETS["sm_90"])
    dense = make_plan(C(M=None, N=256, K=512), "cuda", None)
    assert "nothing to decode" in dequant_gemm_reason(dense, t)
    w8a8 = make_plan(C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int8", with_scaling=True), "cuda", None)
    assert "nothing to decode" in dequant_gemm_reason(w8a8, t)
    w4a8_g64 = make_plan(C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int4", with_scaling=True, group_size=64),
                         "cuda", None)
    assert "wgmma" in dequant_gemm_reason(w4a8_g64, t)          # int8 group scales: multiples of 128
    u8a8 = make_plan(C(M=None, N=256, K=512, A_dtype="int8", W_dtype="uint8", with_scaling=True), "cuda", None)
    assert "W_dtype='uint8'" in dequant_gemm_reason(u8a8, t)
    assert dequant_gemm_reason(make_plan(C(M=None, N=256, K=512, **FORMATS["nf4-g128"]), "cpu", None), t)


def test_dense_config_int8():
    c = C(M=None, N=1000, K=512, A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True,
          with_act_scaling=True, with_bias=True, out_dtype="bfloat16")
    d = dense_config(c)
    assert (d.A_dtype, d.W_dtype, d.group_size, d.with_scaling, d.with_act_scaling, d.with_bias, d.out_dtype) == \
        ("int8", "int8", 128, True, True, True, "bfloat16")


def test_dense_config_float8():
    c = C(M=None, N=1000, K=512, **FORMATS["w4afp8-g128"])
    d = dense_config(c)
    assert (d.A_dtype, d.W_dtype, d.group_size, d.with_scaling, d.with_act_scaling) == \
        ("float8_e4m3", "float8_e4m3", 128, True, True)


@pytest.mark.parametrize("fmt", CODES)
def test_codes_then_dense_gemm_cpu(fmt):
    """The two halves with codes in between (int8 / float8 activations), on the CPU: the decode
    kernel's codes, given to the dense plan's operator with the plan's own scales, bias and
    activation scales, give the quantized operator's reference (the GPU path runs the same pair)."""
    from bitblas.dequant_gemm import DequantGemm
    from bitblas.schedule.cuda_dequant import build_dequant, dequant_args
    cfg = C(M=None, N=96, K=512, **FORMATS[fmt])
    plan = make_plan(cfg, "cuda", None)
    d = DequantGemm(plan, bitblas.build.cuda_target(TARGETS["sm_90"]))
    inputs = random_inputs(cfg, 33, seed=7)
    codes = torch.full((cfg.N, cfg.K), 99, dtype=torch.int8)
    build_dequant(plan, "cpu")(*dequant_args(plan, inputs, codes))
    dense = dense_config(cfg)
    wt = codes if dense.W_dtype == "int8" else codes.view(torch.float8_e4m3fn)
    names = [s.name for s in plan.args]
    kw = {s.name: (wt if i is None else inputs[names[i]]) for s, i in zip(d.dense_plan.args, d._gemm_idx)
          if s.role == "input" and not isinstance(i, str)}
    assert [i for i in d._gemm_idx if isinstance(i, str)] == (["w_table"] if "fp8" in fmt else [])
    out = bitblas.Matmul(dense, target="llvm")(**kw)
    err = relative_error(out, reference_matmul(cfg, **inputs))
    assert err <= tolerance(cfg), f"{fmt}: rel. err {err:.3e}"


def test_argument_wiring_int8():
    from bitblas.dequant_gemm import DequantGemm
    plan = make_plan(C(N=1024, K=1024, **FORMATS["w4a8-g128"]), "cuda", None)
    d = DequantGemm(plan, bitblas.build.cuda_target(TARGETS["sm_90"]))
    names = [s.name for s in plan.args]
    assert [names[i] for i in d._deq_idx] == ["W"]
    assert [None if i is None else names[i] for i in d._gemm_idx] == ["A", None, "scale", "a_scale", "output"]
    assert d._dtype == torch.int8 and d.hint.promote_tiles(d.dense_plan) == 1


def test_argument_wiring():
    from bitblas.dequant_gemm import DequantGemm
    cfg = C(N=1024, K=1024, **FORMATS["nvfp4-bf16"], with_bias=True)
    plan = make_plan(cfg, "cuda", None)
    # no GPU needed to wire: kernels build source-only modules here
    d = DequantGemm(plan, bitblas.build.cuda_target(TARGETS["sm_90"]))
    names = [s.name for s in plan.args]
    assert [names[i] for i in d._deq_idx] == ["W", "scale", "global_scale", "w_table", "s_table"]
    assert [None if i is None else names[i] for i in d._gemm_idx] == ["A", None, "bias", "output"]


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("NK", [(1024, 4096), (1000, 1024)], ids=["N1024K4096", "N1000K1024"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_matmul(fmt, NK):
    N, K = NK
    cfg = C(N=N, K=K, **FORMATS[fmt])
    op = bitblas.Matmul(cfg)
    for rows in (GEMV_MMA_MAX_ROWS + 1, 300, 1024, 2049):     # fewer: the GEMV (test_gpu_gemv_mma)
        inputs = random_inputs(cfg, rows, device="cuda", seed=rows)
        out = torch.full((rows, N), float("nan"), dtype=getattr(torch, cfg.out_dtype), device="cuda")
        op(**inputs, output=out)
        assert past_gemv(choose(op, "cuda", rows)[1])
        torch.cuda.synchronize()
        err = relative_error(out.cpu(), reference_matmul(cfg, **inputs))
        assert err <= tolerance(cfg), f"{fmt} rows={rows}: rel. err {err:.3e} > {tolerance(cfg):.1e}"


def test_static_m_takes_the_path_too():
    """A config with an int M (one static kernel) above the GEMV's rows also decodes then runs wgmma,
    and the tuner leaves that bucket alone as it does for dynamic M."""
    from bitblas.tune.tuner import composite_serves
    cfg = C(M=4096, N=1024, K=1024, **FORMATS["uint4-g128-zeros"])
    op = bitblas.Matmul(cfg, target=TARGETS["sm_90"])
    m, choice = choose(op, "cuda", 4096)
    assert m == 4096 and choice[0] == "dequant-gemm"
    assert composite_serves(cfg, "cuda", 4096, TARGETS["sm_90"]) is not None
    small = C(M=8, N=1024, K=1024, **FORMATS["uint4-g128-zeros"])
    assert choose(bitblas.Matmul(small, target=TARGETS["sm_90"]), "cuda", 8) == (8, None)      # GEMV
    assert composite_serves(small, "cuda", 8, TARGETS["sm_90"]) is None
    mid = C(M=48, N=1024, K=1024, **FORMATS["uint4-g128-zeros"])       # 17..64 rows: the tensor-core GEMV
    assert choose(bitblas.Matmul(mid, target=TARGETS["sm_90"]), "cuda", 48) == (48, None)
    assert composite_serves(mid, "cuda", 48, TARGETS["sm_90"]) is None
