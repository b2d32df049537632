"""NVFP4 x NVFP4 (issue 25) without a GPU: configs, the quantizer, the reference, the CPU operator,
the strided entry point ``bitblas.ops.nvfp4_gemv`` on CPU tensors, its errors, the CUDA kernels'
arithmetic (their generated helpers interpreted on Python ints) and their code generation
(nvcc, sm_90a and sm_80). The GPU runs are in testing/test_gpu_nvfp4.py.
"""
from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch

from bitblas import Matmul, MatmulConfig
from bitblas.formats import E2M1_TABLE, E4M3_TABLE
from bitblas.ops import nvfp4_gemv
from bitblas.plan import make_plan
from bitblas.quantization import dequantize_activation, e2m1_codes, nvfp4_decode, quantize_activation
from bitblas.reference import (TOLERANCES, random_inputs, reference_matmul, reference_nvfp4_gemv, relative_error,
                               tolerance)
from bitblas.schedule.nvfp4 import MAG2_NIBBLES, MAG2_TABLE, PRMT_LAMBDA, SIGN_FLIP, cuda_helpers
from c_interp import run_c

NV = dict(A_dtype="nvfp4", W_dtype="nvfp4", group_size=16, with_scaling=True, with_act_scaling=True)


def cfg(**kw) -> MatmulConfig:
    return MatmulConfig(**{**NV, **kw})


