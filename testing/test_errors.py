"""Bad input: each raises the right exception type, and its message names the argument."""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas.reference import random_inputs

_OPS = {}


def _setup(**fields):
    """(op, inputs for 4 rows) for a small config; ops cached per config."""
    config = bitblas.MatmulConfig(M=None, N=40, K=256, **fields)
    if config not in _OPS:
        _OPS[config] = bitblas.Matmul(config)
    return _OPS[config], random_inputs(config, 4)


@pytest.fixture
def w4():
    """uint4, group 128, scales and zeros (original): the common weight-only case."""
    return _setup(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True)


def _call(op, inputs, **changes):
    d = {**inputs, **changes}
    return op(**{k: v for k, v in d.items() if v is not None})


# -- operator arguments ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, make", [
    ("A", lambda i: i["A"].float()),
    ("A", lambda i: i["A"].bfloat16()),
    ("W", lambda i: i["W"].view(torch.uint8)),
    ("W", lambda i: i["W"].to(torch.int32)),
    ("W", lambda i: i["W"].half()),
    ("scale", lambda i: i["scale"].float()),
    ("zeros", lambda i: i["zeros"].float()),
], ids=["A-f32", "A-bf16", "W-uint8", "W-int32", "W-f16", "scale-f32", "zeros-f32"])
def test_wrong_dtype(w4, naming, name, make):
    op, inputs = w4
    with naming(TypeError, name):
        _call(op, inputs, **{name: make(inputs)})


@pytest.mark.parametrize("name, make", [
    ("A", lambda i: torch.randn(4, 255).half()),
    ("A", lambda i: torch.randn(4, 128).half()),
    ("A", lambda i: torch.tensor(1.0).half()),
    ("W", lambda i: i["W"][:, :64].contiguous()),
    ("W", lambda i: i["W"][:39].contiguous()),
    ("W", lambda i: i["W"].reshape(-1)),
    ("scale", lambda i: i["scale"][:, :1].contiguous()),
    ("scale", lambda i: i["scale"].t().contiguous()),
    ("zeros", lambda i: torch.zeros(40, 3, dtype=torch.float16)),
], ids=["A-k255", "A-k128", "A-0d", "W-k", "W-n", "W-1d", "scale-groups", "scale-transposed", "zeros-groups"])
def test_wrong_shape(w4, naming, name, make):
    op, inputs = w4
    with naming(ValueError, name):
        _call(op, inputs, **{name: make(inputs)})


def test_non_contiguous_A(w4, naming):
    op, inputs = w4
    A = torch.randn(256, 4, dtype=torch.float16).t()
    assert A.shape == (4, 256) and not A.is_contiguous()
    with naming(ValueError, "A"):
        _call(op, inputs, A=A)


def test_non_contiguous_W(naming):
    op, inputs = _setup(W_dtype="float16")
    W = inputs["W"].t().contiguous().t()
    with naming(ValueError, "W"):
        op(inputs["A"], W)


@pytest.mark.parametrize("name", ["A", "W", "scale"])
def test_wrong_device(w4, naming, name):
    """meta tensors stand in for a second device."""
    op, inputs = w4
    with naming(ValueError, name):
        _call(op, inputs, **{name: inputs[name].to("meta")})


def test_not_a_tensor(w4, naming):
    op, inputs = w4
    with naming(TypeError, "A"):
        _call(op, inputs, A=inputs["A"].numpy())


def test_scale_without_with_scaling(naming):
    op, inputs = _setup(W_dtype="uint4")
    with naming(ValueError, "scale"):
        op(**inputs, scale=torch.ones(40, 1, dtype=torch.float16))


@pytest.mark.parametrize("name", ["zeros", "bias", "a_scale", "global_scale"])
def test_extra_not_taken(naming, name):
    op, inputs = _setup(W_dtype="int4", with_scaling=True)
    with naming(ValueError, name):
        op(**inputs, **{name: torch.ones(40)})


@pytest.mark.parametrize("name", ["scale", "zeros"])
def test_missing_required(w4, naming, name):
    op, inputs = w4
    with naming(ValueError, name):
        _call(op, inputs, **{name: None})


def test_missing_a_scale(naming):
    op, inputs = _setup(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True)
    with naming(ValueError, "a_scale"):
        _call(op, inputs, a_scale=None)


def test_wrong_a_scale_shape(naming):
    op, inputs = _setup(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True)
    with naming(ValueError, "a_scale"):
        _call(op, inputs, a_scale=torch.ones(5))


def test_wrong_bias_dtype(naming):
    op, inputs = _setup(W_dtype="float16", with_bias=True)
    with naming(TypeError, "bias"):
        _call(op, inputs, bias=inputs["bias"].float())


@pytest.mark.parametrize("out, exc", [
    (lambda: torch.empty(4, 39, dtype=torch.float16), ValueError),
    (lambda: torch.empty(40, dtype=torch.float16), ValueError),
    (lambda: torch.empty(4, 40, dtype=torch.float32), TypeError),
    (lambda: torch.empty(40, 4, dtype=torch.float16).t(), ValueError),
], ids=["shape", "1d", "dtype", "non-contiguous"])
def test_bad_output(w4, naming, out, exc):
    op, inputs = w4
    with naming(exc, "output"):
        _call(op, inputs, output=out())


