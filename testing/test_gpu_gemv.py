"""The small-M (GEMV) CUDA template: selection, correctness at odd row counts and shapes, hint variants.

Skipped without a CUDA GPU, except the selection and code-generation checks at the bottom, which
run anywhere (code generation needs no GPU; the nvcc check is marked ``nvcc``).
"""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import GEMVHint, GEMVKSplitHint, GEMVRowsHint, gemv_unsupported
from bitblas.kernels import default_hint

_skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu(f):
    return pytest.mark.gpu(_skip(f))
G = 128

CONFIGS = [
    pytest.param(dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True), id="u4"),
    pytest.param(dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
                 id="u4-zeros"),
    pytest.param(dict(A_dtype="float16", W_dtype="int4", group_size=64, with_scaling=True, with_bias=True,
                      out_dtype="float32"), id="i4-g64-bias-f32out"),
    pytest.param(dict(A_dtype="bfloat16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True,
                      zeros_mode="quantized", out_dtype="bfloat16"), id="bf16-u4-qzeros"),
    pytest.param(dict(A_dtype="bfloat16", W_dtype="int8", with_scaling=True, out_dtype="bfloat16"), id="bf16-i8-chan"),
    pytest.param(dict(A_dtype="float16", W_dtype="uint8", group_size=G, with_scaling=True, with_zeros=True,
                      zeros_mode="rescale"), id="u8-rescale"),
    pytest.param(dict(A_dtype="float16", W_dtype="int8", with_scaling=True), id="i8-chan"),
    pytest.param(dict(A_dtype="float16", W_dtype="uint2", group_size=G, with_scaling=True, with_zeros=True,
                      zeros_mode="quantized"), id="u2-qzeros"),
    pytest.param(dict(A_dtype="bfloat16", W_dtype="int2", group_size=G, with_scaling=True, out_dtype="bfloat16"),
                 id="bf16-i2"),
    pytest.param(dict(A_dtype="float16", W_dtype="int1", group_size=G, with_scaling=True, with_zeros=True),
                 id="i1-zeros"),
    pytest.param(dict(A_dtype="bfloat16", W_dtype="uint1", group_size=G, with_scaling=True, with_zeros=True,
                      zeros_mode="rescale", out_dtype="bfloat16"), id="bf16-u1-rescale"),
    pytest.param(dict(A_dtype="float16", W_dtype="uint4"), id="u4-noscale"),
]
ROWS = (1, 3, 16)
SHAPES = ((1000, 1536), (4104, 8192))      # N no multiple of the rows per block; K=1536 leaves lanes idle


def _run(fn, plan, inputs, out):
    """Call a built kernel with the plan's argument list: tables from the format registry, an absent
    optional global scale as 1, float8 tensors as their int8 bits."""
    from bitblas.formats import FORMATS
    args = []
    for s in plan.args:
        if s.role == "output":
            t = out.view(plan.m, -1)
        elif s.role == "table":
            fmt = plan.w if s.name == "w_table" else FORMATS[plan.scale_dtype]
            t = torch.tensor(fmt.table, dtype=torch.float32, device="cuda")
        elif s.name not in inputs and s.optional:
            t = torch.ones(s.shape, dtype=torch.float32, device="cuda")
        else:
            t = inputs[s.name]
            if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                t = t.view(torch.int8)
        args.append(t)
    fn(*args)


def _err(cfg, m, fn=None, plan=None, seed=None, drop=()):
    seed = random.randrange(2 ** 31) if seed is None else seed
    inputs = random_inputs(cfg, m, device="cuda", seed=seed)
    for name in drop:
        inputs.pop(name, None)
    out = torch.full((m, cfg.N), float("nan"), dtype=TORCH_DTYPES[cfg.out_dtype], device="cuda")
    if fn is None:
        op = bitblas.Matmul(cfg)
        op(**inputs, output=out)
        kplan = op._kernel("cuda", m)[0]
        # the rows kernel for m rows, or the tensor-core one for the top of m's class
        assert kplan.m == op.plan("cuda", m).m and isinstance(default_hint(kplan), GEMVHint), \
            "GEMV kernel not selected"
    else:
        _run(fn, plan, inputs, out)
    torch.cuda.synchronize()
    return relative_error(out.cpu(), reference_matmul(cfg, **inputs)), tolerance(cfg), seed


@pytest.mark.parametrize("kw", CONFIGS)
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("m", ROWS)
@gpu
def test_gemv(kw, n, k, m):
    cfg = MatmulConfig(N=n, K=k, **kw)
    err, tol, seed = _err(cfg, m)
    assert err <= tol, f"m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


