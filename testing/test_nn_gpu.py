"""bitblas.Linear / QuantLinear on a CUDA GPU: formats, devices, the QuickStart examples, CUDA graphs,
torch.compile and the small Llama-style model."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import bitblas
from nn_helpers import load_tiny_llama, rel_err
from test_nn import FORMATS, BitBLASLinear, QuantizedNetwork, _layer, _reference
from bitblas.reference import tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU_FORMATS = ["f16xu4_g64_zeros", "f16xi4_g32", "bf16xnf4_g64", "f16xf16", "i8xi2_bitnet", "f16xnvfp4"]


@pytest.mark.parametrize("lead", [(1,), (17,), (2, 3)], ids=["m1", "m17", "b2x3"])
@pytest.mark.parametrize("name", GPU_FORMATS)
def test_linear_cuda_matches_reference(name, lead):
    kw = dict(FORMATS)[name]
    lin, _ = _layer(kw)
    lin = lin.cuda()
    a_float = kw["A_dtype"] in ("float16", "bfloat16", "float32")
    x = torch.randn(*lead, bitblas_k(lin)).to(getattr(torch, kw["A_dtype"]) if a_float else torch.float16)
    out = lin(x.cuda())
    assert out.is_cuda and out.shape == (*lead, lin.out_features)
    assert rel_err(out.cpu(), _reference(lin.cpu(), x)) <= tolerance(lin.config)


def bitblas_k(lin):
    return lin.in_features


def test_cpu_and_cuda_agree_and_state_dict_moves():
    lin, _ = _layer(dict(W_dtype="uint4", group_size=32, with_zeros=True))
    x = torch.randn(5, lin.in_features).half()
    cpu_out = lin(x)
    lin.cuda()
    assert lin.qweight.is_cuda and lin.scales.dtype == torch.float16
    assert rel_err(lin(x.cuda()).cpu(), cpu_out) <= 4e-3
    fresh = bitblas.Linear(lin.in_features, lin.out_features, bias=True, W_dtype="uint4", group_size=32,
                           with_zeros=True)
    fresh.load_state_dict(lin.state_dict())            # CUDA tensors into a CPU layer
    assert torch.equal(fresh(x), cpu_out)
    with pytest.raises(ValueError, match="cuda"):
        lin(x)                                         # CPU input, CUDA weights


def test_quickstart_examples_on_gpu():
    net = QuantizedNetwork().cuda()
    x = torch.randn(64, 784).float().cuda()
    output = net(x)
    assert output.shape == (64, 10) and output.dtype == torch.float32 and torch.isfinite(output).all()
    model = nn.Sequential(BitBLASLinear(1024, 512, bias=True, dtype=torch.float16), nn.ReLU(),
                          BitBLASLinear(512, 256, bias=True, dtype=torch.float16))
    model.cuda()
    x = torch.randn(1, 1024, dtype=torch.float16).cuda()
    with torch.no_grad():
        output = model(x)
        h = torch.relu(x.double() @ model[0].weight.double().T + model[0].bias.double()).half()
        ref = h.double() @ model[2].weight.double().T + model[2].bias.double()
    assert rel_err(output, ref) <= 4e-3


def _llama(cfg_kw=None, qcfg=None):
    tl = load_tiny_llama()
    cfg = tl.TinyLlamaConfig(**(cfg_kw or {}))
    ref = tl.TinyLlama(cfg).init_weights(0).half().cuda()
    q = tl.TinyLlama(cfg).half().cuda()
    q.load_state_dict(ref.state_dict())
    bitblas.quantize_model(q, qcfg or dict(W_dtype="uint4", group_size=64, with_zeros=True))
    for m in (ref, q):
        m.setup_cache(1)
    return tl, ref, q


@torch.no_grad()
def test_llama_logits_on_gpu():
    tl, ref, q = _llama(dict(hidden_size=256, intermediate_size=512, num_layers=3))
    tok = torch.randint(0, 256, (1, 24), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    start = torch.zeros(1, dtype=torch.long, device="cuda")
    a, b = ref(tok, start), q(tok, start)
    cos = tl.cosine(a, b)
    print(f"\nGPU tiny llama uint4 g64: logits cosine {cos:.5f}, max |diff| {float((a - b).abs().max()):.4f}")
    assert cos >= 0.97


@torch.no_grad()
def test_decode_step_in_cuda_graph():
    tl, _, q = _llama()
    tok = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q(tok, pos)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = q(tok, pos)
    for p, t in ((3, 7), (4, 11), (5, 200)):
        tok.fill_(t)
        pos.fill_(p)
        q.reset_cache()                                 # the same cache state for both: empty, then this token
        g.replay()
        replayed = static_out.clone()
        q.reset_cache()
        eager = q(tok, pos)
        assert torch.equal(replayed, eager) or rel_err(replayed, eager) <= 1e-3


@torch.no_grad()
def test_torch_compile_fullgraph_cuda():
    tl, _, q = _llama()
    tok = torch.randint(0, 256, (1, 8), device="cuda")
    start = torch.zeros(1, dtype=torch.long, device="cuda")
    eager = q(tok, start)
    q.setup_cache(1)
    torch._dynamo.reset()
    compiled = torch.compile(q, fullgraph=True)
    out = compiled(tok, start)
    assert rel_err(out, eager) <= 1e-2
