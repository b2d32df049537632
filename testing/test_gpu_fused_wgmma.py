"""The fused mixed-input wgmma GEMM (``FusedWgmmaHint``, bitblas/schedule/fused_wgmma.py) on an
sm_90 GPU: uint4 g128 (with and without float zeros), int4 g128, uint2 g128 and uint8 g128 weights
x rows {65, 100, 128, 257, 1024} (off the row tile, one symbolic kernel per tile) x N=1000, K=1536
(N off the channel tile), each tile shape (row tiles 64 / 128 / 256, 1 / 2 channel tiles, 1 / 2
warpgroups side by side in N or splitting K, weights in registers or staged in shared
memory); N = K = 8192 at 128 rows; K off the slab (N=8192, K=1000): refused, and a Matmul told
to use it falls back to its default kernel, still correct; a dynamic-M Matmul with the hint forced
for rows past the GEMV; the table formats (nf4, fp4_e2m1, float8_e4m3 / e5m2, nvfp4) in the default tiles
at 128, 300 and 1024 rows, and through a default Matmul across the GEMV / fused boundary; int8 activations
(W4A8 / W2A8) and float8_e4m3 ones (W4A-fp8 / W2A-fp8, from one row as tuned) in their tiles and through default
operators. Fresh random inputs, outputs poisoned with NaN, the float64 reference and the tolerance table.

    python -m pytest testing/test_gpu_fused_wgmma.py -m gpu
"""
from __future__ import annotations

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_target
from bitblas.plan import make_plan
from bitblas.schedule import FusedWgmmaHint
from bitblas.schedule.fused_wgmma import fused_wgmma_unsupported
from kernel_helpers import WGMMA_TABLE_FORMATS, check_kernel

_skip = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                           reason="needs an sm_90 GPU")


def gpu(f):
    return pytest.mark.gpu(_skip(f))


FORMATS = {
    "u4-g128": dict(W_dtype="uint4", group_size=128, with_scaling=True),
    "u4-g128-zeros": dict(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
    "i4-g128": dict(W_dtype="int4", group_size=128, with_scaling=True),
    "u2-g128": dict(W_dtype="uint2", group_size=128, with_scaling=True),
    "u8-g128": dict(W_dtype="uint8", group_size=128, with_scaling=True),
}
HINTS = {
    "t128": FusedWgmmaHint(row_tile=128, stages=4),
    "t256w2": FusedWgmmaHint(row_tile=256, warpgroups=2),
    "t128c2": FusedWgmmaHint(row_tile=128, channel_tiles=2),
    "t64c2w2": FusedWgmmaHint(row_tile=64, channel_tiles=2, warpgroups=2, stages=1),
    "t128w2k": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4),
    # overlap: two decoded register sets, the next slab decoded while the wgmma of this one run
    "t128-ov": FusedWgmmaHint(row_tile=128, stages=4, overlap=True),
    "t256w2-ov": FusedWgmmaHint(row_tile=256, warpgroups=2, overlap=True),
    "t128w2k-ov": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True),
    "t128w2k-ov4": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True, stages=4, ring=4),
    # w_smem: weight vectors and raw scales staged by cp.async in a shared-memory ring (split-K defaults)
    "t128w2k-ws": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, w_smem=True),
    "t256w2k-ws": FusedWgmmaHint(row_tile=256, warpgroups=2, split_k=True, stages=4, w_smem=True),
    # every tile above takes the last row tile's boxes from a map of just its rows (tail_box, the
    # default); these, boxes partly out of bounds (zeros read past the rows)
    "t128w2k-ov4-notail": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True, stages=4, ring=4,
                                         tail_box=False),
    "t256w2-notail": FusedWgmmaHint(row_tile=256, warpgroups=2, tail_box=False),
    # k_ctas=2: a 2-CTA cluster per tile splitting K, the sums met through distributed shared memory
    "t128w2k-ov4-kc2": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True, stages=4, ring=4,
                                      k_ctas=2),
    "t128w2k-ws-kc2": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, w_smem=True, k_ctas=2),
    "t128-kc2": FusedWgmmaHint(row_tile=128, stages=4, k_ctas=2),
    "t256w2-kc2": FusedWgmmaHint(row_tile=256, warpgroups=2, k_ctas=2),
}
ROWS = (65, 100, 128, 257, 1024)


