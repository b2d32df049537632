"""quantize -> dequantize error bounds for every weight format and mode, and for activations.

The bounds are derived from the quantizer, not tuned to pass. Both methods (``method="rtn"`` and
the default ``"mse"``) put every element on the point of its group's grid nearest to it:

* integer formats: the grid {lo..hi} * s (less the zero point), so an element is off from its value
  clamped to the grid's range by at most s / 2 (plus a few float32 ulps of w / s, which is up to
  max|code|).
* table formats (nf4, fp4_e2m1, float8, nvfp4): each element goes to the nearest table value, so
  the error is at most s times the distance from w / s to the table.

Round-to-nearest's grid covers the group's range (absmax or min/max), so for ``rtn`` nothing is
clamped: the error of an integer code is at most s / 2; zero points as codes (zeros_mode
"quantized") move the grid by up to half a step, and the float16 rounding of the scale stretches it
by (hi - lo) * 2**-11 steps, so the range ends can be off by s * (0.5 + (hi - lo) * 2**-11); a
table code is off by at most half the largest gap between neighbouring table values. ``mse`` may
clip a group's range (that is how it lowers the squared error), so these hold only for ``rtn``;
instead each of its groups has at most RTN's squared error.
"""
from __future__ import annotations

import math

import pytest
import torch

import bitblas
from bitblas.formats import FORMATS
from bitblas.quantization import dequantize, dequantize_activation, quantize, quantize_activation, quantize_weight
from bitblas.quantization.quantize import TORCH_DTYPES, decode_values, unpack_zeros

N, K = 24, 256
U_FP16 = 2.0 ** -11          # unit roundoff of float16 (the scales' dtype with float16 activations)
REL = 1e-5                   # float32 arithmetic inside the quantizer, relative to values of order 1


def _f32_steps(fmt):
    """Float32 rounding of w / s (and w / s + z), in scale steps: 4 ulps of the largest code."""
    lo, hi = fmt.code_range
    return 2.0 ** -22 * max(-lo, hi, 1)
CODE_FORMATS = [n for n in bitblas.WEIGHT_FORMATS if FORMATS[n].kind != "float"]


def _weight(n=N, k=K, spread=1.0):
    """Random weights with per-row magnitudes over three decades, an all-zero row and an outlier."""
    w = torch.randn(n, k) * torch.exp(torch.randn(n, 1) * 1.2) * spread
    w[3] = 0.0
    w[5, 17] *= 40.0
    return w


def _finite_table(fmt):
    t = torch.tensor(fmt.table, dtype=torch.float64)
    return t[torch.isfinite(t)].unique()


def _dist_to_table(x, fmt):
    """Distance of each element of x (float64) to the nearest finite table value."""
    t = _finite_table(fmt)
    return (x.unsqueeze(-1) - t).abs().amin(-1)


def _half_largest_gap(fmt):
    t = _finite_table(fmt)
    return float((t[1:] - t[:-1]).max()) / 2


def _expand(t, config):
    """[N, groups] -> [N, K] (float64)."""
    gs = config.K if config.group_size == -1 else config.group_size
    return t.to(torch.float64).repeat_interleave(gs, dim=1)


def _mode_id(g, zeros):
    s = "gch" if g == -1 else f"g{g}"
    return s + ("" if zeros is None else f"_z{zeros}")


METHODS = ("rtn", "mse")


def _int_params():
    for name in CODE_FORMATS:
        fmt = FORMATS[name]
        if not fmt.integer:
            continue
        for g in (-1, 128):
            modes = [None] + [m for m in ("original", "rescale", "quantized") if m != "quantized" or fmt.kind == "uint"]
            for z in modes:
                for m in METHODS:
                    yield pytest.param(name, g, z, m, id=f"{name}-{_mode_id(g, z)}-{m}")