def _issue_tensors(M, K, L, rows=128, seed=0, c_layout="permuted"):
    """The workload's five tensors in the issue's layouts: torch permutes of [L, ., .] tensors, b
    and sfb padded to ``rows`` rows (only row 0 read), fresh random codes and scales, c poisoned."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (L, M, K // 2), generator=gen, dtype=torch.uint8).permute(1, 2, 0)
    b = torch.randint(0, 256, (L, rows, K // 2), generator=gen, dtype=torch.uint8).permute(1, 2, 0)
    sfa = (torch.rand(L, M, K // 16, generator=gen) * 3 + 0.05).to(torch.float8_e4m3fn).permute(1, 2, 0)
    sfb = (torch.rand(L, rows, K // 16, generator=gen) * 3 + 0.05).to(torch.float8_e4m3fn).permute(1, 2, 0)
    if c_layout == "permuted":
        c = torch.full((L, M, 1), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    else:
        c = torch.full((M, 1, L), float("nan"), dtype=torch.float16)
    return a, b, sfa, sfb, c


# -- configs --------------------------------------------------------------------------------------
def test_config_and_plan():
    c = cfg(M=1, N=64, K=128, batch=3)
    assert c.to_dict()["batch"] == 3 and MatmulConfig.from_dict(c.to_dict()) == c
    assert "batch" not in cfg(M=1, N=64, K=128).to_dict()
    p = make_plan(c, "cpu", 1)
    assert [(a.name, a.shape, a.user_dtype) for a in p.args] == [
        ("A", (3, 1, 64), "int8"), ("W", (3, 64, 64), "int8"), ("scale", (3, 64, 8), "float8_e4m3fn"),
        ("a_scale", (3, 1, 8), "float8_e4m3fn"), ("global_scale", (1,), "float32"),
        ("a_global_scale", (1,), "float32"), ("output", (3, 1, 64), "float16")]
    assert p.nvfp4_acts and "batch=3" in p.key()
    assert make_plan(cfg(N=64, K=128), "cuda", 2).arg("A").shape == (2, 64)
    assert tolerance(c) == max(TOLERANCES["nvfp4"], TOLERANCES["float16"])


def test_config_errors(naming):
    with naming(ValueError, "with_act_scaling"):
        cfg(N=64, K=128, with_act_scaling=False)
    with naming(ValueError, "K"):
        cfg(N=64, K=48)
    with naming(ValueError, "batch"):
        cfg(N=64, K=128, batch=0)
    with naming((ValueError, NotImplementedError), "out_dtype"):
        cfg(N=64, K=128, out_dtype="int32")
    with pytest.raises(NotImplementedError, match="W_dtype"):
        cfg(N=64, K=128, W_dtype="float8_e4m3", group_size=-1)
    with pytest.raises(NotImplementedError, match="batch"):
        MatmulConfig(N=64, K=128, A_dtype="float16", W_dtype="float16", batch=2)
    with pytest.raises(NotImplementedError, match="with_bias"):
        cfg(N=64, K=128, with_bias=True)


# Existing (unbatched) configs are untouched by the batch field and the nvfp4 activation work: their
# plan keys, kernel keys (minus the versions) and generated CUDA are those of main e8a22da before it
# (regenerate a hash only when that kernel is changed on purpose; the GEMV kernel keys of w4a16, nvfp4w
# and w8a8 were regenerated when the GEMV got one hint class per kernel: same sources, new hint names;
# nvfp4w's source when the rows kernel took two 16-code blocks per 16-byte vector, when it took the
# float16 e2m1 table decoder, when its float16 block dots became one half chain, and when its default
# took l2_prefetch=1; w4a16's, nvfp4w's and w8a8's kernel keys when the rows kernel's hint gained l2_prefetch).
_UNCHANGED = {
    "w4a16": (dict(M=1, N=1024, K=1024, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True,
                   with_zeros=True), "9799a37c7ad27d65", None),
    "nvfp4w": (dict(M=1, N=512, K=1024, A_dtype="float16", W_dtype="nvfp4", group_size=16, with_scaling=True),
               "1965aa66460c9195", "c4837c4160a4e600"),
    "fp16": (dict(M=None, N=1024, K=1024, A_dtype="float16", W_dtype="float16"), "825a3e468f98e706",
             "3c6b36772176836d"),
    "w8a8": (dict(M=4, N=512, K=512, A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True),
             "1d57120129f81b55", None),
}


@pytest.mark.parametrize("name", list(_UNCHANGED))
def test_existing_configs_unchanged(name):
    from bitblas.build import cuda_source, cuda_target
    from bitblas.cache.kernels import kernel_key
    from bitblas.kernels import default_hint
    kw, key_hash, src_hash = _UNCHANGED[name]
    c = MatmulConfig(**kw)
    p = make_plan(c, "cuda", kw["M"])
    fields = "|".join(f"{k}={v}" for k, v in sorted(c.to_dict().items()))
    assert "batch" not in fields and p.key() == f"cuda|m={kw['M']}|{fields}"
    t = cuda_target("sm_90")
    key = kernel_key(p, default_hint(p, t), {"kind": "cuda", "arch": "sm_90"})
    key.pop("versions")
    assert hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16] == key_hash
    if src_hash:
        assert hashlib.sha256(cuda_source(p, t).encode()).hexdigest()[:16] == src_hash


def test_wonly_wave_tiles():
    """nvfp4 x float16 at one row on sm_90 (gemv/template.py _nvfp4_wave_tile): 64-channel blocks
    where they fill 70..100% of one wave of 132 SMs, 16-channel blocks of single-channel warps where
    they fill 90..100% of two per SM, else the 16-channel staged default; each with the L2 prefetch
    when its blocks fit one wave; bfloat16 and other formats keep the default."""
    from bitblas.build import cuda_target
    from bitblas.kernels import default_hint
    from bitblas.schedule.gemv import GEMVRowsHint
    t = cuda_target("sm_90")

    def tile(N, K, A="float16", W="nvfp4"):
        kw = dict(group_size=16) if W == "nvfp4" else dict(group_size=128)
        h = default_hint(make_plan(MatmulConfig(M=1, N=N, K=K, A_dtype=A, W_dtype=W, with_scaling=True, **kw),
                                   "cuda", 1), t)
        assert isinstance(h, GEMVRowsHint) and h.act_smem and h.pdl
        return (h.rows_per_warp, h.warps, h.unroll, h.min_blocks, h.l2_prefetch)
    for N in (6144, 8192):
        assert tile(N, 4096) == tile(N, 8192) == (2, 32, 1, 1, 1)
    assert tile(4096, 4096) == tile(4096, 14336) == (1, 16, 2, 2, 1)
    assert tile(5120, 5120) == tile(3072, 4096) == (2, 8, 1, 4, 1)       # 0.61 / 0.73 of a wave: the default
    assert tile(10240, 8192) == tile(28672, 8192) == (2, 8, 1, 4, 0)     # more than a wave
    assert tile(8192, 8192, A="bfloat16") == (2, 8, 1, 4, 0)
    assert tile(8192, 8192, W="uint4") == (2, 8, 1, 4, 0)


# -- quantizer ------------------------------------------------------------------------------------
def test_e2m1_round_to_nearest_even():
    x = torch.tensor([0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.0, 7.0, 1e9, 0.5, 2.9,
                      -0.25, -0.75, -5.0, -7.0, -0.1])
    want = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, 6.0, 0.5, 3.0,
            -0.0, -1.0, -4.0, -6.0, -0.0]
    codes = e2m1_codes(x)
    got = [E2M1_TABLE[int(c)] for c in codes]
    assert got == want
    assert int(codes[-1]) == 8 and int(codes[0]) == 0           # a negative that rounds to zero keeps its sign
    # every midpoint between neighbours rounds to the code with mantissa bit 0
    mags = sorted(set(abs(v) for v in E2M1_TABLE))
    for lo, hi in zip(mags, mags[1:]):
        c = int(e2m1_codes(torch.tensor([(lo + hi) / 2]))[0])
        assert c % 2 == 0 and E2M1_TABLE[c] in (lo, hi)


def test_quantize_round_trip_exact():
    """Values that are e2m1 codes times e4m3 block scales, each block holding a +-6, come back as
    exactly those codes and scales (no global scale); with one, they decode to the same values."""
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen)
    codes[..., ::16] = 7 + 8 * torch.randint(0, 2, (3, 5, 4), generator=gen)       # a +-6 per block
    finite = [i for i, v in enumerate(E4M3_TABLE) if np.isfinite(v) and 0 < v]
    sidx = torch.tensor(finite)[torch.randint(0, len(finite), (3, 5, 4), generator=gen)]
    scales = torch.tensor(E4M3_TABLE)[sidx].to(torch.float32)
    x = torch.tensor(E2M1_TABLE)[codes].to(torch.float32) * scales.repeat_interleave(16, -1)
    q, s, gs = quantize_activation(x, "nvfp4", global_scale=False)
    assert gs is None and q.dtype == torch.int8 and q.shape == (3, 5, 32) and s.dtype == torch.float8_e4m3fn
    assert torch.equal(s.to(torch.float32), scales)
    lo, hi = q.view(torch.uint8) & 15, q.view(torch.uint8) >> 4
    assert torch.equal(torch.stack((lo, hi), -1).flatten(-2).to(torch.int64), codes)
    assert torch.equal(dequantize_activation(q, "nvfp4", s).to(torch.float32), x)
    q2, s2, g2 = quantize_activation(x, "nvfp4")
    assert g2.shape == (1,) and g2.dtype == torch.float32
    assert relative_error(dequantize_activation(q2, "nvfp4", s2, g2), x) < 0.1


def test_block_scale_choice():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 96, generator=gen) * torch.logspace(-3, 2, 96)
    amax = x.reshape(4, 6, 16).abs().amax(-1)
    _, s, gs = quantize_activation(x, "nvfp4", global_scale=False)
    assert torch.equal(s, (amax / 6).to(torch.float8_e4m3fn))
    q, s, gs = quantize_activation(x, "nvfp4")
    assert torch.allclose(gs, x.abs().amax().reshape(1) / (448 * 6))
    assert torch.equal(s, (amax / 6 / gs).to(torch.float8_e4m3fn))
    err = (dequantize_activation(q, "nvfp4", s, gs) - x).abs().reshape(4, 6, 16).amax(-1)
    assert bool((err <= amax * 0.2 + 1e-12).all())             # within a coarse e2m1 step of each block


def test_quantizer_errors(naming):
    with naming(ValueError, "x"):
        quantize_activation(torch.randn(2, 40), "nvfp4")
    with naming(ValueError, "global_scale"):
        quantize_activation(torch.randn(2, 32), "int8", global_scale=True)
    with naming(ValueError, "scale"):
        dequantize_activation(torch.zeros(2, 16, dtype=torch.int8), "nvfp4")


def test_decode_exact_in_float16():
    """Every code pair times every finite e4m3 scale decodes to float16 exactly (the operands of the
    decode-then-GEMM path); the decode kernel's rule (codes -> values x scale, rounded to float16)."""
    finite = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    codes = torch.arange(256, dtype=torch.uint8).repeat(len(finite), 1).repeat_interleave(8, dim=1)  # [S, 2048]
    scales = finite.view(torch.float8_e4m3fn).unsqueeze(1).expand(-1, 256)                          # [S, 256]
    v32 = nvfp4_decode(codes, scales)
    v16 = nvfp4_decode(codes, scales, dtype=torch.float16)
    assert torch.equal(v16.to(torch.float32), v32) and float(v32.abs().max()) == 6 * 448


