"""The fused mixed-input wgmma GEMM (``FusedWgmmaHint``, bitblas/schedule/fused_wgmma.py), CPU side:

* nvcc code generation for sm_90a (marked nvcc) of every tile shape and weight family it takes
  (int/uint 2/4/8-bit codes; nf4, fp4_e2m1, float8, nvfp4 in the default tiles),
  with N and K off the tile and static row counts off the row tile: no spills, no local-memory
  accumulators, no serialized wgmma (C7513), each compile under 60 s;
* where it refuses a plan or a hint, with the argument named;
* ``Matmul`` runs it for rows past the GEMV where a bucket's hint says so (the tuned-hint path),
  and only there.

The GPU checks are in test_gpu_fused_wgmma.py.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import replace

import pytest

import bitblas
from bitblas import MatmulConfig
from bitblas.build import _nvcc, cuda_source, cuda_target, find_nvcc
from bitblas.dispatch import BucketTable
from bitblas.plan import make_plan
from bitblas.schedule import FusedWgmmaHint, hint_from_dict, hint_to_dict
from bitblas.schedule.fused_wgmma import fused_default, fused_wgmma_unsupported, schedule_fused_wgmma
from c_interp import run_permute
from kernel_helpers import HOST_WARP, TARGETS, choose, run_fdec

SM90 = cuda_target(TARGETS["sm_90"])
FAST2 = (0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15)      # BitBLAS's fast-decoding order of 2-bit codes
SM80 = cuda_target(TARGETS["sm_80"])

FORMATS = {
    "u4-g128": dict(W_dtype="uint4", group_size=128, with_scaling=True),
    "u4-g128-zeros": dict(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
    "i4-g128": dict(W_dtype="int4", group_size=128, with_scaling=True),
    "u2-g128": dict(W_dtype="uint2", group_size=128, with_scaling=True),
    "i2-g128-zeros": dict(W_dtype="int2", group_size=128, with_scaling=True, with_zeros=True),
    "bf16-u2-qzeros": dict(A_dtype="bfloat16", W_dtype="uint2", group_size=128, with_scaling=True, with_zeros=True,
                           zeros_mode="quantized", out_dtype="bfloat16"),
    "u8-g128-bias": dict(W_dtype="uint8", group_size=128, with_scaling=True, with_bias=True),
    "i8-chan-f32": dict(W_dtype="int8", with_scaling=True, out_dtype="float32"),
    "bf16-u4-qzeros": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=128, with_scaling=True,
                           with_zeros=True, zeros_mode="quantized", out_dtype="bfloat16"),
    # the table formats (the mma GEMV's decoders)
    "nf4-g128": dict(W_dtype="nf4", group_size=128, with_scaling=True),
    "fp4-g64-bias": dict(W_dtype="fp4_e2m1", group_size=64, with_scaling=True, with_bias=True),
    "bf16-fp4-g128": dict(A_dtype="bfloat16", W_dtype="fp4_e2m1", group_size=128, with_scaling=True,
                          out_dtype="bfloat16"),
    # no 16-bit scale or output: the kernel's TensorIR touches no 16-bit float (activations by TMA)
    "u4-noscale-f32": dict(W_dtype="uint4", out_dtype="float32"),
    "bf16-fp4-noscale-f32": dict(A_dtype="bfloat16", W_dtype="fp4_e2m1", out_dtype="float32"),
    "bf16-e4m3-chan": dict(A_dtype="bfloat16", W_dtype="float8_e4m3", with_scaling=True, out_dtype="bfloat16"),
    "e5m2-g128-f32": dict(W_dtype="float8_e5m2", group_size=128, with_scaling=True, out_dtype="float32"),
    # nvfp4: two float8 block scales per 16-byte vector, applied per decoded pair
    "nvfp4": dict(W_dtype="nvfp4", group_size=16, with_scaling=True),
    "bf16-nvfp4-bias": dict(A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True, with_bias=True,
                            out_dtype="bfloat16"),
}


def _cfg(name, N=1000, K=1536, M=None):
    return MatmulConfig(M=M, N=N, K=K, **{"A_dtype": "float16", **FORMATS[name]})


def _i8cfg(W_dtype, N=1000, K=1536, M=None, **kw):
    """int8 activations (per-token scales) x ``W_dtype`` (per-channel scales unless ``group_size``)."""
    return MatmulConfig(M=M, N=N, K=K, **{"A_dtype": "int8", "W_dtype": W_dtype, "with_scaling": True,
                                          "with_act_scaling": True, "out_dtype": "float16", **kw})


def _f8cfg(W_dtype, N=1000, K=1536, M=None, **kw):
    """float8_e4m3 activations (per-token scales) x ``W_dtype`` (W4A-fp8 / W2A-fp8)."""
    return _i8cfg(W_dtype, N, K, M, **{"A_dtype": "float8_e4m3", **kw})


def _compiles_clean(src: str) -> None:
    """``src`` compiles for sm_90a within 60 s: no C7513 (serialized wgmma), no stack, no spills in
    the main kernel."""
    t0 = time.perf_counter()
    text = _nvcc(src, "sm_90", 300, ["--resource-usage"])[1]
    wall = time.perf_counter() - t0
    assert wall < 60, f"nvcc took {wall:.1f} s"
    assert "C7513" not in text, text[-2000:]
    props = re.search(r"Function properties for main_kernel\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores",
                      text)
    assert props and props.groups() == ("0", "0"), text[-2000:]


@pytest.mark.nvcc
@pytest.mark.parametrize("name,m,tile", [
    ("u4-g128", None, (128, 1, 1)), ("u4-g128", 100, (256, 1, 2)), ("u4-g128", 257, (128, 2, 1)),
    ("u4-g128-zeros", None, (256, 1, 2)), ("i4-g128", None, (128, 2, 2)),
    ("u2-g128", None, (128, 1, 1)), ("u2-g128", 257, (256, 1, 2)),
    ("u8-g128-bias", None, (256, 1, 2)), ("i8-chan-f32", None, (64, 2, 2)), ("bf16-u4-qzeros", None, (128, 1, 2)),
    ("u4-g128", None, (128, 1, 2, "split_k")), ("u2-g128", 100, (128, 1, 2, "split_k")),
    ("u4-g128-zeros", None, (256, 1, 2, "split_k")), ("u4-g128", 200, (256, 1, 2, "split_k", "s4")),
    # overlap=True: two decoded register sets, wait_group 1 inside the unrolled body (K=1536: one
    # whole body of 8 slabs and a partial one; split over K: a partial one only)
    ("u4-g128", None, (128, 1, 2, "split_k", "overlap")), ("u4-g128-zeros", 257, (256, 1, 2, "overlap")),
    ("u8-g128-bias", None, (128, 1, 1, "overlap")), ("u4-g128-zeros", None, (128, 1, 2, "split_k", "overlap", "s4r4")),
    ("nf4-g128", None, (256, 1, 2)), ("fp4-g64-bias", 300, (128, 1, 2, "split_k")),
    ("bf16-e4m3-chan", None, (256, 1, 2)), ("e5m2-g128-f32", None, (128, 1, 2, "split_k")),
    ("nvfp4", None, (128, 1, 2, "split_k", "overlap", "s4r4")), ("bf16-nvfp4-bias", 300, (256, 1, 2, "overlap")),
])
def test_fused_codegen(name, m, tile):
    """Generated sources (N=1000, K=1536; symbolic rows or a static count off the row tile) compile
    with nvcc for sm_90a within 60 s: the main kernel with wgmma m64n{row_tile}k16, TMA boxes of
    the permuted activations, no spills, no stack (accumulators in registers), no C7513; two
    warpgroups side by side in N share one ring (``empty`` barriers), split over K each has its own."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    RT, R, CW, *flags = tile
    split = "split_k" in flags
    hint = FusedWgmmaHint(row_tile=RT, channel_tiles=R, warpgroups=CW, split_k=split, overlap="overlap" in flags,
                          **(dict(stages=4, ring=4) if "s4r4" in flags else dict(stages=4) if "s4" in flags else {}))
    src = cuda_source(make_plan(_cfg(name), "cuda", m), SM90, hint)
    assert f"wgmma.mma_async.sync.aligned.m64n{RT}k16" in src
    assert ("wgmma.wait_group.sync.aligned 1;" in src) == hint.overlap
    assert "permute_kernel" in src and "cp_async_bulk_tensor" in src
    assert ("empty_ptr" in src) == (CW > 1 and not split)
    _compiles_clean(src)