# Table formats (fp4_e2m1, nf4, float8 weights, nvfp4) x float16 / bfloat16 activations.
TABLE_FORMATS = {}
for _act, _o in (("float16", "float16"), ("bfloat16", "bfloat16")):
    _a = "f16" if _act == "float16" else "bf16"
    TABLE_FORMATS.update({
        f"{_a}-fp4-g128": dict(A_dtype=_act, W_dtype="fp4_e2m1", group_size=G, with_scaling=True, out_dtype=_o),
        f"{_a}-nf4-g64": dict(A_dtype=_act, W_dtype="nf4", group_size=64, with_scaling=True, out_dtype=_o),
        f"{_a}-e4m3-chan": dict(A_dtype=_act, W_dtype="float8_e4m3", with_scaling=True, out_dtype=_o),
        f"{_a}-e5m2-g128": dict(A_dtype=_act, W_dtype="float8_e5m2", group_size=G, with_scaling=True, out_dtype=_o),
        f"{_a}-nvfp4": dict(A_dtype=_act, W_dtype="nvfp4", group_size=16, with_scaling=True, out_dtype=_o),
    })
CODEGEN_FORMATS = list(TABLE_FORMATS) + ["f16-nf4-chan-bias-f32out", "f16-e4m3-noscale"]
TABLE_FORMATS.update({
    "f16-nf4-chan-bias-f32out": dict(A_dtype="float16", W_dtype="nf4", with_scaling=True, with_bias=True,
                                     out_dtype="float32"),
    "f16-e4m3-noscale": dict(A_dtype="float16", W_dtype="float8_e4m3"),
    "bf16-e5m2-chan-f32out": dict(A_dtype="bfloat16", W_dtype="float8_e5m2", with_scaling=True, out_dtype="float32"),
    "bf16-fp4-noscale-bias": dict(A_dtype="bfloat16", W_dtype="fp4_e2m1", with_bias=True, out_dtype="bfloat16"),
})


@pytest.mark.parametrize("fmt", list(TABLE_FORMATS))
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("m", ROWS)
@gpu
def test_gemv_table_formats(fmt, n, k, m):
    cfg = MatmulConfig(N=n, K=k, **TABLE_FORMATS[fmt])
    err, tol, seed = _err(cfg, m)
    assert err <= tol, f"{fmt} m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


@pytest.mark.parametrize("act", ("float16", "bfloat16"))
@pytest.mark.parametrize("m", (1, 7))
@gpu
def test_gemv_nvfp4_default_global_scale(act, m):
    """nvfp4 without global_scale: the operator passes 1; the reference takes none. The float8
    scales were chosen for the dropped global scale (values up to 448 x 6 per weight), so the
    output is float32: a float16 output would overflow in both the kernel and any reference."""
    cfg = MatmulConfig(N=1000, K=1536, A_dtype=act, W_dtype="nvfp4", group_size=16, with_scaling=True,
                       out_dtype="float32")
    err, tol, seed = _err(cfg, m, drop=("global_scale",))
    assert err <= tol, f"m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


HINTS = [GEMVHint(1, 4, 1, 0), GEMVHint(4, 2, 4, 8), GEMVHint(2, 8, 2, 4), GEMVHint(8, 1, 8, 16),
         GEMVHint(4, k_warps=4, grid=5), GEMVHint(3, vec_bytes=8, k_warps=2), GEMVHint(2, k_warps=16, grid=64),
         GEMVHint(4, 1, 1, stages=4), GEMVHint(3, 2, 2, stages=3), GEMVHint(2, 4, 2, stages=1),
         GEMVHint(8, 1, 4, stages=2, min_blocks=8), GEMVHint(3, 2, 4, stages=2, min_blocks=8)]


@pytest.mark.parametrize("hint", HINTS, ids=[str(tuple(h.__dict__.values())) for h in HINTS])
@gpu
def test_gemv_hints(hint):
    from bitblas.build import build_plan
    cfg = MatmulConfig(N=1000, K=1536, A_dtype="float16", W_dtype="int4", group_size=G, with_scaling=True,
                       with_zeros=True)
    for m in (1, 5):
        plan = make_plan(cfg, "cuda", m)
        fn = build_plan(plan, hint=hint)
        err, tol, seed = _err(cfg, m, fn=fn, plan=plan)
        assert err <= tol, f"{hint} m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


EXACT = {"fp4_e2m1": {}, "nf4": {}, "float8_e4m3": {}, "float8_e5m2": {},
         "nvfp4": dict(group_size=16, with_scaling=True)}


