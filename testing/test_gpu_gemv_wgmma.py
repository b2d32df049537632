"""The wgmma GEMV (``GEMVWgmmaHint``, bitblas/schedule/gemv/wgmma.py) on an sm_90
GPU: every int/uint 2-, 4- and 8-bit family it takes (group scales, float / quantized / rescale
zeros, no scales, per-channel scales, bias, float32 and bfloat16 outputs) and the table formats
(nf4, fp4_e2m1, float8_e4m3, float8_e5m2, nvfp4: ``test_gemv_wgmma_table_formats``) at row counts that are
no multiple of 8 or of the kernel's B width, N no multiple of 64, and each tile shape (64 / 128
channels per warpgroup, 1 / 2 / 4 warpgroups splitting K); the kernel takes its row count at run
time; a dynamic-M operator on a wide layer runs it through ``Matmul``.

    python -m pytest testing/test_gpu_gemv_wgmma.py -m gpu
    python -m pytest testing/test_gpu_gemv_wgmma.py testing/test_gpu_fused_wgmma.py -m gpu -k nvfp4
"""
from __future__ import annotations

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_target
from bitblas.plan import make_plan
from bitblas.schedule import GEMVHint
from bitblas.schedule.gemv import gemv_hint_unsupported
from kernel_helpers import WGMMA_TABLE_FORMATS, check_kernel

_skip = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                           reason="needs an sm_90 GPU")


def gpu(f):
    return pytest.mark.gpu(_skip(f))


