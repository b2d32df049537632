"""Matmul with backend="tir": source, tuning, weight-dequantize forward, transform_weight.

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_ops_backend_tir.py.
"""
import pytest
import torch

from bitblas import Matmul, MatmulConfig
from compat_helpers import (UNSET, check_transform_weight, finetune_cases, mm, mm_id, poisoned, quant_problem,
                            tuning_table)

CASES = tuning_table()
FINETUNE = finetune_cases(CASES)
FORWARD = [mm(1, 1024, 1024, "f16 i4 f16 f16", **UNSET)] + [s for s in CASES if s["W_dtype"] == "uint4"]
TRANSFORM = [mm(M, 768, 768, f"f16 {w} f16 f16", with_bias=False) for M in (1, 768) for w in ("u4", "i4")]


@pytest.mark.parametrize("spec", CASES, ids=mm_id)
def test_matmul_codegen_default(spec):
    """testing/python/operators/test_general_matmul_ops_backend_tir.py::test_matmul_codegen_default"""
    assert Matmul(config=MatmulConfig(**spec), enable_tuning=False, backend="tir").get_source()


@pytest.mark.parametrize("spec", FINETUNE, ids=mm_id)
def test_matmul_finetune(spec):
    """testing/python/operators/test_general_matmul_ops_backend_tir.py::test_matmul_finetune"""
    op = Matmul(config=MatmulConfig(**spec), enable_tuning=False, backend="tir")
    op.hardware_aware_finetune(topk=10)
    assert op.get_source()


@pytest.mark.parametrize("spec", FORWARD, ids=mm_id)
def test_matmul_torch_forward(spec, device):
    """testing/python/operators/test_general_matmul_ops_backend_tir.py::test_matmul_torch_forward"""
    op = Matmul(config=MatmulConfig(**spec, propagate_a=False), enable_tuning=False, backend="tir")
    problem = quant_problem(op, spec, device, scales="ones")
    out = poisoned((spec["M"], spec["N"]), torch.float16, device)
    op(*problem.args, output=out)
    torch.testing.assert_close(out, problem.expected.to(out.dtype), rtol=1e2, atol=1e0)


@pytest.mark.parametrize("spec", TRANSFORM, ids=mm_id)
def test_matmul_transform_weight(spec, device):
    """testing/python/operators/test_general_matmul_ops_backend_tir.py::test_matmul_transform_weight"""
    check_transform_weight(Matmul(config=MatmulConfig(**spec), enable_tuning=False, backend="tir"), spec, device)