def test_too_many_positional(w4, naming):
    op, inputs = w4
    extra = (inputs["scale"], inputs["zeros"], torch.empty(4, 40, dtype=torch.float16), torch.empty(1))
    with pytest.raises(TypeError, match="positional"):
        op(inputs["A"], inputs["W"], *extra)


def test_positional_and_keyword(w4, naming):
    op, inputs = w4
    with naming(TypeError, "scale"):
        op(inputs["A"], inputs["W"], inputs["scale"], scale=inputs["scale"])


# -- MatmulConfig ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field, fields", [
    ("W_dtype", dict(W_dtype="int3")),
    ("A_dtype", dict(A_dtype="int2")),
    ("layout", dict(layout="tn")),
    ("M", dict(M=0)),
    ("M", dict(M=[])),
    ("M", dict(M=[1, -4])),
    ("M", dict(M=1.5)),
    ("N", dict(N=0)),
    ("K", dict(K=True)),
    ("group_size", dict(group_size=0)),
    ("group_size", dict(group_size=-2)),
    ("group_size", dict(K=200, W_dtype="uint4", group_size=128, with_scaling=True)),
    ("group_size", dict(W_dtype="nvfp4", with_scaling=True, group_size=32)),
    ("out_dtype", dict(out_dtype="int8")),
    ("accum_dtype", dict(accum_dtype="float64")),
    ("accum_dtype", dict(A_dtype="int8", W_dtype="int8", accum_dtype="float32")),
    ("zeros_mode", dict(zeros_mode="symmetric")),
    ("storage_dtype", dict(storage_dtype="uint32")),
    ("with_bias", dict(with_bias=1)),
    ("fast_decoding", dict(fast_decoding="yes")),
    ("with_zeros", dict(W_dtype="uint4", with_zeros=1)),      # zeros without scaling are valid (BitBLAS: q - z)
    ("with_scaling", dict(W_dtype="nvfp4", group_size=16)),
    ("K", dict(K=254, W_dtype="uint2")),
    ("K", dict(K=255, A_dtype="int4", W_dtype="int4")),
    ("in_dtype", dict(in_dtype="bfloat16", A_dtype="float32")),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={v[k]}" for k in v))
def test_config_bad_value(naming, field, fields):
    with naming(ValueError, field):
        bitblas.MatmulConfig(**fields)


@pytest.mark.parametrize("fields, names", [
    (dict(W_dtype="nf4", with_scaling=True, with_zeros=True), ("with_zeros", "nf4")),
    (dict(A_dtype="int8", W_dtype="nf4"), ("A_dtype", "nf4")),
    (dict(A_dtype="int4", W_dtype="int8"), ("A_dtype", "int8")),
    (dict(A_dtype="float8_e4m3", W_dtype="int8"), ("A_dtype", "int8")),     # 8-bit codes are not exact in e4m3
    (dict(A_dtype="float8_e5m2", W_dtype="uint4"), ("A_dtype", "uint4")),
    (dict(A_dtype="float8_e4m3", W_dtype="uint4", with_scaling=True, with_zeros=True), ("with_zeros", "float8_e4m3")),
    (dict(W_dtype="bfloat16"), ("W_dtype", "bfloat16")),
    (dict(W_dtype="float16", with_scaling=True), ("with_scaling", "float16")),
    (dict(W_dtype="int4", with_scaling=True, with_zeros=True, zeros_mode="quantized"), ("zeros_mode", "int4")),
    (dict(A_dtype="int8", W_dtype="uint4", with_scaling=True, with_zeros=True), ("with_zeros", "int8")),
    (dict(out_dtype="int32"), ("out_dtype",)),
    (dict(A_dtype="int8", W_dtype="int8", with_scaling=True, out_dtype="int32"), ("out_dtype", "with_scaling")),
    (dict(with_act_scaling=True), ("with_act_scaling",)),
    (dict(W_dtype="uint4", layout="nn"), ("layout", "uint4")),
], ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else "")
def test_config_unsupported(fields, names):
    with pytest.raises(NotImplementedError) as info:
        bitblas.MatmulConfig(**fields)
    for name in names:
        assert name in str(info.value)


def test_config_is_frozen():
    config = bitblas.MatmulConfig(N=64, K=64)
    with pytest.raises(AttributeError):
        config.N = 128


# -- quantization entry points ------------------------------------------------------------------
def test_pack_codes_rejects_float(naming):
    with naming(TypeError, "codes"):
        bitblas.quantization.pack_codes(torch.zeros(4, 8), "uint4")


def test_pack_codes_bad_length(naming):
    with naming(ValueError, "codes"):
        bitblas.quantization.pack_codes(torch.zeros(4, 7, dtype=torch.int32), "uint4")


def test_unknown_format(naming):
    with naming(ValueError, "format"):
        bitblas.quantization.pack_codes(torch.zeros(4, 8, dtype=torch.int32), "uint3")


def test_quantize_activation_bad_dtype(naming):
    with naming(ValueError, "dtype"):
        bitblas.quantization.quantize_activation(torch.randn(2, 8), "float16")


def test_general_compress_bad_bits(naming):
    with naming(ValueError, "source_bits"):
        bitblas.quantization.general_compress([[1, 2]], source_bits=3)


def test_interleave_bad_nbits(naming):
    with naming(ValueError, "nbits"):
        bitblas.quantization.interleave_weight(torch.zeros(4, dtype=torch.int8), nbits=3)
