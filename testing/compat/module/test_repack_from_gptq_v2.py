"""bitblas.Linear.repack_from_gptq_v2 on a GPTQModel Exllama layer (symmetric: int4 without zero
points; asymmetric: uint4 with quantized zero points), against that layer's own forward.

Mirrors microsoft/BitBLAS testing/python/module/test_repack_from_gptq_v2.py (skipped where
gptqmodel does not import: its ExllamaQuantLinear is the reference).
"""
import pytest
import torch

import bitblas


@pytest.mark.parametrize("group_size,sym", [(64, True), (-1, True), (64, False), (-1, False)])
def test_assert_output_with_gptq(group_size, sym, device):
    """testing/python/module/test_repack_from_gptq_v2.py::test_assert_output_with_gptq"""
    pytest.importorskip("gptqmodel", reason="needs gptqmodel (its ExllamaQuantLinear is the reference)",
                        exc_type=ImportError)
    from gptqmodel.nn_modules.qlinear.qlinear_exllama import ExllamaQuantLinear

    rows, K, N = 1, 256, 256
    group = K if group_size == -1 else group_size
    _, fake_quant, scales, _ = bitblas.quantization.gen_quant4(K, N, group)
    exllama = ExllamaQuantLinear(bits=4, group_size=group, infeatures=K, outfeatures=N, bias=False, sym=sym,
                                 desc_act=False)
    exllama._use_act_order = False
    exllama.pack(fake_quant, scales.T, torch.full((K // group, N), 8, dtype=torch.int32).T, g_idx=None)
    exllama = exllama.to(device)
    exllama.post_init()

    layer = bitblas.Linear(opt_M=rows, in_features=K, out_features=N, bias=False, A_dtype="float16",
                           W_dtype="int4" if sym else "uint4", accum_dtype="float16", out_dtype="float16",
                           group_size=group, with_scaling=True, with_zeros=not sym, zeros_mode="quantized")
    layer.repack_from_gptq_v2(exllama)

    x = torch.rand(rows, K, dtype=torch.float16, device=device)
    layer = layer.to(device)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), exllama(x), rtol=1e-0, atol=1e-1)