def _cfg(name, N, K, **kw):
    return MatmulConfig(N=N, K=K, **{"A_dtype": "float16", **FORMATS[name], **kw})


def _check(cfg, hint, rows):
    plan = make_plan(cfg, "cuda", None)
    why = fused_wgmma_unsupported(plan, hint)
    assert why is None, why
    fn = build_plan(plan, cuda_target(), hint)
    return [e for e in (check_kernel(cfg, plan, fn, m) for m in rows) if e]


def _check_operator(op, cfg, rows, name=""):
    """``op`` (a Matmul of ``cfg``) at each row count: fresh random inputs, the output poisoned with
    NaN, within the tolerance table of the float64 reference."""
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    for m in rows:
        inp = random_inputs(cfg, m, device="cuda")
        out = torch.full((m, cfg.N), float("nan"), dtype=getattr(torch, cfg.out_dtype), device="cuda")
        op(**inp, output=out)
        err = relative_error(out, reference_matmul(cfg, **inp))
        assert err <= tolerance(cfg), (name, m, err)


def _forced(cfg, hint):
    """A dynamic-M operator of ``cfg`` whose bucket above 64 rows names ``hint`` (the tuned path)."""
    import bitblas
    from bitblas.dispatch import BucketTable
    op = bitblas.Matmul(cfg)
    op._buckets = BucketTable((64, 4096))
    op._tuned["cuda"] = {4096: (None, hint)}
    return op


# uint2 with 2 channel tiles of n128 would spill, as would its two decoded slabs with overlap=True at
# n256; and its slab of 4 boxes leaves no room for the 2 slabs overlap=True keeps in the ring of t128 and
# t128w2k (refused: test_fused_wgmma.py)
REFUSED = {("u2-g128", "t128c2"), ("u2-g128", "t128-ov"), ("u2-g128", "t128w2k-ov"), ("u2-g128", "t256w2-ov"),
           ("u2-g128", "t128w2k-ov4"), ("u2-g128", "t256w2k-ws"), ("u2-g128", "t128w2k-ov4-notail"),
           ("u2-g128", "t128w2k-ov4-kc2"), ("u2-g128", "t128w2k-ws-kc2"), ("u2-g128", "t256w2-kc2")}
CASES = [(name, hk) for name in FORMATS for hk in HINTS if (name, hk) not in REFUSED]


@pytest.mark.parametrize("name,hk", CASES)
@gpu
def test_fused_formats(name, hk):
    """N=1000, K=1536: one kernel (symbolic rows) per format x tile, run at 65..1024 rows."""
    errors = _check(_cfg(name, 1000, 1536), HINTS[hk], ROWS)
    assert not errors, errors


@pytest.mark.parametrize("name,hk", [(name, hk) for name in FORMATS
                                     for hk in ("t128", "t256w2", "t128w2k", "t256w2-ov", "t128w2k-ov",
                                                "t128w2k-ov4", "t128w2k-ws", "t256w2k-ws", "t128w2k-ov4-kc2",
                                                "t128w2k-ws-kc2")
                                     if (name, hk) not in REFUSED])
@gpu
def test_fused_8192(name, hk):
    """N = K = 8192 at 128 rows (the issue's shape), the 128- and 256-row tiles."""
    errors = _check(_cfg(name, 8192, 8192), HINTS[hk], (128,))
    assert not errors, errors


TABLE_FORMATS = WGMMA_TABLE_FORMATS


# each format in one of the two default tiles (256-row tiles of two warpgroups side by side; 128-row
# tiles of two warpgroups splitting K), nf4 (its own activation order) in both
TABLE_CASES = [(name, "t128w2k" if i % 2 else "t256w2") for i, name in enumerate(TABLE_FORMATS)
               if "nvfp4" not in name] + [
    ("nf4-g128", "t128w2k"), ("bf16-nf4-chan-bias", "t256w2"),
    # nvfp4 in the default tiles of 4-bit codes (overlap=True) and one without overlap
    ("nvfp4", "t128w2k-ov4"), ("bf16-nvfp4-bias", "t256w2-ov"), ("nvfp4", "t256w2"),
    # w_smem (the split-K defaults without overlap): nvfp4's pair of float8 block scales, 1-byte
    # float8 codes, float32 output
    ("nvfp4", "t256w2k-ws"), ("bf16-e4m3-g128", "t128w2k-ws"), ("bf16-fp4-noscale-f32", "t128w2k-ws")]