@pytest.mark.parametrize("act", ("float16", "bfloat16"))
@pytest.mark.parametrize("wd", list(EXACT))
@gpu
def test_gemv_decode_exact(wd, act):
    """Every code decodes exactly on the GPU (bfloat16 subnormals in the e2m1 multiply included):
    one-hot activation rows pick single weights, scales 1, float32 output, compared for equality
    with the table rounded to the activation dtype (4-bit formats) or as is (float8)."""
    import math

    from bitblas.formats import FORMATS
    from bitblas.quantization.quantize import pack_weight
    fmt = FORMATS[wd]
    N, K, M = 256, 512, 16
    cfg = MatmulConfig(N=N, K=K, A_dtype=act, W_dtype=wd, out_dtype="float32", **EXACT[wd])
    assert isinstance(default_hint(make_plan(cfg, "cuda", M)), GEMVHint)
    g = torch.Generator().manual_seed(0)
    ok = torch.tensor([math.isfinite(v) and not (fmt.bits == 8 and c & 0x7F == 0x7F) for c, v in enumerate(fmt.table)])
    codes = torch.randint(0, len(fmt.table), (N, K), generator=g)
    codes[~ok[codes]] = 0                       # inf / NaN codes: 0 * inf would be NaN
    cols = torch.randperm(K, generator=g)[:M]
    A = torch.zeros(M, K, dtype=TORCH_DTYPES[act])
    A[torch.arange(M), cols] = 1
    extra = {}
    if cfg.with_scaling:
        extra = dict(scale=torch.ones(N, K // cfg.group_size), global_scale=torch.ones(1))
    inputs = {k: v.cuda() for k, v in pack_weight(cfg, codes, **extra).items()}
    out = bitblas.Matmul(cfg)(A.cuda(), **inputs)
    torch.cuda.synchronize()
    table = torch.tensor(fmt.table, dtype=torch.float32)
    if fmt.bits == 4:
        table = table.to(TORCH_DTYPES[act]).float()
    want = table[codes[:, cols].T]              # [M, N]
    bad = (out.cpu() != want).nonzero()
    assert bad.numel() == 0, [(int(i), int(n), int(codes[n, cols[i]]), float(out[i, n]), float(want[i, n]))
                              for i, n in bad[:8]]


STAGED = GEMVHint(2, 8, 1, stages=3, min_blocks=4, act_smem=True)      # the m=1 default (gemv/template.py's staged_row)
STAGED_FORMATS = {
    "u4": dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True),
    "u4-zeros-bias": dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True,
                          with_bias=True),
    "bf16-u4-qzeros": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True,
                           zeros_mode="quantized", out_dtype="bfloat16"),
    "i2": dict(A_dtype="float16", W_dtype="int2", group_size=G, with_scaling=True),
    "u1-rescale": dict(A_dtype="float16", W_dtype="uint1", group_size=G, with_scaling=True, with_zeros=True,
                       zeros_mode="rescale"),
    "i8-chan-f32out": dict(A_dtype="float16", W_dtype="int8", with_scaling=True, out_dtype="float32"),
    "bf16-u8-g128": dict(A_dtype="bfloat16", W_dtype="uint8", group_size=G, with_scaling=True, out_dtype="bfloat16"),
    "a8-i2-g128": dict(A_dtype="int8", W_dtype="int2", group_size=G, with_scaling=True, with_act_scaling=True),
    "a8-u4-chan": dict(A_dtype="int8", W_dtype="uint4", with_scaling=True, with_act_scaling=True),
    # float16 e2m1 codes: the rows kernel's table decoder (gemv/decode.py's _e2m1_lut_consts)
    **{k: TABLE_FORMATS[k] for k in ("f16-nf4-g64", "bf16-fp4-g128", "f16-e4m3-chan", "bf16-e5m2-g128",
                                     "bf16-nvfp4", "f16-fp4-g128", "f16-nvfp4")},
}
# the default, then tiles of the tuner's space (kernels/gemv_rows.py), the last two with more registers
STAGED_HINTS = [STAGED, GEMVHint(8, 4, 1, stages=2, min_blocks=4, act_smem=True),
                GEMVHint(3, 2, 2, stages=2, act_smem=True), GEMVHint(4, 4, 1, stages=4, min_blocks=4, act_smem=True),
                GEMVHint(4, 8, 1, stages=3, min_blocks=2, act_smem=True),
                GEMVHint(4, 16, 1, stages=2, min_blocks=1, act_smem=True),
                GEMVRowsHint(rows_per_warp=2, warps=8, unroll=1, stages=3, min_blocks=4, pdl=True, act_smem=True,
                             l2_prefetch=2),
                # the nvfp4 x float16 wave tiles (gemv/template.py _nvfp4_wave_tile)
                GEMVRowsHint(rows_per_warp=2, warps=32, unroll=1, stages=3, min_blocks=1, pdl=True, act_smem=True,
                             l2_prefetch=1),
                GEMVRowsHint(rows_per_warp=1, warps=16, unroll=2, stages=3, min_blocks=2, pdl=True, act_smem=True,
                             l2_prefetch=1)]


@pytest.mark.parametrize("hint", STAGED_HINTS, ids=["r2w8s3", "r8w4s2", "r3w2u2", "r4w4s4", "r4w8s3b2", "r4w16s2b1",
                                                    "r2w8s3p2", "r2w32s3b1p1", "r1w16u2s3b2p1"])
