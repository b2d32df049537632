"""bfloat16 activations with uint4 weights (tuned operator), per-tensor and grouped scales.

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_bf16.py.
"""
import pytest
import torch

import bitblas.testing
from bitblas import Matmul, MatmulConfig
from compat_helpers import UNSET, mm, mm_id, poisoned, quant_problem

_GROUPED = {**UNSET, "group_size": 32, "with_scaling": True}
CASES = [mm(M, 1024, 1024, "bf16 u4 f32 f32", **fields) for fields in (UNSET, _GROUPED) for M in (1, 1024)]


@pytest.mark.parametrize("spec", CASES, ids=mm_id)
def test_matmul_torch_forward_weight_dequantize(spec, device):
    """testing/python/operators/test_general_matmul_bf16.py::test_matmul_torch_forward_weight_dequantize"""
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("BitBLAS runs this test on compute capability 8.0 and above")
    op = Matmul(config=MatmulConfig(**spec, fast_decoding=False, propagate_a=False), enable_tuning=True)
    problem = quant_problem(op, spec, device, scales="randn", act_dtype=torch.bfloat16, bias_dtype=torch.float32)
    out = poisoned((spec["M"], spec["N"]), torch.float32, device)
    op(*problem.args, output=out)
    bitblas.testing.torch_assert_close(out, problem.expected, rtol=1e2, atol=1e0)
