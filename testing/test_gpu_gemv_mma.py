"""The tensor-core kernel of the small-M template (``GEMVHint(mma=True)``, bitblas/schedule/gemv/mma.py
``body``): weights as the 16 x 16 mma operand, 1..16 activation rows as the 16 x 8 operand
(17..64 rows: one block per chunk of 16 rows).

GPU tests: every 1/2/4-bit int/uint family (scales, float / quantized / rescale zeros, no scales,
bias, float32 out, bfloat16) and the 4-bit table formats (nf4, fp4_e2m1, nvfp4 with its float8
scales and global scale) at row counts 1..64 that are no multiple of 8, N no multiple of 16,
and hints that split K unevenly (vectors past K meet zeroed activations). CPU: code generation
through nvcc for sm_80 / sm_90, and the hint checks.

    python -m pytest testing/test_gpu_gemv_mma.py -m gpu      # GPU
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_source, cuda_target, find_nvcc, nvcc_compile, nvcc_resources
from bitblas.plan import make_plan
from bitblas.schedule import GEMVHint, GEMVWgmmaHint
from bitblas.schedule.gemv import default_gemv_hint
from bitblas.schedule.gemv import mma_gemv_unsupported
from kernel_helpers import TARGETS, check_kernel

G = 128
_skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu(f):
    return pytest.mark.gpu(_skip(f))


CONFIGS = {
    "u4": dict(W_dtype="uint4", group_size=G, with_scaling=True),
    "u4-zeros": dict(W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
    "i4-g64-bias-f32": dict(W_dtype="int4", group_size=64, with_scaling=True, with_bias=True, out_dtype="float32"),
    "bf16-u4-qzeros": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True,
                           zeros_mode="quantized", out_dtype="bfloat16"),
    "u2-rescale": dict(W_dtype="uint2", group_size=G, with_scaling=True, with_zeros=True, zeros_mode="rescale"),
    "bf16-i2": dict(A_dtype="bfloat16", W_dtype="int2", group_size=G, with_scaling=True, out_dtype="bfloat16"),
    "i1-zeros": dict(W_dtype="int1", group_size=G, with_scaling=True, with_zeros=True),
    "u4-noscale": dict(W_dtype="uint4"),
    "i4-chan": dict(W_dtype="int4", with_scaling=True),
    "nf4": dict(W_dtype="nf4", group_size=G, with_scaling=True),
    "bf16-fp4": dict(A_dtype="bfloat16", W_dtype="fp4_e2m1", group_size=G, with_scaling=True, out_dtype="bfloat16"),
    "nvfp4-bias": dict(W_dtype="nvfp4", group_size=16, with_scaling=True, with_bias=True),
}
HINTS = {
    "r16k1u1s1": GEMVHint(rows_per_warp=16, k_warps=1, unroll=1, stages=1, mma=True),
    "r32k2u4s2": GEMVHint(rows_per_warp=32, k_warps=2, unroll=4, stages=2, mma=True),
    "r16k4u2s2": GEMVHint(rows_per_warp=16, k_warps=4, unroll=2, stages=2, mma=True),
    "r48k3u3s2": GEMVHint(rows_per_warp=48, k_warps=3, unroll=3, stages=2, mma=True),
}
ROWS = (1, 3, 8, 9, 16)


def _check(cfg, m, hint):
    plan = make_plan(cfg, "cuda", m)
    return check_kernel(cfg, plan, build_plan(plan, cuda_target(), hint), m)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n,k", [(1000, 1536), (4104, 8192)], ids=["1000x1536", "4104x8192"])
@gpu
def test_gemv_mma_formats(name, n, k):
    cfg = MatmulConfig(N=n, K=k, **CONFIGS[name])
    hint = HINTS["r32k2u4s2"]
    errors = [e for e in (_check(cfg, m, hint) for m in ROWS) if e]
    assert not errors, f"{cfg} {hint}:\n" + "\n".join(errors)


@pytest.mark.parametrize("hint", list(HINTS.values()), ids=list(HINTS))
@pytest.mark.parametrize("k", [1536, 1056, 8192])
@gpu
def test_gemv_mma_hints(hint, k):
    """K=1056 is 33 vectors of 4-bit codes: every k_warps > 1 leaves lanes past K."""
    cfg = MatmulConfig(N=1000, K=k, W_dtype="uint4", group_size=32, with_scaling=True, with_zeros=True)
    errors = [e for e in (_check(cfg, m, hint) for m in (1, 5, 12, 16)) if e]
    assert not errors, f"{hint}:\n" + "\n".join(errors)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n,k", [(1000, 1536), (4104, 8192)], ids=["1000x1536", "4104x8192"])
@gpu
def test_gemv_mma_default_tiles(name, n, k):
    """The default tiles (8 K warps, 4 vectors per step, launch bounds of 2 blocks per SM for 4- and
    8-bit codes) from 2 rows, at row counts inside both token tiles; K=1536 leaves lanes past K."""
    cfg = MatmulConfig(N=n, K=k, **CONFIGS[name])
    errors = []
    for m in (2, 5, 13):
        plan = make_plan(cfg, "cuda", m)
        hint = default_gemv_hint(plan, cuda_target())
        assert hint.tensor_cores
        errors.append(check_kernel(cfg, plan, build_plan(plan, cuda_target(), hint), m))
    errors = [e for e in errors if e]
    assert not errors, f"{cfg}:\n" + "\n".join(errors)


CHUNK_ROWS = (17, 31, 40, 64)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n,k", [(1000, 1536), (4104, 8192)], ids=["1000x1536", "4104x8192"])
@gpu
def test_gemv_mma_row_chunks(name, n, k):
    """17..64 rows: chunks of 16 rows, one block per chunk and channel tile (the last chunk partly
    past m), by the default tile and (40 rows) by a k-split hint that leaves lanes past K."""
    cfg = MatmulConfig(N=n, K=k, **CONFIGS[name])
    errors = []
    for m in CHUNK_ROWS:
        plan = make_plan(cfg, "cuda", m)
        hint = HINTS["r48k3u3s2"] if m == 40 else default_gemv_hint(plan, cuda_target())
        assert hint.tensor_cores
        errors.append(check_kernel(cfg, plan, build_plan(plan, cuda_target(), hint), m))
    errors = [e for e in errors if e]
    assert not errors, f"{cfg}:\n" + "\n".join(errors)


CHUNK_LOOP_HINTS = {
    # the default from N=16896 up to 48 rows: 64 channels per warp, 8-byte vectors (the class tops
    # 32 / 48 only: at 64 rows its K-warp reduction exceeds 48 KB of shared memory)
    "r64k4v8u4": GEMVHint(rows_per_warp=64, k_warps=4, unroll=4, stages=1, vec_bytes=8, mma=True, min_blocks=1,
                          chunk_loop=True),
    "r32k4u1s2": GEMVHint(rows_per_warp=32, k_warps=4, unroll=1, stages=2, mma=True, min_blocks=1, chunk_loop=True),
    "r16k8u2s2": GEMVHint(rows_per_warp=16, k_warps=8, unroll=2, stages=2, mma=True, min_blocks=1, chunk_loop=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("n,k", [(1000, 1536), (4104, 8192)], ids=["1000x1536", "4104x8192"])
@pytest.mark.parametrize("hk", list(CHUNK_LOOP_HINTS))
@gpu
def test_gemv_mma_chunk_loop(name, n, k, hk):
    """chunk_loop: one block serves every 16-row chunk of its channel tile (the weights decoded
    once, 2 token tiles of 8 rows per chunk); the class tops 32 / 48 / 64 at row counts inside
    their last chunk (run-time rows), lanes past K at K=1536 with 8 K warps."""
    cfg = MatmulConfig(N=n, K=k, **CONFIGS[name])
    errors = []
    for top, rows in ((32, (17, 32)), (48, (40,)), (64, (49, 64))):
        if hk == "r64k4v8u4" and top == 64:
            continue
        plan = make_plan(cfg, "cuda", top)
        fn = build_plan(plan, cuda_target(), CHUNK_LOOP_HINTS[hk])
        errors += [check_kernel(cfg, plan, fn, m) for m in rows]
    errors = [e for e in errors if e]
    assert not errors, f"{cfg} {hk}:\n" + "\n".join(errors)


@gpu
def test_gemv_mma_run_time_rows():
    """The tensor-core GEMV takes its row count at run time: the kernel built for the top of a class
    (8, 16, 48) is correct at every row count of the class, a dynamic-M operator builds one kernel
    per class for 2..64 rows (plus the rows kernel at m=1), and a kernel refuses more rows than it
    was built for (a host-side check, not a wrong result)."""
    import bitblas
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    from bitblas.tune.tuner import kernel_args
    cfg = MatmulConfig(N=1000, K=1536, **CONFIGS["u4-zeros"])
    errors = []
    for top, rows in ((8, (1, 2, 5, 7)), (16, (9, 13)), (48, (33, 40, 47))):
        plan = make_plan(cfg, "cuda", top)
        fn = build_plan(plan, cuda_target(), default_gemv_hint(plan, cuda_target()))
        errors += [check_kernel(cfg, plan, fn, m) for m in rows]
    assert not [e for e in errors if e], errors
    inputs = random_inputs(cfg, 9, device="cuda")
    with pytest.raises(Exception, match="row count must be 1..8"):
        fn8 = build_plan(make_plan(cfg, "cuda", 8), cuda_target(), default_gemv_hint(make_plan(cfg, "cuda", 8)))
        fn8(*kernel_args(make_plan(cfg, "cuda", 8), inputs, torch.empty(9, cfg.N, dtype=torch.float16, device="cuda")))
    op = bitblas.Matmul(MatmulConfig(M=None, N=1000, K=1536, **CONFIGS["u4-zeros"]))
    for m in range(1, 65):
        inp = random_inputs(op.config, m, device="cuda")
        out = torch.full((m, cfg.N), float("nan"), dtype=torch.float16, device="cuda")
        op(**inp, output=out)
        err = relative_error(out, reference_matmul(op.config, **inp))
        assert err <= tolerance(op.config), (m, err)
    assert sorted(c.rows for kind, c in op._kernels) == [1, 8, 16, 32, 48, 64]


@pytest.mark.parametrize("m", (4, 16, 64))
@gpu
def test_gemv_mma_precision_long_k(m):
    cfg = MatmulConfig(N=2048, K=16384, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True)
    err = _check(cfg, m, HINTS["r16k4u2s2"])
    assert err is None, err


# -- no GPU needed ------------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", list(TARGETS))
@pytest.mark.parametrize("name,m,hint", [("u4-zeros", 4, "r32k2u4s2"), ("bf16-i2", 9, "r16k1u1s1"),
                                         ("i1-zeros", 16, "r48k3u3s2"), ("u4-noscale", 1, "r16k4u2s2"),
                                         ("nf4", 5, "r32k2u4s2"), ("bf16-fp4", 12, "r16k1u1s1"),
                                         ("nvfp4-bias", 7, "r32k2u4s2"), ("u4-zeros", 40, "r48k3u3s2")])
def test_gemv_mma_codegen(arch, name, m, hint):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cfg = MatmulConfig(N=1000, K=1056 if hint == "r16k4u2s2" else 1536, **CONFIGS[name])
    src = cuda_source(make_plan(cfg, "cuda", m), cuda_target(TARGETS[arch]), HINTS[hint])
    ab = "bf16" if cfg.A_dtype == "bfloat16" else "f16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32" in src
    assert "int mv)" in src and ("(mv - 1)" in src or m == 1)     # the row count, at run time
    assert nvcc_compile(src, arch)[:4] == b"\x7fELF"


def test_gemv_mma_default_tile_choice():
    """Float activations from 2 rows: 4-bit codes take 8 K warps, 4 vectors per step and 2 blocks
    per SM up to 8 rows (nvfp4's float8 scales keep the 2-vector tile); 4- and 8-bit codes from 9
    rows take the same without the next step in flight (on wide layers since the 14th session; on
    sm_90 2- and 4-bit codes there take the wgmma GEMV: test_gemv_wgmma.py); 1- and 2-bit
    codes keep the base tiles."""
    t90 = cuda_target(TARGETS["sm_90"])

    t80 = cuda_target(TARGETS["sm_80"])

    def tile(name, m, n=8192, t=t90, **kw):
        h = default_gemv_hint(make_plan(MatmulConfig(N=n, K=8192, **{**CONFIGS[name], **kw}), "cuda", m), t)
        assert h.tensor_cores and (h.pdl or t is not t90)
        # (the wgmma GEMV takes one vector per step: unroll 1)
        return h.rows_per_warp, h.k_warps, getattr(h, "unroll", 1), h.stages, h.min_blocks

    for name in ("u4", "u4-zeros", "bf16-u4-qzeros", "i4-chan", "nf4", "bf16-fp4"):
        assert tile(name, 2) == tile(name, 8) == tile(name, 8, n=28672) == (32, 8, 4, 2, 2), name
        assert tile(name, 9) == tile(name, 16) == (32, 8, 4, 1, 2), name
        assert tile(name, 16, n=28672, t=t80) == (32, 8, 4, 1, 2), name
        # wide layers on sm_90: the wgmma GEMV (the table formats too, as 4-bit codes)
        h16 = default_gemv_hint(make_plan(MatmulConfig(N=28672, K=8192, **CONFIGS[name]), "cuda", 16), t90)
        assert isinstance(h16, GEMVWgmmaHint), name
    assert tile("nvfp4-bias", 2) == tile("nvfp4-bias", 4) == (32, 8, 2, 2, 0)
    assert tile("nvfp4-bias", 16) == (32, 8, 4, 1, 2)
    h16 = default_gemv_hint(make_plan(MatmulConfig(N=28672, K=8192, **CONFIGS["nvfp4-bias"]), "cuda", 16), t90)
    assert isinstance(h16, GEMVWgmmaHint)      # nvfp4 as 4-bit codes on wide layers (per-pair block scales)
    assert tile("u4", 2, W_dtype="int8", group_size=-1) == tile("u4", 4, W_dtype="int8", group_size=-1) \
        == (32, 8, 2, 2, 0)
    assert tile("u4", 12, W_dtype="int8", group_size=-1) == (32, 8, 4, 1, 2)
    for name in ("u2-rescale", "bf16-i2", "i1-zeros"):
        assert tile(name, 2) == tile(name, 4) == (32, 8, 2, 2, 0), name
        assert tile(name, 16, t=t80) == (32, 4, 4, 2, 0), name
        # on sm_90 2-bit codes take the wgmma GEMV from 9 rows (test_gemv_wgmma.py)
        assert (tile(name, 16) == (32, 4, 4, 2, 0)) == (name == "i1-zeros"), name
    # one row: the rows kernel; before sm_80 (no mma.sync m16n8k16 path here): the rows kernel
    assert not default_gemv_hint(make_plan(MatmulConfig(N=8192, K=8192, **CONFIGS["u4"]), "cuda", 1), t90).tensor_cores
    t75 = cuda_target({**TARGETS["sm_80"], "arch": "sm_75", "max_shared_memory_per_block": 65536})
    assert not default_gemv_hint(make_plan(MatmulConfig(N=8192, K=8192, **CONFIGS["u4"]), "cuda", 2), t75).tensor_cores
    # 17..64 rows (chunks of 16), sm_80 (on sm_90 the wgmma GEMV takes the int formats from N=8192:
    # test_gemv_wgmma.py; the others keep this loop there too): every format takes the chunk loop,
    # 32 channels x 4 K warps, no next step in flight, launch bounds of 1 block per SM; vectors of
    # 16 codes (a lane's activations span 32 bytes), as many per step as two of the default
    # vectors: 4-bit codes 4 vectors of 8 bytes, 2-bit 8 of 4 bytes, 1-bit 4 of 4 bytes (32 codes:
    # the smallest vector); nvfp4 (16-code groups) and 8-bit codes already have 16 codes per vector
    spans = {"u2-rescale": (4, 8), "bf16-i2": (4, 8), "i1-zeros": (4, 4), "nvfp4-bias": (0, 2)}
    for m in (17, 64):
        for name in CONFIGS:
            plan = make_plan(MatmulConfig(N=8192, K=8192, **CONFIGS[name]), "cuda", m)
            h = default_gemv_hint(plan, t80)
            assert h.chunk_loop, (name, m)
            vb, u = spans.get(name, (8, 4))
            assert (h.vec_bytes, h.unroll) == (vb, u), (name, m)
            assert tile(name, m, t=t80) == (32, 4, u, 1, 1), (name, m)
            # from N=16896 up to 48 rows 64 channels per warp (not 1-bit codes: they spill; nf4
            # from 33 rows)
            wide = m <= 48 and name not in ("i1-zeros", "nf4")
            assert tile(name, m, n=28672, t=t80) == (64 if wide else 32, 4, u, 1, 1), (name, m)
            h90 = default_gemv_hint(plan, t90)
            assert isinstance(h90, GEMVWgmmaHint) or h90 == dataclasses.replace(h, pdl=True), (name, m)
        assert tile("nf4", 33, n=28672, t=t80)[0] == tile("nf4", 48, n=28672, t=t80)[0] == 64
        h8 = default_gemv_hint(make_plan(MatmulConfig(N=8192, K=8192, W_dtype="int8", with_scaling=True), "cuda", m),
                              t80)
        assert (h8.vec_bytes, h8.unroll, h8.chunk_loop) == (0, 2, True)


@pytest.mark.nvcc
@pytest.mark.parametrize("name,m", [("u4", 4), ("u4-zeros", 8), ("nf4", 4), ("u4", 16), ("nf4", 12)])
def test_gemv_mma_default_tile_registers(name, m):
    """The default tiles fit 128 registers (2 blocks of 256 threads per SM) with at most a few
    spilled words; over 128 an SM holds 8 warps and the kernel loses time (fewer warps to hide the loads)."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cfg = MatmulConfig(N=8192, K=8192, **CONFIGS[name])
    src = cuda_source(make_plan(cfg, "cuda", m), cuda_target(TARGETS["sm_90"]))
    assert "__launch_bounds__(256, 2)" in src
    use = nvcc_resources(src, "sm_90")
    assert use["registers"] <= 128 and use["spill_stores"] <= 64, use


def test_gemv_mma_refused():
    """Every float-activation weight format decodes to half pairs (8-bit and float8 since the 5th
    session); int8 activations, tiles that are not 16-channel multiples and more than 8 K warps are
    refused, naming the field."""
    for wd in ("int8", "uint8", "float8_e4m3", "float8_e5m2"):
        for act in ("float16", "bfloat16"):
            plan = make_plan(MatmulConfig(N=256, K=512, A_dtype=act, W_dtype=wd, with_scaling=True), "cuda", 4)
            assert mma_gemv_unsupported(plan, GEMVHint(rows_per_warp=16, mma=True)) is None, (wd, act)
    plan_i8 = make_plan(MatmulConfig(N=256, K=512, A_dtype="int8", W_dtype="int4", with_scaling=True), "cuda", 4)
    assert "float16/bfloat16 activations" in mma_gemv_unsupported(plan_i8, GEMVHint(rows_per_warp=16, mma=True))
    plan4 = make_plan(MatmulConfig(N=256, K=512, W_dtype="int4", with_scaling=True), "cuda", 4)
    assert "rows_per_warp=8" in mma_gemv_unsupported(plan4, GEMVHint(rows_per_warp=8, mma=True))
    assert "k_warps=16" in mma_gemv_unsupported(plan4, GEMVHint(rows_per_warp=16, k_warps=16, mma=True))
    with pytest.raises(ValueError, match="rows_per_warp=8"):
        cuda_source(plan4, cuda_target(TARGETS["sm_90"]), GEMVHint(rows_per_warp=8, mma=True))


@pytest.mark.parametrize("name,at_store", [("i4-chan", True), ("u4", False), ("u4-zeros", False), ("nvfp4-bias", False)])
def test_gemv_mma_scale_placement(name, at_store):
    """A per-channel scale multiplies the float32 sum at the store (no hfma2 per decoded pair, no
    scale registers per step); group scales and float zero points stay on the decoded pairs."""
    cfg = MatmulConfig(N=1000, K=1536, **CONFIGS[name])
    src = cuda_source(make_plan(cfg, "cuda", 4), cuda_target(TARGETS["sm_90"]), HINTS["r32k2u4s2"])
    body = src.split("main_kernel(")[-1]
    assert ("bb_scl_" in body) != at_store
    assert ("sr_ptr" in body) != at_store


# wide layers (N >= 16896) at 9..16 rows: the default kernel of each family on the GPU (on sm_90
# uint4 and nf4 take the wgmma GEMV, 8-bit codes the 32-channel tile, int8 activations 64)
WIDE_DEFAULTS = {
    "u4-g128-zeros": dict(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
    "nf4-g128": dict(W_dtype="nf4", group_size=128, with_scaling=True),
    "i8-chan": dict(W_dtype="int8", with_scaling=True),
    "w4a8-g128": dict(A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True),
    "w8a8": dict(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True),
}


@pytest.mark.parametrize("name", list(WIDE_DEFAULTS))
@gpu
def test_gemv_wide_layer_defaults(name):
    """N=16896 (a wide layer), K=1024: the default kernels of 9..16 rows (14th session: the wgmma
    GEMV for 2-/4-bit codes on sm_90, the 32-channel tile under 2 blocks per SM for the
    others, the 64-channel one for int8 activations) through a dynamic-M operator, against the
    reference, output poisoned first."""
    import bitblas
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    kw = {"A_dtype": "float16", **WIDE_DEFAULTS[name]}
    op = bitblas.Matmul(MatmulConfig(M=None, N=16896, K=1024, **kw))
    for m in (9, 13, 16):
        inp = random_inputs(op.config, m, device="cuda")
        out_dtype = torch.float16 if op.config.out_dtype == "float16" else getattr(torch, op.config.out_dtype)
        out = torch.full((m, op.config.N), float("nan"), dtype=out_dtype, device="cuda")
        op(**inp, output=out)
        err = relative_error(out, reference_matmul(op.config, **inp))
        assert err <= tolerance(op.config), (m, err)
