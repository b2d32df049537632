"""GPTQ-style calibrated quantization (bitblas/quantization/gptq.py) and quantize_model(calibration=...)
(bitblas/nn/calibrate.py): less output error than the weight-only quantizers on correlated inputs,
the plain quantizer's exact codes when nothing is compensated (H = identity), valid codes for every
grid through the real packer and the CPU Matmul, the sequential order (a layer's Hessian comes from
the already quantized layers before it), and argument errors."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn

import bitblas
from bitblas.nn import calibrate
from bitblas.quantization import dequantize, pack_weight, quantize_weight
from bitblas.quantization.gptq import HessianAccumulator, gptq_quantize_weight
from bitblas.reference import reference_matmul, relative_error, tolerance


def _correlated(K, g):
    """n samples of K features with strong correlations (a random mixing of fewer latent factors)."""
    mix = torch.randn(K // 4, K, generator=g) / (K // 4) ** 0.5
    return lambda m: torch.randn(m, K // 4, generator=g) @ mix + 0.1 * torch.randn(m, K, generator=g)


def _decode(q, gs, K):
    """float32 weight of a QuantizedWeight of an integer format with scales (and zeros "original")."""
    s = q.scale.float().repeat_interleave(gs if gs > 0 else K, 1)
    if q.zeros is None:
        return q.codes.float() * s
    return (q.codes.float() - q.zeros.float().repeat_interleave(gs if gs > 0 else K, 1)) * s


def _out_err(x, w, wq):
    return float((x @ (w - wq).T).norm() / (x @ w.T).norm())


@pytest.mark.parametrize("method", ["rtn", "mse"])
@pytest.mark.parametrize("kw", [dict(W_dtype="uint4", group_size=64, with_zeros=True),
                                dict(W_dtype="int4", group_size=32), dict(W_dtype="uint4", group_size=-1,
                                                                          with_zeros=True)],
                         ids=["u4g64z", "i4g32", "u4ch_z"])
def test_gptq_lowers_output_error(kw, method):
    """On correlated inputs, ||X W^T - X Wq^T|| is well below the weight-only quantizer's (same
    method, same grid), on the calibration inputs and on fresh inputs of the same distribution."""
    K, N = 128, 48
    for seed in random.sample(range(1 << 30), 3):
        g = torch.Generator().manual_seed(seed)
        sample = _correlated(K, g)
        w = torch.randn(N, K, generator=g) * 0.02
        x, x_new = sample(2048), sample(512)
        acc = HessianAccumulator(K)
        for part in x.split(500):
            acc.add(part)
        H = acc.hessian()
        assert torch.allclose(H, 2 * x.T @ x / len(x), rtol=1e-4, atol=1e-5)
        gs = kw["group_size"]
        plain = _out_err(x_new, w, _decode(quantize_weight(w, method=method, **kw), gs, K))
        for act_order in (False, True):
            q = gptq_quantize_weight(w, H, method=method, act_order=act_order, **kw)
            wq = _decode(q, gs, K)
            assert _out_err(x, w, wq) < 0.7 * _out_err(x, w, _decode(quantize_weight(w, method=method, **kw), gs, K))
            assert _out_err(x_new, w, wq) < 0.8 * plain, (seed, act_order, _out_err(x_new, w, wq), plain)


GRIDS = [dict(W_dtype="uint4", group_size=32, with_zeros=True, zeros_mode="original"),
         dict(W_dtype="uint4", group_size=64, with_zeros=True, zeros_mode="rescale"),
         dict(W_dtype="uint4", group_size=32, with_zeros=True, zeros_mode="quantized"),
         dict(W_dtype="int4", group_size=64), dict(W_dtype="int8", group_size=-1), dict(W_dtype="uint2",
                                                                                       group_size=32,
                                                                                       with_zeros=True),
         dict(W_dtype="nf4", group_size=64), dict(W_dtype="fp4_e2m1", group_size=32),
         dict(W_dtype="float8_e4m3", group_size=64), dict(W_dtype="int4", with_scaling=False)]
GRID_IDS = ["u4g32zorig", "u4g64zresc", "u4g32zquant", "i4g64", "i8ch", "u2g32z", "nf4g64", "fp4g32", "e4m3g64",
            "i4_noscale"]


@pytest.mark.filterwarnings("ignore::bitblas.quantization.LossyQuantizationWarning")   # int4 without scales
@pytest.mark.parametrize("kw", GRIDS, ids=GRID_IDS)
def test_identity_hessian_gives_the_plain_quantizer(kw):
    """H = identity: no column's error moves to another, so the codes, scales and zeros are
    quantize_weight's own (RTN exactly; "mse": the same parameters, codes nearest to them)."""
    N, K = 24, 128
    w = torch.randn(N, K) * (3.0 if kw.get("with_scaling") is False else 0.02)
    for method in ("rtn", "mse"):
        a = quantize_weight(w, method=method, **kw)
        b = gptq_quantize_weight(w, torch.eye(K) * 3.0, method=method, **kw)
        assert b.codes.dtype == a.codes.dtype and b.codes.shape == a.codes.shape
        for t, u in ((a.scale, b.scale), (a.zeros, b.zeros)):
            assert (t is None) == (u is None)
            if t is not None:
                assert t.dtype == u.dtype and torch.equal(t, u), method
        same = (a.codes.float() == b.codes.float()).float().mean().item()
        assert same == 1.0 if method == "rtn" else same > 0.995, (method, same)


