"""Packing: pack -> unpack round trips for every weight format, BitBLAS's packing helpers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bitblas
from bitblas.formats import FORMATS
from bitblas.quantization import (deinterleave_weight, dequantize, general_compress, interleave_weight, pack_codes,
                                  pack_weight, unpack_codes)
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES, decode_values, unpack_zeros

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
    """Code k sits at bit offset (k % codes_per_byte) * bits of byte k // codes_per_byte; signed
    sub-byte weight codes are stored offset-binary (q + 2**(bits-1), BitBLAS's layout), int8 ones
    two's complement."""
    fmt = FORMATS[name]
    codes = _random_codes(fmt, (4, 32))
    packed = pack_codes(codes, fmt).view(torch.uint8).to(torch.int64)
    cpb, mask = fmt.codes_per_byte, (1 << fmt.bits) - 1
    offset = (1 << (fmt.bits - 1)) if fmt.kind == "int" and fmt.bits < 8 else 0
    assert fmt.storage == ("offset" if offset else "twos" if fmt.kind == "int" else "plain")
    expect = torch.zeros_like(packed)
    for k in range(codes.shape[-1]):
        expect[:, k // cpb] |= ((codes[:, k].to(torch.int64) + offset) & mask) << ((k % cpb) * fmt.bits)
    assert torch.equal(packed, expect)


def test_pack_known_bytes():
    assert pack_codes(torch.tensor([1, 2, 15, 0]), "uint4").view(torch.uint8).tolist() == [0x21, 0x0F]
    # int2 -1, 1, -2, 0 stored 1, 3, 0, 2 (offset-binary)
    assert pack_codes(torch.tensor([-1, 1, -2, 0]), "int2").view(torch.uint8).tolist() == [0b10_00_11_01]
    assert pack_codes(torch.tensor([1, 0, 0, 0, 0, 0, 0, 1]), "uint1").view(torch.uint8).tolist() == [0x81]
    assert unpack_codes(torch.tensor([0x8F], dtype=torch.uint8).view(torch.int8), "int4").tolist() == [7, 0]
    assert pack_codes(torch.tensor([-8, 7]), "int4").view(torch.uint8).tolist() == [0xF0]
    # int1: q -1 / 0 stored as bits 0 / 1
    assert pack_codes(torch.tensor([-1, 0, 0, -1, -1, -1, -1, 0]), "int1").view(torch.uint8).tolist() == [0x86]
    assert pack_codes(torch.tensor([-128, 127]), "int8").view(torch.uint8).tolist() == [0x80, 0x7F]
    # two's complement on request (int4 activations; int4 weights with int4 activations)
    assert pack_codes(torch.tensor([-1, -8]), "int4", "twos").view(torch.uint8).tolist() == [0x8F]
    assert unpack_codes(torch.tensor([0x8F], dtype=torch.uint8).view(torch.int8), "int4", "twos").tolist() == [-1, -8]


def test_storage_follows_the_activations():
    """Weights with int4 activations are two's complement (BitBLAS: native s4 multiply, the weight taken as
    it is, int2 / int1 fields widened without an offset); with float / int8 activations, offset-binary."""
    from bitblas.formats import code_storage
    from bitblas.plan import make_plan
    a4 = FORMATS["int4"]
    assert code_storage(FORMATS["int4"], "W", a4) == "twos" and code_storage(a4, "A") == "twos"
    assert code_storage(FORMATS["int2"], "W", a4) == "twos" and code_storage(FORMATS["int1"], "W", a4) == "twos"
    assert code_storage(FORMATS["int2"], "W", FORMATS["int8"]) == "offset"
    assert code_storage(FORMATS["int4"], "W", FORMATS["int8"]) == "offset"
    assert code_storage(FORMATS["uint4"], "W", a4) == "plain"
    plan = make_plan(bitblas.MatmulConfig(N=4, K=16, A_dtype="int4", W_dtype="int4"))
    assert (plan.w_storage, plan.a_storage) == ("twos", "twos")
    config = bitblas.MatmulConfig(N=2, K=8, A_dtype="int4", W_dtype="int4", out_dtype="int32")
    codes = torch.tensor([[-8, -1, 0, 7, 3, -3, 1, 2], [0] * 8])
    assert pack_weight(config, codes)["W"][0].view(torch.uint8).tolist() == [0xF8, 0x70, 0xD3, 0x21]
    with pytest.raises(ValueError, match="storage"):
        pack_codes(codes, "int4", "sign-magnitude")


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
    # in the operator's code order (BitBLAS's fast-decoding interleave where it is on: Plan.w_order)
    order = bitblas.Matmul(config).plan().w_order
    assert (order is not None) == (fmt.kind in ("int", "uint") and fmt.bits in (2, 4))
    assert torch.equal(unpack_codes(packed["W"], fmt, order=order).to(torch.int32), codes)
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


# -- code checks: every code-valued input (issue 26 item 2) -------------------------------------
def _qzeros_config(bits=4, n=8, k=64, g=32):
    return bitblas.MatmulConfig(N=n, K=k, W_dtype=f"uint{bits}", group_size=g, with_scaling=True, with_zeros=True,
                                zeros_mode="quantized")


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("bad", ["above", "below", "fraction"])
@pytest.mark.parametrize("path", ["pack_weight", "transform_weight", "Linear"])
def test_quantized_zero_codes_are_checked(bits, bad, path, naming):
    """zeros_mode="quantized": a zero point outside 0 .. 2**bits - 1 (16 for 4 bits, -1) or not an
    integer (7.6) is refused, naming ``zeros`` and the accepted range, on every path that packs
    them; before, 16 was packed as 0, -1 as 15 and 7.6 as 7."""
    config = _qzeros_config(bits)
    hi = (1 << bits) - 1
    codes = torch.randint(0, hi + 1, (config.N, config.K), dtype=torch.int32)
    scale = torch.rand(config.N, 2, dtype=torch.float16) + 0.5
    zeros = torch.randint(0, hi + 1, (config.N, 2), dtype=torch.int32)
    if bad == "above":
        zeros[3, 1] = hi + 1
    elif bad == "below":
        zeros[0, 0] = -1
    else:
        zeros = zeros.to(torch.float32)
        zeros[5, 1] = min(7.6, hi - 0.4)
    with naming(ValueError, "zeros") as e:
        if path == "pack_weight":
            pack_weight(config, codes, scale, zeros)
        elif path == "transform_weight":
            bitblas.Matmul(config).transform_weight(codes.to(torch.int8), scale, zeros)
        else:
            lin = bitblas.Linear(config.K, config.N, W_dtype=config.W_dtype, group_size=32, with_zeros=True,
                                 zeros_mode="quantized", opt_M=1)
            lin.load_and_transform_weight(codes.to(torch.int8), scale, zeros)
    assert f"[0, {hi}]" in str(e.value)


def test_quantized_zero_codes_integral_floats_accepted():
    """Zero points given as floats with integer values (GPTQ's float zeros) are exact codes."""
    config = _qzeros_config(4)
    codes = torch.randint(0, 16, (config.N, config.K), dtype=torch.int32)
    scale = torch.ones(config.N, 2, dtype=torch.float16)
    zeros = torch.randint(0, 16, (config.N, 2))
    a = pack_weight(config, codes, scale, zeros)
    b = pack_weight(config, codes, scale, zeros.to(torch.float16))
    assert torch.equal(a["zeros"], b["zeros"])


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint8", "nf4"])
def test_fractional_weight_codes_refused(name, naming):
    """Codes given as a float tensor must be integers: 7.6 is refused naming the argument and the
    range (pack_weight: ``codes``; transform_weight: ``weight``), integral floats are exact codes."""
    fmt = FORMATS[name]
    lo, hi = fmt.code_range
    config = bitblas.MatmulConfig(N=2, K=8, W_dtype=name)
    codes = torch.randint(lo, hi + 1, (2, 8)).to(torch.float32)
    assert torch.equal(pack_weight(config, codes)["W"], pack_weight(config, codes.to(torch.int32))["W"])
    codes[1, 2] = lo + 0.6
    with naming(ValueError, "codes") as e:
        pack_weight(config, codes)
    assert f"[{lo}, {hi}]" in str(e.value)
    with naming(ValueError, "weight"):
        bitblas.Matmul(config).transform_weight(codes)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_general_compress_checks_codes(bits, naming):
    """BitBLAS's general_compress packs non-negative codes; outside 0 .. 2**bits - 1 (for 8 bits the
    byte range -128 .. 255) or non-integers the bits would spill into the neighbour: refused."""
    hi = (1 << bits) - 1
    for bad in (hi + 1, -129 if bits == 8 else -1, 0.5):
        w = np.zeros((2, 8), dtype=np.float32 if bad == 0.5 else np.int32)
        w[1, 3] = bad
        with naming(ValueError, "lowprecision_weight"):
            general_compress(w, source_bits=bits)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [48, 37])
def test_quantized_zeros_layout(bits, n):
    """zeros_mode="quantized": the codes [N, groups] are packed [groups, N * bits / 8] along N, code of
    channel n at bit (n % per_byte) * bits of byte n // per_byte (GPTQ's qzeros layout, BitBLAS's
    ``general_compress(intzeros.T)``); N off a whole byte is padded with zero fields."""
    per, g = 8 // bits, 4
    config = bitblas.MatmulConfig(N=n, K=64, W_dtype=f"uint{bits}", group_size=16, with_scaling=True,
                                  with_zeros=True, zeros_mode="quantized")
    zeros = torch.randint(0, 1 << bits, (n, g), dtype=torch.int32)
    packed = pack_weight(config, torch.zeros(n, 64, dtype=torch.int32), torch.ones(n, g), zeros)["zeros"]
    spec = make_plan(config).arg("zeros")
    assert list(packed.shape) == list(spec.shape) == [g, -(-n // per)] and packed.dtype == torch.int8
    expect = np.zeros((g, -(-n // per)), dtype=np.int64)
    for j in range(n):
        expect[:, j // per] |= zeros[j].numpy().astype(np.int64) << (bits * (j % per))
    assert np.array_equal(packed.view(torch.uint8).numpy().astype(np.int64), expect)
    if n % per == 0:
        assert np.array_equal(packed.numpy(), general_compress(zeros.T.numpy(), source_bits=bits))
    assert torch.equal(unpack_zeros(config, packed).to(torch.int32), zeros)


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
