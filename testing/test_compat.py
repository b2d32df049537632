"""Microsoft BitBLAS's API paths, target detection, logging and the TVM version pins."""
from __future__ import annotations

import logging

import pytest
import torch

import bitblas
from bitblas import _tvm
from bitblas.reference import reference_matmul, relative_error, tolerance


def _poisoned(shape, dtype=torch.float16):
    return torch.full(shape, float("nan"), dtype=dtype)


def test_matmul_in_dtype_positional_output():
    """BitBLAS QuickStart: MatmulConfig(in_dtype=...), op(A, W, output)."""
    from bitblas.ops.matmul import Matmul, MatmulConfig
    assert Matmul is bitblas.Matmul and MatmulConfig is bitblas.MatmulConfig
    config = MatmulConfig(M=[1, 32], N=40, K=256, in_dtype="float16", out_dtype="float16", accum_dtype="float16",
                          layout="nt")
    assert config.A_dtype == "float16" and config.W_dtype == "float16" and config.M == (1, 32)
    op = Matmul(config=config, target="llvm")
    A = torch.randn(7, 256, dtype=torch.float16)
    W = torch.randn(40, 256, dtype=torch.float16)
    out = _poisoned((7, 40))
    assert op(A, W, out) is out
    assert relative_error(out, A.double() @ W.double().T) <= tolerance(config)


def test_in_dtype_sets_activation_dtype():
    config = bitblas.MatmulConfig(N=64, K=64, in_dtype="int8", W_dtype="int4")
    assert config.A_dtype == "int8"
    assert "in_dtype" not in config.to_dict()
    assert bitblas.MatmulConfig.from_dict(config.to_dict()) == config


def _wo_config(**kw):
    from bitblas.ops.matmul_dequantize import MatmulWeightOnlyDequantizeConfig
    return MatmulWeightOnlyDequantizeConfig(M=[1, 32], N=40, K=256, in_dtype="float16", out_dtype="float16",
                                            accum_dtype="float16", bit=4, storage_dtype="int8", source_format="uint",
                                            with_scaling=True, with_zeros=True, group_size=128, fast_decoding=True,
                                            with_bias=False, propagate_a=False, propagate_b=False, layout="nt",
                                            zeros_type="quantized", **kw)


def test_weight_only_dequantize_config():
    config = _wo_config()
    assert isinstance(config, bitblas.MatmulConfig)
    assert (config.W_dtype, config.zeros_mode, config.group_size) == ("uint4", "quantized", 128)
    from bitblas.ops.matmul_dequantize import MatmulWeightOnlyDequantizeConfig
    assert MatmulWeightOnlyDequantizeConfig(bit=4, source_format="nf").W_dtype == "nf4"
    assert MatmulWeightOnlyDequantizeConfig(bit=4, source_format="fp").W_dtype == "fp4_e2m1"
    with pytest.raises(ValueError, match="source_format"):
        MatmulWeightOnlyDequantizeConfig(bit=4, source_format="float")
    with pytest.raises(ValueError, match="W_dtype='uint3'"):
        MatmulWeightOnlyDequantizeConfig(bit=3, source_format="uint")


