"""NVFP4 x NVFP4 on the GPU (issue 25), against the float32 torch reference on the same GPU.

``bitblas.ops.nvfp4_gemv`` on the issue's exact permuted views for every benchmark shape and an odd
one (M=1000, K=1536, L=3), with fresh random codes and e4m3 block scales over the whole e4m3 range
(one operand's scales near 448 and down to subnormals, the other's small enough that the float16
output cannot overflow, then the other way round), the output poisoned; ``Matmul`` with the
batched config at 1..40 rows (the GEMV, the GEMV in row chunks, decode-then-GEMM from 17 rows on
sm_90) with global scales; GEMV hint variants; a CUDA-graph capture; a misaligned view.
Skipped without a CUDA GPU.
"""
from __future__ import annotations

import pytest
import torch

from bitblas import Matmul, MatmulConfig
from bitblas.ops import nvfp4_gemv
from bitblas.reference import (TOLERANCES, random_inputs, reference_matmul, reference_nvfp4_gemv, relative_error,
                               tolerance)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NV = dict(A_dtype="nvfp4", W_dtype="nvfp4", group_size=16, with_scaling=True, with_act_scaling=True)
SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4), (1000, 1536, 3)]
_E4M3_FINITE = [b for b in range(256) if b & 0x7F != 0x7F]          # every bit pattern but the NaNs


def _scale_bytes(shape, kind, gen):
    """float8_e4m3fn scales as bit patterns: "wide": any finite pattern, both signs (448 = 0x7e,
    subnormals 0x01..0x07, zeros); "small": positive values 2**-9 .. 2**-6 (patterns 0x01..0x10)."""
    if kind == "wide":
        pool = torch.tensor(_E4M3_FINITE, dtype=torch.uint8)
        return pool[torch.randint(0, len(pool), shape, generator=gen)]
    return torch.randint(1, 0x11, shape, generator=gen, dtype=torch.uint8)