@pytest.mark.parametrize("kw", GRIDS[:4] + GRIDS[6:7], ids=GRID_IDS[:4] + GRID_IDS[6:7])
def test_codes_pack_and_run(kw):
    """GPTQ's result is a layout the kernels read: packed by pack_weight, run by the CPU Matmul
    against the float64 reference, and (decoded as the kernel decodes) closer to the float layer's
    outputs on the calibration distribution than the weight-only quantizer."""
    N, K, M = 40, 128, 5
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    sample = _correlated(K, g)
    w = torch.randn(N, K, generator=g) * 0.02
    x = sample(1024)
    H = 2 * x.T @ x / len(x)
    cfg = bitblas.MatmulConfig(M=None, N=N, K=K, A_dtype="float16", with_scaling=kw.get("with_scaling", True),
                               **{k: v for k, v in kw.items() if k != "with_scaling"})
    q = gptq_quantize_weight(w, H, act_order=True, **kw)
    packed = pack_weight(cfg, q.codes, q.scale, q.zeros)
    wq = dequantize(cfg, packed["W"], packed.get("scale"), packed.get("zeros")).float()
    p = quantize_weight(w, **kw)
    pp = pack_weight(cfg, p.codes, p.scale, p.zeros)
    wp = dequantize(cfg, pp["W"], pp.get("scale"), pp.get("zeros")).float()
    assert _out_err(sample(512), w, wq) < _out_err(sample(512), w, wp)
    a = sample(M).to(torch.float16)
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    bitblas.Matmul(cfg)(a, **packed, output=out)
    err = relative_error(out, reference_matmul(cfg, a, **packed))
    assert err <= tolerance(cfg), err


def test_dead_columns_and_dampening():
    """Inputs that are always zero (H[k, k] = 0) keep their weights (rounded, not zeroed); a rank-
    deficient H still factors (dampening); percdamp=0 on a singular H is raised, not a NaN result."""
    N, K = 16, 64
    w = torch.randn(N, K) * 0.02
    x = torch.randn(256, K)
    x[:, :8] = 0
    H = 2 * x.T @ x / len(x)
    q = gptq_quantize_weight(w, H, "int4", 32, method="rtn")
    wq = _decode(q, 32, K)
    assert torch.isfinite(wq).all()
    assert ((wq[:, :8] - w[:, :8]).abs() <= q.scale[:, :1].float() / 2 + 1e-6).all()    # kept, rounded
    low = torch.randn(8, K)
    H2 = 2 * low.T @ low / 8            # rank 8 < K
    assert torch.isfinite(_decode(gptq_quantize_weight(w, H2, "int4", 32), 32, K)).all()
    q0 = gptq_quantize_weight(w, H2, "int4", 32, percdamp=0)   # raised internally until it factors
    assert torch.isfinite(q0.scale.float()).all()


