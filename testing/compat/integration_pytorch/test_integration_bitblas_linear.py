"""The calls of Microsoft BitBLAS's integration/pytorch example ``Linear`` (bitblas_linear.py), made
here directly: a float16 MatmulConfig in BitBLAS's older field names (``in_dtype``), ``Matmul`` on
``auto_detect_nvidia_target()``, and the forward ``op(A, weight[, bias], output)`` with the output
buffer passed last, positionally; checked against nn.Linear, and (GPU) the forward's latency against
``profile_latency()``.

Mirrors microsoft/BitBLAS integration/pytorch/test_bitblas_linear.py.
"""
import pytest
import torch
from torch import nn

from bitblas import Matmul, MatmulConfig
from bitblas.utils import auto_detect_nvidia_target
from integration_timing import forward_ms


def example_operator(opt_M, in_features, out_features, bias, enable_tuning=False):
    """The operator the example's Linear.__init__ builds for dtype=torch.float16."""
    config = MatmulConfig(M=opt_M, N=out_features, K=in_features, in_dtype="float16", out_dtype="float16",
                          accum_dtype="float16", with_bias=bias, propagate_a=False, propagate_b=False, layout="nt")
    op = Matmul(config=config, target=auto_detect_nvidia_target())
    if enable_tuning:
        op.hardware_aware_finetune(topk=20)
    return op


def example_forward(op, A, weight, bias=None, output=None):
    """The example's Linear.forward: a fresh output buffer unless one is given, passed last."""
    if output is None:
        output = torch.empty(A.shape[:-1] + (weight.shape[0],), dtype=A.dtype, device=A.device)
    op(*[t for t in (A, weight, bias) if t is not None], output)
    return output


@pytest.mark.parametrize("m,bias", [(1, False), (1, True), (1024, False), (1024, True)])
def test_correctness_static_shape(m, bias, device):
    """integration/pytorch/test_bitblas_linear.py::test_correctness_static_shape"""
    dense = nn.Linear(1024, 1024, bias=bias).to(torch.float16).to(device)
    op = example_operator(m, 1024, 1024, bias)
    with torch.no_grad():
        x = torch.randn(m, 1024, dtype=torch.float16).to(device)
        expected = dense(x)
        got = example_forward(op, x, dense.weight.clone(), dense.bias.clone() if bias else None)
    torch.testing.assert_close(expected, got, rtol=1e-1, atol=1e-2)


@pytest.mark.parametrize("m", [1, 1024])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU only: compares CUDA-synchronized forward latency "
                                                          "with the kernel's")
def test_profile_performance(m):
    """integration/pytorch/test_bitblas_linear.py::test_profile_performance"""
    op = example_operator(m, 1024, 1024, bias=False)
    weight = torch.empty(1024, 1024, dtype=torch.float16, device="cuda").uniform_(-1 / 32, 1 / 32)
    x = torch.randn(m, 1024, dtype=torch.float16, device="cuda")
    out = torch.empty(m, 1024, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        module_ms = forward_ms(lambda: example_forward(op, x, weight, output=out))
        kernel_ms = op.profile_latency()
    assert abs(module_ms - kernel_ms) / module_ms < 0.1, (module_ms, kernel_ms)

