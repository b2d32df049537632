"""bitblas.Linear: float16 weights against nn.Linear, and quantized weights set through its buffers.

Mirrors microsoft/BitBLAS testing/python/module/test_bitblas_linear.py.
"""
import pytest
import torch
from torch import nn

import bitblas
import bitblas.testing
from bitblas.cache import global_operator_cache
from compat_helpers import mean_rows, quant_problem

FEATURES = 1024


@pytest.mark.parametrize("opt_M,bias", [(1, False), (1, True), (1024, True), ([1, 1024], True)],
                         ids=["m1", "m1-bias", "m1024-bias", "m1_1024-bias"])
def test_correctness_consistent(opt_M, bias, device):
    """testing/python/module/test_bitblas_linear.py::test_correctness_consistent"""
    dense = nn.Linear(FEATURES, FEATURES, bias=bias).to(torch.float16).to(device)
    layer = bitblas.Linear(FEATURES, FEATURES, bias=bias, A_dtype="float16", W_dtype="float16",
                           accum_dtype="float16", out_dtype="float16", opt_M=opt_M).to(device)
    with torch.no_grad():
        layer.load_and_transform_weight(dense.weight.clone())
        if bias:
            layer.bias = nn.Parameter(dense.bias.clone())
        x = torch.randn(mean_rows(opt_M), FEATURES, dtype=torch.float16).to(device)
        expected, got = dense(x), layer(x)
    bitblas.testing.torch_assert_close(expected, got, rtol=1e-1, atol=1e-2)


# (opt_M, bias, W_dtype, group_size, with_scaling, with_zeros, zeros_mode); BitBLAS lists the first twice
DEQUANT_CASES = [
    (1, False, "uint4", -1, False, False, None),
    (1, False, "uint4", -1, False, False, None),
    (1024, True, "uint4", -1, False, False, None),
    (1, True, "uint2", -1, True, False, None),
    (1, True, "uint2", 128, True, True, "original"),
    (1024, True, "uint2", 128, True, True, "original"),
    (1, True, "uint2", 128, True, True, "rescale"),
]


@pytest.mark.parametrize("opt_M,bias,W_dtype,group_size,with_scaling,with_zeros,zeros_mode", DEQUANT_CASES)
def test_correctness_weight_only_dequantize(opt_M, bias, W_dtype, group_size, with_scaling, with_zeros, zeros_mode,
                                            device):
    """testing/python/module/test_bitblas_linear.py::test_correctness_weight_only_dequantize"""
    global_operator_cache.clear()
    layer = bitblas.Linear(FEATURES, FEATURES, bias=bias, A_dtype="float16", W_dtype=W_dtype, accum_dtype="float16",
                           out_dtype="float16", group_size=group_size, with_scaling=with_scaling,
                           with_zeros=with_zeros, opt_M=opt_M).to(device)
    op = layer.bitblas_matmul
    assert (op.source_format, op.bit) == op.BITBLAS_TRICK_DTYPE_MAP[W_dtype]
    spec = dict(M=opt_M, N=FEATURES, K=FEATURES, W_dtype=W_dtype, with_bias=bias, group_size=group_size,
                with_scaling=with_scaling, with_zeros=with_zeros, zeros_mode=zeros_mode)
    problem = quant_problem(op, spec, device, scales="ones")
    x, qweight, *extras = problem.args
    with torch.no_grad():
        layer.qweight.data = qweight.clone()
        for name in [n for n, on in (("scales", with_scaling), ("zeros", with_zeros), ("bias", bias)) if on]:
            getattr(layer, name).data = extras.pop(0).clone()
        got = layer(x)
    tol = 1e2 if zeros_mode == "original" else 1e0
    torch.testing.assert_close(got, problem.expected.to(got.dtype), rtol=tol, atol=tol)