@pytest.mark.parametrize("name, group_size, zeros_mode, method", list(_int_params()))
def test_integer_weight_error_bound(name, group_size, zeros_mode, method):
    fmt = FORMATS[name]
    lo, hi = fmt.code_range
    config = bitblas.MatmulConfig(N=N, K=K, W_dtype=name, group_size=group_size, with_scaling=True,
                                  with_zeros=zeros_mode is not None, zeros_mode=zeros_mode or "original")
    w = _weight()
    q = quantize(w, config, method=method)
    groups = 1 if group_size == -1 else K // group_size
    assert q["scale"].shape == (N, groups) and q["scale"].dtype == torch.float16
    deq = dequantize(config, **q)
    assert deq.shape == (N, K) and deq.dtype == torch.float64
    s = _expand(q["scale"], config)
    w64 = w.to(torch.float64)
    err = (deq - w64).abs()
    assert torch.equal(deq[3], torch.zeros(K, dtype=torch.float64)), "an all-zero row must stay zero"
    # every method: the nearest point of the group's grid, i.e. within s / 2 of w clamped to the grid
    if zeros_mode is None:
        g_lo, g_hi = lo * s, hi * s
    elif zeros_mode == "rescale":
        z = _expand(q["zeros"], config)
        g_lo, g_hi = lo * s - z, hi * s - z
    else:
        z = _expand(unpack_zeros(config, q["zeros"]) if zeros_mode == "quantized" else q["zeros"], config)
        g_lo, g_hi = (lo - z) * s, (hi - z) * s
    target = torch.minimum(torch.maximum(w64, g_lo), g_hi)
    bound = s * (0.5 + _f32_steps(fmt))
    assert ((deq - target).abs() <= bound).all(), float(((deq - target).abs() / s).max())
    if method != "rtn":
        return
    if zeros_mode is None:
        if fmt.kind == "int" and fmt.bits >= 2:     # the grid spans [-absmax, absmax]: no clamping
            assert (err <= bound).all(), f"max error {float((err / s).max()):.4f} scale steps"
        return
    assert q["zeros"].shape[0] == (groups if zeros_mode == "quantized" else N)   # quantized: [groups, N packed]
    slack = (hi - lo) * U_FP16 if zeros_mode == "quantized" else 0.0
    bound = s * (0.5 + slack + _f32_steps(fmt))
    assert (err <= bound).all(), f"max error {float((err / s).max()):.4f} scale steps, bound {0.5 + slack:.4f}"


@pytest.mark.parametrize("name", [n for n in CODE_FORMATS if FORMATS[n].integer])
def test_integer_weight_without_scales(name):
    """No scales: the codes are the values, round-to-nearest and clamped to the code range."""
    fmt = FORMATS[name]
    lo, hi = fmt.code_range
    config = bitblas.MatmulConfig(N=N, K=K, W_dtype=name)
    w = torch.randn(N, K) * max(hi - lo, 1)
    q = quantize(w, config)
    assert set(q) == {"W"}
    deq = dequantize(config, **q)
    target = w.to(torch.float64).clamp(lo, hi)
    assert ((deq - target).abs() <= 0.5 + 1e-6).all()
    assert deq.min() >= lo and deq.max() <= hi


def _table_params():
    for name in CODE_FORMATS:
        fmt = FORMATS[name]
        if fmt.kind != "table":
            continue
        for m in METHODS:
            if fmt.group_size is not None:
                yield pytest.param(name, fmt.group_size, m, id=f"{name}-g{fmt.group_size}-{m}")
                continue
            for g in (None, -1, 128):
                yield pytest.param(name, g, m, id=f"{name}-{'noscale' if g is None else _mode_id(g, None)}-{m}")


@pytest.mark.parametrize("name, group_size, method", list(_table_params()))
def test_table_weight_error_bound(name, group_size, method):
    fmt = FORMATS[name]
    scaled = group_size is not None
    config = bitblas.MatmulConfig(N=N, K=K, W_dtype=name, group_size=group_size or -1, with_scaling=scaled)
    w = _weight(spread=1.0 if scaled else 0.4)
    q = quantize(w, config, method=method)
    deq = dequantize(config, **q)
    w64 = w.to(torch.float64)
    if not scaled:
        s = torch.ones_like(w64)
    elif fmt.scale_format is not None:          # nvfp4: float8 block scales times the global scale
        sfmt = FORMATS[fmt.scale_format]
        assert q["scale"].dtype == TORCH_DTYPES[sfmt.torch_dtype]
        assert q["global_scale"].shape == (1,) and q["global_scale"].dtype == torch.float32
        s = _expand(q["scale"].to(torch.float64), config) * float(q["global_scale"])
    else:
        s = _expand(q["scale"], config)
    x = w64 / torch.where(s == 0, torch.ones_like(s), s)
    err = (deq - w64).abs()
    # nearest table value for every element ...
    bound = s * (_dist_to_table(x, fmt) + 2.0 ** -22 * x.abs()) + 1e-12
    assert (err <= bound).all(), f"not the nearest table value: excess {float((err - bound).max()):.3g}"
    assert torch.equal(deq[3], torch.zeros(K, dtype=torch.float64))
    if method == "rtn" or not scaled:
        # ... hence within half the largest table gap (plus what lies beyond the table's ends, unscaled)
        beyond = (w64.abs() - fmt.max_abs).clamp(min=0) if not scaled else 0.0
        assert (err <= s * _half_largest_gap(fmt) * (1 + REL) + beyond).all()


def _search_params():
    for name in CODE_FORMATS:
        fmt = FORMATS[name]
        modes = [None]
        if fmt.integer:
            modes += [m for m in ("original", "rescale", "quantized") if m != "quantized" or fmt.kind == "uint"]
        for zm in modes:
            for g in ((fmt.group_size,) if fmt.group_size else (-1, 32)):
                yield pytest.param(name, g, zm, id=f"{name}-{_mode_id(g, zm)}")