@pytest.mark.parametrize("name,hk", TABLE_CASES)
@gpu
def test_fused_table_formats(name, hk):
    """N=1000, K=1536: one kernel (symbolic rows) per table format and default tile, run at 128,
    300 and 1024 rows."""
    cfg = MatmulConfig(N=1000, K=1536, **{"A_dtype": "float16", **TABLE_FORMATS[name]})
    errors = _check(cfg, HINTS[hk], (128, 300, 1024))
    assert not errors, errors


@gpu
def test_fused_nvfp4_8192():
    """nvfp4, N = K = 8192 (64 slabs per warpgroup: whole unrolled overlap bodies) in the default
    tile for 128 rows, run at 128 and 200 rows."""
    from bitblas.schedule.fused_wgmma import fused_default
    cfg = MatmulConfig(N=8192, K=8192, A_dtype="float16", **TABLE_FORMATS["nvfp4"])
    hint = fused_default(make_plan(cfg, "cuda", None), 128)
    assert hint is not None and hint.overlap, hint
    errors = _check(cfg, hint, (128, 200))
    assert not errors, errors


@pytest.mark.parametrize("name", ["nf4-g128", "e4m3-chan", "nvfp4"])
@gpu
def test_table_formats_through_matmul(name):
    """A dynamic-M operator (N=8192, K=1024) of a table format with default kernels on sm_90: the
    wgmma GEMV where it takes the rows (nf4, nvfp4: 17..64; float8: above 48), the fused GEMM past
    the GEMV (128..1024 rows), correct at every row count across the boundary."""
    import bitblas
    cfg = MatmulConfig(M=None, N=8192, K=1024, **{"A_dtype": "float16", **TABLE_FORMATS[name]})
    op = bitblas.Matmul(cfg)
    _check_operator(op, cfg, (17, 33, 64, 128, 300, 1024))
    used = {c.template for kind, c in op._kernels if kind == "cuda"}
    assert {"gemv-wgmma", "fused-wgmma"} <= used, used


# int8 activations (per-token scales) x 2- / 4-bit codes: group scales of whole slabs (promoted per
# slab) or per-channel ones (at the store); with group scales the tiles its two sets of sums allow
# (<= 128-row tiles of one channel tile, 64-row tiles of two), per-channel also 256-row tiles and two
# 128-row channel tiles
I8_FORMATS = {
    "w4a8-g128": dict(W_dtype="int4", group_size=128),
    "w4a8-u4-g128": dict(W_dtype="uint4", group_size=128),
    "w4a8-g256-bias": dict(W_dtype="int4", group_size=256, with_bias=True),
    "w4a8-chan": dict(W_dtype="int4"),
    "w2a8-chan": dict(W_dtype="int2"),
    "w2a8-u2-chan-f32": dict(W_dtype="uint2", out_dtype="float32"),
}
I8_HINTS = {
    "t128": FusedWgmmaHint(row_tile=128, stages=4),
    "t128w2": FusedWgmmaHint(row_tile=128, warpgroups=2),
    "t128w2k": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4),
    "t64c2w2k": FusedWgmmaHint(row_tile=64, channel_tiles=2, warpgroups=2, split_k=True, stages=2),
    # per-channel scales only (one set of sums through the loop)
    "t256w2": FusedWgmmaHint(row_tile=256, warpgroups=2),
    "t128c2w2k": FusedWgmmaHint(row_tile=128, channel_tiles=2, warpgroups=2, split_k=True),
    # the split-K default up to 128 rows: weights staged by cp.async (w_smem), a ring of 4 boxes
    "t128w2k-ws": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4, w_smem=True),
    "t128w2k-ws-kc2": FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4, w_smem=True,
                                     k_ctas=2),
}
I8_PER_CHANNEL_ONLY = {"t256w2", "t128c2w2k"}


def _i8cfg(name, N, K, **kw):
    return MatmulConfig(N=N, K=K, **{"A_dtype": "int8", "with_scaling": True, "with_act_scaling": True,
                                     "out_dtype": "float16", **I8_FORMATS[name], **kw})


