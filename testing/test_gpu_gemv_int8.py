"""The GEMV template with int8 activations (bitblas/schedule/gemv/ + int8.py): packed
int/uint weights decoded to bytes, dp4a with exact int32 sums, group scales in float32, per-channel
scale x per-token activation scale + bias at the store, int32 output without scales.

GPU tests: every int/uint weight format (1, 2, 4, 8 bits) x scale modes x a_scale / bias x output
dtype, at 1, 2, 5 and 16 rows, N and K with and without remainders, through ``bitblas.Matmul``
(which must pick the GEMV kernel); weight codes over their whole range and int8 activations
including -128, compared with the float64 reference (int32 outputs exactly); the kernel shapes
(rows, cp.async ring, vector widths, launch bounds) through explicit hints. CPU: routing, default
hints, refusals and the tuner's candidates; nvcc code generation for sm_80 / sm_90 (marked nvcc).
The decode and dot helpers are checked bit for bit in testing/test_gemv_decode.py.

    python -m pytest testing/test_gpu_gemv_int8.py -m gpu      # GPU
"""
from __future__ import annotations

import math
import random

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_source, cuda_target, find_nvcc, nvcc_compile
from bitblas.formats import FORMATS
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES, pack_weight
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import GEMVHint, GEMVKSplitHint, MMAHint, SimpleCUDAHint, WGMMAHint, gemv_unsupported
from bitblas.schedule.gemv import default_gemv_hint, gemv_hint_unsupported
from bitblas.kernels import default_hint
from kernel_helpers import H200_SPEC, TARGETS

_skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu(f):
    return pytest.mark.gpu(_skip(f))


WEIGHTS = ("int8", "uint8", "int4", "uint4", "int2", "uint2", "int1", "uint1")
_W = {w: ("i" if w.startswith("int") else "u") + w[-1] for w in WEIGHTS}     # int4 -> i4, uint8 -> u8
VARIANTS = {
    "chan-as-bias-f16": dict(with_scaling=True, with_act_scaling=True, with_bias=True, out_dtype="float16"),
    "g128-bf16": dict(group_size=128, with_scaling=True, out_dtype="bfloat16"),
    "i32-bias": dict(with_bias=True, out_dtype="int32"),
}
EXTRA = {                                  # further combinations on a few formats
    "i4-g128-as-bias-f32": dict(W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True,
                                with_bias=True, out_dtype="float32"),
    "u2-chan-bf16": dict(W_dtype="uint2", with_scaling=True, out_dtype="bfloat16"),
    "i1-g64-as-f16": dict(W_dtype="int1", group_size=64, with_scaling=True, with_act_scaling=True),
    "i8-chan-as-bias-bf16": dict(W_dtype="int8", with_scaling=True, with_act_scaling=True, with_bias=True,
                                 out_dtype="bfloat16"),
    "u4-i32": dict(W_dtype="uint4", out_dtype="int32"),
}
CASES = {f"{_W[w]}-{v}": dict(W_dtype=w, **kw) for w in WEIGHTS for v, kw in VARIANTS.items()}
CASES.update(EXTRA)
ROWS = (1, 2, 5, 16)
SHAPES = ((1000, 1536), (4104, 8192))      # N no multiple of the rows per block; K=1536 leaves lanes idle


def _cfg(name, n=1000, k=1536):
    if name in F8_CASES:
        return MatmulConfig(N=n, K=k, A_dtype="float8_e4m3", **F8_CASES[name])
    return MatmulConfig(N=n, K=k, A_dtype="int8", **CASES[name])


# float8_e4m3 activations x 2- / 4-bit codes (W4A-fp8 / W2A-fp8): the m16n8k32 .e4m3 GEMV (sm_89+)
F8_CASES = {
    "w4afp8-g128-as-bias-f16": dict(W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True,
                                    with_bias=True),
    "w4afp8-u4-chan-as-bf16": dict(W_dtype="uint4", with_scaling=True, with_act_scaling=True, out_dtype="bfloat16"),
    "w2afp8-chan-as-f16": dict(W_dtype="int2", with_scaling=True, with_act_scaling=True),
    "w2afp8-u2-g256-f32": dict(W_dtype="uint2", group_size=256, with_scaling=True, out_dtype="float32"),
    "w4afp8-noscale-bias-f32": dict(W_dtype="int4", with_bias=True, out_dtype="float32"),   # sums past float16's range
}
F8_ROWS = (1, 3, 8, 9, 16, 17, 40, 64)