@pytest.mark.nvcc
@pytest.mark.parametrize("name,m,tile", [
    ("u4-g128", None, (128, 1, 2, "split_k", "overlap", "s4r4")), ("u4-g128-zeros", 257, (256, 1, 2, "overlap")),
    ("nvfp4", None, (128, 1, 2, "split_k")), ("u2-g128", 100, (128, 1, 1)),
    ("i8-chan-f32", None, (256, 1, 2, "split_k", "s4")),     # 8-bit codes' 256-row split-K default
])
def test_fused_w_smem_codegen(name, m, tile):
    """``w_smem``: the weight vectors (and 2-byte scales) staged by cp.async, one commit group per
    step, a partial wait before each decode; compiles clean (N=1000, K=1536)."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    RT, R, CW, *flags = tile
    hint = FusedWgmmaHint(row_tile=RT, channel_tiles=R, warpgroups=CW, split_k="split_k" in flags,
                          overlap="overlap" in flags, w_smem=True,
                          **(dict(stages=4, ring=4) if "s4r4" in flags else dict(stages=4) if "s4" in flags else {}))
    src = cuda_source(make_plan(_cfg(name), "cuda", m), SM90, hint)
    assert "cp.async.cg.shared.global" in src and "cp.async.commit_group" in src
    assert "cp.async.wait_group" in src and "ld.global.nc.L1::no_allocate.v4" not in src.split("main_kernel(")[-1]
    _compiles_clean(src)


@pytest.mark.nvcc
@pytest.mark.parametrize("name,permute", [("u4-g128", False), ("u2-g128", True)])
def test_fused_tail_box_codegen(name, permute):
    """``tail_box`` (the default): a second activation map whose boxes hold the last row tile's rows,
    used (with that many bytes expected) where the tile runs past the rows; ``tail_box=False`` has
    one map. Both compile clean."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    plan = make_plan(_cfg(name), "cuda", None)
    hint = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, permute=permute)
    assert hint.tail_box and fused_wgmma_unsupported(plan, hint) is None
    for h, n in ((hint, 2), (replace(hint, tail_box=False), 1)):
        src = cuda_source(plan, SM90, h)
        kernel = src.split("main_kernel(")[-1]
        assert ("A_tail" in kernel) == (n == 2) and "A_map" in kernel
        _compiles_clean(src)


