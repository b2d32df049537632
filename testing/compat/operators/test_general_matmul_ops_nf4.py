"""nf4 weights decoded through the operator's lookup table (``Matmul.lut``).

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_ops_nf4.py.
"""
import pytest
import torch

from bitblas import Matmul, MatmulConfig
from compat_helpers import mm, mm_id, poisoned, reference, weight_values


@pytest.mark.parametrize("spec", [mm(1, 1024, 1024, "f16 nf4 f16 f16"), mm(768, 768, 768, "f16 nf4 f16 f16")],
                         ids=mm_id)
def test_matmul_torch_forward(spec, device):
    """testing/python/operators/test_general_matmul_ops_nf4.py::test_matmul_torch_forward"""
    op = Matmul(config=MatmulConfig(**spec), enable_tuning=False)
    assert op.scheduled_ir_module is not None
    M, N, K = spec["M"], spec["N"], spec["K"]
    A = (torch.rand(M, K, dtype=torch.float16) - 0.5).to(device)
    values, codes = weight_values(*op.BITBLAS_TRICK_DTYPE_MAP[spec["W_dtype"]], (N, K), device)
    table = op.lut
    assert table is not None
    expected = reference(A, table.float().to(device)[values.long()], out_dtype=torch.float16)
    out = poisoned((M, N), torch.float16, device)
    op(A, op.weight_transform(codes.cpu()).to(device), output=out)
    torch.testing.assert_close(out, expected, rtol=1e2, atol=1e0)
