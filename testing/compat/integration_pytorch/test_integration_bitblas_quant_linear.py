"""The calls of Microsoft BitBLAS's integration/pytorch example ``QuantLinear``
(bitblas_quant_linear.py), made here directly: ``MatmulWeightOnlyDequantizeConfig`` (uint codes,
scales and 'original' zero points, int8 storage), ``MatmulWeightOnlyDequantize`` on
``auto_detect_nvidia_target()`` tuned with ``hardware_aware_finetune(topk=20)``, codes of a GPTQ-style
layer packed with ``general_compress``, and ``op(A, qweight, scales, zeros[, bias], output)``.

Mirrors microsoft/BitBLAS integration/pytorch/test_bitblas_quant_linear.py, which also runs
auto_gptq's CudaOldQuantLinear on the same layer: that comparison runs where auto-gptq is installed; the
bitblas one runs everywhere, with BitBLAS's tolerance and a tighter one against a float64 reference.
"""
import numpy as np
import pytest
import torch

import bitblas
from bitblas.ops.matmul_dequantize import MatmulWeightOnlyDequantize, MatmulWeightOnlyDequantizeConfig
from bitblas.quantization.utils import general_compress
from bitblas.utils import auto_detect_nvidia_target
from integration_timing import forward_ms
from reference_packers import autogptq_quantlinear


def example_operator(opt_M, in_features, out_features, bits, group_size, bias, enable_tuning):
    """The operator the example's QuantLinear.__init__ builds (float16, default layout hints)."""
    config = MatmulWeightOnlyDequantizeConfig(
        M=opt_M, N=out_features, K=in_features, in_dtype="float16", out_dtype="float16", accum_dtype="float16",
        bit=bits, storage_dtype="int8", source_format="uint", with_scaling=True, with_zeros=True,
        group_size=group_size, fast_decoding=False, with_bias=bias, propagate_a=False, propagate_b=False,
        layout="nt", zeros_mode="original")
    op = MatmulWeightOnlyDequantize(config, target=auto_detect_nvidia_target())
    if enable_tuning:
        op.hardware_aware_finetune(topk=20)
    return op


def packed_codes(weight, scales, zeros, group_size, bits):
    """The example's QuantLinear.pack: recover each unsigned code as round(w / s + z) per group of
    input columns ([N, K] weight, [N, groups] scales and zero points), then ``general_compress``."""
    cols = torch.arange(weight.shape[1], device=weight.device) // group_size
    s, z = scales.float()[:, cols], zeros.float()[:, cols]
    codes = torch.round((weight.float() + z * s) / s).to(torch.int8).cpu()
    return torch.from_numpy(general_compress(codes, source_bits=bits, storage_dtype=np.int8))


@pytest.mark.parametrize("m,in_features,out_features,bits,group_size,bias",
                         [(1, 1024, 4096, 4, -1, False), (1, 1024, 4096, 4, 128, False), (1, 1024, 4096, 4, 128, True)])
def test_quantization_accuracy(m, in_features, out_features, bits, group_size, bias, device):
    """integration/pytorch/test_bitblas_quant_linear.py::test_quantization_accuracy"""
    group = in_features if group_size == -1 else group_size
    _, fake_quant, s, _ = bitblas.quantization.gen_quant4(in_features, out_features, group)
    zero_point = torch.full((in_features // group, out_features), 8, dtype=torch.int32)

    dense = torch.nn.Linear(in_features, out_features, bias=bias, dtype=torch.float16, device=device)
    dense.weight.data.copy_(fake_quant.weight.data)
    scales, zeros = s.T.contiguous().to(device), zero_point.T.contiguous().to(device)

    op = example_operator(m, in_features, out_features, bits, group_size, bias, enable_tuning=True)
    args = [packed_codes(dense.weight.data, scales, zeros, group, bits).to(device), scales,
            zeros.to(torch.float16)] + ([dense.bias.data.clone()] if bias else [])
    x = torch.rand(m, in_features, dtype=torch.float16, device=device)
    out = torch.empty(m, out_features, dtype=torch.float16, device=device)
    with torch.no_grad():
        op(x, *args, out)
        expected = dense(x)
    torch.testing.assert_close(out, expected, rtol=1e9, atol=1e-2)
    # BitBLAS's tolerance above (rtol=1e9) passes any finite result; this one does not
    exact = x.double() @ dense.weight.double().T + (dense.bias.double() if bias else 0)
    torch.testing.assert_close(out.double(), exact, rtol=1e-2, atol=1e0)

    QuantLinear = autogptq_quantlinear(required=False)
    if QuantLinear is None:       # no auto-gptq: the bitblas checks above are the test
        return
    gptq_layer = QuantLinear(bits=bits, group_size=group, infeatures=in_features, outfeatures=out_features, bias=bias)
    gptq_layer.pack(fake_quant, s.T, zero_point.T, g_idx=None)
    with torch.no_grad():
        torch.testing.assert_close(gptq_layer.to(device)(x), expected, rtol=1e9, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU only: tunes a 16384^2 layer and times it")
def test_profile_performance():
    """integration/pytorch/test_bitblas_quant_linear.py::test_profile_performance"""
    m, features, bits = 1, 16384, 4
    op = example_operator(m, features, features, bits, -1, False, enable_tuning=True)
    qweight = torch.randint(-128, 128, (features, features * bits // 8), dtype=torch.int8, device="cuda")
    scales = torch.randn(features, 1, dtype=torch.float16, device="cuda")
    zeros = torch.zeros(features, 1, dtype=torch.float16, device="cuda")
    x = torch.randn(m, features, dtype=torch.float16, device="cuda")
    out = torch.empty(m, features, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        module_ms = forward_ms(lambda: op(x, qweight, scales, zeros, out))
        kernel_ms = op.profile_latency()
    assert abs(module_ms - kernel_ms) / module_ms < 0.1, (module_ms, kernel_ms)