def test_decode_kernel_word_rule():
    """The decode kernel's sm_89+ rule (bb_nv_dec8), on its own constants: per word of 8 codes the
    even / odd codes' nibbles spread to bytes, each byte -> an e4m3 byte whose value is the code's
    times 2**E4M3_SHIFT (every one of the 16 codes, both signs), the two prmt selectors put the
    bytes back in code order (low byte of each pair first), and the block scale times
    2**-E4M3_SHIFT (UNSHIFT_H2) restores the value: exactly nvfp4_decode's float16 values."""
    from bitblas.schedule.gemv.decode import _emu_prmt
    from bitblas.schedule.nvfp4 import DEC_PAIR_SEL, E4M3_SHIFT, UNSHIFT_H2, e4m3_code_bytes

    def e4m3(byte_values):
        return torch.tensor(byte_values, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)

    # one code per byte: all 16 codes
    got = e4m3([e4m3_code_bytes(c) & 0xFF for c in range(16)]) * 2.0 ** -E4M3_SHIFT
    assert torch.equal(got, torch.tensor(E2M1_TABLE, dtype=torch.float32))
    half_unshift = torch.tensor([UNSHIFT_H2 & 0xFFFF, UNSHIFT_H2 >> 16], dtype=torch.int16).view(torch.float16)
    assert half_unshift.tolist() == [2.0 ** -E4M3_SHIFT] * 2
    rng = random.Random(5)
    words = [rng.getrandbits(32) for _ in range(300)] + [0, 0xFFFFFFFF, 0x76543210, 0xFEDCBA98]
    for q in words:
        el = e4m3_code_bytes(q & 0x0F0F0F0F)
        eh = e4m3_code_bytes((q >> 4) & 0x0F0F0F0F)
        out = []
        for sel in DEC_PAIR_SEL:
            w = _emu_prmt(el, eh, sel)
            out += [(w >> (8 * i)) & 0xFF for i in range(4)]
        codes = torch.tensor([q.to_bytes(4, "little")[i] for i in range(4)], dtype=torch.uint8).view(1, 4)
        scale = torch.tensor([[0x7E]], dtype=torch.uint8).view(torch.float8_e4m3fn)   # 448: the largest
        want = nvfp4_decode(torch.cat([codes, codes], 1), scale, dtype=torch.float16)[0, :8]
        v = (e4m3(out).to(torch.float16) * half_unshift[0]) * torch.tensor(448.0, dtype=torch.float16)
        assert torch.equal(v, want), hex(q)


