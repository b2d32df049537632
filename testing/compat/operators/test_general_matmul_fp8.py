"""float8 (e4m3 / e5m2) activations and weights, and float16 activations with e4m3 weights.

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_fp8.py.
"""
import pytest
import torch

from bitblas import Matmul, MatmulConfig
from compat_helpers import TORCH_DT, UNSET, mm, mm_id

_GROUPED = {**UNSET, "group_size": 32, "with_scaling": True}
FP8_X_FP8 = [mm(M, 1024, 1024, f"{t} {t} f32 f32", **UNSET) for t in ("e4m3", "e5m2") for M in (1, 1024)]
F16_X_FP8 = [mm(M, 1024, 1024, "f16 e4m3 f16 f16", **fields) for fields in (UNSET, _GROUPED) for M in (1, 1024)]


def _needs_sm89(device):
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("BitBLAS runs this test on compute capability 8.9 and above")


def _uniform(rows, cols, dtype, device):
    """Values uniform in [-1, 1), rounded to ``dtype``."""
    return torch.empty(rows, cols).uniform_(-1, 1).to(dtype).to(device)


@pytest.mark.parametrize("spec", FP8_X_FP8, ids=mm_id)
def test_matmul_torch_forward(spec, device):
    """testing/python/operators/test_general_matmul_fp8.py::test_matmul_torch_forward

    BitBLAS's test only prints both results; here they are also compared, with the tolerance its
    weight-dequantize sibling uses (rtol=1e-1, atol=1e-1)."""
    _needs_sm89(device)
    op = Matmul(config=MatmulConfig(**spec), enable_tuning=False, backend="tl")
    a = _uniform(spec["M"], spec["K"], TORCH_DT[spec["A_dtype"]], device)
    b = _uniform(spec["N"], spec["K"], TORCH_DT[spec["W_dtype"]], device)
    out = op(a, op.transform_weight(b))
    assert out.dtype == torch.float32 and out.shape == (spec["M"], spec["N"])
    torch.testing.assert_close(out, a.float() @ b.float().T, rtol=1e-1, atol=1e-1)


@pytest.mark.parametrize("spec", F16_X_FP8, ids=mm_id)
def test_matmul_torch_forward_weight_dequantize(spec, device):
    """testing/python/operators/test_general_matmul_fp8.py::test_matmul_torch_forward_weight_dequantize"""
    _needs_sm89(device)
    op = Matmul(config=MatmulConfig(**spec, propagate_a=False, propagate_b=False), enable_tuning=False, backend="tir")
    M, N, K = spec["M"], spec["N"], spec["K"]
    a = _uniform(M, K, torch.float16, device)
    b = _uniform(N, K, torch.float8_e4m3fn, device)
    w = b.float()
    args = [a, op.transform_weight(b)]
    if spec["with_scaling"]:
        group_size = K if spec["group_size"] in (None, -1) else spec["group_size"]
        scale = _uniform(N, K // group_size, torch.float16, device)
        w = (w * scale.float().repeat_interleave(group_size, dim=1)).half().float()
        args.append(scale)
    expected = (a.float() @ w.T).half()
    torch.testing.assert_close(expected, op(*args), rtol=1e-1, atol=1e-1)
