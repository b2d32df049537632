"""GPU correctness of every format family on CUDA tensors (skipped without a CUDA GPU).

One operator per (config, shape), symbolic in M, serves every row count; a few configs with a
static M check the specialised kernels. Each call gets fresh random inputs and a NaN-poisoned
output, and is compared with the float64 CPU reference within ``tolerance(config)``.
"""
from __future__ import annotations

import random

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

M_LIST = (1, 16, 17, 64, 128, 1024)      # 17 and 64: the tensor-core GEMV in chunks of 16 rows
SHAPES = ((256, 512), (1000, 1536))          # (N, K); 1000 is no multiple of any tile
G = 128

# (id, config fields, both shapes?). One representative per family runs at both shapes.
_C = []
_C.append(("f16", dict(A_dtype="float16", W_dtype="float16", with_bias=True), True))
_C.append(("bf16", dict(A_dtype="bfloat16", W_dtype="bfloat16", out_dtype="bfloat16"), True))
_C.append(("f32xf16", dict(A_dtype="float32", W_dtype="float16", out_dtype="float32"), False))
for _b in (8, 4, 2, 1):
    for _sign in ("int", "uint"):
        _modes = [None, "original", "rescale"] + (["quantized"] if _sign == "uint" else [])
        for _z in _modes:
            _kw = dict(A_dtype="float16", W_dtype=f"{_sign}{_b}", group_size=G, with_scaling=True,
                       with_zeros=_z is not None, zeros_mode=_z or "original")
            _C.append((f"{_sign}{_b}-g{G}-{_z or 'nozero'}", _kw, _z == "original"))
_C.append(("uint4-chan", dict(A_dtype="float16", W_dtype="uint4", with_scaling=True), False))
_C.append(("int4-chan-bias", dict(A_dtype="float16", W_dtype="int4", with_scaling=True, with_bias=True), False))
_C.append(("uint4-noscale", dict(A_dtype="float16", W_dtype="uint4"), False))
_C.append(("bf16-uint4-g128-zeros", dict(A_dtype="bfloat16", W_dtype="uint4", group_size=G, with_scaling=True,
                                         with_zeros=True, out_dtype="bfloat16"), True))
_C.append(("bf16-int2-g128", dict(A_dtype="bfloat16", W_dtype="int2", group_size=G, with_scaling=True,
                                  out_dtype="bfloat16"), False))
_C.append(("nf4-g128", dict(A_dtype="float16", W_dtype="nf4", group_size=G, with_scaling=True), True))
_C.append(("fp4_e2m1-g128", dict(A_dtype="float16", W_dtype="fp4_e2m1", group_size=G, with_scaling=True), True))
_C.append(("f8e4m3-chan", dict(A_dtype="float16", W_dtype="float8_e4m3", with_scaling=True), True))
_C.append(("f8e5m2-g128", dict(A_dtype="bfloat16", W_dtype="float8_e5m2", group_size=G, with_scaling=True,
                               out_dtype="bfloat16"), True))
_C.append(("nvfp4", dict(A_dtype="float16", W_dtype="nvfp4", group_size=16, with_scaling=True), True))
_C.append(("i8xi8-chan-token", dict(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True),
           True))
_C.append(("i8xi8-int32", dict(A_dtype="int8", W_dtype="int8", out_dtype="int32", with_bias=True), False))
# group-scaled int8 x int8: the GEMV up to 32 rows (17: its chunk loop), wgmma above
_C.append(("i8xi8-g128", dict(A_dtype="int8", W_dtype="int8", group_size=G, with_scaling=True,
                              with_act_scaling=True), False))
_C.append(("w4a8-g128", dict(A_dtype="int8", W_dtype="int4", group_size=G, with_scaling=True,
                             with_act_scaling=True), True))
_C.append(("w2a8-g128", dict(A_dtype="int8", W_dtype="int2", group_size=G, with_scaling=True,
                             with_act_scaling=True), True))
_C.append(("i4xi4-int32", dict(A_dtype="int4", W_dtype="int4", out_dtype="int32"), True))
_C.append(("i4xu2-scaled", dict(A_dtype="int4", W_dtype="uint2", with_scaling=True, with_act_scaling=True),
           False))
_C.append(("f8xf8-chan-token", dict(A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True,
                                    with_act_scaling=True, out_dtype="bfloat16"), True))
_C.append(("f8e5m2xf8e4m3-g128", dict(A_dtype="float8_e5m2", W_dtype="float8_e4m3", group_size=G,
                                      with_scaling=True, with_act_scaling=True), True))

CASES = []
for _id, _kw, _both in _C:
    for _si, (_n, _k) in enumerate(SHAPES):
        if _both or _si == 1:
            CASES.append(pytest.param(_kw, _n, _k, id=f"{_id}-{_n}x{_k}"))

_OPS = {}


def _op(kw, n, k, m=None):
    key = (tuple(sorted(kw.items())), n, k, m)
    if key not in _OPS:
        _OPS[key] = bitblas.Matmul(MatmulConfig(M=m, N=n, K=k, **kw))
    return _OPS[key]


def _check(op, m, lead=None):
    """Run op on fresh inputs with m rows; return an error string or None."""
    cfg = op.config
    seed = random.randrange(2 ** 31)
    inputs = random_inputs(cfg, m, device="cuda", seed=seed, lead=lead)
    shape = tuple(lead) if lead is not None else (m,)
    poison = -(2 ** 31) if cfg.out_dtype == "int32" else float("nan")   # int32: a value no test produces
    out = torch.full((*shape, cfg.N), poison, dtype=TORCH_DTYPES[cfg.out_dtype], device="cuda")
    ret = op(**inputs, output=out)
    torch.cuda.synchronize()
    assert ret.data_ptr() == out.data_ptr()
    ref = reference_matmul(cfg, **inputs)
    err = relative_error(out.cpu(), ref)
    tol = tolerance(cfg)
    if not err <= tol:
        return f"m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"
    return None


@pytest.mark.parametrize("kw,n,k", CASES)
def test_formats_all_m(kw, n, k):
    op = _op(kw, n, k)
    errors = [e for e in (_check(op, m) for m in M_LIST) if e]
    assert not errors, f"{op.config}:\n" + "\n".join(errors)


STATIC = [
    pytest.param(dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
                 1, id="uint4-zeros-M1"),
    pytest.param(dict(A_dtype="float16", W_dtype="int4", group_size=G, with_scaling=True), 16, id="int4-M16"),
    pytest.param(dict(A_dtype="float16", W_dtype="float16"), 17, id="f16-M17"),
    pytest.param(dict(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True), 128,
                 id="i8xi8-M128"),
]


@pytest.mark.parametrize("kw,m", STATIC)
def test_static_m(kw, m):
    n, k = SHAPES[1]
    op = _op(kw, n, k, m)
    errors = [e for e in (_check(op, m), _check(op, 5)) if e]   # the static kernel, and the fallback
    assert not errors, f"{op.config}:\n" + "\n".join(errors)


def test_leading_dims():
    op = _op(dict(A_dtype="float16", W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), *SHAPES[1])
    err = _check(op, 6, lead=(2, 3))
    assert err is None, err