def test_gptq_argument_errors():
    w, H = torch.randn(8, 64), torch.eye(64)
    with pytest.raises(ValueError, match="H: expected"):
        gptq_quantize_weight(w, torch.eye(32), "int4", 32)
    with pytest.raises(ValueError, match="inf or nan"):
        gptq_quantize_weight(w, torch.full((64, 64), float("nan")), "int4", 32)
    with pytest.raises(ValueError, match="weight: expected"):
        gptq_quantize_weight(torch.randn(64), H, "int4", 32)
    with pytest.raises(ValueError, match="percdamp"):
        gptq_quantize_weight(w, H, "int4", 32, percdamp=-1)
    with pytest.raises(ValueError, match="block_size"):
        gptq_quantize_weight(w, H, "int4", 32, block_size=0)
    with pytest.raises(TypeError, match="act_order"):
        gptq_quantize_weight(w, H, "int4", 32, act_order="yes")
    with pytest.raises(ValueError, match="method"):
        gptq_quantize_weight(w, H, "int4", 32, method="best")
    with pytest.raises(ValueError, match="group_size"):
        gptq_quantize_weight(w, H, "int4", 48)
    with pytest.raises(ValueError, match="zeros_mode"):
        gptq_quantize_weight(w, H, "uint4", 32, with_zeros=True, zeros_mode="odd")
    with pytest.raises(NotImplementedError, match="nvfp4"):
        gptq_quantize_weight(w, H, "nvfp4", 16)
    with pytest.raises(ValueError, match="W_dtype"):
        gptq_quantize_weight(w, H, "int5", 32)
    with pytest.raises(ValueError, match="last dimension 64"):
        HessianAccumulator(64).add(torch.randn(3, 32))
    # a float format has no grid to compensate: the weight as quantize_weight gives it
    assert torch.equal(gptq_quantize_weight(w, H, "float16").codes, w.to(torch.float16))


# -- quantize_model(calibration=...) -----------------------------------------------------------

class _Net(nn.Module):
    """a and b read the same input (one stage), c reads their sum through a nonlinearity."""

    def __init__(self, K=64, hidden=64, out=32):
        super().__init__()
        self.a, self.b = nn.Linear(K, hidden), nn.Linear(K, hidden, bias=False)
        self.c = nn.Linear(hidden, out)
        self.head = nn.Linear(out, 8)

    def forward(self, x):
        return self.head(self.c(torch.relu(self.a(x) + self.b(x))))


def _nets(count, **kw):
    """``count`` _Net(**kw) in eval mode with the same (fresh random) weights."""
    nets = [_Net(**kw).eval() for _ in range(count)]
    for n in nets[1:]:
        n.load_state_dict(nets[0].state_dict())
    return nets


@pytest.fixture
def hessians(monkeypatch):
    """The Hessians quantize_model(calibration=...) hands gptq_quantize_weight, in call order."""
    seen = []
    real = calibrate.gptq_quantize_weight

    def spy(weight, H, *args, **kw):
        seen.append(H.clone())
        return real(weight, H, *args, **kw)

    monkeypatch.setattr(calibrate, "gptq_quantize_weight", spy)
    return seen


def test_stages_follow_the_execution_order():
    net = _Net()
    layers = {n: m for n, m in net.named_modules() if isinstance(m, nn.Linear)}
    run, batched = calibrate.calibration_runner([torch.randn(4, 64), torch.randn(3, 64)])
    stages, repeats = calibrate._record(net, layers, run)
    assert batched and repeats and stages == [["a", "b"], ["c"], ["head"]]


