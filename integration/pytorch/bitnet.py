"""BitNet b1.58 linear layers: int8 activations x ternary int2 weights with scales.

    python integration/pytorch/bitnet.py [--device cuda]

BitNet b1.58 quantizes each weight matrix to {-1, 0, +1} times one scale, the mean absolute value
of the matrix (absmean), and each token's activations to int8 with its own absmax scale. In bitblas
that is ``bitblas.Linear(A_dtype="int8", W_dtype="int2", with_scaling=True)``: the layer quantizes
float inputs per token, the kernel multiplies int8 by 2-bit codes with int32 accumulation, and the
epilogue applies the per-channel weight scale times the per-token activation scale. The codes are
packed four per byte, so the weights take 1/8 of their float16 size.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

import bitblas
from bitblas.quantization import dequantize_activation, quantize_activation


def ternarize(w: torch.Tensor):
    """BitNet b1.58 weight quantization: codes in {-1, 0, 1} and the absmean scale."""
    s = w.abs().mean().clamp(min=1e-8)
    return (w / s).round().clamp(-1, 1).to(torch.int8), s


def bitnet_linear(w: torch.Tensor, bias=None, device="cpu") -> bitblas.Linear:
    N, K = w.shape
    layer = bitblas.Linear(K, N, bias=bias is not None, A_dtype="int8", W_dtype="int2", with_scaling=True,
                           out_dtype="float16")
    codes, s = ternarize(w)
    # one scale for the whole matrix, given per output channel as the kernel takes it
    layer.load_and_transform_weight(codes, scales=s.expand(N, 1).float(), bias=bias)
    return layer.to(device)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    d, h = 512, 1376
    w_up, w_down = torch.randn(h, d, generator=g) * 0.05, torch.randn(d, h, generator=g) * 0.05
    mlp = nn.Sequential(bitnet_linear(w_up, device=a.device), nn.ReLU(), bitnet_linear(w_down, device=a.device))
    print(mlp)
    packed, f16 = mlp[0].qweight.numel() + mlp[2].qweight.numel(), 2 * (w_up.numel() + w_down.numel())
    print(f"weight bytes: {packed} (float16: {f16})")

    x = torch.randn(8, d, generator=g).half()
    with torch.inference_mode():
        out = mlp(x.to(a.device)).cpu()

    # reference: the same quantization, in float64
    def ref_layer(xin, w):
        codes, s = ternarize(w)
        q, xs = quantize_activation(xin, "int8")
        return (dequantize_activation(q, "int8", xs) @ (codes.double() * s.double()).T).half()
    ref = ref_layer(torch.relu(ref_layer(x, w_up)), w_down)
    err = float((out.double() - ref.double()).abs().max() / ref.double().abs().max())
    print(f"max relative difference to the float64 reference of the same quantization: {err:.2e}")
    full = torch.relu(x.double() @ w_up.double().T) @ w_down.double().T
    cos = float((out.double().flatten() @ full.flatten()) / (out.double().norm() * full.norm()))
    print(f"cosine similarity to the unquantized float MLP (random weights): {cos:.4f}")
    assert err < 1e-2


if __name__ == "__main__":
    main()
