"""Matmul with backend="tl": source, tuning, float16 forward, weight-dequantize forward.

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_ops_backend_tl.py.
"""
import pytest
import torch

import bitblas.testing
from bitblas import Matmul, MatmulConfig
from compat_helpers import PLAIN, UNSET, mm, mm_id, poisoned, quant_problem, tuning_table

NO_LAYOUT_HINTS = dict(propagate_a=False, propagate_b=False)

FINETUNE = [
    pytest.param(mm(1024, 1024, 1024, "f16 f16 f16 f16", **PLAIN, propagate_b=False), id="static"),
    mm([1, 128], 1024, 1024, "f16 f16 f16 f16", **PLAIN, propagate_b=False),
]

FORWARD = [mm(1024, 1024, 1024, "f16 f16 f16 f16", **UNSET, propagate_b=p) for p in (False, True)]

# BitBLAS's keyword defaults for this test, then each case's keywords over them
_DEQUANT_DEFAULTS = dict(layout="nt", with_bias=False, group_size=-1, with_scaling=False, with_zeros=False,
                         zeros_mode="original", fast_decoding=True, propagate_b=None)
_ZERO_MODES = [dict(group_size=32, with_scaling=True, with_zeros=True, zeros_mode=m)
               for m in ("original", "rescale", "quantized")]
_ONE_ROW = [("u4", {}), ("u4", dict(fast_decoding=False)), ("i4", dict(group_size=-1, with_scaling=True)),
            ("i4", dict(group_size=32, with_scaling=True))] + [("u4", z) for z in _ZERO_MODES]
_MANY_ROWS = [("u4", dict(propagate_b=False)), ("i4", dict(group_size=-1, with_scaling=True)),
              ("i4", dict(group_size=32, with_scaling=True))] + [("u4", z) for z in _ZERO_MODES]
DEQUANT = [mm(M, 256, 256, f"f16 {w} f16 f16", **{**_DEQUANT_DEFAULTS, **kw})
           for M, cases in ((1, _ONE_ROW), (256, _MANY_ROWS)) for w, kw in cases]


@pytest.mark.parametrize("spec", tuning_table(), ids=mm_id)
def test_matmul_codegen_default(spec):
    """testing/python/operators/test_general_matmul_ops_backend_tl.py::test_matmul_codegen_default"""
    assert Matmul(config=MatmulConfig(**spec, **NO_LAYOUT_HINTS), enable_tuning=False, backend="tl").get_source()


@pytest.mark.parametrize("spec", FINETUNE, ids=mm_id)
def test_matmul_finetune(spec):
    """testing/python/operators/test_general_matmul_ops_backend_tl.py::test_matmul_finetune"""
    op = Matmul(config=MatmulConfig(**spec, propagate_a=False), enable_tuning=False, backend="tl")
    op.hardware_aware_finetune(topk=20)
    assert op.get_source()


@pytest.mark.parametrize("spec", FORWARD, ids=mm_id)
def test_matmul_torch_forward(spec, device):
    """testing/python/operators/test_general_matmul_ops_backend_tl.py::test_matmul_torch_forward"""
    op = Matmul(config=MatmulConfig(**spec, propagate_a=False), enable_tuning=False, backend="tl")
    A = torch.rand(spec["M"], spec["K"], dtype=torch.float16, device=device)
    B = torch.rand(spec["N"], spec["K"], dtype=torch.float16, device=device)
    out = op(A, op.transform_weight(B))
    torch.testing.assert_close(out, (A.float() @ B.float().T).to(torch.float16), rtol=1e-1, atol=1e-1)


@pytest.mark.parametrize("spec", DEQUANT, ids=mm_id)
def test_matmul_torch_dequant_forward(spec, device):
    """testing/python/operators/test_general_matmul_ops_backend_tl.py::test_matmul_torch_dequant_forward"""
    op = Matmul(config=MatmulConfig(**spec, propagate_a=False), enable_tuning=False, backend="tl")
    problem = quant_problem(op, spec, device, scales="rand")
    out = poisoned((spec["M"], spec["N"]), torch.float16, device)
    op(*problem.args, output=out)
    bitblas.testing.torch_assert_close(out, problem.expected.to(out.dtype), rtol=1e-2, atol=1e-2,
                                       max_mismatched_ratio=0.05)
