"""Weights in Microsoft BitBLAS's fast-decoding order (``Plan.w_order``, the default for int / uint
1-, 2- and 4-bit weights with float16 or int8 activations) on a CUDA GPU, through ``Matmul`` at
row counts that cross every kernel it picks (the rows GEMV, the mma.sync GEMV and its int8 twin, the
fused wgmma GEMM, decode-then-GEMM): fresh random inputs packed by ``pack_weight`` (the plan's
order), a poisoned output, the float64 reference; N and K off the tile. And the bytes BitBLAS packs
(its LOP3Permutate, written from its TIR in test_fast_decoding.py) handed to the operator as
they are.

    python -m pytest testing/test_gpu_fast_decoding.py -m gpu
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bitblas import Matmul, MatmulConfig
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROWS = [1, 3, 8, 16, 24, 48, 64, 100, 256, 1000]
CASES = {
    "f16-u4-g128": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True),
    "f16-i4-g128": dict(A_dtype="float16", W_dtype="int4", group_size=128, with_scaling=True),
    "f16-u4-qzeros": dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True,
                          zeros_mode="quantized"),
    "f16-u2-g64-zeros": dict(A_dtype="float16", W_dtype="uint2", group_size=64, with_scaling=True, with_zeros=True),
    "f16-i2-chan": dict(A_dtype="float16", W_dtype="int2", with_scaling=True),
    "i8-i2-chan": dict(A_dtype="int8", W_dtype="int2", with_scaling=True, out_dtype="float16"),
    "i8-u1-g128": dict(A_dtype="int8", W_dtype="uint1", group_size=128, with_scaling=True, out_dtype="float16"),
    "i8-i2-int32": dict(A_dtype="int8", W_dtype="int2", out_dtype="int32"),
}


@pytest.mark.parametrize("shape", [(1024, 2048), (1000, 1536)], ids=["1024x2048", "1000x1536"])
@pytest.mark.parametrize("case", list(CASES))
def test_fast_decoding_order_every_kernel(case, shape):
    N, K = shape
    c = MatmulConfig(M=ROWS, N=N, K=K, **CASES[case])
    op = Matmul(c)
    assert op.plan().w_order is not None and op.fast_decoding
    dt = TORCH_DTYPES[c.out_dtype]
    bad = []
    for m in ROWS:
        seed = random.randrange(2 ** 31)
        inp = random_inputs(c, m, device="cuda", seed=seed)
        out = torch.full((m, N), -12345 if dt == torch.int32 else float("nan"), dtype=dt, device="cuda")
        op(**inp, output=out)
        ref = reference_matmul(c, **inp)
        if dt == torch.int32:
            ok = torch.equal(out.cpu(), ref.cpu().to(torch.int32))
        else:
            ok = relative_error(out, ref) <= tolerance(c)
        if not ok:
            bad.append(f"m={m} ({op.choice('cuda', m).template}) seed={seed}")
    assert not bad, bad


@pytest.mark.parametrize("A, W", [("float16", "uint4"), ("float16", "int2"), ("int8", "int2")])
def test_bitblas_packed_bytes_as_they_are(A, W):
    """BitBLAS's transform_weight bytes (packed, then its LOP3Permutate) at 1, 16 and 256 rows."""
    from test_bitblas_layouts import bb_general_compress
    from test_fast_decoding import bb_lop3_permutate
    from bitblas.formats import FORMATS
    N, K = 512, 1024
    f = FORMATS[W]
    bits, signed = f.bits, f.kind == "int"
    c = MatmulConfig(M=[1, 16, 256], N=N, K=K, A_dtype=A, W_dtype=W, with_scaling=True, out_dtype="float16")
    op = Matmul(c)
    g = torch.Generator().manual_seed(3)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    q = torch.randint(lo, hi + 1, (N, K), generator=g)
    stored = (q + (1 << (bits - 1)) if signed else q).numpy().astype(np.int8)
    W_bb = torch.from_numpy(bb_lop3_permutate(bb_general_compress(stored, bits), bits, A)).cuda()
    s = torch.rand(N, 1, generator=g) * 0.05 + 0.01
    s = (s if A == "int8" else s.half()).cuda()
    for m in (1, 16, 256):
        if A == "int8":
            x = torch.randint(-127, 128, (m, K), generator=g).to(torch.int8).cuda()
        else:
            x = torch.randn(m, K, generator=g).half().cuda()
        out = torch.full((m, N), float("nan"), dtype=torch.float16, device="cuda")
        op(x, W_bb, s, output=out)
        ref = x.double().cpu() @ (q.double() * s.double().cpu()).T
        assert relative_error(out, ref) <= 4e-3, (m, op.choice("cuda", m).template)
