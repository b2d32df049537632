"""The CPU (LLVM) Matmul operator against the torch reference, for every format and mode.

One Matmul per config, built with M=None (one kernel symbolic in M serves every row count) and
cached in ``_OPS``, so each config compiles once for the whole module. Every call gets fresh random
inputs and an output buffer poisoned with NaN (int32: a sentinel), passed in through ``output=``.
"""
from __future__ import annotations

import random

import pytest
import torch

import bitblas
from bitblas.formats import FORMATS
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance

_OPS = {}
_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "int8": "i8", "int4": "i4",
          "float8_e4m3": "e4m3", "float8_e5m2": "e5m2"}
_ZSHORT = {"original": "zorig", "rescale": "zresc", "quantized": "zquant"}
_INT32_SENTINEL = -2 ** 31
NKS = ((96, 256), (40, 384))
MS = (1, 17, 64)


def _op(config: bitblas.MatmulConfig) -> bitblas.Matmul:
    op = _OPS.get(config)
    if op is None:
        op = _OPS[config] = bitblas.Matmul(config)
    return op


class Case:
    """Config fields other than M, N, K; the test id spells them out."""

    def __init__(self, **fields):
        self.fields = fields

    def config(self, n: int, k: int) -> bitblas.MatmulConfig:
        return bitblas.MatmulConfig(M=None, N=n, K=k, **self.fields)

    @property
    def id(self) -> str:
        f = self.fields
        a = f.get("A_dtype", "float16")
        s = f"{_SHORT[a]}x{f.get('W_dtype', a)}"
        if f.get("with_scaling"):
            g = f.get("group_size", -1)
            s += "_gch" if g == -1 else f"_g{g}"
        if f.get("with_zeros"):
            s += "_" + _ZSHORT[f.get("zeros_mode", "original")]
        if f.get("with_act_scaling"):
            s += "_as"
        if f.get("layout", "nt") != "nt":
            s += "_" + f["layout"]
        if f.get("with_bias"):
            s += "_bias"
        if "out_dtype" in f:
            s += "_o" + _SHORT.get(f["out_dtype"], f["out_dtype"])
        return s


def _weight_cases(A_dtype="float16", out_dtype=None, group_sizes=(128, -1)):
    """Every weight format x scaling / zeros mode it takes, for float activations."""
    extra = {"A_dtype": A_dtype} if A_dtype != "float16" else {}
    if out_dtype is not None:
        extra["out_dtype"] = out_dtype
    for name in bitblas.WEIGHT_FORMATS:
        fmt = FORMATS[name]
        if fmt.kind == "float":
            if name == A_dtype or A_dtype == "float32":
                yield Case(W_dtype=name, **extra)
            continue
        if fmt.group_size is not None:          # nvfp4: fixed group, scales always
            yield Case(W_dtype=name, group_size=fmt.group_size, with_scaling=True, **extra)
            continue
        yield Case(W_dtype=name, **extra)
        for g in group_sizes:
            yield Case(W_dtype=name, group_size=g, with_scaling=True, **extra)
            if fmt.zeros:
                for mode in ("original", "rescale", "quantized"):
                    if mode == "quantized" and fmt.kind != "uint":
                        continue
                    yield Case(W_dtype=name, group_size=g, with_scaling=True, with_zeros=True, zeros_mode=mode,
                               **extra)


def _params(cases, ms=MS, nks=NKS):
    return [pytest.param(c, m, nk, id=f"{c.id}-m{m}-n{nk[0]}k{nk[1]}") for c in cases for m in ms for nk in nks]


def _poisoned(config, shape):
    dt = TORCH_DTYPES[config.out_dtype]
    if config.out_dtype == "int32":
        return torch.full(shape, _INT32_SENTINEL, dtype=dt)
    return torch.full(shape, float("nan"), dtype=dt)


def _check(case: Case, m: int, nk, lead=None, drop=(), flat=()):
    """Run one case; ``drop``: inputs left out, ``flat``: inputs handed to the operator flattened."""
    config = case.config(*nk)
    op = _op(config)
    seed = random.randrange(2 ** 31)
    inputs = random_inputs(config, m, seed=seed, lead=lead)
    for name in drop:
        inputs.pop(name)
    call_inputs = {k: v.reshape(-1) if k in flat else v for k, v in inputs.items()}
    lead = tuple(lead) if lead is not None else (m,)
    out = _poisoned(config, (*lead, config.N))
    res = op(**call_inputs, output=out)
    assert res is out, "the operator must write into (and return) the given output buffer"
    ref = reference_matmul(config, **inputs)
    assert out.shape == ref.shape
    if config.out_dtype == "int32":
        assert not (out == _INT32_SENTINEL).any(), f"unwritten output elements (seed={seed})"
        assert torch.equal(out, ref), f"int32 output differs from the reference (seed={seed}): " \
                                      f"max diff {(out.long() - ref.long()).abs().max()}"
        return
    err = relative_error(out, ref)
    assert err <= tolerance(config), f"relative error {err:.3g} > {tolerance(config):.3g} (seed={seed})"