def _inputs(cfg, m, seed):
    """random_inputs' scales / a_scale / bias, with weight codes drawn over the format's whole range
    (without scales the quantizer would round the small random weights to 0) and int8 activations
    over -128..127 (per-token quantization never writes -128); float8_e4m3 activations: every finite
    byte (subnormals and +-448 included)."""
    inp = random_inputs(cfg, m, seed=seed)
    g = torch.Generator().manual_seed(seed)
    lo, hi = FORMATS[cfg.W_dtype].code_range
    inp["W"] = pack_weight(cfg, torch.randint(lo, hi + 1, (cfg.N, cfg.K), generator=g))["W"]
    if cfg.A_dtype == "float8_e4m3":
        b = torch.randint(0, 256, (m, cfg.K), generator=g, dtype=torch.int32).to(torch.uint8)
        inp["A"] = torch.where((b & 0x7F) == 0x7F, 0, b).to(torch.uint8).view(torch.float8_e4m3fn)   # no NaN byte
    else:
        inp["A"] = torch.randint(-128, 128, (m, cfg.K), generator=g, dtype=torch.int8)
    return inp


def _check(cfg, m, fn=None, plan=None):
    """Run ``bitblas.Matmul(cfg)`` (which must choose the GEMV kernel), or the built kernel ``fn``
    of ``plan``, on fresh inputs into a poisoned output; None or an error line naming the seed."""
    from bitblas.tune.tuner import kernel_args
    seed = random.randrange(2 ** 31)
    cpu = _inputs(cfg, m, seed)
    inputs = {k: v.cuda() for k, v in cpu.items()}
    dt = TORCH_DTYPES[cfg.out_dtype]
    out = torch.full((m, cfg.N), float("nan") if dt.is_floating_point else -12345, dtype=dt, device="cuda")
    if fn is None:
        op = bitblas.Matmul(cfg)
        op(**inputs, output=out)
        kplan = op._kernel("cuda", m)[0]
        assert kplan.m == op.plan("cuda", m).m and isinstance(default_hint(kplan, op.target), GEMVHint), \
            "GEMV kernel not selected"      # the rows kernel for m rows, or the tensor-core one of m's class
    else:
        fn(*kernel_args(plan, inputs, out))
    torch.cuda.synchronize()
    ref = reference_matmul(cfg, **cpu)
    if cfg.out_dtype == "int32":
        bad = int((out.cpu() != ref).sum())
        return f"m={m} seed={seed}: {bad} of {out.numel()} int32 outputs differ" if bad else None
    err, tol = relative_error(out.cpu(), ref), tolerance(cfg)
    return None if err <= tol else f"m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


# -- GPU -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m", ROWS, ids=[f"m{m}" for m in ROWS])
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", list(CASES))
@gpu
def test_gemv_int8(name, n, k, m):
    cfg = _cfg(name, n, k)
    plan, tgt = make_plan(cfg, "cuda", m), cuda_target()
    if isinstance(default_hint(plan, tgt), GEMVHint):
        why = _check(cfg, m)
    else:   # a plan whose default is not a GEMV: build the GEMV by its hint
        why = _check(cfg, m, build_plan(plan, tgt, default_gemv_hint(plan, tgt)), plan)
    assert why is None, f"{name}: {why}"


HINTS = {
    "r1w4u1": GEMVHint(1, 4, 1),
    "r4w2u4-mb8": GEMVHint(4, 2, 4, stages=2, min_blocks=8),
    "r8w1u4-mb8": GEMVHint(8, 1, 4, stages=2, min_blocks=8),
    "r2w4u2-s1": GEMVHint(2, 4, 2, stages=1),
    "r4w1u1-ring4": GEMVHint(4, 1, 1, stages=4),
    "r3w2u2-ring3": GEMVHint(3, 2, 2, stages=3),
    "r4w2u2-v8": GEMVHint(4, 2, 2, vec_bytes=8),
    "r2w2u4-v4": GEMVHint(2, 2, 4, vec_bytes=4),
}