def test_quantize_model_is_sequential(hessians):
    """Each layer's Hessian comes from the inputs it sees with the layers before it already
    quantized (as the finished model computes them), and the result beats the uncalibrated model."""
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    torch.manual_seed(random.randrange(1 << 30))
    net, ref, plain = _nets(3)
    sample = _correlated(64, g)
    x = sample(1024)
    old = {n: getattr(net, n) for n in ("a", "b", "c")}
    cfg = dict(W_dtype="int4", group_size=32, A_dtype="float32")
    bitblas.quantize_model(net, cfg, skip=["head"], calibration=[x[:600], x[600:]])
    assert len(hessians) == 3
    H = dict(zip("abc", hessians))      # in execution order
    wa, wb = net.a.dequantized_weight(), net.b.dequantized_weight()
    assert torch.allclose(H["a"], 2 * x.T @ x / len(x), rtol=1e-4, atol=1e-5) and torch.equal(H["a"], H["b"])
    hid = torch.relu(x @ wa.T + ref.a.bias + x @ wb.T)      # c's input with a and b quantized
    assert torch.allclose(H["c"], 2 * hid.T @ hid / len(hid), rtol=1e-3, atol=1e-4)
    hid_float = torch.relu(ref.a(x) + ref.b(x))
    assert not torch.allclose(H["c"], 2 * hid_float.T @ hid_float / len(x), rtol=1e-3, atol=1e-4)
    # the float layers' weights were restored before the swap; the head was skipped
    assert isinstance(net.head, nn.Linear) and torch.equal(net.head.weight, ref.head.weight)
    assert all(torch.equal(old[n].weight, getattr(ref, n).weight) for n in ("a", "b", "c"))
    bitblas.quantize_model(plain, cfg, skip=["head"])
    xe = sample(256)
    with torch.no_grad():
        e_cal = float((net(xe) - ref(xe)).norm() / ref(xe).norm())
        e_plain = float((plain(xe) - ref(xe)).norm() / ref(xe).norm())
    assert e_cal < 0.85 * e_plain, (e_cal, e_plain)


def test_quantize_model_calibration_forms(hessians):
    """A list of batches and a callable running the same batches give the same layers; one tensor of
    all of them the same Hessians up to float32 summation order (GPTQ then flips a few codes, and
    the flips spread); act_order runs."""
    torch.manual_seed(random.randrange(1 << 30))
    x = torch.randn(96, 64)
    nets = _nets(3)
    hs, results = [], []
    for net, calib in zip(nets, (x, [(x[:50],), {"x": x[50:]}], lambda m: (m(x[:50]), m(x=x[50:])))):
        first = len(hessians)
        bitblas.quantize_model(net, dict(W_dtype="uint4", group_size=32, A_dtype="float32"), skip=["head"],
                               calibration=calib)
        hs.append(hessians[first:])
        results.append([getattr(net, n).dequantized_weight() for n in "abc"])
    assert all(torch.equal(u, v) for u, v in zip(results[1], results[2]))
    assert all(torch.equal(u, v) for u, v in zip(hs[1], hs[2]))
    assert torch.allclose(hs[0][0], hs[1][0], rtol=1e-5, atol=1e-6)
    net = _Net().eval()
    bitblas.quantize_model(net, dict(W_dtype="uint4", group_size=32, A_dtype="float32"), skip=["head"],
                           calibration=x, act_order=True, percdamp=0.05)
    assert isinstance(net.c, bitblas.Linear)


