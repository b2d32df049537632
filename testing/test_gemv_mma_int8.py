"""The int8-activation tensor-core GEMV (bitblas/schedule/gemv/mma_int8.py), without a GPU.

* A Python model of ``mma.sync.aligned.m16n8k32.row.col.s32.{u8,s8}.s8.s32`` (the fragment layout
  of the PTX ISA: a0/a1/a2/a3 = rows g / g+8 / g / g+8 at k 4q.. / 4q.. / 16+4q.. / 16+4q..;
  b0/b1 = k 4q.. / 16+4q.. of column g; c0..c3 = (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)) runs
  the generated helper source (decode, activation gather, the mma operand order) of a whole warp
  on random codes and activations and must give sum(q * a) of every (channel, token) exactly.
* Routing, default hints, vector-width choice and refusals.
* nvcc code generation for sm_80 / sm_90 (marked nvcc).

GPU correctness: testing/test_gpu_gemv_int8.py (``test_gemv_int8_mma*``).
"""
from __future__ import annotations

import dataclasses
import random
import re

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import cuda_source, cuda_target, find_nvcc, nvcc_compile
from bitblas.formats import FORMATS
from bitblas.plan import make_plan
from bitblas.schedule import GEMVHint, GEMVKSplitHint, GEMVMmaHint
from bitblas.schedule.gemv import default_gemv_hint
from bitblas.schedule.gemv import decode as gd
from bitblas.schedule.gemv import gemv_hint_unsupported
from bitblas.schedule.gemv.mma_int8 import mma_i8_helpers, code_shift, mma_i8_vec_bytes, mma_int8_unsupported
from c_interp import run_c
from kernel_helpers import TARGETS, run_fdec

WEIGHTS = ("int8", "uint8", "int4", "uint4", "int2", "uint2", "int1", "uint1")


def _byte(x: int, i: int, signed: bool) -> int:
    v = (x >> (8 * i)) & 0xFF
    return v - 256 if signed and v >= 128 else v


