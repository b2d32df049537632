"""Byte layouts of Microsoft BitBLAS: a tensor packed for BitBLAS means the same thing here.

Each test builds its tensors the way BitBLAS's own code and tests do (its ``transform_weight``,
``general_compress``, ``interleave_weight``, the reference decodes of its operator tests), written
here from their rules rather than with this library's packers, runs them through ``Matmul`` on CPU
tensors and compares with a float64 product written here:

* signed int1/int2/int4 weights are offset-binary: ``general_compress(q + 2**(b-1))``, decoded
  ``u - 2**(b-1)``; int8 weights are taken as they are (BitBLAS adds ``maxq`` only below 8 bits);
* int4 activations pack two two's complement nibbles per byte, low nibble first; int4 weights with
  int4 activations are two's complement as well (BitBLAS's native ``s4`` path returns the weight
  from ``transform_weight`` untouched);
* zeros_mode="quantized": zero points [groups, N] compressed along N (``general_compress`` of the
  [K // group_size, N] zeros; ``repack_from_gptq``'s ``general_compress(intzeros.T)``), decoded
  ``(zeros[g, n // per] >> (bits * (n % per))) & mask``, the weight ``(u - z) * s``;
* nf4 codes index the NormalFloat4 table (BitBLAS's ``lut``) by the unsigned nibble;
* fp4_e2m1: the code order (sign bit 3, zero codes 0 and 8, magnitude rank of the low 3 bits) is
  BitBLAS's; the magnitudes are the OCP e2m1 values 0, 0.5 .. 6 (BitBLAS's decoder places the low
  3 bits in the exponent, 2**(e - 7): see the README's format table);
* ``general_compress`` and ``interleave_weight`` return BitBLAS's bytes.

The configs of int / uint 1-, 2- and 4-bit weights here say ``fast_decoding=False``: BitBLAS's bytes
are then ``general_compress``'s as they are; with its fast decoding on they are lop3-interleaved as
well, which testing/test_fast_decoding.py checks (and ``repack_from_gptq`` below).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import bitblas
from bitblas.formats import FORMATS
from bitblas.quantization import general_compress, interleave_weight
from bitblas.reference import relative_error, tolerance

N, K = 64, 256
_OPS = {}


def _op(config):
    if config not in _OPS:
        _OPS[config] = bitblas.Matmul(config)
    return _OPS[config]


# -- BitBLAS's packing rules, written from their definitions ---------------------------------------
def bb_general_compress(w: np.ndarray, bits: int) -> np.ndarray:
    """BitBLAS's general_compress: 2-D, int8 accumulation, ``|= w[:, j*per + k] << (bits * k)``
    (float16 input cast to int8 first)."""
    per = 8 // bits
    if w.dtype == np.float16:
        w = w.astype(np.int8)
    w = w.astype(np.int8)
    out = np.zeros((w.shape[0], w.shape[1] // per), dtype=np.int8)
    for j in range(w.shape[1] // per):
        for k in range(per):
            out[:, j] |= (w[:, j * per + k].astype(np.int64) << (bits * k)).astype(np.uint8).view(np.int8)
    return out


def bb_interleave_weight(qweight: np.ndarray, nbits: int, target_dtype: str) -> np.ndarray:
    """BitBLAS's numpy interleave_weight on 32-bit words, its masks taken as unsigned bit masks."""
    q = np.ascontiguousarray(qweight).view(np.uint32).astype(np.uint64)
    new = np.zeros_like(q)
    stride = 8 if target_dtype == "int8" else 16
    mask = (1 << nbits) - 1
    groups, per = 32 // stride, stride // nbits
    for i in range(groups):
        for j in range(per):
            off = i * per + j
            shift = (off % groups) * stride + (off // groups) * nbits
            new |= ((q >> (nbits * off)) & mask) << shift
    if nbits == 1 and target_dtype == "int8":
        out = new & 0xF0F00F0F
        out |= ((new & 0x000000F0) >> 4) << 16
        out |= ((new & 0x0000F000) >> 12) << 24
        out |= ((new & 0x000F0000) >> 16) << 4
        out |= ((new & 0x0F000000) >> 24) << 12
        new = out
    elif nbits == 2 and target_dtype == "float16":
        out = new & 0xFF0000FF
        out |= ((new & 0x0000FF00) >> 8) << 16
        out |= ((new & 0x00FF0000) >> 16) << 8
        new = out
    # nbits == 1, float16: BitBLAS computes a further move into another variable and returns ``new``
    return (new & 0xFFFFFFFF).astype(np.uint32).view(np.int8).reshape(qweight.shape)


def bb_dequant_qzeros(qzeros: np.ndarray, bits: int, n: int) -> np.ndarray:
    """BitBLAS's reference decode of quantized zeros (its operator tests): [G, N]."""
    per = 8 // bits
    u = qzeros.view(np.uint8).astype(np.int64)
    return np.stack([(u[:, j // per] >> (bits * (j % per))) & ((1 << bits) - 1) for j in range(n)], axis=1)


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def _rng(seed):
    return np.random.default_rng(seed)


# -- signed integer weights ----------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 2, 1])
@pytest.mark.parametrize("group_size", [-1, 64])
def test_signed_weights_offset_binary(bits, group_size):
    """BitBLAS's transform_weight of int codes q: ``clamp(q) + 2**(bits-1)``, compressed along K;
    fed as W (with group scales) they must give A @ (q * s).T."""
    rng = _rng(bits * 10 + (group_size > 0))
    maxq = 2 ** (bits - 1)
    q = rng.integers(-maxq, maxq, size=(N, K))
    q[0, :4] = [-maxq, maxq - 1, 0, -1 if bits > 1 else 0]
    W = bb_general_compress(q + maxq, bits)
    g = K if group_size == -1 else group_size
    scale = (rng.random((N, K // g)) + 0.5).astype(np.float16)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, fast_decoding=False, W_dtype=f"int{bits}", group_size=group_size, with_scaling=True)
    A = torch.randn(3, K, dtype=torch.float16)
    out = _op(config)(A, _t(W), _t(scale))
    ref = A.double() @ (_t(q).double() * _t(scale).double().repeat_interleave(g, 1)).T
    assert relative_error(out, ref) <= tolerance(config)
    # the library's own packing of the signed codes gives the same bytes
    assert np.array_equal(_op(config).transform_weight(_t(q).to(torch.int8)).numpy(), W)


@pytest.mark.parametrize("bits", [4, 2, 1])
def test_signed_weights_int8_activations(bits):
    """W4A8 / W2A8 / W1A8 on BitBLAS's offset-binary bytes: exact int32 output."""
    rng = _rng(bits)
    maxq = 2 ** (bits - 1)
    q = rng.integers(-maxq, maxq, size=(N, K))
    A = rng.integers(-128, 128, size=(5, K)).astype(np.int8)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, fast_decoding=False, A_dtype="int8", W_dtype=f"int{bits}", out_dtype="int32")
    out = _op(config)(_t(A), _t(bb_general_compress(q + maxq, bits)))
    assert torch.equal(out, _t(A).long() @ _t(q).long().T)


def test_int8_weights_as_they_are():
    """int8 weights: no offset (BitBLAS adds maxq only below 8 bits); the raw int8 weight goes in."""
    rng = _rng(8)
    q = rng.integers(-128, 128, size=(N, K)).astype(np.int8)
    scale = (rng.random((N, 1)) + 0.5).astype(np.float16)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, W_dtype="int8", with_scaling=True)
    A = torch.randn(3, K, dtype=torch.float16)
    out = _op(config)(A, _t(q), _t(scale))
    assert relative_error(out, A.double() @ (_t(q).double() * _t(scale).double()).T) <= tolerance(config)
    assert torch.equal(_op(config).transform_weight(_t(q)), _t(q))


def test_int4_activations_and_weights_twos_complement():
    """BitBLAS's int4 x int4 test: ``(A[:, ::2] & 0x0F) + ((A[:, 1::2] & 0x0F) << 4)`` for both
    operands (two's complement nibbles, the weight as it is); the full signed range, exact."""
    rng = _rng(44)
    A = rng.integers(-8, 8, size=(5, K))
    B = rng.integers(-8, 8, size=(N, K))

    def nibbles(x):
        return ((x[:, ::2] & 0x0F) + ((x[:, 1::2] & 0x0F) << 4)).astype(np.uint8).view(np.int8)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, A_dtype="int4", W_dtype="int4", out_dtype="int32")
    out = _op(config)(_t(nibbles(A)), _t(nibbles(B)))
    assert torch.equal(out, _t(A).long() @ _t(B).long().T)
    assert np.array_equal(_op(config).transform_weight(_t(B).to(torch.int8)).numpy(), nibbles(B))


def test_int4_activations_int2_weights_twos_complement():
    """int2 weights with int4 activations: two's complement fields, as BitBLAS's int4 operator test hands
    them over (raw fields, no transform_weight; its int2 -> int4 decode adds no offset)."""
    rng = _rng(42)
    A = rng.integers(-8, 8, size=(5, K))
    q = rng.integers(-2, 2, size=(N, K))
    a = ((A[:, ::2] & 0x0F) + ((A[:, 1::2] & 0x0F) << 4)).astype(np.uint8).view(np.int8)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, fast_decoding=False, A_dtype="int4", W_dtype="int2", out_dtype="int32")
    out = _op(config)(_t(a), _t(bb_general_compress(q & 0x3, 2)))
    assert torch.equal(out, _t(A).long() @ _t(q).long().T)


# -- quantized zero points -------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 2, 1, 8])
def test_quantized_zeros_bitblas_layout(bits):
    """BitBLAS's operator test, with random (not constant) zero points: uint weight codes compressed
    along K, zero points [K // group_size, N] compressed along N, reference ``(B - z) * s``."""
    rng = _rng(100 + bits)
    gs, hi = 64, (1 << bits) - 1
    G = K // gs
    B = rng.integers(0, hi + 1, size=(N, K))
    zeros = rng.integers(0, hi + 1, size=(G, N))
    scale = (rng.random((N, G)) * 0.5 + 0.25).astype(np.float16)
    W = bb_general_compress(B, bits) if bits < 8 else B.astype(np.uint8).view(np.int8)
    qzeros = bb_general_compress(zeros, bits) if bits < 8 else zeros.astype(np.uint8).view(np.int8)
    assert np.array_equal(bb_dequant_qzeros(qzeros, bits, N), zeros)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, fast_decoding=False, W_dtype=f"uint{bits}", group_size=gs,
                                  with_scaling=True, with_zeros=True, zeros_mode="quantized")
    A = torch.randn(4, K, dtype=torch.float16)
    out = _op(config)(A, _t(W), _t(scale), _t(qzeros))
    zexp = _t(bb_dequant_qzeros(qzeros, bits, N)).double().T.repeat_interleave(gs, 1)     # [N, K]
    ref = A.double() @ ((_t(B).double() - zexp) * _t(scale).double().repeat_interleave(gs, 1)).T
    assert relative_error(out, ref) <= tolerance(config)
    # transform_weight takes the codes [N, groups] and returns BitBLAS's qzeros bytes
    _, _, z = _op(config).transform_weight(_t(B).to(torch.int32), _t(scale), _t(zeros.T))
    assert np.array_equal(z.numpy(), qzeros)


def test_repack_from_gptq_quantized_zeros_bytes():
    """BitBLAS's repack_from_gptq, zeros_mode "quantized": ``general_compress(intzeros.T)`` with
    intzeros the GPTQ zero points (stored minus one); the layer's zeros buffer holds those bytes."""
    rng = _rng(7)
    bits, gs = 4, 64
    G = K // gs
    codes = rng.integers(0, 16, size=(K, N))                      # GPTQ: [K, N]
    z = rng.integers(1, 16, size=(G, N))                          # zero points; GPTQ v1 stores z - 1
    qweight = np.zeros((K // 8, N), dtype=np.int64)
    for i in range(8):
        qweight |= codes[i::8] << (4 * i)
    qzeros = np.zeros((G, N // 8), dtype=np.int64)
    for i in range(8):
        qzeros |= (z[:, i::8] - 1) << (4 * i)
    scales = (rng.random((G, N)) * 0.1 + 0.01).astype(np.float16)
    lin = bitblas.Linear(K, N, W_dtype="uint4", group_size=gs, with_zeros=True, zeros_mode="quantized", opt_M=1)
    i32 = lambda x: _t(x.astype(np.uint32).view(np.int32))       # noqa: E731
    lin.repack_from_gptq(qweight=i32(qweight), qzeros=i32(qzeros), scales=_t(scales))
    assert np.array_equal(lin.zeros.numpy(), bb_general_compress(z, bits))
    # BitBLAS's repack_from_gptq goes through its transform_weight: lop3-interleaved (fast decoding)
    from test_fast_decoding import bb_lop3_permutate
    assert np.array_equal(lin.qweight.numpy(), bb_lop3_permutate(bb_general_compress(codes.T, bits), bits, "float16"))
    x = torch.randn(3, K, dtype=torch.float16)
    deq = (_t(codes).double() - _t(z).double().repeat_interleave(gs, 0)) * _t(scales).double().repeat_interleave(gs, 0)
    assert relative_error(lin(x), x.double() @ deq) <= 4e-3


# -- table formats ---------------------------------------------------------------------------------
BB_NF4_LUT = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
              -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
              0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
              0.7229568362236023, 1.0)


def test_nf4_code_order():
    """BitBLAS's nf4: ``lut[(W[n, k // 2] >> (4 * (k % 2))) & 0xF]`` times the group scale."""
    rng = _rng(4)
    assert FORMATS["nf4"].table == BB_NF4_LUT
    gs = 64
    codes = rng.integers(0, 16, size=(N, K))
    W = bb_general_compress(codes, 4)
    scale = (rng.random((N, K // gs)) + 0.5).astype(np.float16)
    config = bitblas.MatmulConfig(M=None, N=N, K=K, W_dtype="nf4", group_size=gs, with_scaling=True)
    A = torch.randn(3, K, dtype=torch.float16)
    u = W.view(np.uint8).astype(np.int64)
    idx = np.stack([(u[:, k // 2] >> (4 * (k % 2))) & 0xF for k in range(K)], axis=1)
    deq = torch.tensor(BB_NF4_LUT, dtype=torch.float64)[_t(idx)] * _t(scale).double().repeat_interleave(gs, 1)
    out = _op(config)(A, _t(W), _t(scale))
    assert relative_error(out, A.double() @ deq.T) <= tolerance(config)


def bb_fp4_decode(code: int) -> float:
    """BitBLAS's fp4_e2m1 decode (``_tir_packed_to_fp4_to_f16``): sign = bit 3, e = code & 7, the
    half whose exponent field is ``e | 8`` (2**(e - 7)), zero for e = 0."""
    s, e = code >> 3, code & 7
    if e == 0:
        return 0.0
    return (-1.0 if s else 1.0) * 2.0 ** ((e | 8) - 15)


def test_fp4_code_order():
    """fp4_e2m1 codes: sign bit, zero codes and the rank of the magnitudes are BitBLAS's."""
    ours = FORMATS["fp4_e2m1"].table
    theirs = [bb_fp4_decode(c) for c in range(16)]
    assert [np.signbit(v) for v in ours] == [np.signbit(v) if v else c >= 8 for c, v in enumerate(theirs)]
    assert [c for c in range(16) if ours[c] == 0] == [c for c in range(16) if theirs[c] == 0] == [0, 8]
    assert list(np.argsort(np.abs(ours[:8]), kind="stable")) == list(np.argsort(np.abs(theirs[:8]), kind="stable"))
    assert all(abs(ours[c + 8]) == abs(ours[c]) for c in range(8))
    assert ours[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# -- BitBLAS's packing helpers -----------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [np.int8, np.int64, np.float16])
def test_general_compress_matches_bitblas(bits, dtype):
    w = _rng(bits).integers(0, 1 << bits if bits < 8 else 128, size=(6, 64)).astype(dtype)
    assert np.array_equal(general_compress(w, source_bits=bits), bb_general_compress(w, bits))


@pytest.mark.parametrize("nbits", [1, 2, 4])
@pytest.mark.parametrize("target_dtype", ["float16", "int8"])
def test_interleave_weight_matches_bitblas(nbits, target_dtype):
    w = _rng(nbits).integers(-128, 128, size=(5, 32)).astype(np.int8)
    assert np.array_equal(interleave_weight(w, nbits, target_dtype), bb_interleave_weight(w, nbits, target_dtype))
    t = torch.from_numpy(w)
    assert np.array_equal(interleave_weight(t, nbits, target_dtype).numpy(), bb_interleave_weight(w, nbits, target_dtype))