@pytest.mark.parametrize("name, group_size, zeros_mode", list(_search_params()))
def test_mse_never_worse_than_rtn(name, group_size, zeros_mode):
    """The default search keeps RTN's grid unless another has a smaller squared error, group by group
    (decoded as the operator does), and lowers the total error of random weights."""
    fmt = FORMATS[name]
    config = bitblas.MatmulConfig(N=N, K=K, W_dtype=name, group_size=group_size, with_scaling=True,
                                  with_zeros=zeros_mode is not None, zeros_mode=zeros_mode or "original")
    w = _weight()
    gs = K if group_size == -1 else group_size
    err = {}
    for m in METHODS:
        deq = dequantize(config, **quantize(w, config, method=m))
        err[m] = ((deq - w.to(torch.float64)) ** 2).reshape(N, -1, gs).sum(-1)
    # the search compares float32 errors: a group may differ from RTN's by float32 rounding at most
    assert (err["mse"] <= err["rtn"] * (1 + 1e-6)).all(), float((err["mse"] / err["rtn"]).nan_to_num(1).max())
    # mean over groups of the error ratio (the rows' magnitudes span decades: a total would follow a few rows)
    nz = err["rtn"] > 0
    ratio = float((err["mse"][nz] / err["rtn"][nz]).mean())
    if fmt.kind == "uint" and zeros_mode is None:
        assert ratio <= 1.0          # negative weights clamp to 0 whatever the scale: little to gain
    elif fmt.bits <= 4:
        assert ratio < 0.97, ratio   # measured 0.08-0.94 over 20 seeds
    else:
        assert ratio < 1.0, ratio    # 8-bit integers and float8: measured 0.84-0.997


def test_rtn_is_plain_round_to_nearest():
    """method="rtn": min/max scale and zero point per group, rounded to float16, codes round-to-nearest
    (the quantizer before the search; the search's candidate 0)."""
    w = torch.randn(N, K)
    q = quantize_weight(w, "uint4", group_size=64, with_zeros=True, method="rtn")
    wg = w.reshape(N, -1, 64)
    lo_, hi_ = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    s = ((hi_ - lo_) / 15).half().float()
    z = (-lo_ / s).half().float()
    codes = (wg / s.unsqueeze(-1) + z.unsqueeze(-1)).round().clamp(0, 15).reshape(N, K)
    assert torch.equal(q.scale, s.half()) and torch.equal(q.zeros, z.half())
    assert torch.equal(q.codes, codes.to(torch.int16))
    qi = quantize_weight(w, "int4", group_size=64, method="rtn")
    si = (wg.abs().amax(-1) / 7).half().float()
    assert torch.equal(qi.scale, si.half())
    assert torch.equal(qi.codes, (wg / si.unsqueeze(-1)).round().clamp(-8, 7).reshape(N, K).to(torch.int16))


def test_method_default_and_errors():
    w = torch.randn(N, K)
    a = quantize_weight(w, "uint4", group_size=64, with_zeros=True)
    b = quantize_weight(w, "uint4", group_size=64, with_zeros=True, method="mse")
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale) and torch.equal(a.zeros, b.zeros)
    with pytest.raises(ValueError, match=r"method='gptq' is invalid; accepted: 'mse', 'rtn'"):
        quantize_weight(w, "uint4", method="gptq")
    with pytest.raises(ValueError, match="method="):
        bitblas.nn.QuantizationConfig(method="awq")
    # no scales: nothing to search, the methods agree
    c = bitblas.MatmulConfig(N=N, K=K, W_dtype="int4")
    x = torch.randn(N, K) * 4
    assert torch.equal(quantize(x, c)["W"], quantize(x, c, method="rtn")["W"])


def test_mse_with_non_finite_weights_keeps_rtn():
    w = torch.randn(N, K)
    w[2, 5] = float("inf")
    w[7, 9] = float("nan")
    a = quantize_weight(w, "uint4", group_size=64, with_zeros=True)
    b = quantize_weight(w, "uint4", group_size=64, with_zeros=True, method="rtn")
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale.isnan(), b.scale.isnan())


def test_linear_takes_the_method():
    w = torch.randn(N, K) * 0.05
    for m in METHODS:
        lin = bitblas.Linear(K, N, W_dtype="uint4", group_size=64, with_scaling=True, with_zeros=True)
        lin.load_and_transform_weight(w, method=m)
        q = quantize_weight(w, "uint4", group_size=64, with_zeros=True, method=m)
        u = lin.unpacked()
        assert torch.equal(u["codes"].to(torch.int16), q.codes) and torch.equal(u["scales"], q.scale)
        assert torch.equal(u["zeros"], q.zeros)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name, group_size, zeros", [("uint4", 128, True), ("int4", 64, False), ("nf4", 128, False),
                                                     ("nvfp4", 16, False), ("float8_e4m3", 128, False)])
