"""int4 activations with int4 / int2 weights, packed by the caller, int32 output.

Mirrors microsoft/BitBLAS testing/python/operators/test_general_matmul_ops_int4.py.
"""
import pytest
import torch

import bitblas
from compat_helpers import pack_fields, poisoned, reference
from compat_marks import out_of_scope

_LADDER = out_of_scope("BitBLAS's ladder-permuted weight layout (bitblas.ops.LadderPermutate, propagate_b=True)")
_LOP3 = out_of_scope("BitBLAS's LOP3 permutation for decoding int2 to int4 (bitblas.ops.LOP3Permutate, "
                     "datatype='int4')")


def _case(W_dtype, propagate_b, fast_decoding=False, marks=()):
    return pytest.param(W_dtype, propagate_b, fast_decoding, marks=marks,
                        id=f"{W_dtype}-propb={propagate_b}-fastdec={fast_decoding}")


CASES = [_case("int4", False), _case("int4", True, marks=_LADDER),
         _case("int2", False, False), _case("int2", False, True, marks=_LOP3),
         _case("int2", True, False, marks=_LADDER), _case("int2", True, True, marks=_LADDER)]


@pytest.mark.parametrize("W_dtype,propagate_b,fast_decoding", CASES)
def test_matmul_torch_forward(W_dtype, propagate_b, fast_decoding, device):
    """testing/python/operators/test_general_matmul_ops_int4.py::test_matmul_torch_forward"""
    M = N = K = 128
    config = bitblas.MatmulConfig(M=M, N=N, K=K, A_dtype="int4", W_dtype=W_dtype, accum_dtype="int32",
                                  out_dtype="int32", layout="nt", propagate_b=propagate_b, fast_decoding=fast_decoding)
    op = bitblas.Matmul(config=config, enable_tuning=False)
    assert op.get_source()
    bits = int(W_dtype[3:])
    A = torch.randint(0, 4, (M, K), dtype=torch.int8, device=device)
    B = torch.randint(0, 4 if bits == 4 else 2, (N, K), dtype=torch.int8, device=device)
    C = poisoned((M, N), torch.int32, device)
    op(pack_fields(A, 4), pack_fields(B, bits), output=C)
    assert op.profile_latency() is not None
    torch.testing.assert_close(C, reference(A, B, out_dtype=torch.int32), rtol=1e-2, atol=1e-2)