def test_weight_only_dequantize_transform_and_call():
    """transform_weight(codes, scale, zeros) -> [W, scale, zeros]; op(A, W, scale, zeros, output)."""
    from bitblas.ops.matmul_dequantize import MatmulWeightOnlyDequantize
    config = _wo_config()
    op = MatmulWeightOnlyDequantize(config, target="llvm")
    N, K = config.N, config.K
    codes = torch.randint(0, 16, (N, K), dtype=torch.int8)
    scale = (torch.rand(N, 2) * 0.02 + 0.001).half()
    zeros = torch.randint(0, 16, (N, 2), dtype=torch.int8)
    res = op.transform_weight(codes, scale, zeros)
    assert isinstance(res, list) and len(res) == 3
    W, s, z = res
    assert W.dtype == torch.int8 and W.shape == (N, K // 2)
    assert torch.equal(s, scale)
    assert z.dtype == torch.int8 and z.shape == (2, N // 2)   # [groups, N] packed along N: 2 codes a byte
    assert torch.equal(op.transform_weight(codes), W)
    A = torch.randn(5, K, dtype=torch.float16)
    out = _poisoned((5, N))
    assert op(A, W, s, z, out) is out
    # against a dequantization written here, not the library's
    deq = (codes.double() - zeros.double().repeat_interleave(128, 1)) * scale.double().repeat_interleave(128, 1)
    assert relative_error(out, A.double() @ deq.T) <= tolerance(config)
    assert relative_error(out, reference_matmul(config, A, W, s, z)) <= tolerance(config)


def test_positional_fills_bias_then_output():
    config = bitblas.MatmulConfig(N=40, K=128, W_dtype="int4", with_scaling=True, group_size=64, with_bias=True)
    op = bitblas.Matmul(config)
    codes = torch.randint(-8, 8, (40, 128), dtype=torch.int8)
    scale = (torch.rand(40, 2) * 0.02 + 0.001).half()
    bias = torch.randn(40).half()
    W, s, b = op.transform_weight(codes, scale, bias=bias)
    A = torch.randn(3, 128, dtype=torch.float16)
    out = _poisoned((3, 40))
    assert op(A, W, s, b, out) is out
    ref = A.double() @ (codes.double() * scale.double().repeat_interleave(64, 1)).T + bias.double()
    assert relative_error(out, ref) <= tolerance(config)


def test_auto_detect_nvidia_target_without_gpu(monkeypatch):
    from bitblas import env
    from bitblas.utils import auto_detect_nvidia_target
    monkeypatch.setattr(env, "TARGET", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    t = auto_detect_nvidia_target()
    assert t.kind.name == "cuda"
    assert str(t.attrs["arch"]) == "sm_80"


def test_set_log_level():
    logger = logging.getLogger("bitblas")
    before = logger.level
    try:
        bitblas.set_log_level("INFO")
        assert logger.level == logging.INFO
        bitblas.set_log_level("debug")
        assert logger.level == logging.DEBUG
        bitblas.set_log_level(logging.ERROR)
        assert logger.level == logging.ERROR
        with pytest.raises(ValueError, match="level='LOUD'"):
            bitblas.set_log_level("LOUD")
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(before)
        for h in [h for h in logger.handlers if type(h).__name__ == "_StderrHandler"]:
            logger.removeHandler(h)


def test_import_adds_only_a_null_handler():
    assert all(isinstance(h, logging.NullHandler) for h in logging.getLogger("bitblas").handlers)


def _fake_installed(ffi, tvm_v):
    def installed(dist, module):
        return {"apache-tvm-ffi": ffi, "apache-tvm": tvm_v}[dist]
    return installed


def test_check_versions_accepts_pins(monkeypatch):
    monkeypatch.setattr(_tvm, "installed", _fake_installed(_tvm.REQUIRED_TVM_FFI, _tvm.REQUIRED_TVM))
    _tvm.check_versions()


@pytest.mark.parametrize("ffi, tvm_v", [("0.1.15", _tvm.REQUIRED_TVM), (None, _tvm.REQUIRED_TVM),
                                         (_tvm.REQUIRED_TVM_FFI, "0.26.0")],
                         ids=["ffi-0.1.15", "ffi-missing", "tvm-0.26"])
def test_check_versions_rejects_other_versions(monkeypatch, ffi, tvm_v):
    monkeypatch.setattr(_tvm, "installed", _fake_installed(ffi, tvm_v))
    with pytest.raises(ImportError) as info:
        _tvm.check_versions()
    msg = str(info.value)
    assert "0.1.14.post1" in msg and "0.27.0.post1" in msg
    assert str(ffi or "missing") in msg and tvm_v in msg


@pytest.mark.parametrize("kw", [
    dict(A_dtype="float16", W_dtype="uint4", with_scaling=False, with_zeros=True, zeros_mode="original", group_size=32),
    dict(A_dtype="int8", W_dtype="int8", accum_dtype="int32", out_dtype="int8", with_bias=True),
    dict(A_dtype="float16", W_dtype="int4", with_scaling=True, group_size=32),
])
def test_profile_latency_times_calls_of_the_operator(kw):
    """profile_latency times calls through the operator (``apply``: checks, dispatch, launch), also
    for configs in BitBLAS's spellings that the kernels run in another (zero points without scales,
    int8 outputs), which it used to refuse; ``kernel_only`` launches the compiled kernel directly."""
    op = bitblas.Matmul(bitblas.MatmulConfig(M=[1, 8], N=64, K=64, **kw), target="llvm")
    calls = []
    apply = op.apply
    op.apply = lambda *a: calls.append(a) or apply(*a)
    ms = op.profile_latency(m=3, repeats=4)
    assert ms > 0 and calls and all(a[0].shape == (3, 64) for a in calls)
    assert (calls[0][-1].dtype == torch.int8) == (kw.get("out_dtype") == "int8")
    n = len(calls)
    assert op.profile_latency(m=3, repeats=4, kernel_only=True) > 0 and len(calls) == n


def test_profile_latency_repeats_one_weight_unless_flush_l2():
    """By default profile_latency calls the operator on the same tensors each time, as Microsoft
    BitBLAS's (tvm's time_evaluator) and integration/pytorch's test_profile_performance, which
    compares it with a loop of forward calls on one layer, expect; ``flush_l2=True`` cycles
    through weight copies (the cache size of the machine decides how many: at least 2 for a weight
    of 4 KiB)."""
    op = bitblas.Matmul(bitblas.MatmulConfig(M=[1, 8], N=64, K=64, A_dtype="float16", W_dtype="float16"),
                        target="llvm")
    calls = []
    apply = op.apply
    op.apply = lambda *a: calls.append(a) or apply(*a)
    op.profile_latency(m=2, repeats=3)
    assert len({a[1].data_ptr() for a in calls}) == 1
    calls.clear()
    op.profile_latency(m=2, repeats=3, flush_l2=True)
    assert len({a[1].data_ptr() for a in calls}) > 1