@pytest.mark.parametrize("hint", list(HINTS))
@pytest.mark.parametrize("name", ["i4-chan-as-bias-f16", "i1-i32-bias", "u2-g128-bf16", "i8-chan-as-bias-f16"])
@gpu
def test_gemv_int8_hints(name, hint):
    """Every rows-kernel shape with int8 activations; vector widths that do not fit the format are
    skipped (int8 activations need >= 16 values per vector)."""
    from bitblas.schedule.gemv import vec_bytes
    h = HINTS[hint]
    cfg = _cfg(name)
    for m in (1, 5):
        plan = make_plan(cfg, "cuda", m)
        if vec_bytes(plan, h.vec_bytes) is None:
            pytest.skip(f"vec_bytes={h.vec_bytes} does not fit {name}")
        why = _check(cfg, m, build_plan(plan, cuda_target(), h), plan)
        assert why is None, f"{name} {h}: {why}"


@pytest.mark.parametrize("m", (1, 16))
@gpu
def test_gemv_int8_long_k_exact(m):
    """int32 sums at K=16384 with extreme codes (int8 x int8 up to 128 * 128 per product) stay exact."""
    cfg = MatmulConfig(N=512, K=16384, A_dtype="int8", W_dtype="int8", out_dtype="int32")
    why = _check(cfg, m)
    assert why is None, why


@gpu
def test_gemv_int8_misaligned_views():
    """A and W views that start off a 16-byte boundary: the operator realigns them for the 16-byte loads."""
    cfg = _cfg("i4-chan-as-bias-f16")
    cpu = _inputs(cfg, 3, seed=5)
    inputs = {k: v.cuda() for k, v in cpu.items()}

    from kernel_helpers import shifted_view as shifted
    A, W = shifted(inputs["A"]), shifted(inputs["W"])
    assert A.data_ptr() % 16 and W.data_ptr() % 16
    out = bitblas.Matmul(cfg)(**{**inputs, "A": A, "W": W})
    torch.cuda.synchronize()
    assert relative_error(out.cpu(), reference_matmul(cfg, **cpu)) <= tolerance(cfg)


MMA_ROWS = (3, 9, 16, 17, 40, 64)      # 17..64: chunks of 16 rows, one block per chunk and channel tile


@pytest.mark.parametrize("m", MMA_ROWS, ids=[f"m{m}" for m in MMA_ROWS])
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", list(CASES))
@gpu
def test_gemv_int8_mma(name, n, k, m):
    """The m16n8k32 tensor-core GEMV (gemv_mma_int8) by its default hint, every format x scale mode,
    at 3..16 rows and at 17..64 in chunks of 16 (40 rows by the 3..8-row tile; plans the chunked
    kernel refuses go elsewhere), fresh random inputs into a poisoned output (int32 outputs exactly)."""
    cfg = _cfg(name, n, k)
    plan, tgt = make_plan(cfg, "cuda", m), cuda_target()
    if m > 16 and gemv_unsupported(plan):
        assert "tensor-core kernel takes more than 16 rows" in gemv_unsupported(plan)
        pytest.skip(gemv_unsupported(plan))
    hint = default_gemv_hint(plan, tgt)
    if not hint.tensor_cores or m == 40:               # few rows default to the rows kernel: the 3..8-row tile
        from bitblas.schedule.gemv.mma_int8 import mma_int8_unsupported
        hint = GEMVHint(32, k_warps=8, unroll=2, stages=2, mma=True, pdl=hint.pdl)
        why = mma_int8_unsupported(plan, hint)
        if why:
            pytest.skip(f"tensor-core GEMV refuses {name}: {why}")
    why = _check(cfg, m, build_plan(plan, tgt, hint), plan)
    assert why is None, f"{name} {hint}: {why}"


