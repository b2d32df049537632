"""bitblas.Linear.repack_from_gptq on an auto_gptq layer, against that layer's own forward.

Mirrors microsoft/BitBLAS testing/python/module/test_repack_from_gptq.py (skipped without auto-gptq:
its QuantLinear is the reference; testing/reference_packers.py loads it).
"""
import pytest
import torch

import bitblas
from reference_packers import autogptq_quantlinear


@pytest.mark.parametrize("group_size", [64, -1])
def test_assert_output_with_gptq(group_size, device):
    """testing/python/module/test_repack_from_gptq.py::test_assert_output_with_gptq"""
    QuantLinear = autogptq_quantlinear()

    rows, K, N = 1, 256, 256
    group = K if group_size == -1 else group_size
    _, fake_quant, scales, _ = bitblas.quantization.gen_quant4(K, N, group)
    gptq_layer = QuantLinear(bits=4, group_size=group, infeatures=K, outfeatures=N, bias=False)
    gptq_layer.pack(fake_quant, scales.T, torch.full((K // group, N), 7, dtype=torch.int32).T, g_idx=None)

    layer = bitblas.Linear(opt_M=rows, in_features=K, out_features=N, bias=False, A_dtype="float16",
                           W_dtype="uint4", accum_dtype="float16", out_dtype="float16", group_size=group,
                           with_scaling=True, with_zeros=True, zeros_mode="quantized")
    layer.repack_from_gptq(gptq_layer)

    x = torch.rand(rows, K, dtype=torch.float16, device=device)
    gptq_layer, layer = gptq_layer.to(device), layer.to(device)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), gptq_layer(x), rtol=1e-0, atol=1e-1)