@pytest.mark.parametrize("name,hk", [(n, h) for n in I8_FORMATS for h in I8_HINTS
                                     if not (h in I8_PER_CHANNEL_ONLY and "group_size" in I8_FORMATS[n])
                                     and not (h.endswith("kc2") and "2" in I8_FORMATS[n]["W_dtype"])])
@gpu
def test_fused_int8(name, hk):
    """int8 activations, N=1000, K=1536: one kernel (symbolic rows) per format x tile, 65..1024 rows."""
    errors = _check(_i8cfg(name, 1000, 1536), I8_HINTS[hk], ROWS)
    assert not errors, errors


@pytest.mark.parametrize("hk", ["t128", "t128w2k", "t128w2k-ws"])
@gpu
def test_fused_int8_8192(hk):
    """W4A8 g128, N = K = 8192 at 128 and 4096 rows."""
    errors = _check(_i8cfg("w4a8-g128", 8192, 8192), I8_HINTS[hk], (128, 4096))
    assert not errors, errors


@pytest.mark.parametrize("name", ["w4a8-g128", "w2a8-chan"])
@gpu
def test_int8_default_kernels(name):
    """A dynamic-M int8-activation operator (N=8192, K=2048) with its default kernels on sm_90: the
    GEMV up to 64 rows, the fused GEMM past it (up to 1024 rows; per-channel in three tiles),
    decode-then-GEMM above; correct at every row count across the boundaries."""
    import bitblas
    cfg = _i8cfg(name, 8192, 2048, M=None)
    op = bitblas.Matmul(cfg)
    _check_operator(op, cfg, (64, 65, 128, 129, 256, 257, 1024, 1025))
    used = {c.template for kind, c in op._kernels if kind == "cuda"}
    assert {"fused-wgmma", "dequant-gemm"} <= used, used


# float8_e4m3 activations (per-token scales) x 2- / 4-bit codes (W4A-fp8, W2A-fp8): two sets of sums
# always (each slab's float8 sums promoted), so the tiles of int8 with group scales; from one row (a
# tuned bucket's kernel; untuned, the m16n8k32 GEMV serves 1..16 rows)
F8_FORMATS = {
    "w4afp8-g128": dict(W_dtype="int4", group_size=128),
    "w4afp8-u4-g256-bias": dict(W_dtype="uint4", group_size=256, with_bias=True, out_dtype="bfloat16"),
    "w4afp8-chan": dict(W_dtype="int4"),
    "w2afp8-chan": dict(W_dtype="int2"),
    "w2afp8-u2-g256-f32": dict(W_dtype="uint2", group_size=256, out_dtype="float32"),
}
F8_HINTS = {k: I8_HINTS[k] for k in ("t128", "t128w2", "t128w2k", "t64c2w2k", "t128w2k-ws")}


def _f8cfg(name, N, K, **kw):
    return MatmulConfig(N=N, K=K, **{"A_dtype": "float8_e4m3", "with_scaling": True, "with_act_scaling": True,
                                     "out_dtype": "float16", **F8_FORMATS[name], **kw})


@pytest.mark.parametrize("name,hk", [(n, h) for n in F8_FORMATS for h in F8_HINTS])
@gpu
def test_fused_fp8(name, hk):
    """float8 activations, N=1000, K=1536: one kernel (symbolic rows) per format x tile, 1..1024 rows."""
    errors = _check(_f8cfg(name, 1000, 1536), F8_HINTS[hk], (1, 7, 16, 17) + ROWS)
    assert not errors, errors


@gpu
def test_fused_fp8_8192():
    """W4A-fp8 g128, N = K = 8192 at 1, 128 and 4096 rows."""
    errors = _check(_f8cfg("w4afp8-g128", 8192, 8192), F8_HINTS["t128w2k"], (1, 128, 4096))
    assert not errors, errors