def issue_tensors(M, K, L, wide="a", rows=128, seed=None, device="cuda"):
    """The workload's tensors as the issue hands them over (permutes of [L, ., .] tensors, b and sfb
    padded to ``rows`` rows), fresh random codes and scales, c poisoned with NaN."""
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2 ** 31)
    a = torch.randint(0, 256, (L, M, K // 2), generator=gen, dtype=torch.uint8)
    b = torch.randint(0, 256, (L, rows, K // 2), generator=gen, dtype=torch.uint8)
    sfa = _scale_bytes((L, M, K // 16), "wide" if wide == "a" else "small", gen)
    sfb = _scale_bytes((L, rows, K // 16), "wide" if wide == "b" else "small", gen)
    a, b = a.to(device).permute(1, 2, 0), b.to(device).permute(1, 2, 0)
    sfa = sfa.to(device).view(torch.float8_e4m3fn).permute(1, 2, 0)
    sfb = sfb.to(device).view(torch.float8_e4m3fn).permute(1, 2, 0)
    c = torch.full((L, M, 1), float("nan"), dtype=torch.float16, device=device).permute(1, 2, 0)
    return a, b, sfa, sfb, c


@pytest.mark.parametrize("wide", ["a", "b"])
@pytest.mark.parametrize("M,K,L", SHAPES, ids=[f"{m}x{k}xL{l}" for m, k, l in SHAPES])
def test_nvfp4_gemv(M, K, L, wide):
    a, b, sfa, sfb, c = issue_tensors(M, K, L, wide)
    if hasattr(torch, "float4_e2m1fn_x2"):
        a, b = a.view(torch.float4_e2m1fn_x2), b.view(torch.float4_e2m1fn_x2)
    assert nvfp4_gemv(a, b, sfa, sfb, c) is c
    ref = reference_nvfp4_gemv(a, b, sfa, sfb)
    assert float(ref.abs().max()) < 6e4, "test data overflows float16"
    err = relative_error(c, ref)
    assert err <= TOLERANCES["float16"], (M, K, L, wide, err)


def test_nvfp4_gemv_contiguous_c_and_padding():
    """c as a plain contiguous [M, 1, L] tensor; b with a single row (no padding)."""
    M, K, L = 1000, 1536, 3
    a, b, sfa, sfb, _ = issue_tensors(M, K, L, rows=1)
    c = torch.full((M, 1, L), float("nan"), dtype=torch.float16, device="cuda")
    nvfp4_gemv(a, b, sfa, sfb, c)
    assert relative_error(c, reference_nvfp4_gemv(a, b, sfa, sfb)) <= TOLERANCES["float16"]


def test_nvfp4_gemv_graph_capture():
    M, K, L = 4096, 7168, 8
    a, b, sfa, sfb, c = issue_tensors(M, K, L)
    nvfp4_gemv(a, b, sfa, sfb, c)                           # build and load outside the capture
    torch.cuda.synchronize()
    c.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        nvfp4_gemv(a, b, sfa, sfb, c)
    g.replay()
    torch.cuda.synchronize()
    assert relative_error(c, reference_nvfp4_gemv(a, b, sfa, sfb)) <= TOLERANCES["float16"]


def test_nvfp4_gemv_misaligned_view(naming):
    M, K, L = 64, 256, 2
    big = torch.zeros(L, M, K // 2 + 16, dtype=torch.uint8, device="cuda")
    a = big[:, :, 1:K // 2 + 1].permute(1, 2, 0)
    _, b, sfa, sfb, c = issue_tensors(M, K, L)
    with naming(ValueError, "a"):
        nvfp4_gemv(a, b, sfa, sfb, c)


@pytest.fixture(scope="module")
def batched_op():
    return Matmul(MatmulConfig(M=None, N=1000, K=1536, batch=3, **NV))


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 17, 40])
def test_matmul_batched(batched_op, rows):
    """The same computation through Matmul: GEMV (1..8 rows), the GEMV in chunks of 8 rows (13),
    decode-then-GEMM from 17 rows on sm_90 (else GEMV chunks); global scales on both operands."""
    c = batched_op.config
    inp = random_inputs(c, rows, device="cuda")
    out = torch.full((c.batch, rows, c.N), float("nan"), dtype=torch.float16, device="cuda")
    batched_op(**inp, output=out)
    ref = reference_matmul(c, **inp, cast=False, device="cuda")
    assert relative_error(out, ref) <= tolerance(c), (rows, batched_op._nv.uses_gemm(rows))


@pytest.mark.parametrize("rows", [1, 33])
def test_matmul_plain(rows):
    c = MatmulConfig(M=None, N=2048, K=7168, out_dtype="bfloat16", **NV)
    op = Matmul(c)
    inp = random_inputs(c, rows, device="cuda")
    for k in ("global_scale", "a_global_scale"):          # the defaults (1)
        inp.pop(k)
    ref = reference_matmul(c, **inp, cast=False, device="cuda")
    out = op(**inp)
    assert out.shape == (rows, c.N) and out.dtype == torch.bfloat16
    assert relative_error(out, ref) <= tolerance(c)


GEMV_HINTS = [dict(rows_per_warp=4, warps=8, unroll=1, stages=3), dict(rows_per_warp=2, warps=4, unroll=2, stages=2),
              dict(rows_per_warp=1, warps=8, unroll=1, stages=4, min_blocks=4),
              dict(rows_per_warp=4, warps=4, unroll=1, stages=2, min_blocks=2),
              dict(rows_per_warp=2, warps=8, unroll=1, stages=3, l2_prefetch=2)]


@pytest.mark.parametrize("hint", GEMV_HINTS, ids=[f"R{h['rows_per_warp']}W{h['warps']}U{h['unroll']}S{h['stages']}"
                                                  f"P{h.get('l2_prefetch', 0)}" for h in GEMV_HINTS])
def test_gemv_hints(hint):
    from bitblas.schedule.nvfp4 import NVFP4GemvHint
    M, K, L = 1000, 7168, 3
    a, b, sfa, sfb, c = issue_tensors(M, K, L, wide="b")
    op = Matmul(MatmulConfig(M=1, N=M, K=K, **NV))
    h = NVFP4GemvHint(**hint, pdl=torch.cuda.get_device_capability()[0] >= 9)
    v = lambda t: t.view(torch.int8).permute(2, 0, 1)      # noqa: E731
    op._nv.launch(v(b)[:, :1], v(a), v(sfa), v(sfb)[:, :1], None, None, c.permute(2, 1, 0), hint=h)
    assert relative_error(c, reference_nvfp4_gemv(a, b, sfa, sfb)) <= TOLERANCES["float16"]