def test_quantize_model_calibration_errors():
    net = _Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    cfg = dict(W_dtype="int4", group_size=32, A_dtype="float32")
    with pytest.raises(TypeError, match="calibration"):
        bitblas.quantize_model(net, cfg, calibration="ids")
    with pytest.raises(ValueError, match="calibration: an empty list"):
        bitblas.quantize_model(net, cfg, calibration=[])
    with pytest.raises(TypeError, match="a batch must be"):
        bitblas.quantize_model(net, cfg, calibration=[torch.randn(2, 64), 3])
    with pytest.raises(ValueError, match="calibrated quantization only"):
        bitblas.quantize_model(net, cfg, act_order=True)
    with pytest.raises(ValueError, match="percdamp"):
        bitblas.quantize_model(net, cfg, calibration=torch.randn(4, 64), percdamp=float("nan"))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):   # the model's own error
        bitblas.quantize_model(net, cfg, calibration=torch.randn(4, 63))
    assert all(isinstance(m, nn.Linear) for m in (net.a, net.b, net.c, net.head))
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    with torch.device("meta"):
        meta = _Net()
    with pytest.raises(ValueError, match="meta device"):
        bitblas.quantize_model(meta, cfg, calibration=torch.randn(4, 64))


def test_layers_the_calibration_never_runs_are_quantized_plainly():
    net = _Net()
    net.extra = nn.Linear(64, 64)     # never called by forward
    with pytest.warns(UserWarning, match="never ran 1 layer"):
        bitblas.quantize_model(net, dict(W_dtype="int4", group_size=32, A_dtype="float32"), skip=["head"],
                               calibration=torch.randn(32, 64))
    assert isinstance(net.extra, bitblas.Linear)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gptq_on_cuda():
    """On the weight's device: H = identity gives the plain quantizer's codes, a correlated H the
    CPU's result up to float rounding, and quantize_model(calibration=...) on a CUDA model (float16,
    CPU calibration ids moved to it) builds CUDA bitblas layers whose outputs track the float model."""
    K, N = 256, 128
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    sample = _correlated(K, g)
    w = torch.randn(N, K, generator=g) * 0.02
    kw = dict(W_dtype="uint4", group_size=128, with_zeros=True)
    a = quantize_weight(w.cuda(), method="rtn", **kw)
    b = gptq_quantize_weight(w.cuda(), torch.eye(K), method="rtn", **kw)
    assert b.codes.device.type == "cuda" and torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale)
    x = sample(2048)
    H = 2 * x.T @ x / len(x)
    qc, qg = gptq_quantize_weight(w, H, **kw), gptq_quantize_weight(w.cuda(), H.cuda(), **kw)
    assert (qc.codes == qg.codes.cpu()).float().mean() > 0.9
    assert abs(_out_err(x, w, _decode(qc, 128, K)) - _out_err(x, w, _decode(qg, 128, K).cpu())) < 0.01
    torch.manual_seed(random.randrange(1 << 30))
    ref, net = (n.half().cuda() for n in _nets(2, K=K, hidden=K, out=128))
    bitblas.quantize_model(net, dict(W_dtype="uint4", group_size=128), skip=["head"], calibration=sample(1024).half())
    assert isinstance(net.c, bitblas.Linear) and net.c.qweight.device.type == "cuda"
    xe = sample(64).half().cuda()
    with torch.no_grad():
        out, want = net(xe).float(), ref(xe).float()
    assert float((out - want).norm() / want.norm()) < 0.2


def test_prequantized_layers_compute_quantized_during_calibration(hessians):
    """A layer given in ``weights`` is not calibrated, but the layers after it see its quantized outputs."""
    torch.manual_seed(random.randrange(1 << 30))
    net, ref = _nets(2)
    x = torch.randn(512, 64)
    qa = quantize_weight(net.a.weight, "int4", 32)
    bitblas.quantize_model(net, dict(W_dtype="int4", group_size=32), skip=["head"], weights={"a": qa}, calibration=x)
    assert len(hessians) == 2                                   # b and c
    hid = torch.relu(x @ net.a.dequantized_weight().T + ref.a.bias + x @ net.b.dequantized_weight().T)
    assert torch.allclose(hessians[1], 2 * hid.T @ hid / len(x), rtol=1e-3, atol=1e-4)
    assert torch.equal(net.a.unpacked()["codes"].to(torch.int16), qa.codes)