# -- float16 activations x every weight format x every scaling / zeros mode --------------------
F16_CASES = list(_weight_cases())


@pytest.mark.parametrize("case, m, nk", _params(F16_CASES))
def test_matmul(case, m, nk):
    _check(case, m, nk)


def test_f16_grid_covers_every_weight_format():
    """The grid above must not silently lose a format (e.g. after a registry change)."""
    covered = {c.fields["W_dtype"] for c in F16_CASES}
    assert covered == set(bitblas.WEIGHT_FORMATS) - {"bfloat16"}
    modes = {(c.fields["W_dtype"], c.fields.get("zeros_mode")) for c in F16_CASES if c.fields.get("with_zeros")}
    assert ("uint4", "quantized") in modes and ("int4", "rescale") in modes


@pytest.mark.parametrize("m", MS)
def test_matmul_nvfp4_default_global_scale(m):
    """nvfp4 without global_scale: the kernel must take it as 1."""
    _check(Case(W_dtype="nvfp4", group_size=16, with_scaling=True), m, NKS[0], drop=("global_scale",))


# -- bfloat16 and float32 activations, on a few formats ----------------------------------------
OTHER_FLOAT_CASES = [
    Case(A_dtype="bfloat16", W_dtype="bfloat16", out_dtype="bfloat16"),
    Case(A_dtype="bfloat16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True,
         out_dtype="bfloat16"),
    Case(A_dtype="bfloat16", W_dtype="int4", group_size=-1, with_scaling=True, out_dtype="bfloat16"),
    Case(A_dtype="bfloat16", W_dtype="nf4", group_size=128, with_scaling=True, out_dtype="float32"),
    Case(A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True, out_dtype="bfloat16"),
    Case(A_dtype="bfloat16", W_dtype="float8_e4m3", group_size=-1, with_scaling=True, out_dtype="float16"),
    Case(A_dtype="float32", W_dtype="float16", out_dtype="float32"),
    Case(A_dtype="float32", W_dtype="bfloat16", out_dtype="float32"),
    Case(A_dtype="float32", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True,
         zeros_mode="rescale", out_dtype="float32"),
    Case(A_dtype="float32", W_dtype="int8", group_size=-1, with_scaling=True, out_dtype="float32"),
    Case(A_dtype="float32", W_dtype="fp4_e2m1", group_size=128, with_scaling=True, out_dtype="float32"),
    Case(A_dtype="float32", W_dtype="uint2", group_size=128, with_scaling=True, with_zeros=True,
         zeros_mode="quantized", out_dtype="float16"),
]


@pytest.mark.parametrize("case, m, nk", _params(OTHER_FLOAT_CASES))
def test_matmul_float_acts(case, m, nk):
    _check(case, m, nk)


