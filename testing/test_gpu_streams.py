"""The operator runs on torch's current CUDA stream and can be captured in a CUDA graph.

The side-stream test makes the side stream busy (``torch.cuda._sleep``) and then writes the
activations on it: a kernel launched on any other stream would run first and read stale
activations, so a correct result shows that the launch was ordered on the side stream.
"""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CONFIGS = [
    pytest.param(dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
                 id="uint4-g128-zeros"),
    pytest.param(dict(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True), id="i8xi8"),
]
ROWS = (1, 33)       # the small-M (GEMV) path and the general one


def _setup(kw, m):
    cfg = MatmulConfig(N=1000, K=1536, **kw)
    op = bitblas.Matmul(cfg)
    inputs = random_inputs(cfg, m, device="cuda")
    static = {k: v.clone() for k, v in inputs.items()}
    static["A"].zero_()
    out = torch.full((m, cfg.N), float("nan"), dtype=TORCH_DTYPES[cfg.out_dtype], device="cuda")
    op(**static, output=out)            # build, load the module, create constant tables
    torch.cuda.synchronize()
    return cfg, op, inputs, static, out


def _err(cfg, out, inputs):
    return relative_error(out.cpu(), reference_matmul(cfg, **inputs)), tolerance(cfg)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("kw", CONFIGS)
def test_side_stream(kw, m):
    cfg, op, inputs, static, out = _setup(kw, m)
    out.fill_(float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)          # ~10 ms of work queued ahead on the side stream
        static["A"].copy_(inputs["A"])
        op(**static, output=out)
        res = out.clone()
    side.synchronize()
    err, tol = _err(cfg, res, inputs)
    assert err <= tol, f"side stream: rel. err {err:.3e} > {tol:.1e} (kernel not ordered on the current stream?)"


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("kw", CONFIGS)
def test_cuda_graph(kw, m):
    cfg, op, inputs, static, out = _setup(kw, m)
    side = torch.cuda.Stream()                  # warm up on a side stream, as torch's docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(**static, output=out)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op(**static, output=out)
    for _ in range(2):                          # replay on fresh inputs each time
        fresh = random_inputs(cfg, m, device="cuda")
        for k, v in fresh.items():
            static[k].copy_(v)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        err, tol = _err(cfg, out, fresh)
        assert err <= tol, f"graph replay: rel. err {err:.3e} > {tol:.1e}"


CHAIN = [pytest.param(dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True), 1, id="u4-m1"),
         pytest.param(dict(A_dtype="float16", W_dtype="int2", group_size=128, with_scaling=True, with_zeros=True), 1,
                      id="i2-zeros-m1"),
         pytest.param(dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True), 8, id="u4-m8-mma"),
         pytest.param(dict(A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True,
                           out_dtype="float16"), 1, id="w4a8-m1")]


@pytest.mark.parametrize("kw,m", CHAIN)
def test_dependent_chain(kw, m):
    """Back-to-back calls where each reads the previous one's output (the GEMV kernels are launched
    with programmatic dependent launch on sm_90: the next kernel starts while the previous one
    drains and must wait before it reads): eager and in a graph, bitwise equal to the same calls
    with a synchronize between them; the buffers are poisoned (NaN) before every run."""
    from bitblas.quantization.quantize import quantize_activation
    cfg = MatmulConfig(N=2048, K=2048, **kw)
    op = bitblas.Matmul(cfg)
    inputs = random_inputs(cfg, m, device="cuda", seed=7)
    weights = {k: v for k, v in inputs.items() if k not in ("A", "a_scale")}
    int8 = cfg.A_dtype == "int8"
    steps = 4
    bufs = [torch.empty(m, cfg.N, dtype=TORCH_DTYPES[cfg.out_dtype], device="cuda") for _ in range(steps)]

    def chain(sync):
        x, xs = inputs["A"], inputs.get("a_scale")
        for b in bufs:
            op(x, **weights, a_scale=xs, output=b)
            if sync:
                torch.cuda.synchronize()
            if int8:                       # requantize on the GPU: a torch kernel between ours
                x, xs = quantize_activation(b.float(), "int8")
            else:
                x = b / b.abs().amax().clamp(min=1)     # keep the values bounded; reads b after our kernel
        return [b.clone() for b in bufs]

    for b in bufs:
        b.fill_(float("nan"))
    ref = chain(sync=True)
    assert all(torch.isfinite(r.float()).all() for r in ref)
    for b in bufs:
        b.fill_(float("nan"))
    eager = chain(sync=False)
    torch.cuda.synchronize()
    for r, e in zip(ref, eager):
        assert torch.equal(r, e)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain(sync=False)
    for b in bufs:
        b.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    for r, b in zip(ref, bufs):
        assert torch.equal(r, b)


@pytest.mark.parametrize("m", [1, 4])
def test_direct_chain(m):
    """Our kernels back to back with nothing between them: y = op(x), z = op(y) (N == K)."""
    cfg = MatmulConfig(N=4096, K=4096, A_dtype="float16", W_dtype="int4", group_size=128, with_scaling=True)
    op = bitblas.Matmul(cfg)
    inputs = random_inputs(cfg, m, device="cuda", seed=3)
    inputs["scale"] = inputs["scale"] * 0.25     # |y| ~ |x| over the chain (symmetric int4: no rank-one growth)
    w = {k: v for k, v in inputs.items() if k != "A"}
    bufs = [torch.full((m, 4096), float("nan"), dtype=torch.float16, device="cuda") for _ in range(6)]
    ref = []
    x = inputs["A"]
    for b in bufs:
        op(x, **w, output=b)
        torch.cuda.synchronize()
        ref.append(b.clone())
        x = b
    assert all(torch.isfinite(r).all() for r in ref)
    for b in bufs:
        b.fill_(float("nan"))
    x = inputs["A"]
    for b in bufs:
        op(x, **w, output=b)
        x = b
    torch.cuda.synchronize()
    for r, b in zip(ref, bufs):
        assert torch.equal(r, b)
