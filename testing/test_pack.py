"""Packing: pack -> unpack round trips for every weight format, BitBLAS's packing helpers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bitblas
from bitblas.formats import FORMATS
from bitblas.quantization import (deinterleave_weight, dequantize, general_compress, interleave_weight, pack_codes,
                                  pack_weight, unpack_codes)
from bitblas.quantization.quantize import TORCH_DTYPES, decode_values

CODE_FORMATS = [n for n in bitblas.WEIGHT_FORMATS if FORMATS[n].kind != "float"]
FLOAT8 = [n for n in CODE_FORMATS if FORMATS[n].torch_dtype]


def _random_codes(fmt, shape):
    lo, hi = fmt.code_range
    codes = torch.randint(lo, hi + 1, shape, dtype=torch.int32)
    codes[..., 0], codes[..., 1] = lo, hi      # both ends of the range, every time
    return codes


@pytest.mark.parametrize("name", CODE_FORMATS)
def test_pack_unpack_round_trip(name):
    fmt = FORMATS[name]
    codes = _random_codes(fmt, (3, 5, 64))
    packed = pack_codes(codes, fmt)
    assert packed.dtype == torch.int8
    assert packed.shape == (3, 5, 64 * fmt.bits // 8)
    back = unpack_codes(packed, fmt)
    assert back.dtype == torch.int16
    assert torch.equal(back.to(torch.int32), codes)


@pytest.mark.parametrize("name", CODE_FORMATS)
def test_pack_bit_layout(name):
    """Code k sits at bit offset (k % codes_per_byte) * bits of byte k // codes_per_byte."""
    fmt = FORMATS[name]
    codes = _random_codes(fmt, (4, 32))
    packed = pack_codes(codes, fmt).view(torch.uint8).to(torch.int64)
    cpb, mask = fmt.codes_per_byte, (1 << fmt.bits) - 1
    expect = torch.zeros_like(packed)
    for k in range(codes.shape[-1]):
        expect[:, k // cpb] |= (codes[:, k].to(torch.int64) & mask) << ((k % cpb) * fmt.bits)
    assert torch.equal(packed, expect)


def test_pack_known_bytes():
    assert pack_codes(torch.tensor([1, 2, 15, 0]), "uint4").view(torch.uint8).tolist() == [0x21, 0x0F]
    assert pack_codes(torch.tensor([-1, 1, -2, 0]), "int2").view(torch.uint8).tolist() == [0b00_10_01_11]
    assert pack_codes(torch.tensor([1, 0, 0, 0, 0, 0, 0, 1]), "uint1").view(torch.uint8).tolist() == [0x81]
    assert unpack_codes(torch.tensor([0x8F], dtype=torch.uint8).view(torch.int8), "int4").tolist() == [-1, -8]


@pytest.mark.parametrize("name", FLOAT8)
def test_float8_bit_patterns_round_trip(name):
    """float8 weights: codes are the bit patterns; the table decodes them as torch does."""
    fmt = FORMATS[name]
    bits = torch.arange(256, dtype=torch.int32)
    t = bits.to(torch.uint8).view(TORCH_DTYPES[fmt.torch_dtype])
    assert torch.equal(unpack_codes(t, fmt).to(torch.int32), bits)
    assert torch.equal(pack_codes(bits, fmt).view(TORCH_DTYPES[fmt.torch_dtype]).view(torch.uint8),
                       bits.to(torch.uint8))
    ours, torchs = decode_values(bits, fmt), t.to(torch.float64)
    assert torch.equal(torch.isnan(ours), torch.isnan(torchs))
    finite = ~torch.isnan(torchs)
    assert torch.equal(ours[finite], torchs[finite])


@pytest.mark.parametrize("name", bitblas.WEIGHT_FORMATS)
def test_pack_weight_dequantize_round_trip(name):
    """Unpacked codes -> the operator's W -> dequantize (no scales) gives the codes' values back."""
    fmt = FORMATS[name]
    n, k = 6, 64
    if fmt.kind == "float":
        a = "float32" if name == "bfloat16" else "float16"
        config = bitblas.MatmulConfig(N=n, K=k, A_dtype=a, W_dtype=name)
        w = torch.randn(n, k).to(TORCH_DTYPES[fmt.torch_dtype])
        packed = pack_weight(config, w)
        assert set(packed) == {"W"} and packed["W"].dtype == w.dtype
        assert torch.equal(dequantize(config, **packed), w.to(torch.float64))
        return
    if fmt.scale == "required":            # nvfp4: scales of 1, global scale 1
        config = bitblas.MatmulConfig(N=n, K=k, W_dtype=name, with_scaling=True, group_size=fmt.group_size)
        scale = torch.ones(n, k // fmt.group_size).to(torch.float8_e4m3fn)
    else:
        config = bitblas.MatmulConfig(N=n, K=k, W_dtype=name)
        scale = None
    codes = _random_codes(fmt, (n, k))
    if fmt.torch_dtype:                    # float8 bit patterns: NaN ones cannot round-trip by value
        codes[torch.isnan(decode_values(codes, fmt))] = 0
    packed = pack_weight(config, codes, scale)
    spec = bitblas.Matmul(config).plan().arg("W")
    assert packed["W"].dtype == TORCH_DTYPES[spec.user_dtype]
    assert list(packed["W"].shape) == list(spec.shape)
    assert torch.equal(unpack_codes(packed["W"], fmt).to(torch.int32), codes)
    assert torch.equal(dequantize(config, **packed), decode_values(codes, fmt))


@pytest.mark.parametrize("name", [n for n in CODE_FORMATS if FORMATS[n].kind in ("uint", "int")])
def test_pack_weight_rejects_out_of_range_codes(name, naming):
    fmt = FORMATS[name]
    config = bitblas.MatmulConfig(N=2, K=8, W_dtype=name)
    lo, hi = fmt.code_range
    for bad in (lo - 1, hi + 1):
        if fmt.bits == 8 and fmt.kind == "uint" and bad < 0:
            continue                       # int8 tensors carry uint8 codes as bit patterns
        codes = torch.zeros(2, 8, dtype=torch.int32)
        codes[1, 3] = bad
        with naming(ValueError, "codes"):
            pack_weight(config, codes)


def _general_compress_loop(w, bits):
    """BitBLAS's general_compress, written as the loop it is: little-endian along the last axis."""
    per = 8 // bits
    out = np.zeros((*w.shape[:-1], w.shape[-1] // per), dtype=np.uint8)
    for k in range(w.shape[-1]):
        out[..., k // per] |= (w[..., k].astype(np.uint8) << (bits * (k % per))).astype(np.uint8)
    return out.view(np.int8)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_general_compress(bits):
    rng = np.random.default_rng()
    w = rng.integers(0, 1 << bits, size=(5, 32), dtype=np.int64)
    packed = general_compress(w, source_bits=bits)
    assert packed.dtype == np.int8 and packed.shape == (5, 32 * bits // 8)
    assert np.array_equal(packed, _general_compress_loop(w, bits))
    back = unpack_codes(torch.from_numpy(packed), f"uint{bits}").numpy()
    assert np.array_equal(back, w)
    assert general_compress(w, bits, storage_dtype=np.uint8).dtype == np.uint8


@pytest.mark.parametrize("nbits", [1, 2, 4])
@pytest.mark.parametrize("target_dtype", ["float16", "int8"])
@pytest.mark.parametrize("as_torch", [False, True], ids=["numpy", "torch"])
def test_interleave_deinterleave_inverse(nbits, target_dtype, as_torch):
    rng = np.random.default_rng()
    w = rng.integers(-128, 128, size=(3, 16), dtype=np.int64).astype(np.int8)
    x = torch.from_numpy(w) if as_torch else w
    inter = interleave_weight(x, nbits, target_dtype)
    assert type(inter) is type(x) and inter.shape == x.shape and inter.dtype == x.dtype
    back = deinterleave_weight(inter, nbits, target_dtype)
    back = back.numpy() if as_torch else back
    inter_np = inter.numpy() if as_torch else inter
    assert np.array_equal(back, w)
    # a permutation of the codes inside each 32-bit word, and not the identity
    codes = unpack_codes(torch.from_numpy(np.ascontiguousarray(w)), f"uint{nbits}").reshape(3, 4, -1)
    icodes = unpack_codes(torch.from_numpy(np.ascontiguousarray(inter_np)), f"uint{nbits}").reshape(3, 4, -1)
    assert torch.equal(codes.sort(-1).values, icodes.sort(-1).values)
    assert not np.array_equal(interleave_weight(np.arange(16, dtype=np.int8), nbits, target_dtype),
                              np.arange(16, dtype=np.int8))


def test_interleave_4bit_float16_lanes():
    """4-bit codes 0..7 of a word: the low 16 bits get codes 0, 2, 4, 6, the high 16 bits 1, 3, 5, 7."""
    codes = torch.arange(8, dtype=torch.int32).reshape(1, 8)
    word = pack_codes(codes, "uint4")
    inter = interleave_weight(word, 4, "float16")
    assert unpack_codes(inter, "uint4").tolist() == [[0, 2, 4, 6, 1, 3, 5, 7]]