CONFIGS = {
    "u4": dict(W_dtype="uint4", group_size=128, with_scaling=True),
    "u4-zeros": dict(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
    "i4-g64-bias-f32": dict(W_dtype="int4", group_size=64, with_scaling=True, with_bias=True, out_dtype="float32"),
    "bf16-u4-qzeros": dict(A_dtype="bfloat16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True,
                           zeros_mode="quantized", out_dtype="bfloat16"),
    "u2-rescale": dict(W_dtype="uint2", group_size=128, with_scaling=True, with_zeros=True, zeros_mode="rescale"),
    "bf16-i2": dict(A_dtype="bfloat16", W_dtype="int2", group_size=128, with_scaling=True, out_dtype="bfloat16"),
    "u4-noscale": dict(W_dtype="uint4"),
    "i4-chan": dict(W_dtype="int4", with_scaling=True),
    "i8-chan": dict(W_dtype="int8", with_scaling=True),
    "u8-g128-bias": dict(W_dtype="uint8", group_size=128, with_scaling=True, with_bias=True),
}
HINTS = {f"r{r}k{k}s{s}": GEMVHint(rows_per_warp=r, k_warps=k, unroll=1, stages=s, mma=True, wgmma=True, pdl=True)
         for r, k, s in ((16, 1, 4), (32, 1, 2), (16, 4, 2), (16, 2, 3))}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("hk", list(HINTS))
@gpu
def test_gemv_wgmma_formats(name, hk):
    """Each family x tile at 17, 29, 40 and 64 rows (kernels built for 24, 32, 40, 64: the top of
    the row's 8-row class, run with the actual rows), N=1000, K=4096."""
    cfg = MatmulConfig(N=1000, K=4096, **{"A_dtype": "float16", **CONFIGS[name]})
    errors = []
    for m, top in ((17, 24), (29, 32), (40, 40), (64, 64)):
        plan = make_plan(cfg, "cuda", top)
        why = gemv_hint_unsupported(plan, HINTS[hk])
        if why:
            errors.append(f"refused: {why}")
            continue
        fn = build_plan(plan, cuda_target(), HINTS[hk])
        errors.append(check_kernel(cfg, plan, fn, m))
    refused = [e for e in errors if e and e.startswith("refused")]
    if len(refused) == len(errors):
        pytest.skip(refused[0])
    assert not [e for e in errors if e and not e.startswith("refused")], errors


@pytest.mark.parametrize("hk", ["r16k1s4", "r16k4s2"])
@pytest.mark.parametrize("name", list(CONFIGS))
@gpu
def test_gemv_wgmma_few_rows(name, hk):
    """9..16 rows (the default for 2- and 4-bit codes on wide layers, one warpgroup of 64
    channels, and for 2-bit codes from N=8192, 4 warpgroups splitting K): one kernel built for 16
    rows at 9, 13 and 16 rows, N=1000, K=4096."""
    cfg = MatmulConfig(N=1000, K=4096, **{"A_dtype": "float16", **CONFIGS[name]})
    plan = make_plan(cfg, "cuda", 16)
    why = gemv_hint_unsupported(plan, HINTS[hk])
    if why:
        pytest.skip(why)
    fn = build_plan(plan, cuda_target(), HINTS[hk])
    errors = [check_kernel(cfg, plan, fn, m) for m in (9, 13, 16)]
    assert not [e for e in errors if e], errors


TABLE_CONFIGS = WGMMA_TABLE_FORMATS            # the table formats (kernel_helpers)


@pytest.mark.parametrize("name", list(TABLE_CONFIGS))
@gpu
def test_gemv_wgmma_table_formats(name):
    """N=1000, K=1536 (N off the 64-channel tile): 64 channels, one warpgroup, 4 slots, built for 40
    rows (run at 17 and 33) and 64 rows; a second tile (128 channels, or 4 warpgroups splitting K)
    built for 64 rows and run at 17, 33 and 64 (the kernels take their row count at run time)."""
    cfg = MatmulConfig(N=1000, K=1536, **{"A_dtype": "float16", **TABLE_CONFIGS[name]})
    runs = [(HINTS["r16k1s4"], 40, (17, 33)), (HINTS["r16k1s4"], 64, (64,))]
    runs.append((HINTS["r32k1s2" if list(TABLE_CONFIGS).index(name) % 2 else "r16k4s2"], 64, (17, 33, 64)))
    errors = []
    for hint, top, rows in runs:
        plan = make_plan(cfg, "cuda", top)
        why = gemv_hint_unsupported(plan, hint)
        assert why is None, why
        fn = build_plan(plan, cuda_target(), hint)
        errors += [f"{hint} m={m}: {e}" for m in rows for e in [check_kernel(cfg, plan, fn, m)] if e]
    assert not errors, errors


@gpu
def test_gemv_wgmma_nvfp4_8192():
    """nvfp4, N = K = 8192: the default tile (wgmma_tile: 4 warpgroups splitting K) built for 64
    rows, run at 17, 33 and 64 rows."""
    from bitblas.kernels import default_hint
    from bitblas.schedule import GEMVWgmmaHint
    cfg = MatmulConfig(N=8192, K=8192, A_dtype="float16", **TABLE_CONFIGS["nvfp4"])
    plan = make_plan(cfg, "cuda", 64)
    hint = default_hint(plan, cuda_target())
    assert isinstance(hint, GEMVWgmmaHint), hint
    fn = build_plan(plan, cuda_target(), hint)
    errors = [e for e in (check_kernel(cfg, plan, fn, m) for m in (17, 33, 64)) if e]
    assert not errors, errors


@gpu
def test_gemv_wgmma_through_matmul():
    """A dynamic-M operator on a wide layer (N=28672, the wgmma default on sm_90) is correct from
    9 to 64 rows and builds one wgmma kernel per 8-row class (9..16 rows: one, for 16)."""
    import bitblas
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    op = bitblas.Matmul(MatmulConfig(M=None, N=28672, K=4096, A_dtype="float16", W_dtype="uint4",
                                     group_size=128, with_scaling=True, with_zeros=True))
    for m in (9, 12, 16, 17, 23, 24, 31, 47, 50, 64):
        inp = random_inputs(op.config, m, device="cuda")
        out = torch.full((m, op.config.N), float("nan"), dtype=torch.float16, device="cuda")
        op(**inp, output=out)
        err = relative_error(out, reference_matmul(op.config, **inp))
        assert err <= tolerance(op.config), (m, err)
    rows = sorted(c.rows for kind, c in op._kernels)
    assert rows == [16, 24, 32, 48, 56, 64], rows
