"""The format registry: tables and code ranges checked against independent definitions."""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas.formats import FORMATS, get_format


def test_e2m1_table():
    """OCP MX fp4 e2m1: sign bit, 2 exponent bits (bias 1), 1 mantissa bit, no inf / NaN."""
    positive = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    for name in ("fp4_e2m1", "nvfp4"):
        t = FORMATS[name].table
        assert list(t[:8]) == positive
        assert list(t[8:]) == [-v for v in positive]


@pytest.mark.parametrize("name, torch_dtype", [("float8_e4m3", torch.float8_e4m3fn),
                                               ("float8_e5m2", torch.float8_e5m2)])
def test_float8_max_abs(name, torch_dtype):
    assert FORMATS[name].max_abs == torch.finfo(torch_dtype).max


@pytest.mark.parametrize("name", [n for n in FORMATS if FORMATS[n].integer])
def test_integer_code_range(name):
    f = FORMATS[name]
    lo, hi = f.code_range
    assert hi - lo + 1 == 2 ** f.bits
    assert (lo < 0) == (f.kind == "int")
    assert f.codes_per_byte == max(8 // f.bits, 1)


def test_roles():
    assert set(bitblas.ACTIVATION_FORMATS) == {"float16", "bfloat16", "float32", "int8", "int4", "uint4", "float8_e4m3",
                                               "float8_e5m2"}
    assert "float32" not in bitblas.WEIGHT_FORMATS
    assert {"uint1", "int2", "nf4", "fp4_e2m1", "nvfp4", "float8_e5m2"} <= set(bitblas.WEIGHT_FORMATS)


def test_get_format_names_the_argument(naming):
    with naming(ValueError, "A_dtype"):
        get_format("int2", "A", "A_dtype")
    with naming(ValueError, "W_dtype"):
        get_format("float32", "W")
    assert get_format("int4", "A").bits == 4