# -- reference ------------------------------------------------------------------------------------
def test_reference_nvfp4_gemv():
    """The reference against a float64 loop over the issue's definition."""
    M, K, L = 5, 64, 2
    a, b, sfa, sfb, _ = _issue_tensors(M, K, L, rows=3)
    ref = reference_nvfp4_gemv(a, b, sfa, sfb)
    assert ref.shape == (M, 1, L) and ref.dtype == torch.float32
    t = E2M1_TABLE
    for lb in range(L):
        for m in range(M):
            s = 0.0
            for k in range(K):
                wa = int(a[m, k // 2, lb]) >> (4 * (k % 2)) & 15
                wb = int(b[0, k // 2, lb]) >> (4 * (k % 2)) & 15
                s += t[wa] * float(sfa[m, k // 16, lb].float()) * t[wb] * float(sfb[0, k // 16, lb].float())
            assert abs(float(ref[m, 0, lb]) - s) <= 1e-5 * max(1.0, abs(s))


# -- the CUDA helpers' arithmetic, interpreted (c_interp) ---------------------------------------
def _mag2(code: int) -> int:
    return int(round(2 * abs(E2M1_TABLE[code])))


def test_tables():
    assert [(MAG2_TABLE[i // 4] >> (8 * (i % 4))) & 0xFF for i in range(8)] == [_mag2(c) for c in range(8)]
    assert [(MAG2_NIBBLES >> (4 * i)) & 0xF for i in range(8)] == [_mag2(c) for c in range(8)]
    assert SIGN_FLIP == 0x88888888


@pytest.mark.parametrize("sm", (90, 80))
def test_gemv_helpers_arithmetic(sm):
    """bb_nv_act8 (the staged activation bytes), bb_nv_mag and bb_nv_dot (a 32-code vector's two
    block dot products with their scales) from the generated source: every pair of codes at every
    position (words of one repeated code), then random words, against the table products."""
    h = cuda_helpers(sm)
    act8 = h["bb_nv_act8"]
    assert h["bb_nv_stage"].startswith(act8)
    rng = random.Random(sm)
    cases = [([cw * 0x11111111] * 4, [ca * 0x11111111] * 4) for cw in range(16) for ca in range(16)]
    cases += [([rng.getrandbits(32) for _ in range(4)], [rng.getrandbits(32) for _ in range(4)]) for _ in range(200)]
    finite = [v for v in E4M3_TABLE if np.isfinite(v)]
    for wq, aq in cases:
        o = [0] * 8
        run_c(act8, {"q": list(aq), "o": o}, skip_lines=(PRMT_LAMBDA,))
        acodes = [(aq[j] >> (4 * t)) & 15 for j in range(4) for t in range(8)]
        for k, c in enumerate(acodes):          # signed doubled values, word 2j + t // 4, byte t % 4
            byte = (o[2 * (k // 8) + (k % 8) // 4] >> (8 * (k % 4))) & 0xFF
            assert (byte - 256 if byte >= 128 else byte) == int(2 * E2M1_TABLE[c])
        pm = [0] * 16
        run_c(h["bb_nv_mag"], {"w": list(wq), "pm": pm, "t0": MAG2_TABLE[0], "t1": MAG2_TABLE[1]},
              skip_lines=(PRMT_LAMBDA,))
        sw, sa = [rng.choice(finite) for _ in range(2)], [rng.choice(finite) / 4 for _ in range(2)]
        got = run_c(h["bb_nv_dot"], {"pm": pm, "av": o, "sa": sa, "sw": sw, "acc": 0.5})["return"]
        wcodes = [(wq[j] >> (4 * t)) & 15 for j in range(4) for t in range(8)]
        want = 0.5
        for blk in range(2):
            dot = sum(E2M1_TABLE[wcodes[k]] * E2M1_TABLE[acodes[k]] for k in range(16 * blk, 16 * blk + 16))
            want += dot * 4 * sw[blk] * sa[blk]
        assert got == pytest.approx(want, rel=1e-6, abs=1e-30), (hex(wq[0]), hex(aq[0]))


# -- the CPU operator and the entry point -----------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_ops():
    """Operators shared by the CPU tests (their kernel is built once: symbolic rows and batch)."""
    return {b: Matmul(cfg(M=None, N=48, K=96, batch=b), target="llvm") for b in (None, 3)}


@pytest.mark.parametrize("batch", [None, 3], ids=["plain", "batch3"])
@pytest.mark.parametrize("rows", [1, 4])
def test_cpu_operator(cpu_ops, batch, rows):
    op = cpu_ops[batch]
    c = op.config
    inp = random_inputs(c, rows)
    shape = (rows, c.N) if batch is None else (batch, rows, c.N)
    out = torch.full(shape, float("nan"), dtype=torch.float16)
    res = op(**inp, output=out)
    assert res is out
    ref = reference_matmul(c, **inp)
    assert relative_error(out, ref) <= tolerance(c)
    # positional extras: op(A, W, scale, a_scale, output)
    out2 = op(inp["A"], inp["W"], inp["scale"], inp["a_scale"], global_scale=inp["global_scale"],
              a_global_scale=inp["a_global_scale"])
    assert torch.equal(out2, out)


def test_cpu_operator_strided_and_leading_dims(cpu_ops):
    """Batched views with odd strides (rows taken from padded tensors, a transposed output) run in
    place; unbatched activations with two leading dimensions."""
    op = cpu_ops[3]
    c = op.config
    inp = random_inputs(c, 2)
    A = torch.zeros(3, 7, c.K // 2, dtype=torch.int8)
    A[:, 2:4] = inp["A"]
    B = torch.zeros(3, 9, c.K // 16, dtype=torch.float8_e4m3fn)
    B[:, 5:7] = inp["a_scale"]
    out = torch.full((3, c.N, 2), float("nan"), dtype=torch.float16).transpose(1, 2)
    op(A[:, 2:4], inp["W"], scale=inp["scale"], a_scale=B[:, 5:7], output=out, global_scale=inp["global_scale"],
       a_global_scale=inp["a_global_scale"])
    assert relative_error(out, reference_matmul(c, **inp)) <= tolerance(c)
    op1 = cpu_ops[None]
    inp = random_inputs(op1.config, 6, lead=(2, 3))
    res = op1(**inp)
    assert res.shape == (2, 3, c.N)
    assert relative_error(res, reference_matmul(op1.config, **inp)) <= tolerance(op1.config)


@pytest.mark.parametrize("c_layout", ["permuted", "contiguous"])
def test_nvfp4_gemv_cpu(c_layout):
    """The entry point on the issue's exact permuted views (a as float4_e2m1fn_x2, b and sfb padded
    to 128 rows), an odd M and L, the output poisoned."""
    M, K, L = 37, 96, 3
    a, b, sfa, sfb, c = _issue_tensors(M, K, L, c_layout=c_layout)
    if hasattr(torch, "float4_e2m1fn_x2"):
        a = a.view(torch.float4_e2m1fn_x2)
    assert a.stride() == (K // 2, 1, M * K // 2) and b.stride() == (K // 2, 1, 128 * K // 2)
    res = nvfp4_gemv(a, b, sfa, sfb, c)
    assert res is c
    ref = reference_nvfp4_gemv(a, b, sfa, sfb)
    assert relative_error(c, ref) <= TOLERANCES["float16"]
    # row 0 of b only: the padding rows do not matter
    b2 = b.clone()
    b2[1:] = 0
    c2 = torch.full_like(c, float("nan"))
    nvfp4_gemv(a, b2, sfa, sfb, c2)
    assert torch.equal(c2, c)


def test_nvfp4_gemv_errors(naming):
    M, K, L = 8, 64, 2
    a, b, sfa, sfb, c = _issue_tensors(M, K, L, rows=4)
    with naming(ValueError, "a"):                              # not K-contiguous
        nvfp4_gemv(a.contiguous(), b, sfa, sfb, c)
    with naming(ValueError, "sfb"):
        nvfp4_gemv(a, b, sfa, sfb.contiguous(), c)
    a48, b48, sfa48, sfb48, c48 = _issue_tensors(M, 48, L, rows=4)
    with naming(ValueError, "a"):                              # K = 48 is not a multiple of 32
        nvfp4_gemv(a48, b48, sfa48, sfb48, c48)
    with naming(TypeError, "sfa"):
        nvfp4_gemv(a, b, sfa.to(torch.float16), sfb, c)
    with naming(ValueError, "sfa"):
        nvfp4_gemv(a, b, sfa[:, :2], sfb, c)
    with naming(ValueError, "b"):                              # fewer than one row
        nvfp4_gemv(a, b[:0], sfa, sfb, c)
    with naming(ValueError, "b"):
        nvfp4_gemv(a, b[:, :, :1], sfa, sfb, c)
    with naming(TypeError, "c"):
        nvfp4_gemv(a, b, sfa, sfb, c.to(torch.int32))
    with naming(ValueError, "c"):
        nvfp4_gemv(a, b, sfa, sfb, c[:4])
    with naming(TypeError, "a"):
        nvfp4_gemv(a.to(torch.float16), b, sfa, sfb, c)
    with naming(TypeError, "b"):
        nvfp4_gemv(a, "b", sfa, sfb, c)


def test_operator_errors(cpu_ops, naming):
    op = cpu_ops[3]
    inp = random_inputs(op.config, 2)
    with naming(ValueError, "a_scale"):
        op(inp["A"], inp["W"], scale=inp["scale"])
    with naming(TypeError, "scale"):
        op(inp["A"], inp["W"], scale=inp["scale"].to(torch.float16), a_scale=inp["a_scale"])
    with naming(ValueError, "W"):
        op(inp["A"], inp["W"][:2], scale=inp["scale"], a_scale=inp["a_scale"])
    with naming(ValueError, "A"):
        op(inp["A"].transpose(1, 2), inp["W"], scale=inp["scale"], a_scale=inp["a_scale"])
    with naming(ValueError, "output"):
        op(**inp, output=torch.empty(3, 2, 5, dtype=torch.float16))
    with naming(ValueError, "a_global_scale"):
        op(**{**inp, "a_global_scale": torch.ones(2)})
    with naming(ValueError, "a_global_scale"):
        Matmul(MatmulConfig(M=1, N=16, K=32), target="llvm")(torch.zeros(1, 32, dtype=torch.float16),
                                                           torch.zeros(16, 32, dtype=torch.float16),
                                                           a_global_scale=torch.ones(1))
    with pytest.raises(NotImplementedError):
        op.hardware_aware_finetune()
    from bitblas.nn import Linear
    with pytest.raises(NotImplementedError, match="nvfp4"):
        Linear(64, 32, A_dtype="nvfp4", W_dtype="nvfp4", group_size=16)


# -- CUDA code generation (no GPU) -----------------------------------------------------------------
CODEGEN = [(1, 7168, 16384, None), (1, 1000, 1536, None), (3, 512, 7168, None),
           (8, 256, 2048, dict(rows_per_warp=4, warps=4, unroll=2, stages=2))]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("m,N,K,hint", CODEGEN, ids=[f"m{m}-{N}x{K}" for m, N, K, _ in CODEGEN])
def test_gemv_codegen(arch, m, N, K, hint):
    from bitblas.build import cuda_source, cuda_target, find_nvcc, nvcc_resources
    from bitblas.schedule.nvfp4 import NVFP4GemvHint
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    t = cuda_target(arch)
    h = NVFP4GemvHint(**hint, pdl=arch == "sm_90") if hint else None
    src = cuda_source(make_plan(cfg(N=N, K=K), "cuda", m), t, h)
    assert "__dp4a" in src and "prmt.b32" in src
    assert ("cvt.rn.f16x2.e4m3x2" in src) == (arch == "sm_90")
    if arch == "sm_90":
        assert "griddepcontrol" in src
    res = nvcc_resources(src, arch)
    assert res["spill_stores"] == 0


def test_gemv_l2_prefetch_before_the_wait():
    """``l2_prefetch``: the first steps of each warp's weight rows and scales are prefetched into L2
    (prefetch.global.L2, which binds no value) before the PDL wait, and nothing is read from global
    memory before it; without PDL the same prefetches and no wait; more steps than the row has are
    clipped. The defaults by K (benchmark.nvfp4's sweep) and the refusal of a negative count."""
    import re
    from bitblas.build import cuda_source, cuda_target
    from bitblas.schedule.nvfp4 import NVFP4GemvHint, nvfp4_gemv_unsupported
    t = cuda_target("sm_90")
    p = make_plan(cfg(N=7168, K=16384), "cuda", 1)
    src = cuda_source(p, t, NVFP4GemvHint(pdl=True, l2_prefetch=2))
    body = src[src.index('extern "C" __global__'):]
    body = body[body.index("{"):]
    head, tail = body.split("griddepcontrol_wait();", 1)
    assert head.count("bb_pf_l2(") == 2 * 2 * 2              # 2 steps x 2 rows x (codes, scales)
    assert "bb_pf_l2(" not in tail
    assert not re.search(r"bb_ldw4\(|bb_nv_ldsc\(|bb_nv_stage\(|__ldg|= *\(?\w+_ptr\[", head)
    assert "prefetch.global.L2" in src
    plain = cuda_source(p, t, NVFP4GemvHint(pdl=False, l2_prefetch=1))
    assert "griddepcontrol" not in plain and plain.count("bb_pf_l2(") == 1 + 2 * 2
    short = cuda_source(make_plan(cfg(N=64, K=1024), "cuda", 1), t, NVFP4GemvHint(pdl=True, l2_prefetch=9))
    assert short.count("bb_pf_l2(") == 1 + 2 * 2 * 1     # K=1024: one step of 32 vectors per row
    assert "l2_prefetch=-1" in nvfp4_gemv_unsupported(p, NVFP4GemvHint(l2_prefetch=-1), 90)
    d = {K: NVFP4GemvHint.default(make_plan(cfg(N=64, K=K), "cuda", 1), t) for K in (2048, 7168, 16384)}
    assert d[2048] == NVFP4GemvHint(rows_per_warp=1, unroll=2, stages=2, pdl=True)
    assert NVFP4GemvHint.default(make_plan(cfg(N=64, K=2048), "cuda", 4), t) == NVFP4GemvHint(pdl=True)
    assert d[7168] == NVFP4GemvHint(stages=4, pdl=True, l2_prefetch=1)
    assert d[16384] == NVFP4GemvHint(pdl=True, l2_prefetch=2)
    assert NVFP4GemvHint.default(make_plan(cfg(N=64, K=16384), "cuda", 1), cuda_target("sm_80")).l2_prefetch == 0


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_decode_codegen(arch):
    from bitblas.build import cuda_target, find_nvcc, nvcc_compile
    from bitblas.ops.nvfp4 import decode_source
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    src = decode_source(1536, cuda_target(arch))
    assert nvcc_compile(src, arch)[:4] == b"\x7fELF"


def test_gemv_hint_limits():
    from bitblas.schedule.nvfp4 import NVFP4GemvHint, nvfp4_gemv_unsupported
    p = make_plan(cfg(N=64, K=32768), "cuda", 8)
    assert "shared memory" in nvfp4_gemv_unsupported(p, NVFP4GemvHint(), 90)
    assert nvfp4_gemv_unsupported(make_plan(cfg(N=64, K=16384), "cuda", 1), NVFP4GemvHint(), 90) is None
    assert "static row count" in nvfp4_gemv_unsupported(make_plan(cfg(N=64, K=64), "cuda", 9), NVFP4GemvHint(), 90)
    assert "warps" in nvfp4_gemv_unsupported(make_plan(cfg(N=64, K=64), "cuda", 1), NVFP4GemvHint(warps=0), 90)


@pytest.mark.parametrize("sm", [70, 75, 80, 86, 89, 90, 100, 120])
def test_gemv_staging_fits_the_opt_in_limit(sm):
    """The GEMV never stages more activation rows than a block may opt in to on its arch (sm_86,
    sm_89 and sm_120: 99 KB, not the 160 / 200 KB of sm_80 / sm_90), and an operator for that arch
    launches it with as many rows as fit."""
    from bitblas.arch import Arch
    from bitblas.ops.nvfp4 import NVFP4Matmul
    from bitblas.schedule.nvfp4 import NVFP4_GEMV_MAX_ROWS, NVFP4GemvHint, gemv_smem_bytes, gemv_smem_cap, \
        nvfp4_gemv_unsupported
    optin = Arch.from_sm(sm).optin_smem_per_block
    cap = gemv_smem_cap(sm)
    assert cap <= optin and cap >= min(optin, 160 * 1024)
    K = 32768
    from bitblas.build import cuda_target
    tgt = cuda_target(f"sm_{sm}")
    nv = NVFP4Matmul(cfg(N=64, K=K), lambda: tgt)
    rows = nv.gemv_rows()
    assert 1 <= rows <= NVFP4_GEMV_MAX_ROWS and gemv_smem_bytes(K, rows) <= optin
    assert rows == NVFP4_GEMV_MAX_ROWS or gemv_smem_bytes(K, rows + 1) > cap
    if rows < NVFP4_GEMV_MAX_ROWS and sm >= 61:
        reason = nvfp4_gemv_unsupported(make_plan(cfg(N=64, K=K), "cuda", rows + 1), NVFP4GemvHint(), sm)
        assert "shared memory" in reason and str(cap) in reason


def test_torch_op(cpu_ops):
    """The torch custom op (bitblas.torch_op.matmul) runs a batched nvfp4 config, eagerly and through
    its fake implementation (shapes under torch.compile's tracing)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from bitblas.torch_op import matmul, operator_key
    op = cpu_ops[3]
    c = op.config
    inp = random_inputs(c, 2)
    key = operator_key(c, "llvm")
    out = matmul(inp["A"], inp["W"], inp["scale"], None, None, inp["a_scale"], inp["global_scale"], key=key)
    ref = reference_matmul(c, inp["A"], inp["W"], inp["scale"], a_scale=inp["a_scale"],
                           global_scale=inp["global_scale"])
    assert out.shape == (3, 2, c.N) and relative_error(out, ref) <= tolerance(c)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(inp[k]) for k in ("A", "W", "scale", "a_scale", "global_scale")]
        res = torch.ops.bitblas.matmul(fake[0], fake[1], fake[2], None, None, fake[3], fake[4], key)
    assert tuple(res.shape) == (3, 2, c.N)