@pytest.mark.parametrize("name", ["w4afp8-g128", "w2afp8-chan"])
@gpu
def test_fp8_default_kernels(name):
    """A dynamic-M float8-activation operator (N=8192, K=2048) with its default kernels on sm_90: the
    m16n8k32 GEMV up to 16 rows, the fused GEMM up to 1024, decode-then-GEMM (the float8 wgmma GEMM)
    above."""
    import bitblas
    cfg = _f8cfg(name, 8192, 2048, M=None)
    op = bitblas.Matmul(cfg)
    _check_operator(op, cfg, (1, 16, 17, 64, 65, 128, 256, 1024, 1025, 2048))
    used = {c.template for kind, c in op._kernels if kind == "cuda"}
    assert {"gemv-mma", "fused-wgmma", "dequant-gemm"} <= used, used


@gpu
def test_fused_k_off_slab_falls_back():
    """N=8192, K=1000 (no whole slab): the fused kernel refuses the plan (naming K); a Matmul whose
    bucket names it warns and serves the rows with its default kernel, correct."""
    for name in ("u4-g128", "u2-g128", "u8-g128", "nf4", "e4m3"):
        cfg = (_cfg(name, 8192, 1000, M=None, group_size=-1) if name in FORMATS else
               MatmulConfig(M=None, N=8192, K=1000, A_dtype="float16", with_scaling=True,
                            W_dtype={"nf4": "nf4", "e4m3": "float8_e4m3"}[name]))
        hint = HINTS["t128"]
        why = fused_wgmma_unsupported(make_plan(cfg, "cuda", None), hint)
        assert why is not None and "K=1000" in why, why
        _check_operator(_forced(cfg, hint), cfg, ROWS, name)


@pytest.mark.parametrize("case", ["u4-g128-zeros", "w4a8-g128"])
@gpu
def test_fused_through_matmul(case):
    """A dynamic-M operator whose bucket above 64 rows names the fused kernel (float16 and int8
    activations): correct at GEMV row counts (its default kernels) and past them (one fused kernel,
    symbolic in the rows)."""
    if case in FORMATS:
        cfg, hint = _cfg(case, 1000, 1536, M=None), HINTS["t256w2"]
    else:
        cfg, hint = _i8cfg(case, 1000, 1536, M=None), I8_HINTS["t128w2k"]
    op = _forced(cfg, hint)
    _check_operator(op, cfg, (17, 64, 65, 100, 257, 1024, 4100))
    fused = [c for kind, c in op._kernels if kind == "cuda" and c.hint == hint]      # (kind, KernelChoice)
    assert len(fused) == 1 and fused[0].rows is None, list(op._kernels)


# permute=False: the activations as given (no permute kernel, no temporary), the codes moved in
# registers: the 4-bit int / uint formats in both code orders, nf4 and fp4_e2m1, float16 and bfloat16
# activations
NAT_FORMATS = {
    "u4-g128": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True),
    "u4-g128-plain": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, fast_decoding=False),
    "i4-g128-zeros": dict(A_dtype="float16", W_dtype="int4", group_size=128, with_scaling=True, with_zeros=True),
    "u4-chan-bias": dict(A_dtype="float16", W_dtype="uint4", with_scaling=True, with_bias=True),
    "bf16-u4-qzeros": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=256, with_scaling=True, with_zeros=True,
                           zeros_mode="quantized", out_dtype="bfloat16"),
    # table codes: nf4 (16-entry prmt lookup), fp4_e2m1 (bit placement after a nibble unzip)
    "nf4-g128": dict(A_dtype="float16", W_dtype="nf4", group_size=128, with_scaling=True),
    "fp4-g128": dict(A_dtype="float16", W_dtype="fp4_e2m1", group_size=128, with_scaling=True),
    "bf16-fp4-chan-bias": dict(A_dtype="bfloat16", W_dtype="fp4_e2m1", with_scaling=True, with_bias=True,
                               out_dtype="bfloat16"),
    # nvfp4: a quad's float8 block scales gathered by shuffles (natural_block_scale_helper)
    "nvfp4": dict(A_dtype="float16", W_dtype="nvfp4", group_size=16, with_scaling=True),
    "bf16-nvfp4-bias": dict(A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True, with_bias=True,
                            out_dtype="bfloat16"),
    # 8-bit codes: 16-bit halves gathered per destination lane, the 8-bit pair decoders
    "u8-g128": dict(A_dtype="float16", W_dtype="uint8", group_size=128, with_scaling=True),
    "i8-chan": dict(A_dtype="float16", W_dtype="int8", with_scaling=True),
    "bf16-e4m3-chan": dict(A_dtype="bfloat16", W_dtype="float8_e4m3", with_scaling=True, out_dtype="bfloat16"),
    "e5m2-g128": dict(A_dtype="float16", W_dtype="float8_e5m2", group_size=128, with_scaling=True),
    # 2-bit codes: groups of half a slab, each half's scale and offset gathered per quad
    "u2-g128": dict(A_dtype="float16", W_dtype="uint2", group_size=128, with_scaling=True),
    "i2-g128-zeros-plain": dict(A_dtype="float16", W_dtype="int2", group_size=128, with_scaling=True, with_zeros=True,
                                fast_decoding=False),
    "bf16-u2-qzeros-g384": dict(A_dtype="bfloat16", W_dtype="uint2", group_size=384, with_scaling=True,
                                with_zeros=True, zeros_mode="quantized", out_dtype="bfloat16"),
    "i2-chan-bias": dict(A_dtype="float16", W_dtype="int2", with_scaling=True, with_bias=True),
}
NAT_HINTS = ("t128", "t256w2", "t128w2k-ov4", "t256w2-ov", "t128w2k-ov4-notail", "t128w2k-ws-kc2")


