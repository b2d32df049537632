"""Matmul on its default backend: tuning, weight-dequantize forward, transform_weight.

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_ops_backend.py.
"""
import pytest
import torch

from bitblas import Matmul, MatmulConfig
from compat_helpers import (UNSET, check_transform_weight, finetune_cases, mm, mm_id, poisoned, quant_problem,
                            tuning_table)
from compat_marks import out_of_scope

CASES = tuning_table()
FINETUNE = finetune_cases(CASES)
FORWARD = [mm(1, 1024, 1024, "f16 i4 f16 f16", **UNSET)] + [s for s in CASES if s["W_dtype"] == "uint4"]
TRANSFORM = [mm(M, 768, 768, f"f16 {w} f16 f16", with_bias=False) for M in (1, 768) for w in ("u4", "i4")]


@out_of_scope("bitblas.tl (TileLang lowering of matmul.prim_func with tl_lower)")
def test_matmul_codegen_default():
    """testing/python/operators/test_general_matmul_ops_backend.py::test_matmul_codegen_default"""


@pytest.mark.parametrize("spec", FINETUNE, ids=mm_id)
def test_matmul_finetune(spec):
    """testing/python/operators/test_general_matmul_ops_backend.py::test_matmul_finetune"""
    op = Matmul(config=MatmulConfig(**spec), enable_tuning=False)
    op.hardware_aware_finetune(topk=10)
    assert op.get_source()


@pytest.mark.parametrize("spec", FORWARD, ids=mm_id)
def test_matmul_torch_forward(spec, device):
    """testing/python/operators/test_general_matmul_ops_backend.py::test_matmul_torch_forward"""
    op = Matmul(config=MatmulConfig(**spec, propagate_a=False), enable_tuning=False)
    problem = quant_problem(op, spec, device, scales="ones")
    out = poisoned((spec["M"], spec["N"]), torch.float16, device)
    op(*problem.args, output=out)
    torch.testing.assert_close(out, problem.expected.to(out.dtype), rtol=1e2, atol=1e0)


@pytest.mark.parametrize("spec", TRANSFORM, ids=mm_id)
def test_matmul_transform_weight(spec, device):
    """testing/python/operators/test_general_matmul_ops_backend.py::test_matmul_transform_weight"""
    op = Matmul(config=MatmulConfig(**spec), enable_tuning=False)
    check_transform_weight(op, spec, device)