@pytest.mark.parametrize("fmt", list(STAGED_FORMATS))
@gpu
def test_gemv_staged_row(fmt, hint):
    """The activation row staged in shared memory, every decoder, one row: N not a multiple of the
    block's channels, K=1536 (48 vector positions: a partial block of 32 and idle staging
    threads), and K=8192; output poisoned first (NaN / zero), fresh random data."""
    from bitblas.build import build_plan
    from bitblas.schedule.gemv import gemv_hint_unsupported
    for n, k in ((1000, 1536), (520, 8192)):
        cfg = MatmulConfig(N=n, K=k, **STAGED_FORMATS[fmt])
        plan = make_plan(cfg, "cuda", 1)
        assert gemv_hint_unsupported(plan, hint) is None, (fmt, hint)
        fn = build_plan(plan, hint=hint)
        err, tol, seed = _err(cfg, 1, fn=fn, plan=plan)
        assert err <= tol, f"{fmt} {n}x{k} {hint} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


TABLE_HINT_FORMATS = ["f16-nf4-g64", "bf16-nvfp4", "f16-e4m3-chan", "bf16-fp4-g128", "bf16-e5m2-g128"]


@pytest.mark.parametrize("hint", HINTS, ids=[str(tuple(h.__dict__.values())) for h in HINTS])
@pytest.mark.parametrize("fmt", TABLE_HINT_FORMATS)
@gpu
def test_gemv_table_hints(fmt, hint):
    """Every kernel shape (rows, k-split, cp.async ring) with the table decoders; hints whose vector
    width does not fit the format (nvfp4: 16 values per scale, 32 in the rows kernel) are skipped."""
    from bitblas.build import build_plan
    from bitblas.schedule.gemv import vec_blocks, vec_bytes
    cfg = MatmulConfig(N=1000, K=1536, **TABLE_FORMATS[fmt])
    for m in (1, 5):
        plan = make_plan(cfg, "cuda", m)
        if vec_bytes(plan, hint.vec_bytes, blocks=vec_blocks(plan, hint)) is None:
            pytest.skip(f"vec_bytes={hint.vec_bytes} does not fit {fmt}")
        fn = build_plan(plan, hint=hint)
        err, tol, seed = _err(cfg, m, fn=fn, plan=plan)
        assert err <= tol, f"{fmt} {hint} m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


@pytest.mark.parametrize("m", (1, 16))
@gpu
def test_gemv_precision_long_k(m):
    """float16 accumulation inside each 32-value vector stays far inside the tolerance at K=16384."""
    cfg = MatmulConfig(N=2048, K=16384, A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True,
                       with_zeros=True)
    err, tol, seed = _err(cfg, m)
    assert err <= tol / 2, f"seed={seed}: rel. err {err:.3e} > {tol / 2:.1e}"


@gpu
def test_gemv_misaligned_activations():
    """A view whose data pointer is not 16-byte aligned still gives the right result."""
    cfg = MatmulConfig(N=1000, K=1536, A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True)
    inputs = random_inputs(cfg, 1, device="cuda")
    buf = torch.empty(cfg.K + 1, dtype=torch.float16, device="cuda")
    buf[1:].copy_(inputs["A"].view(-1))
    a = buf[1:].view(1, cfg.K)
    op = bitblas.Matmul(cfg)
    out = op(a, inputs["W"], scale=inputs["scale"])
    torch.cuda.synchronize()
    err = relative_error(out.cpu(), reference_matmul(cfg, **inputs))
    assert err <= tolerance(cfg)