_TWO_BIT = [n for n, f in NAT_FORMATS.items() if f["W_dtype"] in ("uint2", "int2")]
# 2-bit codes with overlap would spill (register_words); they run the split-K tile without it instead
NAT_CASES = ([(n, h) for n in NAT_FORMATS for h in NAT_HINTS if not (n in _TWO_BIT and "-ov" in h)]
             + [(n, "t128w2k-ws") for n in _TWO_BIT])


@pytest.mark.parametrize("name,hk", NAT_CASES)
@gpu
def test_fused_natural(name, hk):
    """permute=False, N=1000, K=1536 (K=2048 for groups of 256, 3072 for 2-bit codes in clusters):
    one kernel per format x tile, run at 65..1024 rows."""
    from dataclasses import replace
    K = 3072 if name in _TWO_BIT and "kc2" in hk else 2048 if NAT_FORMATS[name].get("group_size") == 256 else 1536
    cfg = MatmulConfig(N=1000, K=K, **NAT_FORMATS[name])
    errors = _check(cfg, replace(HINTS[hk], permute=False), ROWS)
    assert not errors, errors


@pytest.mark.parametrize("name", ["u4-g128", "nvfp4", "i8-chan", "u2-g128"])
@gpu
def test_fused_natural_8192(name):
    """permute=False at N = K = 8192, 128 and 256 rows (the default split-K tile and a 256-row tile),
    against the reference."""
    from dataclasses import replace
    cfg = MatmulConfig(N=8192, K=8192, **NAT_FORMATS[name])
    for hk in ("t128w2k-ws" if name in _TWO_BIT else "t128w2k-ov4", "t256w2"):
        errors = _check(cfg, replace(HINTS[hk], permute=False), (128, 256))
        assert not errors, errors


@pytest.mark.parametrize("name", ["u4-g128", "bf16-u4-qzeros", "nf4-g128", "fp4-g128", "nvfp4", "u8-g128",
                                  "bf16-e4m3-chan", "u2-g128", "i2-g128-zeros-plain"])
@gpu
def test_natural_default_through_matmul(name):
    """An untuned dynamic-M operator takes permute=False in its split-K tiles (fused_default; nvfp4, 2-
    and 8-bit codes up to the channels measured faster: run at 4096): correct across the GEMV / fused boundary and
    past the split-K rows, with activations off the 16-byte boundary too (the operator realigns them:
    TMA reads them as given), and its 128-row kernel is the natural-order one."""
    import bitblas
    from kernel_helpers import shifted_view
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    # nvfp4 / 2- / 8-bit codes: natural up to N = 4096 / 6144 / 4096 (_natural_max_n); run at 4096 channels
    clustered = name in ("nvfp4", "u8-g128", "bf16-e4m3-chan", "u2-g128", "i2-g128-zeros-plain")
    if clustered and torch.cuda.get_device_properties(0).multi_processor_count < 128:
        pytest.skip("64 tiles run as clusters on >= 128 SMs")
    cfg = MatmulConfig(M=None, N=4096 if clustered else 8192, K=2048, **NAT_FORMATS[name])
    op = bitblas.Matmul(cfg)
    assert op.choice("cuda", 128).hint.permute is False
    _check_operator(op, cfg, (64, 65, 128, 200, 256, 1024), name)
    inp = random_inputs(cfg, 128, device="cuda")
    out = torch.full((128, cfg.N), float("nan"), dtype=getattr(torch, cfg.out_dtype), device="cuda")
    op(**{**inp, "A": shifted_view(inp["A"])}, output=out)
    assert relative_error(out, reference_matmul(cfg, **inp)) <= tolerance(cfg)


