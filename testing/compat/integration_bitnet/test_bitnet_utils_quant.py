"""The calls of Microsoft BitBLAS's BitNet example layer (integration/BitNet/utils_quant.py,
``BitLinearBitBLAS.from_bit_linear`` and its forward), made here directly on a small layer, checked
against the fake-quantized float BitLinear forward the example replaces:

* the layer's operator: MatmulConfig(int8 activations x int2 weights, int32 accumulation, float32
  output, no scales), looked up through ``global_operator_cache`` (loaded from
  ``get_database_path()`` for ``auto_detect_nvidia_target()`` when empty); the example tunes and
  saves a missing one, so the test first saves an untuned operator into a fresh database and the
  lookup finds it (tuning every M bucket on CPU would take minutes);
* the weight: BitNet b1.58's absmean ternary codes through ``transform_weight``; the forward:
  per-row absmax int8 activations, ``op(q_x, qweight)``, divided by both scales, float16, plus bias.

The quantization arithmetic below is our own re-implementation of BitNet's published rules.
"""
import pytest
import torch

import bitblas
from bitblas import Matmul, MatmulConfig
from bitblas.cache import get_database_path, global_operator_cache


def layer_config(in_features, out_features):
    return MatmulConfig(N=out_features, K=in_features, A_dtype="int8", W_dtype="int2", accum_dtype="int32",
                        out_dtype="float32", layout="nt", with_bias=False, group_size=None, with_scaling=False,
                        with_zeros=False, zeros_mode=None)


def ternary_weight(w):
    """(codes in {-1, 0, 1}, scale): w * scale rounded and clipped, scale = 1 / mean |w|."""
    scale = 1.0 / w.float().abs().mean().clamp(min=1e-5)
    return (w.float() * scale).round().clamp(-1, 1), scale


def int8_activation(x):
    """(codes in [-128, 127], per-row scale [.., 1]): x * scale rounded and clipped, scale = 127 / max |x|."""
    scale = 127.0 / x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
    return (x.float() * scale).round().clamp(-128, 127), scale


def fake_quant_forward(x, weight, bias):
    """BitLinear: the float layer run on dequantized activations and weights."""
    qx, sx = int8_activation(x)
    qw, sw = ternary_weight(weight)
    out = torch.nn.functional.linear(qx / sx, qw / sw)
    return out if bias is None else out + bias


@pytest.fixture
def seeded_database(tmp_path):
    """A database holding the layer's (untuned) operator, as a previous run of the example leaves it."""
    previous = bitblas.get_database_path()
    bitblas.set_database_path(str(tmp_path / "db"))
    target = bitblas.auto_detect_nvidia_target()
    global_operator_cache.clear()
    config = layer_config(256, 128)
    global_operator_cache.add(config, Matmul(config, target=target))
    global_operator_cache.save_into_database(get_database_path(), target)
    global_operator_cache.clear()
    yield config
    global_operator_cache.clear()
    bitblas.set_database_path(None)
    if bitblas.get_database_path() != previous:
        bitblas.set_database_path(previous)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_from_bit_linear(bias, device, seeded_database):
    """integration/BitNet/utils_quant.py (BitLinearBitBLAS.from_bit_linear, forward); no BitBLAS test"""
    torch.manual_seed(0)
    in_features, out_features = 256, 128
    weight = (torch.randn(out_features, in_features) * 0.02).to(device)
    b = torch.randn(out_features).to(device) if bias else None

    # the example's operator lookup
    config = layer_config(in_features, out_features)
    if global_operator_cache.size() == 0:
        global_operator_cache.load_from_database(get_database_path(), bitblas.auto_detect_nvidia_target())
    op = global_operator_cache.get(config)
    assert op is not None, "the operator saved by the previous run should come from the database"
    assert global_operator_cache.size() > 0

    # from_bit_linear (one weight group: one scale for the whole matrix, repeated per output row)
    codes, w_scale = ternary_weight(weight)
    qweight = op.transform_weight(codes.to(torch.int8))
    w_scales = w_scale.repeat(out_features)

    # forward
    x = torch.randn(3, in_features, device=device)
    qx, x_scale = int8_activation(x)
    acc = op(qx.to(torch.int8), qweight)
    assert acc.dtype == torch.float32
    out = (acc / x_scale / w_scales).half()
    if b is not None:
        out = out + b.view(1, -1)

    expected = fake_quant_forward(x, weight, b)
    assert out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)
