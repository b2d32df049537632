"""bitblas.Linear.repack_from_gptq_v2 on a GPTQModel Exllama layer (symmetric: int4 without zero
points; asymmetric: uint4 with quantized zero points), against that layer's own forward.

Mirrors microsoft/BitBLAS testing/python/module/test_repack_from_gptq_v2.py. Its reference is
GPTQModel's ``gptqmodel.nn_modules.qlinear.qlinear_exllama.ExllamaQuantLinear``, a layer whose
constructor raises unless GPTQModel's compiled CUDA extension ``gptqmodel_exllama_kernels`` imports;
later GPTQModel releases (7.7.0, the current one, among them) have no such module. Where it cannot
be built the test is skipped, naming that; the same repack (v1 and v2 checkpoints, symmetric and
not) is checked against the checkpoint's own dequantization in test_api_surface.py and against
GPTQModel's BitBLAS-backend calls in integrations/test_gptqmodel_calls.py.
"""
import importlib

import pytest
import torch

import bitblas


@pytest.mark.parametrize("group_size,sym", [(64, True), (-1, True), (64, False), (-1, False)])
def test_assert_output_with_gptq(group_size, sym, device):
    """testing/python/module/test_repack_from_gptq_v2.py::test_assert_output_with_gptq"""
    try:
        from gptqmodel.nn_modules.qlinear.qlinear_exllama import ExllamaQuantLinear
        importlib.import_module("gptqmodel_exllama_kernels")      # the layer's constructor needs it
    except ImportError as e:
        pytest.skip("the reference, GPTQModel's ExllamaQuantLinear with its compiled CUDA extension "
                    f"gptqmodel_exllama_kernels, is not importable here ({e}); GPTQModel 7.x has no such layer")

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
