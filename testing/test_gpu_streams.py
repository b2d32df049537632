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