def test_mse_on_cuda(name, group_size, zeros):
    """The search runs on the weight's device (transformers' device_map="cuda" quantizes there):
    results stay on it and no group is worse than RTN's."""
    w = (torch.randn(256, 512) * 0.02).cuda()
    config = bitblas.MatmulConfig(N=256, K=512, W_dtype=name, group_size=group_size, with_scaling=True,
                                  with_zeros=zeros)
    err = {}
    for m in METHODS:
        q = quantize(w, config, method=m)
        assert all(t.device.type == "cuda" for t in q.values())
        deq = dequantize(config, **{k: v.cpu() for k, v in q.items()})
        err[m] = ((deq - w.cpu().double()) ** 2).reshape(256, -1, group_size).sum(-1)
    assert (err["mse"] <= err["rtn"] * (1 + 1e-6)).all()
    assert float(err["mse"].sum()) < float(err["rtn"].sum())


def test_nvfp4_without_global_scale():
    w = _weight()
    config = bitblas.MatmulConfig(N=N, K=K, W_dtype="nvfp4", group_size=16, with_scaling=True)
    q = quantize_weight(w, "nvfp4", global_scale=False)
    assert q.global_scale is None and q.scale.dtype == torch.float8_e4m3fn
    deq = dequantize(config, W=bitblas.quantization.pack_weight(config, q.codes)["W"], scale=q.scale)
    s = _expand(q.scale.to(torch.float64), config)
    x = w.to(torch.float64) / torch.where(s == 0, torch.ones_like(s), s)
    bound = s * (_dist_to_table(x, FORMATS["nvfp4"]) + 2.0 ** -22 * x.abs()) + 1e-12
    assert ((deq - w.to(torch.float64)).abs() <= bound).all()


@pytest.mark.parametrize("name", ["nf4", "fp4_e2m1", "int4"])
def test_non_contiguous_weight(name):
    """A transposed view quantizes like its contiguous copy (the table search used to fail on it)."""
    w = torch.randn(96, 64).t()
    for gs in (-1, 32):
        a, b = quantize_weight(w, name, gs), quantize_weight(w.contiguous(), name, gs)
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_float_weight_is_exact(name):
    config = bitblas.MatmulConfig(N=N, K=K, A_dtype=name, W_dtype=name)
    w = torch.randn(N, K).to(TORCH_DTYPES[name])
    q = quantize(w, config)
    assert set(q) == {"W"} and q["W"].dtype == TORCH_DTYPES[name]
    assert torch.equal(dequantize(config, **q), w.to(torch.float64))


@pytest.mark.parametrize("dtype", ["int8", "int4", "float8_e4m3", "float8_e5m2"])
def test_activation_error_bound(dtype):
    fmt = FORMATS[dtype]
    x = torch.randn(2, 3, K) * torch.exp(torch.randn(2, 3, 1))
    x[1, 2] = 0.0
    q, s = quantize_activation(x, dtype)
    assert s.shape == (2, 3) and s.dtype == torch.float32
    if fmt.kind == "table":
        assert q.dtype == TORCH_DTYPES[fmt.torch_dtype] and q.shape == x.shape
    else:
        assert q.dtype == torch.int8 and q.shape == (2, 3, K // fmt.codes_per_byte)
    deq = dequantize_activation(q, dtype, s)
    assert deq.shape == x.shape and deq.dtype == torch.float64
    x64 = x.to(torch.float64)
    s64 = s.to(torch.float64).unsqueeze(-1)
    err = (deq - x64).abs()
    assert torch.equal(deq[1, 2], torch.zeros(K, dtype=torch.float64))
    if fmt.kind == "table":
        xs = x64 / torch.where(s64 == 0, torch.ones_like(s64), s64)
        bound = s64 * (_dist_to_table(xs, fmt) + 2.0 ** -22 * xs.abs()) + 1e-12
        assert (err <= bound).all()
        assert (err <= s64 * _half_largest_gap(fmt) * (1 + REL)).all()
    else:
        assert (err <= s64 * 0.5 * (1 + REL)).all()
        # the per-token scale uses the symmetric range: the largest magnitude maps to the top code
        qmax = fmt.code_range[1]
        assert torch.allclose(s64.squeeze(-1)[0], x64.abs().amax(-1)[0] / qmax, rtol=1e-6)
    # without the scale: the raw codes' values
    raw = dequantize_activation(q, dtype)
    assert torch.allclose(raw * s64, deq)
    assert math.isclose(float(raw.abs().max()), fmt.max_abs if fmt.kind == "table" else fmt.code_range[1],
                        rel_tol=0.07)