# -- integer and float8 activations --------------------------------------------------------------
INT_CASES = [
    # int8 x int8: per-channel weight scale, per-token activation scale
    *[Case(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True, out_dtype=o)
      for o in ("float16", "bfloat16", "float32")],
    # int8 x int8, int32 output without scales: exact
    Case(A_dtype="int8", W_dtype="int8", out_dtype="int32"),
    # W4A8 / W2A8: group-wise weight scales
    Case(A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int8", W_dtype="int2", group_size=128, with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int8", W_dtype="uint4", group_size=128, with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int8", W_dtype="int4", out_dtype="int32"),
    # int4 activations x int4 / int2 weights
    Case(A_dtype="int4", W_dtype="int4", with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int4", W_dtype="int2", with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int4", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int4", W_dtype="int2", out_dtype="int32"),
    Case(A_dtype="int4", W_dtype="uint1", out_dtype="int32"),
    # float8 x float8, both ways: per-channel weight scale, per-token activation scale
    *[Case(A_dtype=a, W_dtype=w, with_scaling=True, with_act_scaling=True)
      for a in ("float8_e4m3", "float8_e5m2") for w in ("float8_e4m3", "float8_e5m2")],
    Case(A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True, with_act_scaling=True, out_dtype="float32"),
    Case(A_dtype="float8_e5m2", W_dtype="float8_e4m3", group_size=128, with_scaling=True, with_act_scaling=True,
         out_dtype="bfloat16"),
    Case(A_dtype="float8_e5m2", W_dtype="float8_e5m2"),
]


@pytest.mark.parametrize("case, m, nk", _params(INT_CASES))
def test_matmul_low_bit_acts(case, m, nk):
    _check(case, m, nk)


# -- layout "nn", bias, leading batch dims -------------------------------------------------------
EPILOGUE_CASES = [
    Case(W_dtype="float16", layout="nn"),
    Case(W_dtype="float16", layout="nn", with_bias=True),
    Case(A_dtype="bfloat16", W_dtype="bfloat16", layout="nn", out_dtype="bfloat16"),
    Case(W_dtype="float16", with_bias=True),
    Case(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True, with_bias=True),
    Case(W_dtype="nvfp4", group_size=16, with_scaling=True, with_bias=True),
    Case(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True, with_bias=True),
    Case(A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True, with_bias=True,
         out_dtype="float32"),
    Case(A_dtype="int8", W_dtype="int8", with_bias=True, out_dtype="int32"),
    Case(A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True, with_act_scaling=True, with_bias=True),
]


@pytest.mark.parametrize("case, m, nk", _params(EPILOGUE_CASES))
def test_matmul_epilogue(case, m, nk):
    _check(case, m, nk)


LEAD_CASES = [
    Case(W_dtype="float16"),
    Case(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True, with_bias=True),
    Case(W_dtype="float16", layout="nn", with_bias=True),
    Case(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True, with_bias=True),
    Case(A_dtype="int4", W_dtype="int4", with_scaling=True, with_act_scaling=True),
    Case(A_dtype="int8", W_dtype="int8", out_dtype="int32"),
]


@pytest.mark.parametrize("case", LEAD_CASES, ids=lambda c: c.id)
def test_matmul_leading_batch_dims(case):
    """A [2, 3, K] -> out [2, 3, N] (activation scales [2, 3])."""
    _check(case, 6, NKS[0], lead=(2, 3))


def test_matmul_flat_act_scale_with_batch_dims():
    """A [2, 3, K] with its per-token scale flattened to [6]."""
    _check(Case(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True), 6, NKS[0], lead=(2, 3),
           flat=("a_scale",))


@pytest.mark.parametrize("case", [
    Case(W_dtype="int4", with_scaling=True),
    Case(W_dtype="uint8", with_scaling=True, with_zeros=True, zeros_mode="rescale"),
    Case(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True),
], ids=lambda c: c.id)
def test_matmul_per_channel_scale_as_1d(case):
    """Per-channel scales and zeros may come as [N] instead of [N, 1]."""
    _check(case, 5, NKS[0], flat=("scale", "zeros"))


def test_matmul_one_kernel_serves_every_m():
    """M=None: calls with different row counts reuse the one kernel symbolic in M."""
    config = bitblas.MatmulConfig(M=None, N=40, K=128, W_dtype="int4", with_scaling=True, group_size=64)
    op = bitblas.Matmul(config)
    for m in (3, 1, 17):
        inputs = random_inputs(config, m)
        out = op(**inputs)
        assert relative_error(out, reference_matmul(config, **inputs)) <= tolerance(config)
    assert [c.rows for _, c in op._kernels] == [None]


@pytest.mark.parametrize("m", [1, 5])
def test_matmul_static_m(m):
    """An int M gets a kernel specialised to it; other row counts still work (symbolic kernel)."""
    config = bitblas.MatmulConfig(M=5, N=40, K=128, W_dtype="uint4", with_scaling=True, with_zeros=True,
                                  group_size=64, zeros_mode="quantized")
    op = bitblas.Matmul(config)
    inputs = random_inputs(config, m)
    out = _poisoned(config, (m, config.N))
    op(**inputs, output=out)
    assert relative_error(out, reference_matmul(config, **inputs)) <= tolerance(config)
    assert [(kind, c.rows) for kind, c in op._kernels] == [("cpu", 5 if m == 5 else None)]


@pytest.mark.parametrize("w_dtype", ["uint4", "uint1"])
def test_matmul_quantized_zeros_n_off_byte(w_dtype):
    """Quantized zero points are packed along N: N = 37 leaves the last byte partly filled."""
    _check(Case(W_dtype=w_dtype, group_size=64, with_scaling=True, with_zeros=True, zeros_mode="quantized"), 3,
           (37, 128))


def test_matmul_zero_rows():
    config = bitblas.MatmulConfig(M=None, N=40, K=128, W_dtype="float16")
    inputs = random_inputs(config, 1)
    out = bitblas.Matmul(config)(torch.empty(0, 128, dtype=torch.float16), inputs["W"])
    assert out.shape == (0, 40) and out.dtype == torch.float16