@pytest.mark.parametrize("name,N", [("u2-g128", 8192), ("i2-g128-zeros-plain", 4096), ("i8-chan", 4096),
                                    ("bf16-e4m3-chan", 4096), ("nf4-g128", 8192), ("fp4-g128", 4096)])
@gpu
def test_wide_natural_default_through_matmul(name, N):
    """Past the split-K rows, the tiles side by side of an untuned dynamic-M operator take natural K
    order up to the channels measured faster (_natural_max_n, side by side): its 1024-row kernel is the natural
    one, correct from 257 to 1024 rows."""
    import bitblas
    cfg = MatmulConfig(M=None, N=N, K=2048, **NAT_FORMATS[name])
    op = bitblas.Matmul(cfg)
    h = op.choice("cuda", 1024).hint
    assert (h.split_k, h.permute) == (False, False), h
    _check_operator(op, cfg, (257, 700, 1024), name)


@pytest.mark.parametrize("name,N,rows", [("i8-chan", 8192, (129, 200, 256)), ("bf16-e4m3-chan", 8192, (256,)),
                                         ("i8-chan", 4096, (300, 512))])
@gpu
def test_8bit_split256_default_through_matmul(name, N, rows):
    """8-bit codes take 256-row split-K tiles where these run in fewer waves than 128-row ones
    (fused_default: 8192 channels at 129-256 rows, 4096 at 257-512, there in natural order): correct
    through an untuned dynamic-M operator."""
    import bitblas
    cfg = MatmulConfig(M=None, N=N, K=2048, **NAT_FORMATS[name])
    op = bitblas.Matmul(cfg)
    h = op.choice("cuda", rows[-1]).hint
    assert (h.row_tile, h.split_k, h.permute) == (256, True, N > 4096), h
    _check_operator(op, cfg, rows, name)


CLUSTER_CASES = ["u4-g128", "u4-g128-zeros", "u8-g128", "u2-g128", "nvfp4", "nf4-g128", "w4a8-g128", "w4afp8-g128",
                 "w4a8-chan"]


@pytest.mark.parametrize("name", CLUSTER_CASES)
@gpu
def test_clustered_default_through_matmul(name):
    """An untuned dynamic-M operator with 4096 channels runs its 128-row bucket as 2-CTA clusters
    splitting K (64 split-K tiles on >= 128 SMs: fused_default's _clustered), behind the permute
    kernel without PDL; int8 / float8 activations only with group scales (W4A8 per channel keeps one
    CTA per tile); with the last row tile's own TMA boxes (tail_box): correct at rows off the tile,
    at the tile, and past it."""
    import bitblas
    if name in I8_FORMATS:
        cfg = _i8cfg(name, 4096, 4096, M=None)
    elif name in F8_FORMATS:
        cfg = _f8cfg(name, 4096, 4096, M=None)
    else:
        fmt = TABLE_FORMATS[name] if name in TABLE_FORMATS else FORMATS[name]
        cfg = MatmulConfig(M=None, N=4096, K=4096, A_dtype="float16", **fmt)
    op = bitblas.Matmul(cfg)
    if torch.cuda.get_device_properties(0).multi_processor_count >= 128:
        hint = op.choice("cuda", 128).hint
        assert isinstance(hint, FusedWgmmaHint) and hint.tail_box, hint
        assert hint.k_ctas == (1 if name == "w4a8-chan" else 2), hint
        assert hint.k_ctas == 1 or hint.pdl == (not hint.permute), hint
    _check_operator(op, cfg, (65, 80, 127, 128, 129, 200), name)