@pytest.mark.parametrize("m", F8_ROWS, ids=[f"m{m}" for m in F8_ROWS])
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("name", list(F8_CASES))
@gpu
def test_gemv_f8_mma(name, n, k, m):
    """float8_e4m3 activations on the GEMV: through ``bitblas.Matmul`` where it serves the rows by
    default (1..16 on sm_90, 1..64 on sm_89: one row the staged rows kernel converting the row to
    float16 pairs where it takes the plan, else the m16n8k32 .e4m3 kernel), else its default hint
    built directly (17..64, the chunk loop); fresh random codes over their range and any finite
    e4m3 activation byte, into a poisoned output."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 mma.sync needs sm_89+")
    cfg = _cfg(name, n, k)
    plan, tgt = make_plan(cfg, "cuda", m), cuda_target()
    from bitblas.schedule.gemv import gemv_default_takes
    if gemv_default_takes(plan, tgt):
        why = _check(cfg, m)
    else:
        hint = default_gemv_hint(plan, tgt)
        assert hint.tensor_cores and hint.chunk_loop, hint
        why = _check(cfg, m, build_plan(plan, tgt, hint), plan)
    assert why is None, f"{name}: {why}"


F8_ROWS_HINTS = {"r4w2u4s2": GEMVHint(rows_per_warp=4, warps=2, unroll=4, stages=2),
                 "r1w4u1s1-v8": GEMVHint(rows_per_warp=1, warps=4, unroll=1, vec_bytes=8, stages=1),
                 "r4w8u1s2-smem": GEMVHint(rows_per_warp=4, warps=8, unroll=1, stages=2, min_blocks=4, act_smem=True),
                 "r2w8u1s4-smem": GEMVHint(rows_per_warp=2, warps=8, unroll=1, stages=4, min_blocks=4, act_smem=True)}


@pytest.mark.parametrize("hint", list(F8_ROWS_HINTS))
@pytest.mark.parametrize("name", list(F8_CASES))
@gpu
def test_gemv_f8_rows_hints(name, hint):
    """float8_e4m3 activations on the rows kernel by explicit hints: the activations converted to
    float16 pairs per step (1 and 3 rows) or once into the staged row (1 row), N=1000, K=1536;
    float32 outputs are refused (float16 partial sums measured 5.0e-4 .. 6.6e-4 of max|ref| there,
    past the float8 tolerance of 5e-4 that the m16n8k32 kernel's float32 sums meet)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("cvt.rn.f16x2.e4m3x2 needs sm_89+")
    h = F8_ROWS_HINTS[hint]
    cfg = _cfg(name)
    if cfg.out_dtype == "float32":          # float16 partial sums: float32 outputs keep the m16n8k32 kernel
        assert "float32" in gemv_hint_unsupported(make_plan(cfg, "cuda", 1), h)
        pytest.skip("the rows kernel refuses float8 activations with a float32 output")
    for m in ((1,) if h.act_smem else (1, 3)):
        plan, tgt = make_plan(cfg, "cuda", m), cuda_target()
        why = _check(cfg, m, build_plan(plan, tgt, h), plan)
        assert why is None, f"{name} {hint} m={m}: {why}"


MMA_HINTS = {
    "r16k1u1s1": GEMVHint(rows_per_warp=16, k_warps=1, unroll=1, stages=1, mma=True),
    "r32k2u4s2": GEMVHint(rows_per_warp=32, k_warps=2, unroll=4, stages=2, mma=True),
    "r16k4u2s2": GEMVHint(rows_per_warp=16, k_warps=4, unroll=2, stages=2, mma=True),
    "r48k3u3s2": GEMVHint(rows_per_warp=48, k_warps=3, unroll=3, stages=2, mma=True),
    "r64k8u2s2": GEMVHint(rows_per_warp=64, k_warps=8, unroll=2, stages=2, mma=True),
    "r32k8u1s2-v8": GEMVHint(rows_per_warp=32, k_warps=8, unroll=1, stages=2, vec_bytes=8, mma=True),
}


@pytest.mark.parametrize("hint", list(MMA_HINTS))
@pytest.mark.parametrize("name", ["i4-chan-as-bias-f16", "i1-i32-bias", "u2-g128-bf16", "i8-chan-as-bias-f16",
                                  "i2-g128-bf16", "u8-i32-bias", "w4afp8-g128-as-bias-f16", "w2afp8-chan-as-f16"])
@pytest.mark.parametrize("k", [1536, 1664])
@gpu
def test_gemv_int8_mma_hints(name, hint, k):
    """Explicit tensor-core hints, k_warps 1..8 (K=1664 = 13 groups of 128: lanes past K for k_warps > 1);
    int8 and float8_e4m3 (mma.sync .e4m3, sm_89+) activations."""
    from bitblas.schedule.gemv.mma_int8 import mma_int8_unsupported
    h = MMA_HINTS[hint]
    cfg = _cfg(name, 1000, k)
    if cfg.A_dtype == "float8_e4m3" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 mma.sync needs sm_89+")
    for m in (3, 8, 9, 16):
        plan = make_plan(cfg, "cuda", m)
        if mma_int8_unsupported(plan, h):
            pytest.skip(mma_int8_unsupported(plan, h))
        why = _check(cfg, m, build_plan(plan, cuda_target(), h), plan)
        assert why is None, f"{name} {h}: {why}"


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("k", [1536, 1664])
@pytest.mark.parametrize("rpw", [32, 64])
@gpu
def test_gemv_int8_mma_chunk_loop(name, k, rpw):
    """chunk_loop on the m16n8k32 kernel: one block serves every 16-row chunk (the weights decoded
    once), every format x scale mode, class tops 32 / 64 at row counts inside their last chunk
    (run-time rows), K=1664 with lanes past K for the 4 K warps; int32 outputs exactly; 64 channels
    per warp (the default from N=16896 up to 32 / 48 rows): blocks past N=1000."""
    from bitblas.schedule.gemv.mma_int8 import mma_int8_unsupported
    h = GEMVHint(rows_per_warp=rpw, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1, chunk_loop=True)
    cfg = _cfg(name, 1000, k)
    for top, rows in ((32, (17, 32)), (64, (40, 64))):
        plan = make_plan(cfg, "cuda", top)
        if mma_int8_unsupported(plan, h):
            pytest.skip(mma_int8_unsupported(plan, h))
        fn = build_plan(plan, cuda_target(), h)
        for m in rows:
            why = _check(cfg, m, fn, plan)
            assert why is None, f"{name} {h} top={top}: {why}"


# -- no GPU needed ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("w", WEIGHTS)
def test_gemv_int8_selection(w, arch):
    """int8 activations at 1..16 static rows: the GEMV template (rows kernel at 1..2 rows, the
    m16n8k32 tensor-core GEMV from 3); at 17..64 rows the tensor-core GEMV in chunks of 16 rows
    where it takes the plan (8-bit codes: per channel up to 32 rows, with group scales not); above,
    or a symbolic M, the tensor-core / simple schedules."""
    target = cuda_target(TARGETS[arch])
    for kw in VARIANTS.values():
        cfg = MatmulConfig(N=1000, K=1536, A_dtype="int8", W_dtype=w, **kw)
        for m in (1, 7, 16):
            plan = make_plan(cfg, "cuda", m)
            assert gemv_unsupported(plan) is None, (w, kw, m)
            hint = default_hint(plan, target)
            first = 7 if w.endswith("8") or ("group_size" in kw and w.endswith("4")) else 4
            assert isinstance(hint, GEMVHint) and hint.tensor_cores == (m >= first), (w, kw, m, hint)   # m16n8k32
        op = bitblas.Matmul(cfg)     # the rows kernel per row count, the tensor-core one per class (8: 1..8)
        assert op.plan("cuda", 1).m == 1 and op.plan("cuda", 7).m == 8
        for m in (17, 33, 64):                # the m16n8k32 GEMV in chunks of 16 rows (8-bit codes up to 32)
            plan = make_plan(cfg, "cuda", m)
            hint = default_hint(plan, target)
            gemv = gemv_unsupported(plan) is None and (w[-1] != "8" or m <= 32)
            assert isinstance(hint, GEMVHint) == gemv and (not gemv or hint.tensor_cores), (w, kw, m, hint)
        for m in (65, None):
            hint = default_hint(make_plan(cfg, "cuda", m), target)
            assert isinstance(hint, (MMAHint, WGMMAHint, SimpleCUDAHint)), (w, kw, m, hint)
    cfg = MatmulConfig(N=1000, K=1536, A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True)
    assert isinstance(default_hint(make_plan(cfg, "cuda", 33), cuda_target(TARGETS["sm_90"])), WGMMAHint)
    assert isinstance(default_hint(make_plan(cfg, "cuda", 33), cuda_target(TARGETS["sm_80"])), MMAHint)
    assert default_hint(make_plan(cfg, "cuda", 32), cuda_target(TARGETS["sm_90"])) == GEMVHint(    # the chunk loop
        rows_per_warp=32, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1, pdl=True, chunk_loop=True)


def test_gemv_int8_default_hint():
    """The float rule's shapes: m <= 2 the rows kernel with launch bounds (2-bit and 1-bit: 8 channels
    per warp, 8-bit: 2, 4-bit: 4, all in 2-warp blocks), then the rows kernel up to 2 rows (3 for
    group-scaled 4-bit codes, 4 for group-scaled 8-bit) and the tensor-core kernel above (2 blocks
    per SM; from 9 rows 8 K warps x 4 vectors); PDL on sm_90."""
    def hint(w, m):
        return default_gemv_hint(make_plan(MatmulConfig(N=4096, K=4096, A_dtype="int8", W_dtype=w, group_size=128,
                                                       with_scaling=True), "cuda", m), cuda_target(TARGETS["sm_90"]))
    assert hint("int4", 1) == GEMVHint(rows_per_warp=4, warps=2, unroll=4, stages=2, min_blocks=8, pdl=True)
    assert hint("uint2", 2) == GEMVHint(rows_per_warp=8, warps=2, unroll=4, stages=2, min_blocks=8, pdl=True)
    # one row of 2-bit codes: the row staged in shared memory (gemv/template.py's staged_row)
    assert hint("uint2", 1) == GEMVHint(rows_per_warp=2, warps=8, unroll=1, stages=3, min_blocks=4, pdl=True,
                                        act_smem=True)
    assert hint("int8", 1) == GEMVHint(rows_per_warp=2, warps=2, unroll=4, stages=2, min_blocks=8, pdl=True)
    assert hint("int4", 3) == GEMVHint(rows_per_warp=4, warps=1, unroll=4, stages=2, pdl=True)
    assert hint("int8", 4) == GEMVHint(rows_per_warp=4, warps=1, unroll=4, stages=2, pdl=True)
    assert hint("int4", 4) == hint("int8", 5) == hint("int2", 3) == \
        GEMVHint(rows_per_warp=32, k_warps=8, unroll=2, stages=2, mma=True, min_blocks=2, pdl=True)
    assert hint("int4", 16) == GEMVHint(rows_per_warp=32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2,
                                        pdl=True)


def test_gemv_int8_refused(naming):
    """What the int8 path does not take is refused naming the field and the value."""
    from bitblas.schedule import schedule_cuda_gemv
    from bitblas.schedule.gemv import mma_gemv_unsupported
    odd = make_plan(MatmulConfig(N=1000, K=1544, A_dtype="int8", W_dtype="int4", with_scaling=True), "cuda", 1)
    assert "K=1544" in gemv_unsupported(odd)               # 1544 = 8 (mod 16): no 16-value vector
    one = make_plan(MatmulConfig(N=1000, K=1552, A_dtype="int8", W_dtype="uint1", out_dtype="int32"), "cuda", 1)
    assert "K=1552" in gemv_unsupported(one) and "32 for uint1" in gemv_unsupported(one)
    a4 = make_plan(MatmulConfig(N=1000, K=1536, A_dtype="int4", W_dtype="int4", with_scaling=True), "cuda", 1)
    assert "A_dtype='int4'" in gemv_unsupported(a4)
    plan = make_plan(_cfg("i4-chan-as-bias-f16"), "cuda", 4)
    with naming(ValueError, "k_warps"):
        schedule_cuda_gemv(None, plan, GEMVHint(2, k_warps=4))
    with naming(ValueError, "rows_per_warp=8"):                # the int8 tensor-core kernel's tile rule
        schedule_cuda_gemv(None, plan, GEMVHint(8, k_warps=4, mma=True))
    assert "A_dtype='int8'" in mma_gemv_unsupported(plan, GEMVHint(32, k_warps=4, mma=True))   # the float one
    with pytest.raises(ValueError, match="vec_bytes=4"):      # 8 int4 values: below one 16-byte activation load
        schedule_cuda_gemv(None, plan, GEMVHint(2, 2, 2, vec_bytes=4))


def test_gemv_int8_tuner_candidates():
    """The tuner offers the rows and tensor-core kernels for int8 activations (no k-split), and the
    cost model refuses the k-split."""
    from bitblas.tune.space import estimate
    from bitblas.tune.space import candidates
    cfg = _cfg("i4-chan-as-bias-f16")
    cands = candidates(cfg, "cuda", 4, H200_SPEC)
    gemv = [c.hint for c in cands if isinstance(c.hint, GEMVHint)]
    assert gemv and not any(isinstance(h, GEMVKSplitHint) for h in gemv) and any(h.tensor_cores for h in gemv)
    assert all(h.vec_bytes in (0, 8, 16) for h in gemv)
    plan = make_plan(cfg, "cuda", 4)
    assert math.isfinite(estimate(plan, GEMVHint(4, 1, 4), 4, H200_SPEC))
    assert math.isinf(estimate(plan, GEMVHint(4, k_warps=4), 4, H200_SPEC))
    assert math.isfinite(estimate(plan, GEMVHint(32, k_warps=4, mma=True), 4, H200_SPEC))
    # 17..64 rows: only the tensor-core kernel (chunks of 16 rows); its cost grows with the chunks
    gemv32 = [c for c in candidates(cfg, "cuda", 32, H200_SPEC) if isinstance(c.hint, GEMVHint)]
    assert gemv32 and all(c.hint.tensor_cores and c.plan_m == 32 for c in gemv32)
    assert not [c for c in candidates(cfg, "cuda", 128, H200_SPEC) if isinstance(c.hint, GEMVHint)]
    tile = GEMVHint(32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2)
    cost = [estimate(make_plan(cfg, "cuda", m), tile, m, H200_SPEC) for m in (16, 32, 64)]
    assert cost[0] < cost[1] < cost[2], cost


# nvcc: every weight format x (scale mode, a_scale, bias, output dtype) x rows 1 / 3 / 16
CODEGEN = [(1, "chan-as-bias-f16"), (1, "g128-bf16"), (1, "i32-bias"),
           (3, "g128-as-bias-f16"), (3, "chan-bf16"), (3, "i32"),
           (16, "chan-as-bias-f16"), (16, "g128-bf16"), (16, "i32-bias")]
CODEGEN_VARIANTS = dict(VARIANTS, **{
    "g128-as-bias-f16": dict(group_size=128, with_scaling=True, with_act_scaling=True, with_bias=True),
    "chan-bf16": dict(with_scaling=True, out_dtype="bfloat16"),
    "i32": dict(out_dtype="int32"),
})


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("w", WEIGHTS)
def test_gemv_int8_codegen(w, arch):
    """The dp4a kernels compile with nvcc (N=1000, K=1536: remainders in N and in the lanes' K); from
    3 rows (where the default is the tensor-core kernel, testing/test_gemv_mma_int8.py) by the rows
    kernel's former default shapes."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    tgt = cuda_target(TARGETS[arch])
    for m, v in CODEGEN:
        plan = make_plan(MatmulConfig(N=1000, K=1536, A_dtype="int8", W_dtype=w, **CODEGEN_VARIANTS[v]), "cuda", m)
        hint = None if m < 3 else GEMVHint(4, 1, 4 if m <= 8 else 2, stages=2 if m <= 4 else 1, pdl=arch == "sm_90")
        src = cuda_source(plan, tgt, hint)
        assert "dp4a." in src and "bb_dec_i8_" in src, (w, m, v)
        if m == 1:              # 2-bit codes stage the row in 8-warp blocks (4 per SM), the others 8 2-warp blocks
            bounds = "(256, 4)" if plan.w.bits == 2 else "(64, 8)"
            assert f"__launch_bounds__{bounds}" in src, (w, v, src[src.find("__launch_bounds__"):][:30])
        assert nvcc_compile(src, arch), (w, m, v)