@gpu
@pytest.mark.parametrize("m", (1, 16, 128))
def test_gemv_misaligned_block_scales(m):
    """nvfp4's float8 block scales from a view off a 2-byte boundary (the kernels read a vector's two
    scales in one 2-byte load): realigned by a copy on the general path, refused by the fast paths
    (which then take the general one) and copied once at bind; the result equals the aligned one's."""
    cfg = MatmulConfig(N=1000, K=1536, A_dtype="float16", W_dtype="nvfp4", group_size=16, with_scaling=True)
    inputs = random_inputs(cfg, m, device="cuda")
    sc = inputs["scale"]
    buf = torch.empty(sc.numel() + 1, dtype=sc.dtype, device="cuda")
    buf[1:].copy_(sc.reshape(-1))
    odd = buf[1:].view(sc.shape)
    assert odd.data_ptr() % 2 == 1
    op = bitblas.Matmul(cfg)
    kw = {k: v for k, v in inputs.items() if k not in ("A", "W", "scale")}
    want = op(inputs["A"], inputs["W"], scale=sc, **kw).clone()
    ref = reference_matmul(cfg, **inputs)
    assert relative_error(want.cpu(), ref) <= tolerance(cfg)
    for _ in range(2):                        # the first call builds the entry, the second takes the fast path
        out = torch.full_like(want, float("nan"))
        op(inputs["A"], inputs["W"], scale=odd, output=out, **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    bound = op.bind(inputs["W"], scale=odd, **{k: v for k, v in kw.items() if k != "a_scale"})
    assert torch.equal(bound(inputs["A"]), want)


# -- no GPU needed ------------------------------------------------------------------------------
@pytest.mark.nvcc
@pytest.mark.parametrize("act", ("float16", "bfloat16"))
def test_gemv_nvfp4_rows_two_blocks(act):
    """nvfp4 in the rows kernel: 16-byte vectors of two 16-code blocks (one 16-byte load, the two
    scale bytes together), each block's dot product times its scale in float32 (bb_dsb; cvt of the
    scale pair on sm_89+, arithmetic below: both compile); an explicit 8-byte vector keeps one
    block per vector (bb_e4m3f) and the k-split kernel its 8-byte vectors."""
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    from bitblas.schedule.gemv import vec_blocks, vec_bytes
    cfg = MatmulConfig(N=1000, K=1536, A_dtype=act, W_dtype="nvfp4", group_size=16, with_scaling=True,
                       out_dtype=act)
    plan = make_plan(cfg, "cuda", 1)
    rows = GEMVRowsHint(rows_per_warp=2, warps=8, unroll=1, stages=3, act_smem=True)
    assert vec_blocks(plan, rows) == 2 and vec_bytes(plan, 0, blocks=2) == 16
    ks = GEMVKSplitHint(rows_per_warp=2, k_warps=4)
    assert vec_blocks(plan, ks) == 1 and vec_bytes(plan, 0, blocks=1) == 8
    for arch in ("sm_80", "sm_90"):
        src = cuda_source(plan, arch, rows)
        assert "bb_dsb_" in src and "bb_ldw4(" in src and "bb_e4m3f(" not in src
        assert "cvt.rn.f16x2.e4m3x2" in src and "__CUDA_ARCH__ >= 890" in src
        one = cuda_source(plan, arch, dataclasses.replace(rows, vec_bytes=8))
        assert "bb_dsb_" not in one and "bb_ldw2(" in one and "bb_e4m3f(" in one
        if find_nvcc() is not None:
            assert nvcc_compile(src, arch) and nvcc_compile(one, arch)


def test_gemv_selection():
    cfg = MatmulConfig(N=1000, K=1536, A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True)
    assert gemv_unsupported(make_plan(cfg, "cuda", 1)) is None
    assert gemv_unsupported(make_plan(cfg, "cuda", 16)) is None
    assert gemv_unsupported(make_plan(cfg, "cuda", 64)) is None          # the tensor-core kernel, 16-row chunks
    assert "1..64" in gemv_unsupported(make_plan(cfg, "cuda", 65))
    assert gemv_unsupported(make_plan(cfg, "cuda", None))
    assert gemv_unsupported(make_plan(cfg, "cpu", 1))
    assert isinstance(default_hint(make_plan(cfg, "cuda", 4)), GEMVHint)
    assert default_hint(make_plan(cfg, "cuda", 40)).tensor_cores
    # the rows kernel stops at 16 rows, naming the kernel that takes more
    from bitblas.schedule.gemv import gemv_hint_unsupported
    assert "the mma GEMV: up to 64" in gemv_hint_unsupported(make_plan(cfg, "cuda", 17), GEMVHint(4, 1, 4))
    op = bitblas.Matmul(cfg)
    # the rows kernel is built per row count (m=1), the tensor-core one for the top of each class
    assert op.plan("cuda", 1).m == 1 and op.plan("cuda", 2).m == 8 and op.plan("cuda", 7).m == 8
    assert op.plan("cuda", 9).m == 16 and op.plan("cuda", 17).m == 32 and op.plan("cuda", 49).m == 64
    assert op.plan("cpu", 7).m is None
    assert op.plan("cuda", 65).m is None
    for kw in TABLE_FORMATS.values():                 # table formats: GEMV at 1..16 rows as well
        tcfg = MatmulConfig(N=1000, K=1536, **kw)
        assert gemv_unsupported(make_plan(tcfg, "cuda", 1)) is None, kw
        assert isinstance(default_hint(make_plan(tcfg, "cuda", 16)), GEMVHint)
        assert bitblas.Matmul(tcfg).plan("cuda", 1).m == 1
    f8 = MatmulConfig(N=1000, K=1536, A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True)
    assert "activations" in gemv_unsupported(make_plan(f8, "cuda", 1))
    assert bitblas.Matmul(f8).plan("cuda", 1).m is None


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gemv_codegen(arch):
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    for kw in (dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
               dict(A_dtype="bfloat16", W_dtype="int8", with_scaling=True, out_dtype="bfloat16")):
        plan = make_plan(MatmulConfig(N=1000, K=1536, **kw), "cuda", 3)
        src = cuda_source(plan, arch)
        assert "lop3.b32" in src or "__byte_perm" in src
        assert nvcc_compile(src, arch)


@pytest.mark.nvcc
def test_gemv_launch_bounds():
    """min_blocks reaches __launch_bounds__ (ptxas may then spend more registers on loads in
    flight): at m=1 the staged-row tiles take 4 blocks per SM (8 warps, 4 for 1-/2-bit codes),
    2-bit codes on narrow layers and 8-bit ones off their wave window 8 (2-warp blocks)."""
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    for kw, n, bounds in ((dict(W_dtype="uint4", group_size=128, with_scaling=True), 1000, "__launch_bounds__(256, 4)"),
                          (dict(W_dtype="nf4", group_size=128, with_scaling=True), 1000, "__launch_bounds__(256, 4)"),
                          (dict(W_dtype="int2", group_size=128, with_scaling=True), 1000, "__launch_bounds__(64, 8)"),
                          (dict(W_dtype="int2", group_size=128, with_scaling=True), 8192, "__launch_bounds__(128, 4)"),
                          (dict(W_dtype="int8", with_scaling=True), 1000, "__launch_bounds__(64, 8)")):
        plan = make_plan(MatmulConfig(N=n, K=1536, A_dtype="float16", **kw), "cuda", 1)
        src = cuda_source(plan, "sm_90")
        assert bounds in src, (kw, src[src.find("__launch_bounds__"):][:40])
        assert nvcc_compile(src, "sm_90")
    plan = make_plan(MatmulConfig(N=256, K=512, W_dtype="uint4", group_size=128, with_scaling=True), "cuda", 5)
    assert "__launch_bounds__(32, 4)" in cuda_source(plan, "sm_90", GEMVHint(4, 1, 2, stages=1, min_blocks=4))



def test_gemv_rows_l2_prefetch_before_the_wait():
    """The rows kernel's ``l2_prefetch``: the first steps of each warp's weight rows and their
    scales prefetched into L2 before the PDL wait, nothing read from global memory before it (a
    prefetch binds no value), more steps than the row has clipped; a negative count refused."""
    import re
    from bitblas.build import cuda_source
    from bitblas.schedule.gemv import gemv_hint_unsupported
    h = GEMVRowsHint(rows_per_warp=2, warps=8, unroll=1, stages=3, min_blocks=4, pdl=True, act_smem=True,
                     l2_prefetch=2)
    for kw, per in ((dict(W_dtype="nvfp4", group_size=16), 2), (dict(W_dtype="uint4", group_size=128), 2),
                    (dict(W_dtype="uint4", group_size=128, with_zeros=True), 2)):
        plan = make_plan(MatmulConfig(N=1000, K=8192, A_dtype="float16", with_scaling=True, **kw), "cuda", 1)
        src = cuda_source(plan, "sm_90", h)
        body = src[src.index('extern "C" __global__'):]
        body = body[body.index("{"):]
        head, tail = body.split("griddepcontrol_wait();", 1)
        assert head.count("bb_pf_l2(") == 2 * 2 * per and "bb_pf_l2(" not in tail, kw   # steps x rows x (W, scale)
        assert not re.search(r"bb_ldw\d|bb_ldsb|bb_lda\(|__ldg|scale\[|zeros\[", head), kw
    short = make_plan(MatmulConfig(N=64, K=512, A_dtype="float16", W_dtype="uint4", group_size=128,
                                   with_scaling=True), "cuda", 1)
    src = cuda_source(short, "sm_90", dataclasses.replace(h, l2_prefetch=5))
    assert src.count("bb_pf_l2(") == 1 + 1 * 2 * 2           # K=512: one step (16 lanes' vectors)
    assert "l2_prefetch=-1" in gemv_hint_unsupported(short, dataclasses.replace(h, l2_prefetch=-1))


def test_gemv_l2_prefetch_default(monkeypatch):
    """Where the default rows kernel prefetches its first step into L2 (gemv/template.py's
    default_gemv_hint): nvfp4 x float16, staged row, PDL (sm_90), blocks within one wave of 4 per
    SM (132 SMs here); not past a wave, not bfloat16, not uint4, not without PDL."""
    from bitblas import arch
    from bitblas.build import cuda_target
    monkeypatch.setattr(arch, "_LOCAL_SMS", [132])

    def pf(n, k=8192, act="float16", w="nvfp4", target="sm_90"):
        g = 16 if w == "nvfp4" else 128
        c = MatmulConfig(N=n, K=k, A_dtype=act, W_dtype=w, group_size=g, with_scaling=True, out_dtype=act)
        h = default_hint(make_plan(c, "cuda", 1), cuda_target(target))
        return h.l2_prefetch if isinstance(h, GEMVRowsHint) else None
    assert pf(8192) == pf(4096, 4096) == pf(6144, 4096) == pf(4096, 14336) == pf(8448) == 1
    assert pf(8464) == pf(28672) == pf(28672, 4096) == 0       # 529+ blocks of 16 channels: past one wave
    assert pf(8192, act="bfloat16") == pf(8192, w="uint4") == pf(8192, target="sm_80") == 0


def test_gemv_staged_row_defaults(monkeypatch):
    """Which m=1 plans stage the activation row (gemv/template.py's staged_row), and the checks of
    ``act_smem``: one row, the rows kernel, a row that fits 48 KB of shared memory. The 8-bit
    rule reads the SM count: an H200's 132 here, whatever GPU runs the test."""
    from bitblas import arch
    from bitblas.schedule.gemv import gemv_hint_unsupported
    monkeypatch.setattr(arch, "_LOCAL_SMS", [132])

    def hint(n=8192, k=8192, m=1, **kw):
        return default_hint(make_plan(MatmulConfig(N=n, K=k, **kw), "cuda", m))

    def staged(h):
        return isinstance(h, GEMVRowsHint) and h.act_smem
    g = dict(group_size=128, with_scaling=True)
    assert hint(A_dtype="float16", W_dtype="uint4", **g) == STAGED
    assert hint(A_dtype="bfloat16", W_dtype="uint4", with_zeros=True, out_dtype="bfloat16", **g) == STAGED
    assert hint(A_dtype="float16", W_dtype="fp4_e2m1", **g) == STAGED
    assert hint(A_dtype="float16", W_dtype="nf4", **g) == STAGED
    assert not staged(hint(k=14336, A_dtype="float16", W_dtype="nf4", **g))          # nf4 up to K=8192
    assert hint(A_dtype="float16", W_dtype="int2", **g) == GEMVHint(8, 4, 1, stages=2, min_blocks=4, act_smem=True)
    assert not staged(hint(n=6144, A_dtype="float16", W_dtype="int2", **g))          # 1-/2-bit from N=8192
    assert hint(A_dtype="float16", W_dtype="int8", with_scaling=True) == STAGED      # 16-row blocks: 97% of a wave
    assert not staged(hint(n=10240, A_dtype="float16", W_dtype="int8", with_scaling=True))
    assert not staged(hint(n=4096, A_dtype="float16", W_dtype="int8", with_scaling=True))
    i8 = dict(A_dtype="int8", with_scaling=True, with_act_scaling=True, group_size=128)
    assert hint(W_dtype="int2", **i8) == STAGED and not staged(hint(W_dtype="int4", **i8))
    # the staged row takes 2 bytes per value (4-bit codes): K=28672 does not fit 48 KB
    assert not staged(hint(n=4096, k=28672, A_dtype="float16", W_dtype="uint4", **g))
    assert not staged(hint(m=2, A_dtype="float16", W_dtype="uint4", **g))
    plan = make_plan(MatmulConfig(N=4096, K=28672, A_dtype="float16", W_dtype="uint4", **g), "cuda", 1)
    assert "57344 bytes of shared memory" in gemv_hint_unsupported(plan, STAGED)
    plan2 = make_plan(MatmulConfig(N=4096, K=4096, A_dtype="float16", W_dtype="uint4", **g), "cuda", 2)
    assert "one activation row" in gemv_hint_unsupported(plan2, STAGED)
    with pytest.raises(ValueError, match="act_smem is an option of the rows kernel"):   # the one-hint spelling
        GEMVHint(32, k_warps=8, unroll=2, stages=2, mma=True, act_smem=True)


@pytest.mark.nvcc
@pytest.mark.parametrize("kw", [dict(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
                                dict(W_dtype="nf4", group_size=64, with_scaling=True),
                                dict(W_dtype="int8", with_scaling=True),
                                dict(W_dtype="uint1", group_size=128, with_scaling=True)],
                         ids=["u4-zeros", "nf4", "i8", "u1"])
def test_gemv_staged_row_codegen(kw):
    """The staged row: a shared buffer written once per block (16-byte stores, one barrier) and read
    in 16-byte words in the loop, no activation loads from global memory inside it; compiles."""
    from bitblas.build import cuda_source, find_nvcc, nvcc_resources
    plan = make_plan(MatmulConfig(N=1000, K=1536, A_dtype="float16", **kw), "cuda", 1)
    hint = GEMVHint(8, 4, 1, stages=2, min_blocks=4, act_smem=True) if plan.w.bits == 1 else STAGED
    src = cuda_source(plan, "sm_90", hint)
    body = src[src.index("void __launch_bounds__"):]
    assert "__shared__" in body and body.count("tvm_builtin_cuda_cta_sync();") == 1
    sync = body.index("tvm_builtin_cuda_cta_sync();")
    assert "bb_sts4(" in body[:sync] and "bb_sts4(" not in body[sync:]
    assert "bb_lds4(" in body[sync:] and "A_ptr[" not in body[sync:]
    if find_nvcc() is not None:
        res = nvcc_resources(src, "sm_90")
        assert res["registers"] <= 65536 // (32 * hint.warps * hint.min_blocks), res


@pytest.mark.nvcc
@pytest.mark.parametrize("w,rows,one_vector", [("uint4", 8, True), ("uint4", 4, False), ("nf4", 4, True),
                                               ("int8", 8, True)])
def test_gemv_interleaved_decode(w, rows, one_vector):
    """8+ channels per warp and the nf4 table decoder decode one weight vector at a time and use it
    at once (one decoded vector in registers; 8 channels of 4-bit codes spill without it), the
    other float kernels decode the vectors of all channels of a step first."""
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    plan = make_plan(MatmulConfig(N=4096, K=8192, W_dtype=w, group_size=128 if w != "int8" else -1,
                                  with_scaling=True), "cuda", 2)
    src = cuda_source(plan, "sm_90", GEMVHint(rows, 2, 4, stages=2, min_blocks=8))
    # one vector: 16 words of half pairs (4-bit codes) or 16 float32 values (8-bit codes)
    assert ("dq_ptr[16];" in src) == one_vector, src[src.find("dq_ptr["):][:20]
    if find_nvcc() is not None:
        assert nvcc_compile(src, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.parametrize("m,kw,hint", [
    (1, dict(W_dtype="uint4", group_size=128, with_scaling=True), None),
    (1, dict(W_dtype="int2", group_size=128, with_scaling=True, with_zeros=True), GEMVHint(8, 1, 4, stages=3, pdl=True)),
    (8, dict(W_dtype="uint4", group_size=128, with_scaling=True), None),
    (3, dict(W_dtype="int4", group_size=128, with_scaling=True), GEMVHint(2, k_warps=4, pdl=True))],
    ids=["rows-default", "rows-ring3", "mma-default", "ksplit"])
def test_gemv_pdl(m, kw, hint):
    """Programmatic dependent launch (sm_90 defaults): griddepcontrol.wait comes before every
    global access, the trigger after the last weight load (rows / tensor-core kernels) and before
    the output store; the launch parameters carry TVM's PDL tag; sm_80 targets refuse it."""
    from bitblas.build import cuda_source, cuda_target, find_nvcc, nvcc_compile
    from bitblas.schedule import schedule_cuda_gemv
    plan = make_plan(MatmulConfig(N=1000, K=1536, A_dtype="float16", **kw), "cuda", m)
    h90 = hint or default_hint(plan, cuda_target("sm_90"))
    assert h90.pdl and not default_hint(plan, cuda_target("sm_80")).pdl
    src = cuda_source(plan, "sm_90", hint)
    body = src[src.index("void __launch_bounds__"):]
    wait, trig = body.index("griddepcontrol_wait();"), body.index("griddepcontrol_launch_dependents();")
    first_access = min(body.index(t) for t in ("W_ptr[", "A_ptr[", "scale_ptr[", "output_ptr["))
    assert wait < first_access
    if not isinstance(hint, GEMVKSplitHint):
        assert body.rindex("W_ptr[") < trig < body.index("output_ptr[")
    mod = schedule_cuda_gemv(None, plan, h90, cuda_target("sm_90"))
    assert "tirx.use_programtic_dependent_launch" in [str(t) for t in mod["main"].attrs["tirx.kernel_launch_params"]]
    with pytest.raises(ValueError, match="pdl"):
        cuda_source(plan, "sm_80", h90)
    if find_nvcc() is not None:
        assert nvcc_compile(src, "sm_90")


CODEGEN_CASES = [(1, 1000, 1536, None), (3, 256, 512, GEMVHint(2, k_warps=4)), (16, 1000, 1536, None),
                 (1, 256, 512, GEMVHint(4, 1, 1, stages=4))]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("fmt", CODEGEN_FORMATS)
def test_gemv_table_codegen(fmt, arch):
    """The table decoders compile with nvcc at 1, 3 and 16 rows, for the rows, k-split and ring kernels."""
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    for m, n, k, hint in CODEGEN_CASES:
        cfg = MatmulConfig(N=n, K=k, **TABLE_FORMATS[fmt])
        plan = make_plan(cfg, "cuda", m)
        src = cuda_source(plan, arch, hint)
        assert "bb_dec_" in src and ("lop3.b32" in src or "prmt.b32" in src or "__byte_perm" in src)
        if plan.w.global_scale:           # nvfp4: its block scales per vector (e4m3f) or two per vector (dsb)
            assert "global_scale" in src and ("bb_e4m3f(" in src or "bb_dsb_" in src)
        assert nvcc_compile(src, arch), (fmt, m, n, k, hint)