@pytest.mark.nvcc
@pytest.mark.parametrize("name,tile", [("u4-g128", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("u4-g128-zeros", (128, 1, 1)), ("nvfp4", (128, 1, 2, "split_k", "w_smem")),
                                       ("u2-g128", (128, 1, 2))])
def test_fused_k_ctas_codegen(name, tile):
    """``k_ctas=2``: a 2-CTA cluster per tile splitting K (N=1000, K=2048): a cluster launch
    (``clusterCtaIdx.x`` among the launch parameters, beside PDL's), the second CTA's sums stored
    into the first's shared memory between two cluster barriers; compiles clean."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    RT, R, CW, *flags = tile
    hint = FusedWgmmaHint(row_tile=RT, channel_tiles=R, warpgroups=CW, split_k="split_k" in flags,
                          overlap="overlap" in flags, w_smem="w_smem" in flags, k_ctas=2,
                          **(dict(stages=4, ring=4) if "s4r4" in flags else dict(stages=4) if "w_smem" in flags else {}))
    plan = make_plan(_cfg(name, K=2048), "cuda", None)
    assert fused_wgmma_unsupported(plan, hint) is None
    tags = [str(t) for t in schedule_fused_wgmma(None, plan, hint, SM90)["main"].attrs["tirx.kernel_launch_params"]]
    assert tags[0] == "clusterCtaIdx.x" and "tirx.use_programtic_dependent_launch" in tags, tags
    src = cuda_source(plan, SM90, hint)
    assert "mapa.shared::cluster" in src and src.count("bb_cluster_sync();") == 2
    _compiles_clean(src)


def test_fused_k_ctas_refusals():
    """k_ctas other than 1 / 2, or K without a slab per warpgroup of both CTAs, named."""
    plan = make_plan(_cfg("u2-g128", K=1536), "cuda", None)          # slabs of 256 K
    why = fused_wgmma_unsupported(plan, FusedWgmmaHint(k_ctas=3))
    assert why and "k_ctas=3" in why
    split = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True)
    assert fused_wgmma_unsupported(plan, split) is None
    why = fused_wgmma_unsupported(plan, replace(split, k_ctas=2))
    assert why and "K=1536" in why and "multiple of 1024" in why and "k_ctas=2" in why, why


I8_CASES = [("int4", 128, None, (128, 1, 2, "split_k")), ("uint4", 128, 257, (128, 1, 1)),
            ("int4", -1, None, (64, 2, 2)), ("int2", -1, None, (128, 1, 2)), ("uint2", -1, 100, (64, 1, 2, "split_k")),
            ("int4", 256, None, (128, 1, 2, "split_k", "s4r4")),
            # per-channel: one set of sums through the loop, so 256-row tiles and two channel tiles
            ("int4", -1, None, (256, 1, 2)), ("uint2", -1, 300, (128, 2, 2, "split_k")), ("int2", -1, None, (256, 1, 1))]


@pytest.mark.nvcc
@pytest.mark.parametrize("W,gs,m,tile", I8_CASES)
def test_fused_int8_codegen(W, gs, m, tile):
    """int8 activations (W4A8 / W2A8, group or per-channel scales): ``wgmma m64n{row_tile}k32
    .s32.{s8,u8}.s8`` with the decoded bytes as A, the int32 sums promoted once per slab with group
    scales (the first k32 of a slab overwrites the sums), 128-byte TMA boxes of int8; compiles for
    sm_90a within 60 s, no spills or stack, no C7513."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    RT, R, CW, *flags = tile
    hint = FusedWgmmaHint(row_tile=RT, channel_tiles=R, warpgroups=CW, split_k="split_k" in flags,
                          **(dict(stages=4, ring=4) if "s4r4" in flags else {}))
    src = cuda_source(make_plan(_i8cfg(W, group_size=gs), "cuda", m), SM90, hint)
    a_type = "s8" if W.startswith("int") else "u8"
    assert f"wgmma.mma_async.sync.aligned.m64n{RT}k32.s32.{a_type}.s8" in src
    assert '"r"(keep)' in src and ("bb_perm" in src and "cp_async_bulk_tensor" in src)
    _compiles_clean(src)


F8_CASES = [("int4", 128, None, (128, 1, 2, "split_k", "s4r4")), ("uint4", 128, 257, (128, 1, 1)),
            ("int4", -1, None, (64, 2, 2)), ("int2", 256, None, (128, 1, 2)), ("uint2", -1, 100, (64, 1, 2, "split_k")),
            ("uint4", 256, None, (128, 1, 2, "split_k"))]


@pytest.mark.nvcc
@pytest.mark.parametrize("W,gs,m,tile", F8_CASES)
def test_fused_fp8_codegen(W, gs, m, tile):
    """float8_e4m3 activations (W4A-fp8 / W2A-fp8): ``wgmma m64n{row_tile}k32 .f32.e4m3.e4m3`` with
    the weights decoded to e4m3 bytes as A (``bb_fdec``), each slab's sums promoted into float32
    ones; compiles for sm_90a within 60 s, no spills or stack, no C7513."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    RT, R, CW, *flags = tile
    hint = FusedWgmmaHint(row_tile=RT, channel_tiles=R, warpgroups=CW, split_k="split_k" in flags,
                          **(dict(stages=4, ring=4) if "s4r4" in flags else {}))
    src = cuda_source(make_plan(_f8cfg(W, group_size=gs), "cuda", m), SM90, hint)
    assert f"wgmma.mma_async.sync.aligned.m64n{RT}k32.f32.e4m3.e4m3" in src
    assert '"r"(keep)' in src and "bb_fdec_f8_" in src and "bb_perm" in src and "cp_async_bulk_tensor" in src
    _compiles_clean(src)


@pytest.mark.parametrize("W", ["int4", "uint4", "int2", "uint2"])
def test_fused_fp8_slab_model(W):
    """The float8 path's decode and index plumbing, on the generated helpers: every code through
    the kernel's ``bb_fdec`` (interpreted) gives the e4m3 byte of its value; weights packed as the
    plan stores them (its code order), activations (e4m3 bytes) reordered by the permute kernel's
    ``bb_perm``, and the wgmma m64nNk32 A / B fragment model (as the int8 test) give, per
    channel, exactly the natural order's sum(value * a)."""
    import random
    from bitblas.code_order import slot_codes
    from bitblas.formats import E4M3_TABLE
    from bitblas.schedule.fused_wgmma import _gemv_stand_in, main_script
    from bitblas.schedule.gemv.decode import e4m3_code_dec, e4m3_code_slots
    from bitblas.schedule.gemv.wgmma import _perm_groups, _perm_helper_bytes, permute_script, slab_permutation_i8
    rng = random.Random(11)
    plan = make_plan(_f8cfg(W, K=2048), "cuda", None)
    b, order = plan.w.bits, plan.w_order
    off = 1 << (b - 1) if W.startswith("int") else 0
    n, V = 32 // b, 128 // b
    SL = 4 * V
    code = slot_codes(order) if order is not None else tuple(range(n))
    src = e4m3_code_dec("t", b, plan.w_storage, 4)
    assert repr(src.split("{", 1)[1])[1:-1] in main_script(plan, FusedWgmmaHint(row_tile=128, stages=4))
    # each code value, in every field of a word
    for u in range(1 << b):
        out = run_fdec(src, [sum(u << (b * s) for s in range(n))] * 4)
        assert all(E4M3_TABLE[(x >> (8 * i)) & 0xFF] == u - off for x in out for i in range(4)), (u, out)
    perm = slab_permutation_i8(b, 4, order, e4m3_code_slots(b))
    assert sorted(perm) == list(range(SL))
    G, per, stride = _perm_groups(perm, 16)
    helper = _perm_helper_bytes(perm, per)
    assert repr(helper) in permute_script(plan, _gemv_stand_in(FusedWgmmaHint()))   # the kernel's own permute
    finite = [x for x in range(256) if E4M3_TABLE[x] == E4M3_TABLE[x]]              # no NaN pattern
    a = [rng.choice(finite) for _ in range(SL)]
    P = [None] * SL
    for J in range(G):
        P[16 * per * J:16 * per * (J + 1)] = _emulate_perm_bytes(helper, a[16 * stride * J:], per)
    assert P == [a[perm[t]] for t in range(SL)]
    for _ in range(3):
        u = [rng.randrange(1 << b) for _ in range(SL)]
        dec = []
        for q in range(4):
            words = [sum(u[q * V + j * n + code[s]] << (b * s) for s in range(n)) for j in range(4)]
            dec.append(run_fdec(src, words))
        got = 0.0
        for s in range(len(dec[0]) // 2):
            for q in range(4):
                for h in range(2):
                    for i in range(4):
                        got += E4M3_TABLE[(dec[q][2 * s + h] >> (8 * i)) & 0xFF] * E4M3_TABLE[P[32 * s + 16 * h + 4 * q + i]]
        assert got == sum((u[k] - off) * E4M3_TABLE[a[k]] for k in range(SL))


def _emulate_perm_bytes(helper: str, src: list, nchunks: int) -> list:
    """Run a generated int8 ``bb_perm`` (c_interp) on a list of byte values; returns the first
    ``nchunks`` * 16 bytes it writes."""
    words = [sum(src[4 * i + b] << (8 * b) for b in range(4)) for i in range(len(src) // 4)]
    return [(w >> (8 * b)) & 0xFF for w in run_permute(helper, words, nchunks) for b in range(4)]


@pytest.mark.parametrize("W", ["int4", "uint4", "int2", "uint2"])
def test_fused_int8_slab_model(W):
    """The int8 path's index plumbing, on the generated helpers: weights packed as the plan stores
    them (its code order), decoded by the kernel's ``bb_mdec``; activations reordered by the
    permute kernel's ``bb_perm`` (emulated, every group of output chunks); a model of the wgmma
    m64nNk32 A fragment (lane (g, q): words 2s / 2s+1 of channel g at K slots 4q.. / 16+4q.. of
    k32 step s, B row 32 s + slot of the permuted slab) gives, per channel, the exact
    ``2**SH * sum(q * a)`` of the natural order."""
    import random
    from bitblas.code_order import slot_codes
    from bitblas.schedule.fused_wgmma import _gemv_stand_in, main_script
    from bitblas.schedule.gemv.mma_int8 import mma_i8_helpers, code_shift
    from bitblas.schedule.gemv.wgmma import _perm_groups, _perm_helper_bytes, permute_script, slab_permutation_i8
    rng = random.Random(7)
    plan = make_plan(_i8cfg(W, K=2048), "cuda", None)
    b, order = plan.w.bits, plan.w_order
    signed, SH = W.startswith("int"), code_shift(plan)
    n, V = 32 // b, 128 // b                       # codes per word, per 16-byte vector
    SL = 4 * V
    code = slot_codes(order) if order is not None else tuple(range(n))
    perm = slab_permutation_i8(b, 4, order)
    G, per, stride = _perm_groups(perm, 16)
    helper = _perm_helper_bytes(perm, per)
    assert repr(helper) in permute_script(plan, _gemv_stand_in(FusedWgmmaHint()))   # the kernel's own permute
    hs = mma_i8_helpers("mt", b, plan.w_storage, 4, order)["bb_mdec_mt"]
    assert repr(hs.split("{", 1)[1])[1:-1] in main_script(plan, FusedWgmmaHint(row_tile=128, stages=4))
    a = [rng.randrange(256) for _ in range(SL)]                  # int8 activations as bytes
    P = [None] * SL
    for J in range(G):
        P[16 * per * J:16 * per * (J + 1)] = _emulate_perm_bytes(helper, a[16 * stride * J:], per)
    assert P == [a[perm[t]] for t in range(SL)]
    sa = [x - 256 if x >= 128 else x for x in a]
    for _ in range(3):
        u = [rng.randrange(1 << b) for _ in range(SL)]           # stored codes (offset-binary if signed)
        dec = []
        for q in range(4):                                       # lane q's vector, decoded
            words = [sum(u[q * V + j * n + code[s]] << (b * s) for s in range(n)) for j in range(4)]
            dec.append(run_fdec(hs, words))
            assert len(dec[-1]) == 4 * (8 // b)
        got = 0
        for s in range(len(dec[0]) // 2):                       # k32 steps of the slab
            for q in range(4):
                for h in range(2):
                    for i in range(4):
                        wb = (dec[q][2 * s + h] >> (8 * i)) & 0xFF
                        wv = (wb - 256 if wb >= 128 else wb) if signed else wb
                        ab = P[32 * s + 16 * h + 4 * q + i]
                        got += wv * (ab - 256 if ab >= 128 else ab)
        off = 1 << (b - 1) if signed else 0
        assert got == (1 << SH) * sum((u[k] - off) * sa[k] for k in range(SL))


def test_fused_refusals_name_the_argument():
    plan = make_plan(_cfg("u4-g128"), "cuda", None)
    cases = [
        (plan, FusedWgmmaHint(row_tile=96), "row_tile=96"),
        (plan, FusedWgmmaHint(row_tile=256, channel_tiles=2), "channel_tiles=2"),
        (plan, FusedWgmmaHint(channel_tiles=3), "channel_tiles=3"),
        (plan, FusedWgmmaHint(warpgroups=4), "warpgroups=4"),
        (plan, FusedWgmmaHint(stages=0), "stages=0"),
        (make_plan(_cfg("u2-g128"), "cuda", None), FusedWgmmaHint(row_tile=128, channel_tiles=2), "spill"),
        (plan, FusedWgmmaHint(row_tile=256, ring=1), "ring=1"),
        (plan, FusedWgmmaHint(row_tile=256, ring=7), "ring=7"),
        (plan, FusedWgmmaHint(row_tile=256, warpgroups=2, split_k=True, ring=4), "ring=4"),
        (plan, FusedWgmmaHint(row_tile=256, ring=3, overlap=True), "overlap=True"),
        (make_plan(_cfg("u2-g128"), "cuda", None), FusedWgmmaHint(row_tile=128, stages=4, overlap=True), "overlap=True"),
        (make_plan(_cfg("u4-g128", K=1152), "cuda", None), FusedWgmmaHint(warpgroups=2, split_k=True), "K=1152"),
        (make_plan(MatmulConfig(N=1000, K=1536, A_dtype="float16", W_dtype="uint1", group_size=128,
                                with_scaling=True), "cuda", None), FusedWgmmaHint(), "W_dtype='uint1'"),
        # two groups per 16-byte vector: only nvfp4's float8 block scales (applied per decoded pair)
        (make_plan(MatmulConfig(N=1000, K=1536, A_dtype="float16", W_dtype="int4", group_size=16,
                                with_scaling=True), "cuda", None), FusedWgmmaHint(), "group_size=16"),
        (make_plan(MatmulConfig(N=1000, K=1088, A_dtype="float16", W_dtype="uint2", group_size=64,
                                with_scaling=True), "cuda", None), FusedWgmmaHint(), "K=1088"),
        # int8 activations: 2- and 4-bit int codes, groups of whole slabs, a float output, no overlap
        (make_plan(_i8cfg("int8"), "cuda", None), FusedWgmmaHint(), "W_dtype='int8'"),
        (make_plan(_i8cfg("int2", group_size=128), "cuda", None), FusedWgmmaHint(), "group_size=128"),
        (make_plan(_i8cfg("int4", group_size=64), "cuda", None), FusedWgmmaHint(), "group_size=64"),
        (make_plan(_i8cfg("int4", out_dtype="int32", with_scaling=False, with_act_scaling=False), "cuda", None),
         FusedWgmmaHint(), "out_dtype='int32'"),
        (make_plan(_i8cfg("int4"), "cuda", None), FusedWgmmaHint(overlap=True), "overlap=True"),
        (make_plan(_i8cfg("int4", group_size=128), "cuda", None), FusedWgmmaHint(row_tile=256), "two sets"),
        # float8 activations: the same rules, and two sets of sums always (promoted per slab)
        (make_plan(MatmulConfig(N=1000, K=1536, A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True),
                   "cuda", None), FusedWgmmaHint(), "W_dtype='float8_e4m3'"),
        (make_plan(_f8cfg("int2", group_size=128), "cuda", None), FusedWgmmaHint(), "group_size=128"),
        (make_plan(_f8cfg("uint4"), "cuda", None), FusedWgmmaHint(row_tile=256), "two sets"),
        (make_plan(_f8cfg("int4"), "cuda", None), FusedWgmmaHint(overlap=True), "overlap=True"),
        (make_plan(MatmulConfig(N=1000, K=1536, A_dtype="float8_e5m2", W_dtype="float8_e4m3", with_scaling=True),
                   "cuda", None), FusedWgmmaHint(), "A_dtype='float8_e5m2'"),
    ]
    for p, h, word in cases:
        why = fused_wgmma_unsupported(p, h)
        assert why is not None and word in why, (h, why)
    assert fused_wgmma_unsupported(plan, FusedWgmmaHint(row_tile=256, warpgroups=2)) is None
    with pytest.raises(ValueError, match="sm_90"):
        schedule_fused_wgmma(None, plan, FusedWgmmaHint(), SM80)
    with pytest.raises(ValueError, match="row_tile=96"):
        schedule_fused_wgmma(None, plan, FusedWgmmaHint(row_tile=96), SM90)


def test_fused_default_tiles():
    """The untuned tile by rows: split-K 128-row tiles up to 128 rows; past 128 rows split-K 256-row
    tiles for 4-bit codes where they run in fewer waves than 128-row ones (8192 channels at 256 rows: 128 blocks
    against 256 on 132 SMs; 4096 channels: one wave either way, so 128-row tiles keep every SM
    busy); 256-row tiles side by side where there are many. The split-K tiles read the activations
    as given where the natural-order decoder takes the plan (2- and 4-bit int / uint, 4-bit table codes,
    groups of whole slabs or 2-bit half slabs; nvfp4 and 8-bit codes only when clustered), else after
    the permute pass; those without overlap stage their weights in shared memory
    (w_smem, 4 weight slots); split-K tiles filling at most half the SMs run as 2-CTA clusters
    splitting K (k_ctas=2)."""
    def cfg(N, **kw):
        return MatmulConfig(M=None, N=N, K=8192, A_dtype="float16", W_dtype="uint4", **{"group_size": 128,
                                                                                        "with_scaling": True, **kw})
    big, small = make_plan(cfg(8192), "cuda", None), make_plan(cfg(4096), "cuda", None)
    split128 = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4, overlap=True, permute=False)
    assert fused_default(big, 128) == split128
    # 4096 channels: 64 split-K tiles at 128 rows, at most half of 132 SMs: a 2-CTA cluster each
    assert fused_default(small, 128) == replace(split128, k_ctas=2) == fused_default(small, 65, sms=128)
    assert fused_default(small, 128, sms=127) == split128                   # 128 CTAs would not fit
    assert fused_default(big, 256) == FusedWgmmaHint(row_tile=256, warpgroups=2, split_k=True, stages=4, permute=False,
                                                     w_smem=True)
    g64 = make_plan(cfg(8192, group_size=64), "cuda", None)          # groups inside a slab: permuted
    assert fused_default(g64, 128) == FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4,
                                                     overlap=True)
    assert fused_default(big, 200, sms=264) == split128          # twice the SMs: one wave either way
    assert fused_default(small, 256) == split128
    u2 = make_plan(MatmulConfig(M=None, N=8192, K=8192, A_dtype="float16", W_dtype="uint2", group_size=128,
                                with_scaling=True), "cuda", None)
    assert fused_default(u2, 256) == FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4,
                                                    w_smem=True)   # uint2: 256-row tiles measured slower
    # 8-bit codes: 256-row split-K tiles where they run in fewer waves (8192^2 at 256 rows: one, not two)
    for w in ("int8", "float8_e4m3"):
        p8 = lambda N: make_plan(MatmulConfig(M=None, N=N, K=N, A_dtype="float16", W_dtype=w,  # noqa: E731
                                              with_scaling=True), "cuda", None)
        assert fused_default(p8(8192), 256, sms=132) == FusedWgmmaHint(row_tile=256, warpgroups=2, split_k=True,
                                                                       stages=4, w_smem=True), w
        assert fused_default(p8(4096), 256, sms=132).row_tile == 128, w     # one wave either way
    assert fused_default(big, 1024) == FusedWgmmaHint(row_tile=256, warpgroups=2, overlap=True)
    assert fused_default(big, 4096) is None
    # permuted tiles: clustered without PDL (the permute kernel keeps its SMs); int8 / float8
    # activations with group scales on the 128-row tile only (as measured)
    def few(w, N=1024, **kw):
        return make_plan(MatmulConfig(M=None, N=N, K=8192, A_dtype="float16", W_dtype=w, **kw), "cuda", None)
    for w in ("nf4", "fp4_e2m1"):                 # table codes in natural order: clustered with PDL
        h = fused_default(few(w, with_scaling=True, group_size=128), 100)
        assert (h.permute, h.k_ctas, h.pdl) == (False, 2, True), (w, h)
    # nvfp4, 2- and 8-bit codes: natural order up to the channels measured faster (_natural_max_n)
    for w, kw, n_max in (("uint8", {}, 4096), ("float8_e4m3", {}, 4096), ("nvfp4", dict(group_size=16), 4096),
                         ("uint2", dict(group_size=128), 6144)):
        h = fused_default(few(w, with_scaling=True, **kw), 100)
        assert (h.permute, h.k_ctas, h.pdl) == (False, 2, True), (w, h)
        h = fused_default(few(w, N=n_max, with_scaling=True, **kw), 256)
        assert (h.permute, h.split_k) == (False, True), (w, h)
        h = fused_default(few(w, N=8192, with_scaling=True, **kw), 128)
        assert (h.permute, h.k_ctas, h.split_k) == (True, 1, True), (w, h)
    # 4-bit codes split over K: natural order up to N = 8192, then permuted with PDL
    for w in ("uint4", "nf4", "fp4_e2m1"):
        for N, natural in ((8192, True), (10240, False), (28672, False)):
            h = fused_default(few(w, N=N, with_scaling=True, group_size=128), 128)
            assert (h.split_k, h.permute, h.pdl) == (True, not natural, True), (w, N, h)
    # nvfp4's permuted split-K tiles in one wave run without PDL (measured faster behind the permute
    # kernel); in more waves with it
    for N, rows, pdl in ((8192, 128, False), (8192, 256, False), (28672, 128, True)):
        h = fused_default(few("nvfp4", N=N, with_scaling=True, group_size=16), rows, sms=132)
        assert (h.split_k, h.permute, h.pdl) == (True, True, pdl), (N, rows, h)
    # tiles side by side (1024 rows): natural order up to the channels measured faster
    # (_natural_max_n, side by side): 2-bit codes and nf4 to 8192, 8-bit and fp4_e2m1 to 4096; uint4 /
    # nvfp4 never
    for w, kw, n_max in (("uint2", dict(group_size=128), 8192), ("int8", {}, 4096), ("float8_e4m3", {}, 4096),
                         ("nf4", dict(group_size=128), 8192), ("fp4_e2m1", dict(group_size=128), 4096),
                         ("uint4", dict(group_size=128), 0), ("nvfp4", dict(group_size=16), 0)):
        for N in (4096, 8192, 16384):
            h = fused_default(few(w, N=N, with_scaling=True, **kw), 1024)
            assert (h.row_tile, h.warpgroups, h.split_k) == (256, 2, False), (w, N, h)
            assert h.permute == (N > n_max), (w, N, h)
    i8 = lambda **kw: make_plan(_i8cfg("int4", N=4096, K=8192, **kw), "cuda", None)   # noqa: E731
    h = fused_default(i8(group_size=128), 128)
    assert (h.k_ctas, h.pdl) == (2, False), h
    assert fused_default(i8(), 128).k_ctas == 1                          # per channel: measured slower
    assert fused_default(i8(group_size=128), 128, sms=127).k_ctas == 1   # 64 tiles: 128 CTAs would not fit


def test_int8_default_tiles():
    """int8 activations: split-K 128-row tiles up to 128 rows; then 128-row tiles of one warpgroup
    (group scales) or, per-channel, two side by side (up to 256 rows) and 256-row ones; decode-then-
    GEMM above 1024 rows, and the selector of a dynamic-M operator on sm_90 takes them past the GEMV.
    The split-K tiles stage their weights in shared memory (w_smem)."""
    g128 = make_plan(_i8cfg("int4", N=8192, K=8192, group_size=128), "cuda", None)
    chan = make_plan(_i8cfg("int2", N=8192, K=8192), "cuda", None)
    split = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4, w_smem=True)
    assert fused_default(g128, 65) == split and fused_default(chan, 128) == split
    assert fused_default(g128, 1024) == FusedWgmmaHint(row_tile=128, stages=4)
    # per channel, tiles side by side in one wave of more than half the SMs: without PDL (measured faster)
    assert fused_default(chan, 256, sms=132) == FusedWgmmaHint(row_tile=128, warpgroups=2, stages=4, pdl=False)
    assert fused_default(chan, 257, sms=132) == FusedWgmmaHint(row_tile=256, warpgroups=2, stages=4, pdl=False)
    assert fused_default(chan, 1024, sms=132) == FusedWgmmaHint(row_tile=256, warpgroups=2, stages=4)  # 4 waves
    small = make_plan(_i8cfg("int4", N=4096, K=4096), "cuda", None)          # 64 tiles: with PDL
    assert fused_default(small, 256, sms=132) == FusedWgmmaHint(row_tile=128, warpgroups=2, stages=4)
    assert fused_default(g128, 1025) is None and fused_default(chan, 1025) is None
    op = bitblas.Matmul(_i8cfg("int4", N=8192, K=8192, group_size=128), target=TARGETS["sm_90"])
    assert choose(op, "cuda", 300) == (None, FusedWgmmaHint(row_tile=128, stages=4))
    assert not isinstance(choose(op, "cuda", 64)[1], FusedWgmmaHint)
    assert not isinstance(choose(op, "cuda", 2048)[1], FusedWgmmaHint)


def test_fp8_default_tiles():
    """float8_e4m3 activations: the fused GEMM's split-K 64-row tiles up to 64 rows (the tuner's
    space from one row; by default the GEMV serves up to 16 on sm_90: one row the rows kernel, then
    the m16n8k32 one), then the int8
    rules with two sets of sums (group or per-channel scales alike: 128-row tiles of one
    warpgroup past 128 rows); decode-then-GEMM above 1024 rows with group scales, above 384 with
    per-channel ones (H200: the dense float8 GEMM after the decode is faster there). The 128-row
    split-K tile stages its weights in shared memory (w_smem), the 64-row one does not."""
    g128 = make_plan(_f8cfg("int4", N=8192, K=8192, group_size=128), "cuda", None)
    chan = make_plan(_f8cfg("uint2", N=8192, K=8192), "cuda", None)
    chan4 = make_plan(_f8cfg("int4", N=28672, K=8192), "cuda", None)
    for p in (g128, chan, chan4):
        assert fused_default(p, 1) == fused_default(p, 64) == \
            FusedWgmmaHint(row_tile=64, warpgroups=2, split_k=True, stages=4, ring=4)
        assert fused_default(p, 65) == FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4,
                                                      w_smem=True)
        assert fused_default(p, 129) == fused_default(p, 384) == FusedWgmmaHint(row_tile=128, stages=4)
        assert fused_default(p, 1025) is None
    assert fused_default(g128, 1024) == FusedWgmmaHint(row_tile=128, stages=4)
    assert fused_default(chan, 385) is None and fused_default(chan4, 385) is None
    op = bitblas.Matmul(_f8cfg("int4", N=8192, K=8192), target=TARGETS["sm_90"])
    assert op.choice("cuda", 384).template == "fused-wgmma" and op.choice("cuda", 385).template == "dequant-gemm"
    op = bitblas.Matmul(_f8cfg("int4", N=8192, K=8192, group_size=128), target=TARGETS["sm_90"])
    assert op.choice("cuda", 1).template == "gemv-rows"       # one row: the rows kernel, float16 pairs
    assert op.choice("cuda", 16).template == "gemv-mma"       # the m16n8k32 GEMV
    assert choose(op, "cuda", 17)[1] == fused_default(g128, 17)
    assert not isinstance(choose(op, "cuda", 2048)[1], FusedWgmmaHint)


def test_fused_hint_is_data():
    h = FusedWgmmaHint(row_tile=256, warpgroups=2, split_k=True, stages=3, ring=3, pdl=False)
    assert hint_from_dict(hint_to_dict(h)) == h


def test_fused_through_matmul_only_where_asked():
    """A bucket whose hint is a FusedWgmmaHint serves its rows above the GEMV with the fused kernel
    (one symbolic kernel); without it, or at GEMV row counts, the operator's choice is unchanged."""
    cfg = MatmulConfig(M=None, N=8192, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True)
    op = bitblas.Matmul(cfg, target=TARGETS["sm_90"])
    before = {r: choose(op, "cuda", r) for r in (17, 64, 65, 300, 5000)}
    assert not any(isinstance(before[r][1], FusedWgmmaHint) for r in (17, 64, 5000))   # GEMV; decode-then-GEMM
    fused = FusedWgmmaHint(row_tile=256, warpgroups=2)
    op._buckets = BucketTable((64, 4096))
    op._tuned["cuda"] = {4096: (None, fused)}
    op._reset_dispatch("cuda")
    for r in (65, 100, 300, 4096, 5000):
        assert choose(op, "cuda", r) == (None, fused), r
    assert choose(op, "cuda", 17) == before[17] and choose(op, "cuda", 64) == before[64]
    src = op.get_source(m=300)
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in src and "permute_kernel" in src


@pytest.mark.parametrize("hint", [FusedWgmmaHint(row_tile=128, raster_rows=512), FusedWgmmaHint(row_tile=64),
                                  FusedWgmmaHint(row_tile=256, warpgroups=2, raster_rows=256)])
def test_fused_raster_covers_every_tile(hint):
    """The block -> (channel block, row tile) map of the generated kernel (its ``T.meta_var`` lines,
    evaluated here) covers every tile once for row counts on and off the raster groups, and a
    group's row tiles are adjacent block indices."""
    import types
    from bitblas.schedule.fused_wgmma import main_script
    plan = make_plan(_cfg("u4-g128", N=1000), "cuda", None)
    text = main_script(plan, hint)
    grid = re.search(r"bx = T.cta_id\(\[(.*)\]\)", text).group(1)
    metas = re.findall(r"^    (\w+) = T.meta_var\((.*)\)$", text, re.M)
    T = types.SimpleNamespace(min=min)
    ch = 64 * hint.channel_tiles * (1 if hint.split_k else hint.warpgroups)
    for mv in (1, 65, hint.row_tile * 3 + 1, 1000, 4100):
        env = {"T": T, "mv": mv, "tx": 0}
        blocks = eval(grid, env)
        tiles = []
        for bx in range(blocks):
            env["bx"] = bx
            for name, expr in metas:
                env[name] = eval(expr, env)
            tiles.append((env["n0"] // ch, env["r0"] // hint.row_tile))
        nrt = -(-mv // hint.row_tile)
        assert sorted(tiles) == [(c, r) for c in range(-(-1000 // ch)) for r in range(nrt)], mv
        gr = max(1, hint.raster_rows // hint.row_tile)
        if nrt >= gr:
            assert [r for _, r in tiles[:gr]] == list(range(gr)) and len({c for c, _ in tiles[:gr]}) == 1


def test_byte_acts_group_scale_registers_only_where_grouped():
    """int8 / float8 activations: the slab's group-scale registers (``gs``) exist in group-scaled
    kernels only; per-channel scales are applied at the store."""
    from bitblas.schedule.fused_wgmma import main_script
    hint = FusedWgmmaHint(row_tile=128, stages=4)
    for cfg in (_i8cfg, _f8cfg):
        for gs, W in ((128, "int4"), (-1, "int4"), (-1, "uint2")):
            src = main_script(make_plan(cfg(W, K=2048, group_size=gs), "cuda", None), hint)
            assert ("gs = T.alloc_local" in src) == (gs > 0), (cfg.__name__, W, gs)


# -- permute=False: the activations in natural K order, the codes moved in registers ----------------
_NDEC_HARNESS = HOST_WARP + r"""
#include <cmath>
static unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
static unsigned bb_prmt(unsigned x, unsigned y, unsigned s) {     // prmt.b32 with sign mode (selector bit 3)
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) {
    unsigned n = (s >> (4 * i)) & 15, b = (unsigned)(v >> (8 * (n & 7))) & 0xFF;
    if (n & 8) b = (b & 0x80) ? 0xFF : 0;
    r |= b << (8 * i);
  }
  return r;
}
static unsigned bb_lop3(unsigned a, unsigned b, unsigned c, unsigned lut) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i)
    r |= ((lut >> ((((a >> i) & 1) << 2) | (((b >> i) & 1) << 1) | ((c >> i) & 1))) & 1u) << i;
  return r;
}
// 16-bit float pairs: the decoder's operands are exact small integers (magic + field, magic + off)
static float h2f(unsigned short h, bool bf) {
  if (bf) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e ? (1024 + m) * (float)(1 << e) / (1024.f * (1 << 15)) : m / (1024.f * (1 << 14));
  return h >> 15 ? -v : v;
}
static unsigned short f2h(float f, bool bf) {       // exact for the values here (at most 11 significant bits)
  if (bf) { unsigned u; memcpy(&u, &f, 4); return (unsigned short)(u >> 16); }
  unsigned short s = std::signbit(f) ? 0x8000 : 0; if (s) f = -f;      // -0 keeps its sign
  if (f == 0) return s;
  int e = 15; while (f >= 2048.f) { f /= 2; ++e; }
  while (f < 1024.f) { f *= 2; --e; }
  return s | (unsigned short)((e + 10) << 10) | (unsigned short)((int)f - 1024);
}
template <bool BF> struct P2 { unsigned short x, y; };
typedef P2<false> __half2;
typedef P2<true> __nv_bfloat162;
template <bool BF> static P2<BF> __hsub2(P2<BF> a, P2<BF> b) {
  return {f2h(h2f(a.x, BF) - h2f(b.x, BF), BF), f2h(h2f(a.y, BF) - h2f(b.y, BF), BF)};
}
template <bool BF> static P2<BF> __hfma2(P2<BF> a, P2<BF> b, P2<BF> c) {
  return {f2h(std::fma(h2f(a.x, BF), h2f(b.x, BF), h2f(c.x, BF)), BF), f2h(std::fma(h2f(a.y, BF), h2f(b.y, BF), h2f(c.y, BF)), BF)};
}
// a warp's __shfl_sync with a width: lane src of each group of width lanes
template <class T> static T __shfl_sync(unsigned, T v, int src, int width) {
  unsigned u; memcpy(&u, &v, 4);
  exchange[threadIdx.x] = u;
  sync_point.arrive_and_wait();
  unsigned r = exchange[(threadIdx.x & ~(unsigned)(width - 1)) + src];
  sync_point.arrive_and_wait();
  T out; memcpy(&out, &r, 4); return out;
}
template <bool BF> static P2<BF> __hmul2(P2<BF> a, P2<BF> b) {
  return {f2h(h2f(a.x, BF) * h2f(b.x, BF), BF), f2h(h2f(a.y, BF) * h2f(b.y, BF), BF)};
}
static __half2 __float2half2_rn(float f) { return {f2h(f, false), f2h(f, false)}; }
// nvfp4's block scales (bb_sclb): cvt.rn.f16x2.e4m3x2 (exact), the half2 / bfloat162 lane picks
static unsigned short e4m3_half(unsigned b) {
  int e = (b >> 3) & 15, m = b & 7;
  float v = e ? (8 + m) * std::ldexp(1.f, e - 10) : m * std::ldexp(1.f, -9);
  return f2h((b & 0x80) ? -v : v, false);
}
static unsigned bb_cvt_e4m3x2(unsigned short x) { return e4m3_half(x & 0xFF) | (unsigned)e4m3_half(x >> 8) << 16; }
struct float2 { float x, y; };
static float2 __half22float2(__half2 h) { return {h2f(h.x, false), h2f(h.y, false)}; }
static __nv_bfloat162 __float22bfloat162_rn(float2 f) { return {f2h(f.x, true), f2h(f.y, true)}; }
static __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {f2h(a, true), f2h(b, true)}; }
static float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <bool BF> static P2<BF> __low2half2_(P2<BF> a) { return {a.x, a.x}; }
template <bool BF> static P2<BF> __high2half2_(P2<BF> a) { return {a.y, a.y}; }
#define __low2half2 __low2half2_
#define __high2half2 __high2half2_
#define __low2bfloat162 __low2half2_
#define __high2bfloat162 __high2half2_
static __nv_bfloat162 __float2bfloat162_rn(float f) { return {f2h(f, true), f2h(f, true)}; }
#define __device__
#define __forceinline__ inline
#ifndef NOUT
#define NOUT 16
#endif
HELPER
int main() {
  static unsigned w[32][4], d[32][32];
  for (int l = 0; l < 32; ++l) for (int j = 0; j < 4; ++j) scanf("%u", &w[l][j]);
  int off; scanf("%d", &off);
  std::thread lanes[32];
#ifdef BB_SCALES
  static unsigned sc[32];
  for (int l = 0; l < 32; ++l) scanf("%u", &sc[l]);
#endif
#ifdef BB_HALVES          // per lane: its group's offset, scale and zero term
  static int offs[32]; static float ss[32], cc[32];
  for (int l = 0; l < 32; ++l) scanf("%d %f %f", &offs[l], &ss[l], &cc[l]);
#endif
  for (unsigned l = 0; l < 32; ++l)
    lanes[l] = std::thread([l, off] {
      threadIdx.x = l;
#ifdef BB_HALVES
      bb_ndec_t(w[l], offs[l], d[l]);
      bb_scl2_t(d[l], ss[l], cc[l]);
#else
      bb_ndec_t(w[l], off, d[l]);
#endif
#ifdef BB_SCALES
      bb_sclb_t(d[l], sc[l]);
#endif
    });
  for (auto& t : lanes) t.join();
  for (int l = 0; l < 32; ++l) for (int i = 0; i < NOUT; ++i) printf("%u%c", d[l][i], i == NOUT - 1 ? '\n' : ' ');
}
"""


def _host_asm(src: str) -> str:
    """The decoders' inline ``lop3`` / ``prmt`` as calls of the harness's emulations (``bb_lop3``,
    ``bb_prmt``): each ``%n`` operand replaced by its input expression; the CUDA 16-bit float headers
    dropped (the harness emulates their types)."""
    src = re.sub(r"#include <cuda_(fp16|bf16)\.h>\n", "", src)
    def call(m):
        op, args, out, ins = m.groups()
        inputs = re.findall(r'"r"\((.*?)\)(?=, "r"|$)', ins)
        vals = [inputs[int(x[1:]) - 1] if x.startswith("%") else x for x in args.split(", ")]
        return f"{out} = bb_{op}({', '.join(vals)});"
    src = re.sub(r'asm\("cvt\.rn\.f16x2\.e4m3x2 %0, %1;" : "=r"\((\w+)\) : "h"\((.*?)\)\);',
                 lambda m: f"{m.group(1)} = bb_cvt_e4m3x2({m.group(2)});", src)
    return re.sub(r'asm\("(lop3|prmt)\.b32 %0, ([^"]*);" : "=r"\((\w+)\) : (.*?)\);', call, src)


def _host_lanes(tmp_path, src: str, defines: str = ""):
    """The harness with the decoder source ``src`` (``_host_asm``-ed) and ``defines`` compiled for the
    host (skips without g++): returns ``run(input text) -> per-lane lists of output words``."""
    import shutil
    import subprocess
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs a host C++ compiler (g++)")
    src = _host_asm(src)
    assert "asm" not in src, src
    (tmp_path / "lanes.cpp").write_text(defines + _NDEC_HARNESS.replace("HELPER", src))
    subprocess.run([gxx, "-std=c++20", "-O1", "-pthread", "-o", str(tmp_path / "lanes"), str(tmp_path / "lanes.cpp")],
                   check=True, capture_output=True)

    def run(inp: str):
        out = subprocess.run([str(tmp_path / "lanes")], input=inp, check=True, capture_output=True, text=True).stdout
        return [[int(x) for x in line.split()] for line in out.strip().split("\n")]
    return run


def _check_fragments(got, act: str, steps: int, value):
    """Lane q of each quad holds A fragment word 2 s + t = the pair of K k, k + 1 of the quad's slab
    (k = 16 s + 2 q + 8 t) for each of ``steps`` k16 steps: ``value(base, kk)`` is the value of K kk,
    ``base`` the quad's first lane, rounded to ``act`` as the decoders do."""
    from bitblas.schedule.gemv.decode import _act_bits
    for lane in range(32):
        q, base = lane % 4, lane - lane % 4
        for s in range(steps):
            for t in range(2):
                k = 16 * s + 2 * q + 8 * t
                val = [value(base, kk) for kk in (k, k + 1)]
                want = _act_bits(val[0], act) | _act_bits(val[1], act) << 16
                assert got[lane][2 * s + t] == want, (lane, s, t, hex(got[lane][2 * s + t]), hex(want))


@pytest.mark.parametrize("act", ("float16", "bfloat16"))
@pytest.mark.parametrize("storage,order,dec,bits", [
    ("plain", None, "int", 4), ("plain", (0, 4, 1, 5, 2, 6, 3, 7), "int", 4), ("offset", (0, 4, 1, 5, 2, 6, 3, 7), "int", 4),
    ("twos", None, "int", 4), ("plain", None, "lut4", 4), ("plain", None, "e2m1", 4),
    ("plain", None, "int", 8), ("twos", None, "int", 8), ("plain", None, "e4m3", 8), ("plain", None, "e5m2", 8),
    ("plain", None, "int", 2), ("plain", FAST2, "int", 2), ("offset", FAST2, "int", 2), ("twos", None, "int", 2)])
def test_natural_decoder_on_the_host(tmp_path, act, storage, order, dec, bits):
    """``bb_ndec`` (permute=False), its very source compiled for the host with a warp of 32 threads
    emulating __shfl_xor_sync (``lop3``, ``prmt`` and the 16-bit pairs emulated exactly): lane q of
    each quad ends with A fragment word 2 s (+1) = the codes of K 16 s + 2 q + {0, 1} (+ 8) of the
    quad's slab (lane p holds K 32 p .. 32 p + 31 in its 4 words, code j of a word in slot
    ``order[j]``), each field (``storage`` "twos": its sign bit XOR-ed) minus ``off``; table codes
    (nf4's table for "lut4", fp4_e2m1 for "e2m1") their table value. 8-bit codes: lane p holds K
    16 p .. 16 p + 15 (float8 codes their e4m3 / e5m2 value, NaN and inf excluded); 2-bit codes K
    64 p .. 64 p + 63, in the plain or BitBLAS's fast-decoding order."""
    import random
    from bitblas.formats import E2M1_TABLE, E4M3_TABLE, E5M2_TABLE, NF4_TABLE
    from bitblas.schedule.fused_wgmma import natural_dec_helper
    table = {"lut4": NF4_TABLE, "e2m1": E2M1_TABLE, "e4m3": E4M3_TABLE, "e5m2": E5M2_TABLE}.get(dec)
    V, n = 128 // bits, 32 // bits                 # codes per lane, per word
    run = _host_lanes(tmp_path, natural_dec_helper("t", act, storage, order, dec, table, bits), f"#define NOUT {V // 2}\n")
    rng = random.Random(f"{act}-{storage}-{order}-{dec}-{bits}")    # a str seed: the same data in every process
    slot = order or tuple(range(n))
    finite = [c for c in range(1 << bits) if table is None or math.isfinite(table[c])]
    flip = 1 << (bits - 1) if storage == "twos" else 0
    for off in ({2: (0, 2, 3), 4: (0, 8, 15), 8: (0, 128, 255)}[bits] if dec == "int" else (0,)):
        codes = [[rng.choice(finite) for _ in range(V)] for _ in range(32)]      # lane -> its V codes (K order)
        words = [[sum(codes[l][n * j + i] << (bits * slot[i]) for i in range(n)) for j in range(4)] for l in range(32)]
        got = run(" ".join(str(x) for lw in words for x in lw) + f" {off}\n")

        def value(base, kk):
            field = codes[base + kk // V][kk % V] ^ flip
            return table[field] if table else field - off
        _check_fragments(got, act, V // 4, value)


@pytest.mark.parametrize("act", ("float16", "bfloat16"))
@pytest.mark.parametrize("storage,order", [("plain", FAST2), ("offset", None)])
def test_natural_halves_on_the_host(tmp_path, act, storage, order):
    """2-bit codes in natural order with groups of 128 (half a slab): ``bb_ndec(halves=True)`` then
    ``bb_scl2`` (their very source on the host, a warp of 32 threads emulating the shuffles): the
    pairs of K 0..127 of the quad's slab (lanes 0, 1's codes) are (field - offset) x scale + zero
    term with lane 0's offset, scale and term, those of K 128..255 with lane 2's, whatever lanes 1
    and 3 hold (each lane passes its own group's)."""
    import random
    from bitblas.schedule.fused_wgmma import natural_dec_helper, natural_scale_halves_helper
    run = _host_lanes(tmp_path, natural_dec_helper("t", act, storage, order, "int", None, 2, halves=True)
                      + natural_scale_halves_helper("t", act, 32), "#define NOUT 32\n#define BB_HALVES\n")
    rng = random.Random(f"nh-{act}-{storage}-{order}")
    slot = order or tuple(range(16))
    for _ in range(3):
        codes = [[rng.randrange(4) for _ in range(64)] for _ in range(32)]
        words = [[sum(codes[l][16 * j + i] << (2 * slot[i]) for i in range(16)) for j in range(4)] for l in range(32)]
        # per (quad, half): offset, scale, zero term (exact in 16 bits); lanes 1 and 3 carry their group's too
        grp = [(rng.randrange(4), rng.choice((0.5, 1.0, 2.0, -4.0)), rng.choice((0.0, 1.0, -3.0, 0.25)))
               for _ in range(16)]
        lane_g = [grp[2 * (l // 4) + (l % 4) // 2] for l in range(32)]
        got = run(" ".join(str(x) for lw in words for x in lw) + " 0\n"
                  + " ".join(f"{o} {sv!r} {cv!r}" for o, sv, cv in lane_g) + "\n")

        def value(base, kk):
            o, sv, cv = lane_g[base + 2 * (kk // 128)]
            return (codes[base + kk // 64][kk % 64] - o) * sv + cv
        _check_fragments(got, act, 16, value)


@pytest.mark.parametrize("act", ("float16", "bfloat16"))
def test_natural_block_scales_on_the_host(tmp_path, act):
    """nvfp4 with ``permute=False``: ``bb_ndec`` then the natural order's ``bb_sclb`` (its very
    source on the host, a warp of 32 threads emulating __shfl_xor_sync, ``cvt.rn.f16x2.e4m3x2``
    emulated exactly): lane q of each quad ends with A fragment word 2 s (+1) = the e2m1 values of
    K 16 s + 2 q + {0, 1} (+ 8) of the quad's slab times the float8_e4m3 scale of their 16-value
    block, which lane (16 s) // 32 of the quad loaded (its two scale bytes, the first block low).
    Scale bytes over the whole e4m3 range (subnormal, negative, 448) but NaN."""
    import random
    from bitblas.formats import E2M1_TABLE, E4M3_TABLE
    from bitblas.schedule.fused_wgmma import natural_block_scale_helper, natural_dec_helper
    run = _host_lanes(tmp_path, natural_dec_helper("t", act, "plain", None, "e2m1", E2M1_TABLE)
                      + natural_block_scale_helper("t", act), "#define BB_SCALES\n")
    rng = random.Random(f"nsclb-{act}")
    finite = [b for b in range(256) if b not in (0x7F, 0xFF)]
    for _ in range(3):
        codes = [[rng.randrange(16) for _ in range(32)] for _ in range(32)]      # lane -> its 32 codes (K order)
        scales = [[rng.choice(finite) for _ in range(2)] for _ in range(32)]    # lane -> its two blocks' bytes
        words = [[sum(codes[l][8 * j + i] << (4 * i) for i in range(8)) for j in range(4)] for l in range(32)]
        got = run(" ".join(str(x) for lw in words for x in lw) + " 0\n"
                  + " ".join(str(sc[0] | sc[1] << 8) for sc in scales) + "\n")

        def value(base, kk):
            return E2M1_TABLE[codes[base + kk // 32][kk % 32]] * E4M3_TABLE[scales[base + kk // 32][kk % 32 // 16]]
        _check_fragments(got, act, 8, value)


@pytest.mark.nvcc
@pytest.mark.parametrize("name,tile", [("u4-g128", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("i4-g128", (256, 1, 2, "split_k", "s4")), ("u4-g128-zeros", (256, 1, 2, "split_k")),
                                       ("bf16-u4-qzeros", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("nf4-g128", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("bf16-fp4-g128", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("u4-noscale-f32", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("bf16-fp4-noscale-f32", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("nvfp4", (128, 1, 2, "split_k", "overlap", "s4r4")),
                                       ("bf16-nvfp4-bias", (256, 1, 2, "split_k", "s4")),
                                       ("nvfp4", (128, 1, 2, "split_k", "w_smem", "s4")),
                                       ("u8-g128-bias", (128, 1, 2, "split_k", "w_smem", "s4")),
                                       ("i8-chan-f32", (128, 1, 2, "split_k", "s4r4")),
                                       ("bf16-e4m3-chan", (128, 1, 2, "split_k", "w_smem", "s4")),
                                       ("e5m2-g128-f32", (256, 1, 2, "split_k")),
                                       ("u2-g128", (128, 1, 2, "split_k", "w_smem", "s4")),
                                       ("i2-g128-zeros", (128, 1, 2, "split_k", "s4")),
                                       ("bf16-u2-qzeros", (128, 1, 2, "split_k", "w_smem", "s4")),
                                       # the tiles side by side the defaults take in natural order
                                       ("u2-g128", (256, 1, 2)), ("i8-chan-f32", (256, 1, 2)),
                                       ("bf16-e4m3-chan", (256, 1, 2)), ("nf4-g128", (256, 1, 2, "overlap")),
                                       ("bf16-fp4-g128", (256, 1, 2, "overlap"))])
def test_fused_natural_codegen(name, tile):
    """permute=False in the split-K tiles the defaults give it: one kernel (no permute kernel, no
    temporary), TMA boxes of the activations as given, the codes moved in registers (shuffles);
    compiles clean for sm_90a within 60 s, also where nothing but the decoder uses 16-bit floats
    (float32 output, no scales: the decoder's source includes their headers). Also the 256-row
    tiles side by side the defaults take in natural order (2- and 8-bit codes without ``overlap``,
    nf4 / fp4_e2m1 with it: ptxas spilled these at K=2048 while the loop's last body was a guarded
    iteration)."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    RT, R, CW, *flags = tile
    hint = FusedWgmmaHint(row_tile=RT, channel_tiles=R, warpgroups=CW, split_k="split_k" in flags,
                          overlap="overlap" in flags, permute=False, w_smem="w_smem" in flags,
                          **(dict(stages=4, ring=4) if "s4r4" in flags else dict(stages=4) if "s4" in flags else {}))
    src = cuda_source(make_plan(_cfg(name, K=2048), "cuda", None), SM90, hint)
    assert "permute_kernel" not in src and "cp_async_bulk_tensor" in src and "__shfl_xor_sync" in src
    assert f"wgmma.mma_async.sync.aligned.m64n{RT}k16" in src
    _compiles_clean(src)


def test_fused_natural_refusals():
    """permute=False names what it takes: float activations, 2-bit int / uint codes, 4-bit int / uint /
    table codes and 8-bit int / uint / float8 codes, groups of whole slabs (2-bit: half slabs) or
    nvfp4's 16-value blocks."""
    nat = FusedWgmmaHint(row_tile=128, permute=False)
    assert fused_wgmma_unsupported(make_plan(_cfg("u4-g128", K=2048), "cuda", None), nat) is None
    for name in ("u2-g128", "i2-g128-zeros"):         # 2-bit: groups of half a slab, gathered per quad
        assert fused_wgmma_unsupported(make_plan(_cfg(name, K=2048), "cuda", None), nat) is None
    u2g64 = MatmulConfig(N=1000, K=2048, A_dtype="float16", W_dtype="uint2", group_size=64, with_scaling=True)
    assert "multiples of 128" in fused_wgmma_unsupported(make_plan(u2g64, "cuda", None), nat)
    u1 = MatmulConfig(N=1000, K=2048, A_dtype="float16", W_dtype="uint1", group_size=128, with_scaling=True)
    assert "2-bit int / uint" in fused_wgmma_unsupported(make_plan(u1, "cuda", None), nat)
    for name in ("u8-g128-bias", "i8-chan-f32", "bf16-e4m3-chan", "e5m2-g128-f32"):
        assert fused_wgmma_unsupported(make_plan(_cfg(name, K=2048), "cuda", None), nat) is None
    for name in ("nf4-g128", "bf16-fp4-g128"):
        assert fused_wgmma_unsupported(make_plan(_cfg(name, K=2048), "cuda", None), nat) is None
    for name in ("nvfp4", "bf16-nvfp4-bias"):           # 16-value float8 block scales: gathered per quad
        assert fused_wgmma_unsupported(make_plan(_cfg(name, K=2048), "cuda", None), nat) is None
    g64 = MatmulConfig(N=1000, K=2048, A_dtype="float16", W_dtype="uint4", group_size=64, with_scaling=True)
    assert "group_size=64" in fused_wgmma_unsupported(make_plan(g64, "cuda", None), nat)
    assert "A_dtype='int8'" in fused_wgmma_unsupported(make_plan(_i8cfg("int4", K=2048), "cuda", None), nat)


@pytest.mark.parametrize("NS,peel", [(12, False), (12, True), (16, False), (16, True), (5, True), (8, True)])
def test_step_loop_last_body(NS, peel):
    """step_loop with group=8 over 2 register slots: every step processed once, in order, each step's
    loads issued once, one step ahead, into the slot it is processed from; with ``peel`` the last body
    (whole or partial) follows the loop at constant indices without guards, without it the last
    iteration's steps past NS are guarded. Checked by running the emitted lines as Python."""
    from bitblas.schedule.gemv.emit import step_loop
    lines, G, ST = [], 8, 2
    step_loop(lines.append, NS, ST, lambda ind, step, slot: lines.append(f"{ind}ev.append(('load', {step}, {slot}))"),
              lambda ind, step, slot, j: lines.append(f"{ind}ev.append(('proc', {step}, {slot}))"), group=G, peel=peel)
    src = "\n".join(ln.replace("T.serial", "range") for ln in lines)
    ev = []
    scope = {}
    exec("def run(ev):\n" + src, scope)
    scope["run"](ev)
    assert [e[1] for e in ev if e[0] == "proc"] == list(range(NS))
    assert [e[1] for e in ev if e[0] == "load"] == list(range(NS))
    for s in range(NS):                      # loaded before processed, into its slot
        assert ev.index(("load", s, s % ST)) < ev.index(("proc", s, s % ST))
    # the guarded form guards at least the last iteration's look-ahead load (and its steps past NS)
    assert any(ln.lstrip().startswith("if ") for ln in lines) == (not peel)
    assert sum("range(" in ln for ln in src.splitlines()) == (((NS - 1) // G > 0) if peel else 1)
