"""Checkpoint importers against the real packers, where they install on CPU from the registry
(``pip install -e ".[packers]"``; each test skips without its package).

- compressed-tensors: ``PackedQuantizationCompressor`` (llm-compressor's pack-quantized format);
- AutoAWQ: ``WQLinear_GEMM.from_linear`` and AutoAWQ's own ``dequantize_gemm``;
- AutoGPTQ: ``QuantLinear.pack`` of ``qlinear_cuda_old`` (GPTQ v1; the file is loaded by itself:
  auto-gptq 0.7.1's package ``__init__`` does not import under transformers 5).

GPTQModel (whose v1 zero points borrow across the 32-bit word) needs torch>=2.14.1 and is not tested
here; the v1 rule is tested from its definition in test_nn_checkpoint.py.
"""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas.nn import from_compressed_tensors, load_compressed_tensors_model
from reference_packers import autogptq_quantlinear

N, K = 64, 256


def _fp16_scales(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 0.01 + 0.002).half().float()


# -- compressed-tensors ---------------------------------------------------------------------------

def _ct():
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams
    return PackedQuantizationCompressor, QuantizationArgs, QuantizationScheme, calculate_qparams


def ct_compress(w, bits, symmetric, group_size):
    """compressed-tensors' own qparams and packing of ``w`` [N, K]: (compressed state, its decompressed weight)."""
    P, Args, Scheme, qparams = _ct()
    args = Args(num_bits=bits, type="int", symmetric=symmetric, strategy="group" if group_size else "channel",
                group_size=group_size)
    G = w.shape[1] // group_size if group_size else 1
    wg = w.reshape(w.shape[0], G, -1)
    s, zp = qparams(wg.amin(-1), wg.amax(-1), args)
    scheme = Scheme(targets=["Linear"], weights=args)
    comp = P.compress({"weight": w, "weight_scale": s.half().float(), "weight_zero_point": zp}, scheme)
    return comp, P.decompress(dict(comp), scheme)["weight"]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("group_size", [32, None], ids=["g32", "channel"])
def test_compressed_tensors_layer(bits, symmetric, group_size):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(bits)) * 0.05
    comp, ref = ct_compress(w, bits, symmetric, group_size)
    imp = from_compressed_tensors(comp["weight_packed"], comp["weight_scale"], comp["weight_shape"],
                                  comp.get("weight_zero_point"), bits=bits)
    assert imp.codes.shape == (N, K) and imp.group_size == (group_size or K)
    # (u - z) * s in float32 is their dequantized weight, exactly
    wq = (imp.codes.float() - imp.zeros.repeat_interleave(imp.group_size, 1)) * \
        imp.scale.float().repeat_interleave(imp.group_size, 1)
    assert torch.equal(wq, ref)
    # and so is a bitblas layer loaded through the model loader
    model = torch.nn.Sequential(torch.nn.Linear(K, N, bias=False))
    sd = {f"0.{k}": v for k, v in comp.items()}
    cfg = {"format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": bits, "type": "int", "symmetric": symmetric, "group_size": group_size,
        "strategy": "group" if group_size else "channel"}}}}
    load_compressed_tensors_model(model, sd, cfg, linear_kwargs=dict(A_dtype="float32"))
    lin = model[0]
    assert isinstance(lin, bitblas.Linear)
    assert lin.W_dtype == f"{'int' if symmetric else 'uint'}{bits}"
    assert torch.equal(lin.dequantized_weight(), ref)


def test_compressed_tensors_forward_and_errors(naming):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(7)) * 0.05
    comp, ref = ct_compress(w, 4, False, 64)
    model = torch.nn.Sequential(torch.nn.Linear(K, N, bias=True)).half()
    sd = {f"0.{k}": v for k, v in comp.items()} | {"0.bias": torch.randn(N).half()}
    load_compressed_tensors_model(model, sd)
    x = torch.randn(3, K).half()
    out = model(x)
    exp = x.double() @ ref.double().T + sd["0.bias"].double()
    assert float((out.double() - exp).abs().max() / exp.abs().max()) < 4e-3
    bad = dict(sd)
    bad["0.weight_zero_point"] = bad["0.weight_zero_point"][:, :1]
    with naming(ValueError, "weight_zero_point"):
        load_compressed_tensors_model(torch.nn.Sequential(torch.nn.Linear(K, N)).half(), bad)
    cfg = {"config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}}}
    with naming(NotImplementedError, "quantization_config"):
        load_compressed_tensors_model(torch.nn.Sequential(torch.nn.Linear(K, N)).half(), sd, cfg)


# -- AutoAWQ ----------------------------------------------------------------------------------------

def test_autoawq_gemm():
    pytest.importorskip("awq")
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm
    gs = 64
    g = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (N, K), generator=g)
    z = torch.randint(0, 16, (K // gs, N), generator=g)
    s = _fp16_scales(K // gs, N, seed=3)
    lin = torch.nn.Linear(K, N, bias=False)
    lin.weight.data = (q - z.repeat_interleave(gs, 0).T).float() * s.repeat_interleave(gs, 0).T
    awq = WQLinear_GEMM.from_linear(lin, 4, gs, scales=s, zeros=z)
    theirs = dequantize_gemm(awq.qweight, awq.qzeros, awq.scales, 4, gs)          # [K, N] float16
    layer = bitblas.Linear(K, N, W_dtype="uint4", group_size=gs, with_zeros=True)
    layer.repack_from_awq(awq)
    assert torch.equal(layer.dequantized_weight().half(), theirs.T)
    assert torch.equal(layer.dequantized_weight(), lin.weight.data)


# -- AutoGPTQ ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [2, 4, 8])
def test_autogptq_v1_pack(bits):
    QuantLinear = autogptq_quantlinear()
    gs, maxq = 64, (1 << bits) - 1
    g = torch.Generator().manual_seed(bits)
    q = torch.randint(0, maxq + 1, (N, K), generator=g)
    z = torch.randint(1, maxq + 1, (N, K // gs), generator=g)   # AutoGPTQ's v1 packer ORs -1 for a zero of 0
    s = _fp16_scales(N, K // gs, seed=bits)
    lin = torch.nn.Linear(K, N, bias=True)
    lin.weight.data = (q - z.repeat_interleave(gs, 1)).float() * s.repeat_interleave(gs, 1)
    ql = QuantLinear(bits, gs, K, N, True, weight_dtype=torch.float32)
    ql.pack(lin, s, z, torch.arange(K) // gs)
    layer = bitblas.Linear(K, N, bias=True, W_dtype=f"uint{bits}", group_size=gs, with_zeros=True)
    layer.repack_from_gptq(ql)                                     # checkpoint_format="gptq" (v1)
    assert torch.equal(layer.dequantized_weight(), lin.weight.data)
    x = torch.randn(2, K)
    with torch.no_grad():       # AutoGPTQ's own forward (its torch path on CPU) on the same tensors
        theirs, ours = ql(x), layer(x.half()).float()
    assert torch.allclose(ours, theirs, rtol=0, atol=3e-3 * float(theirs.abs().max()))