def mma_m16n8k32(a, b, c, a_signed, value=None):
    """The warp-wide mma on per-lane registers: ``a[lane]`` 4 words, ``b[lane]`` 2 words (s8),
    ``c[lane]`` 4 int32; returns the new ``c``. ``value``: byte -> value of both operands
    (float8: the e4m3 table) instead of the integer bytes."""
    A = [[None] * 32 for _ in range(16)]
    B = [[None] * 8 for _ in range(32)]
    for lane in range(32):
        g, q = lane // 4, lane % 4
        for i in range(4):
            row, k0 = g + 8 * (i % 2), 4 * q + 16 * (i // 2)
            for e in range(4):
                A[row][k0 + e] = value((a[lane][i] >> (8 * e)) & 0xFF) if value else _byte(a[lane][i], e, a_signed)
        for i in range(2):
            for e in range(4):
                B[4 * q + 16 * i + e][g] = value((b[lane][i] >> (8 * e)) & 0xFF) if value else _byte(b[lane][i], e, True)
    out = []
    for lane in range(32):
        g, q = lane // 4, lane % 4
        vals = []
        for j in range(4):
            row, col = g + 8 * (j // 2), 2 * q + j % 2
            vals.append(c[lane][j] + sum(A[row][k] * B[k][col] for k in range(32)))
        out.append(vals)
    return out


def _prep(src: str, ab: bytes, na: int) -> list:
    """The gathered activation words ``ap`` of ``bb_mprep`` on the activation bytes ``ab``."""
    ap = run_c(src, {"a": [int.from_bytes(ab[4 * j:4 * j + 4], "little") for j in range(na)], "ap": {}})["ap"]
    assert sorted(ap) == list(range(na))
    return [ap[i] for i in range(na)]


_MMA = re.compile(r'asm volatile\("mma\.sync\.aligned\.m16n8k32\.row\.col\.s32\.(u8|s8)\.s8\.s32 .*?" '
                  r': "\+r"\(c\[(\d+)\]\), "\+r"\(c\[(\d+)\]\), "\+r"\(c\[(\d+)\]\), "\+r"\(c\[(\d+)\]\) '
                  r': "r"\((\w+)\[(\d+)\]\), "r"\((\w+)\[(\d+)\]\), "r"\((\w+)\[(\d+)\]\), "r"\((\w+)\[(\d+)\]\), '
                  r'"r"\(b\[(\d+)\]\), "r"\(b\[(\d+)\]\)\);')


def _warp_mma(steps, dec, prep, zero, a_signed, value=None):
    """Run the generated mma steps (``_MMA`` / ``_MMA_F8`` matches of ``bb_mma``) of one warp:
    A from the lanes' decoded words ``dec[lane, h]`` (channel g: h=0, g+8: h=1), B from the gathered
    activation words ``prep[lane]``; returns each lane's 8 accumulators (two chains of 4)."""
    c = [[zero] * 8 for _ in range(32)]
    for s in steps:
        o = [int(s[i]) for i in (2, 3, 4, 5)]
        assert o == list(range(o[0], o[0] + 4))
        regs = [(s[6 + 2 * i], int(s[7 + 2 * i])) for i in range(4)]
        a = [[dec[lane, 0 if nm == "dg" else 1][i] for nm, i in regs] for lane in range(32)]
        b = [[prep[lane][int(s[14])], prep[lane][int(s[15])]] for lane in range(32)]
        new = mma_m16n8k32(a, b, [c[lane][o[0]:o[0] + 4] for lane in range(32)], a_signed, value)
        for lane in range(32):
            c[lane][o[0]:o[0] + 4] = new[lane]
    return c


@pytest.mark.parametrize("wd", WEIGHTS)
@pytest.mark.parametrize("nw", (1, 2, 4))
def test_mma_int8_fragment_model(wd, nw):
    """One warp, one 16-channel tile, 8 tokens, each lane quad q one vector (4 V positions of K):
    the generated decode + gather + mma operand order give 2**shift * sum_k q[n, k] * a[t, k] in
    the C fragment layout the kernel's store reads, exactly (codes over the whole range, -128)."""
    from bitblas.quantization.utils import unpack_codes
    fmt = FORMATS[wd]
    V = nw * 32 // fmt.bits
    if V < 16:
        pytest.skip("fewer than 16 values per vector")
    NA = V // 4
    signed = fmt.kind == "int"
    src = mma_i8_helpers("t", fmt.bits, fmt.storage, nw)
    steps = [m for m in (_MMA.fullmatch(ln.strip()) for ln in src["bb_mma_t"].splitlines()) if m]
    assert len(steps) == NA // 2 and all(s[1] == ("s8" if signed else "u8") for s in steps)
    sh = 8 - fmt.bits if signed and fmt.bits < 8 else 0
    rng = random.Random(fmt.bits * 7 + nw + signed)
    for trial in range(3):
        wb = [[bytes(rng.getrandbits(8) for _ in range(4 * nw)) for _ in range(4)] for _ in range(16)]
        codes = [sum((unpack_codes(torch.tensor(list(wb[n][q]), dtype=torch.uint8).view(torch.int8), fmt).tolist()
                      for q in range(4)), []) for n in range(16)]
        acts = [[rng.choice((-128, 127, rng.randint(-128, 127))) for _ in range(4 * V)] for _ in range(8)]
        dec, prep = {}, {}
        for lane in range(32):
            g, q = lane // 4, lane % 4
            for h in range(2):
                dec[lane, h] = run_fdec(src["bb_mdec_t"], [int.from_bytes(wb[g + 8 * h][q][4 * j:4 * j + 4], "little")
                                                           for j in range(nw)])
                assert len(dec[lane, h]) == NA
            prep[lane] = _prep(src["bb_mprep_t"], bytes(x & 0xFF for x in acts[g][q * V:(q + 1) * V]), NA)
        c = _warp_mma(steps, dec, prep, 0, signed)
        for lane in range(32):
            g, q = lane // 4, lane % 4
            for j in range(4):
                n, t = g + 8 * (j // 2), 2 * q + j % 2
                want = sum(x * y for x, y in zip(codes[n], acts[t]))
                got = c[lane][j] + c[lane][j + 4]
                assert got == want << sh, (wd, nw, trial, lane, j, got, want)


_MMA_F8 = re.compile(_MMA.pattern.replace(r"s32\.(u8|s8)\.s8\.s32", r"f32\.(e4m3)\.e4m3\.f32").replace(r'\+r', r'\+f'))


@pytest.mark.parametrize("wd", ("int4", "uint4", "int2", "uint2"))
@pytest.mark.parametrize("nw", (1, 2, 4))
def test_mma_f8_fragment_model(wd, nw):
    """float8_e4m3 activations (W4A-fp8 / W2A-fp8): the generated e4m3 code decoder (interpreted),
    the activation gather into its slots and the m16n8k32 .e4m3 operand order give, per (channel,
    token), exactly sum_k value(code[n, k]) * a[t, k] over one vector per lane quad; weights packed in
    the plan's code order (BitBLAS's fast-decoding order for an 8-bit target), activations any finite
    e4m3 byte."""
    from bitblas.code_order import slot_codes
    from bitblas.formats import E4M3_TABLE
    fmt = FORMATS[wd]
    b = fmt.bits
    V = nw * 32 // b
    if V < 16:
        pytest.skip("fewer than 16 values per vector")
    plan = _plan(wd, A_dtype="float8_e4m3", k=4 * V * 4)
    order, n = plan.w_order, 32 // b
    code = slot_codes(order) if order is not None else tuple(range(n))
    off = (1 << (b - 1)) if fmt.kind == "int" else 0
    NA = V // 4
    src = mma_i8_helpers("t", b, plan.w_storage, nw, order, f8=True)
    steps = [m for m in (_MMA_F8.fullmatch(ln.strip()) for ln in src["bb_mma_t"].splitlines()) if m]
    assert len(steps) == NA // 2
    finite = [x for x in range(256) if E4M3_TABLE[x] == E4M3_TABLE[x]]
    rng = random.Random(b * 7 + nw)
    for trial in range(3):
        u = [[[rng.randrange(1 << b) for _ in range(V)] for _ in range(4)] for _ in range(16)]   # [n][q][k]
        acts = [[rng.choice(finite) for _ in range(4 * V)] for _ in range(8)]
        dec, prep = {}, {}
        for lane in range(32):
            g, q = lane // 4, lane % 4
            for h in range(2):
                uq = u[g + 8 * h][q]
                words = [sum(uq[j * n + code[s]] << (b * s) for s in range(n)) for j in range(nw)]
                dec[lane, h] = run_fdec(src["bb_mdec_t"], words)
                assert len(dec[lane, h]) == NA
            prep[lane] = _prep(src["bb_mprep_t"], bytes(acts[g][q * V:(q + 1) * V]), NA)
        c = _warp_mma(steps, dec, prep, 0.0, False, E4M3_TABLE.__getitem__)
        for lane in range(32):
            g, q = lane // 4, lane % 4
            for j in range(4):
                ch, t = g + 8 * (j // 2), 2 * q + j % 2
                want = sum((u[ch][qq][k] - off) * E4M3_TABLE[acts[t][qq * V + k]] for qq in range(4) for k in range(V))
                assert c[lane][j] + c[lane][j + 4] == want, (wd, nw, trial, lane, j)


def _plan(w, m=4, n=1000, k=1536, A_dtype="int8", **kw):
    return make_plan(MatmulConfig(N=n, K=k, A_dtype=A_dtype, W_dtype=w, **kw), "cuda", m)


def test_mma_int8_vec_bytes_and_shift():
    """Group scales: 4 vectors inside one group (2-bit g128: 8-byte vectors, 1-bit: 4-byte);
    per-channel: the widest vector of <= 64 values."""
    g = dict(group_size=128, with_scaling=True)
    assert [mma_i8_vec_bytes(_plan(w, **g)) for w in ("int8", "int4", "int2", "int1")] == [16, 16, 8, 4]
    assert [mma_i8_vec_bytes(_plan(w, with_scaling=True)) for w in ("int8", "int4", "int2", "int1")] == [16, 16, 16, 8]
    assert mma_i8_vec_bytes(_plan("int4", group_size=64, with_scaling=True)) == 8
    assert mma_i8_vec_bytes(_plan("int1", group_size=64, with_scaling=True)) is None
    assert [code_shift(_plan(w)) for w in ("int8", "uint8", "int4", "uint4", "int2", "int1", "uint1")] == \
        [0, 0, 4, 0, 6, 7, 0]


def test_mma_int8_default_hint():
    """From 3 rows (group-scaled 4-bit codes 4, 8-bit codes 5 with group scales and 6 without) the
    tensor-core kernel (sm_80+; pdl on sm_90): the float path's base tiles under 2 blocks per SM,
    from 9 rows below N=16896 8 K warps x 4 vectors, from N=16896 the 64-channel tile without the
    next step in flight; fewer rows, sm_75 and groups too small for 4 vectors keep the rows kernel."""
    t80, t90 = cuda_target(TARGETS["sm_80"]), cuda_target(TARGETS["sm_90"])
    for w in WEIGHTS:
        for kw in (dict(with_scaling=True), dict(group_size=128, with_scaling=True), dict(out_dtype="int32")):
            assert default_gemv_hint(_plan(w, 7, **kw), t80) == GEMVHint(32, k_warps=8, unroll=2, stages=2, mma=True,
                                                                        min_blocks=2)
            assert default_gemv_hint(_plan(w, 8, **kw), t90) == GEMVHint(32, k_warps=8, unroll=2, stages=2, mma=True,
                                                                        min_blocks=2, pdl=True)
            assert default_gemv_hint(_plan(w, 16, **kw), t80) == GEMVHint(32, k_warps=8, unroll=4, stages=1, mma=True,
                                                                         min_blocks=2)
            assert default_gemv_hint(_plan(w, 16, n=28672, **kw), t80) == \
                GEMVHint(64, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=2)
            assert not default_gemv_hint(_plan(w, 2, **kw), t80).tensor_cores
            grouped = "group_size" in kw
            first = (5 if grouped else 6) if w.endswith("8") else 4 if grouped and w.endswith("4") else 3
            below = default_gemv_hint(_plan(w, first - 1, **kw), t80)
            assert below.tensor_cores is False
            assert default_gemv_hint(_plan(w, first, **kw), t80).tensor_cores is True
            if first - 1 >= 3:                # the rows kernel: no ring from 5 rows or for per-channel 8-bit
                assert below.stages == (1 if first - 1 >= 5 or (w.endswith("8") and not grouped) else 2), (w, kw)
    assert not default_gemv_hint(_plan("int1", 8, group_size=64, with_scaling=True), t80).tensor_cores


def test_mma_int8_chunk_tile():
    """17..64 rows: the chunk loop, 32 channels x 4 K warps; from N=16896 64 channels for sub-byte
    codes up to 32 rows (per-channel up to 48); 8-bit codes keep 32."""
    t90 = cuda_target(TARGETS["sm_90"])
    loop = GEMVHint(32, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1, chunk_loop=True, pdl=True)
    for w in WEIGHTS:
        for kw in (dict(with_scaling=True), dict(group_size=128, with_scaling=True)):
            for m in (17, 32, 48, 64):
                h = default_gemv_hint(_plan(w, m, n=28672, k=8192, **kw), t90)
                assert default_gemv_hint(_plan(w, m, n=8192, k=8192, **kw), t90) == loop, (w, kw, m)
                wide = not w.endswith("8") and m <= (32 if "group_size" in kw else 48)
                assert h == (dataclasses.replace(loop, rows_per_warp=64) if wide else loop), (w, kw, m)


def test_mma_int8_refused():
    h = GEMVHint(32, k_warps=4, mma=True)
    why = mma_int8_unsupported(_plan("int1", group_size=64, with_scaling=True), h)
    assert "group_size=64" in why and "int1" in why and "4 bytes hold 32" in why
    assert "rows_per_warp=8" in gemv_hint_unsupported(_plan("int4"), GEMVHint(8, k_warps=4, mma=True))
    assert "k_warps=16" in gemv_hint_unsupported(_plan("int4"), GEMVHint(16, k_warps=16, mma=True))
    assert "vec_bytes=4" in mma_int8_unsupported(_plan("int4"), GEMVHint(16, k_warps=4, vec_bytes=4, mma=True))
    assert "int8 activations" in mma_int8_unsupported(
        make_plan(MatmulConfig(N=256, K=512, W_dtype="int4"), "cuda", 4), h)
    assert "k_warps=4" in gemv_hint_unsupported(_plan("int4"), GEMVHint(2, k_warps=4))   # k-split: still refused
    assert gemv_hint_unsupported(_plan("int4"), h) is None
    with pytest.raises(ValueError, match="group_size=64"):
        cuda_source(_plan("int1", group_size=64, with_scaling=True), cuda_target(TARGETS["sm_80"]), h)


def test_mma_int8_tuner_candidates():
    from bitblas.tune.space import candidates
    cands = [c.hint for c in candidates(MatmulConfig(N=1000, K=1536, A_dtype="int8", W_dtype="int4",
                                                     with_scaling=True), "cuda", 8)]
    mma = [h for h in cands if isinstance(h, GEMVMmaHint)]
    # 3 tile widths x 4 K-warp counts x 2 unrolls, each with and without the next step in flight and
    # under launch bounds of 2 blocks per SM or none
    assert len(mma) == 96 and all(h.rows_per_warp % 16 == 0 for h in mma)
    assert {(h.stages, h.min_blocks) for h in mma} == {(1, 0), (1, 2), (2, 0), (2, 2)}
    plan = _plan("int4", 8, with_scaling=True)
    assert default_gemv_hint(plan, cuda_target(TARGETS["sm_80"])) in mma
    assert not any(isinstance(h, GEMVKSplitHint) for h in cands)
    g64 = [c.hint for c in candidates(MatmulConfig(N=1000, K=1536, A_dtype="int8", W_dtype="int1", group_size=64,
                                                   with_scaling=True), "cuda", 8)]
    assert not any(isinstance(h, GEMVMmaHint) for h in g64)


VARIANTS = {
    "chan-as-bias-f16": dict(with_scaling=True, with_act_scaling=True, with_bias=True, out_dtype="float16"),
    "g128-bf16": dict(group_size=128, with_scaling=True, out_dtype="bfloat16"),
    "i32-bias": dict(with_bias=True, out_dtype="int32"),
}


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("w", WEIGHTS)
def test_mma_int8_codegen(w, arch):
    """m16n8k32 kernels compile (N=1000 K=1536: N remainders, lanes past K; N=256 K=512), every
    scale mode at 3, 8, 9 and 16 rows, the default hint (k_warps 8 / 4) and a k_warps=1 one."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    tgt = cuda_target(TARGETS[arch])
    at = "s8" if w.startswith("int") else "u8"
    i = 0
    for m in (3, 8, 9, 16, 40):               # 40 rows: 3 chunks of 16
        for v, kw in VARIANTS.items():
            n, k = ((1000, 1536), (256, 512))[i % 2]
            i += 1
            plan = make_plan(MatmulConfig(N=n, K=k, A_dtype="int8", W_dtype=w, **kw), "cuda", m)
            hint = default_gemv_hint(plan, tgt) if i % 3 and m >= 8 else GEMVHint(16, k_warps=1, unroll=2, stages=2,
                                                                                  mma=True, pdl=arch == "sm_90")
            assert isinstance(hint, GEMVMmaHint), (w, m, v)
            src = cuda_source(plan, tgt, hint)
            assert f"mma.sync.aligned.m16n8k32.row.col.s32.{at}.s8.s32" in src, (w, m, v)
            assert nvcc_compile(src, arch)[:4] == b"\x7fELF", (w, m, v, n, k)


# -- float8_e4m3 activations (W4A-fp8 / W2A-fp8): the same kernel on mma.sync .e4m3 --------------
F8_WEIGHTS = ("int4", "uint4", "int2", "uint2")


def _f8(w, m, n=8192, k=8192, **kw):
    return _plan(w, m, n=n, k=k, A_dtype="float8_e4m3", with_scaling=True, with_act_scaling=True, **kw)


def test_mma_f8_routing_and_defaults():
    """The untuned operator: one row the staged rows kernel (the row converted to float16 pairs;
    2-bit codes from N=8192, as with float16 activations), else the m16n8k32 GEMV for float8
    activations, up to 16 rows on sm_90 (the fused wgmma GEMM above) and 64 on sm_89; never on
    sm_80 (no float8 mma.sync or cvt); the mma tiles: 4-bit codes the wide tile without the next
    step in flight at every row count, 2-bit codes the int8 tiles; above 16 rows the chunk loop."""
    from bitblas.arch import Arch
    from bitblas.kernels.select import select
    from bitblas.schedule import GEMVRowsHint
    t89, t90 = cuda_target(TARGETS["sm_89"]), cuda_target(TARGETS["sm_90"])
    staged = dict(warps=8, unroll=1, min_blocks=4, pdl=True, act_smem=True)
    wide = GEMVHint(32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2, pdl=True)
    for w in F8_WEIGHTS:
        for kw in (dict(), dict(group_size=128)):
            for n in (1000, 8192):
                cfg = _f8(w, 1, n=n, **kw).config
                rows1 = "gemv-rows" if w.endswith("4") or n >= 8192 else "gemv-mma"
                for rows in (1, 8, 16, 17, 64, 65):
                    got = {sm: select(cfg, "cuda", rows, Arch.from_sm(sm)).template for sm in (80, 89, 90)}
                    want = rows1 if rows == 1 else "gemv-mma"
                    assert got[89] == (want if rows <= 64 else got[89]), (w, kw, n, rows, got)
                    assert got[80] not in ("gemv-mma", "gemv-rows"), (w, kw, n, rows, got)
                    assert (got[90] == want) == (rows <= 16), (w, kw, n, rows, got)
            assert default_gemv_hint(_f8(w, 1, **kw), t90) == (
                GEMVRowsHint(rows_per_warp=2, stages=3, **staged) if w.endswith("4")
                else GEMVRowsHint(rows_per_warp=2, stages=4, **staged))
            for m in (1, 8, 16):
                h = default_gemv_hint(_f8(w, m, n=1000 if m == 1 else 8192, **kw), t90)
                if w.endswith("4") and m == 1:
                    assert isinstance(h, GEMVRowsHint) and h.act_smem, (w, m, h)
                elif w.endswith("4") or m > 8:
                    assert h == wide, (w, m, h)
                else:
                    assert h == GEMVHint(32, k_warps=8, unroll=2, stages=2, mma=True, min_blocks=2, pdl=True), (w, m, h)
            assert default_gemv_hint(_f8(w, 40, **kw), t89).chunk_loop


def test_mma_f8_refused():
    """The m16n8k32 tiles and the rows kernel (converting the activations to float16 pairs) take
    float8 activations; the k-split and wgmma GEMV hints are refused naming the dtype; an sm_80
    target refuses the build; the tuner's GEMV candidates are mma tiles and rows kernels only, and
    none on sm_80."""
    from bitblas.arch import Arch
    from bitblas.kernels import by_name
    from bitblas.schedule import GEMVRowsHint, GEMVWgmmaHint
    p = _f8("int4", 4)
    for h in (GEMVHint(2, k_warps=4), GEMVWgmmaHint(rows_per_warp=16)):
        assert "float8_e4m3" in gemv_hint_unsupported(p, h), h
    for h in (GEMVHint(32, k_warps=8, mma=True), GEMVHint(4, warps=2, unroll=4, stages=2)):
        assert gemv_hint_unsupported(p, h) is None, h
        with pytest.raises(ValueError, match="sm_89"):
            cuda_source(p, cuda_target(TARGETS["sm_80"]), h)
    f32 = _f8("int4", 1, out_dtype="float32")          # float16 partial sums: not for a float32 output
    assert "float32" in gemv_hint_unsupported(f32, GEMVHint(4, warps=2, unroll=4, stages=2))
    assert gemv_hint_unsupported(f32, GEMVHint(32, k_warps=8, mma=True)) is None
    assert default_gemv_hint(f32, cuda_target(TARGETS["sm_90"])).tensor_cores
    for t in ("gemv-mma", "gemv-rows"):
        assert "sm_89" in by_name(t).reason(p, Arch.from_sm(80))
        assert by_name(t).space(p, 4, Arch.from_sm(80)) == []
    cands = by_name("gemv-mma").space(p, 4, Arch.from_sm(90))
    assert cands and all(isinstance(c.hint, GEMVMmaHint) for c in cands)
    rows = by_name("gemv-rows").space(p, 4, Arch.from_sm(90))
    assert rows and all(isinstance(c.hint, GEMVRowsHint) for c in rows)
    assert by_name("gemv-ksplit").space(p, 4, Arch.from_sm(90)) == []
    # the cost model prices the rows kernel's float16-pair decode, the mma kernel's byte decode
    from bitblas.schedule.gemv import decode_ops_per_weight
    f16 = _plan("int4", 4, n=8192, k=8192, A_dtype="float16", with_scaling=True)
    assert decode_ops_per_weight(p, rows[0].hint) == decode_ops_per_weight(f16) > decode_ops_per_weight(p, cands[0].hint)


def test_f8_rows_prep_pairs():
    """The rows kernel's float8 prep (emit.f8_half_prep) pairs the activation bytes of exactly the
    codes of each decoded pair (decode.pair_codes under the plan's code order), the first code in
    the low half, times 2**-4 (the kernel's scale times 2**4), for every float8 weight format's
    order and vector size."""
    from bitblas.schedule.gemv.emit import f8_half_prep
    pat = re.compile(r"__byte_perm\(a\[(\d+)\], a\[(\d+)\], 0x([0-9a-f]+)\).*e4m3x2.*__hmul2\(.*, k\); ap\[(\d+)\] = ")
    for w in F8_WEIGHTS:
        for kw in (dict(), dict(group_size=128)):
            plan = _f8(w, 1, **kw)
            for nw in (1, 2, 4):
                pairs = gd.pair_codes("int", plan.w.bits, nw, plan.w_order)
                got = {}
                src = f8_half_prep("t", plan.w.bits, nw, plan.w_order)
                assert "const __half2 k = __float2half2_rn(0.0625f);" in src
                for ln in src.splitlines():
                    mt = pat.search(ln)
                    if mt:
                        words = (int(mt.group(1)), int(mt.group(2)))
                        sel, i = int(mt.group(3), 16), int(mt.group(4))
                        lo = 4 * words[(sel & 0xF) // 4] + (sel & 0xF) % 4
                        hi = 4 * words[((sel >> 4) & 0xF) // 4] + ((sel >> 4) & 0xF) % 4
                        got[i] = (lo, hi)
                assert got == dict(enumerate(pairs)), (w, kw, nw)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
def test_f8_rows_codegen(arch):
    """The one-row default for float8 activations: the staged rows kernel, the row's bytes
    converted to float16 pairs (cvt.rn.f16x2.e4m3x2) by the float8 prep, the float16 decode and
    dot, the activation scale (and per-channel scales, bias) in the epilogue; compiles with nvcc
    (group / per-channel scales, bias, bfloat16 output, N=1000, K=1536)."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    tgt = cuda_target(TARGETS[arch])
    for w, kw in (("int4", dict(group_size=128)), ("uint4", dict(with_bias=True, out_dtype="bfloat16")),
                  ("int2", dict(n=8192, k=1536))):
        plan = _f8(w, 1, **{"n": 1000, "k": 1536, **kw})
        hint = default_gemv_hint(plan, tgt)
        assert hint.act_smem, (w, hint)
        src = cuda_source(plan, tgt, hint)
        assert "bb_prep_f8h_" in src and "cvt.rn.f16x2.e4m3x2" in src and "mma.sync" not in src, w
        assert "fma.rn.f16x2" in src and "a_scale" in src and "0x1p+4f" in src, w     # the 2**-4 undone
        assert nvcc_compile(src, arch)[:4] == b"\x7fELF", (w, arch)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("w", F8_WEIGHTS)
def test_mma_f8_codegen(w, arch):
    """m16n8k32 .e4m3 kernels compile with no stack frame: group / per-channel scales, bias, bfloat16
    output, N=1000 K=1536 (N remainder, lanes past K), at 1, 16 and 40 (the chunk loop) rows."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    tgt = cuda_target(TARGETS[arch])
    for i, m in enumerate((1, 16, 40)):
        kw = (dict(group_size=128), dict(with_bias=True, out_dtype="bfloat16"), dict())[i]
        plan = _f8(w, m, n=1000, k=1536, **kw)
        hint = default_gemv_hint(plan, tgt)
        if m == 1:                          # one row: the rows kernel by default (test_f8_rows_codegen)
            hint = GEMVHint(32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2)
        src = cuda_source(plan, tgt, hint)
        assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in src, (w, m)
        assert nvcc_compile(src, arch)[:4] == b"\x7fELF", (w, m, arch)
