"""A GPTQ checkpoint into bitblas.Linear layers.

    python integration/pytorch/gptq_checkpoint.py [--device cuda]

No network here, so the example first writes a small GPTQ checkpoint itself (an MLP quantized
round-to-nearest to 4 bits, group 32, act-order ``g_idx``, the classic "zero - 1" qzeros, packed into
int32 words exactly as AutoGPTQ stores them) to a .safetensors file (torch.save without safetensors).
Then it does what you would do with a real one: build the float model, ``load_gptq_model`` (every
layer with a ``qweight`` becomes a ``bitblas.Linear``; the rest loads as usual), run it, and check the
outputs against dequantize-then-matmul.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn

from bitblas.nn import load_gptq_model

BITS, GROUP = 4, 32


class MLP(nn.Module):
    def __init__(self, d=256, h=512):
        super().__init__()
        self.up = nn.Linear(d, h, bias=False)
        self.down = nn.Linear(h, d, bias=True)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


def _words(x: torch.Tensor) -> torch.Tensor:
    return ((x + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32).contiguous()


def gptq_quantize_and_pack(w: torch.Tensor, gen: torch.Generator):
    """RTN "GPTQ" of one weight [N, K] with a random act-order; returns the checkpoint tensors and the
    float64 weight they stand for."""
    N, K = w.shape
    maxq, per = (1 << BITS) - 1, 32 // BITS
    perm = torch.randperm(K, generator=gen)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[perm] = (torch.arange(K) // GROUP).to(torch.int32)            # act-order: groups over a permutation
    G = K // GROUP
    scales = torch.empty(G, N, dtype=torch.float16)
    zeros = torch.empty(G, N, dtype=torch.int64)
    for g in range(G):
        wg = w[:, g_idx == g].double()
        lo, hi = wg.min(1).values.clamp(max=0), wg.max(1).values.clamp(min=0)
        scales[g] = ((hi - lo) / maxq).clamp(min=1e-8).half()
        zeros[g] = torch.round(-lo / scales[g].double()).clamp(1, maxq).long()
    s, z = scales.double()[g_idx.long()].T, zeros[g_idx.long()].T        # [N, K]
    q = torch.round(w.double() / s + z).clamp(0, maxq).long()
    qt = q.T                                                             # [K, N]
    qweight = sum(qt[j::per] << (BITS * j) for j in range(per))          # packed along K
    zs = (zeros - 1) & maxq                                              # classic format: zero - 1
    qzeros = sum(zs[:, j::per] << (BITS * j) for j in range(per))        # packed along N
    ckpt = {"qweight": _words(qweight), "qzeros": _words(qzeros), "scales": scales, "g_idx": g_idx}
    return ckpt, (q - z).double() * s


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    float_model = MLP()
    for prm in float_model.parameters():
        prm.data.copy_(torch.randn(prm.shape, generator=gen) * 0.05)
    ckpt, deq = {}, {}
    for name in ("up", "down"):
        layer = getattr(float_model, name)
        t, deq[name] = gptq_quantize_and_pack(layer.weight.data, gen)
        ckpt.update({f"{name}.{k}": v for k, v in t.items()})
    ckpt["down.bias"] = float_model.down.bias.data.half()
    ckpt.update({f"head.{k}": v.half() for k, v in float_model.head.state_dict().items()})

    path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    try:
        from safetensors.torch import load_file, save_file
        save_file(ckpt, path)
        ckpt = load_file(path)
        print("checkpoint:", path)
    except ImportError:
        torch.save(ckpt, path.replace(".safetensors", ".pt"))
        ckpt = torch.load(path.replace(".safetensors", ".pt"))
    for k, v in ckpt.items():
        print(f"  {k:14s} {str(v.dtype):14s} {list(v.shape)}")

    model = MLP().half().to(a.device)             # the architecture, float weights to be replaced
    load_gptq_model(model, ckpt, bits=BITS, group_size=GROUP)
    print(model)

    x = torch.randn(4, 256, generator=gen).half()
    with torch.inference_mode():
        out = model(x.to(a.device)).cpu().double()
    h = torch.relu(x.double() @ deq["up"].T).half().double()
    h = (h @ deq["down"].T + ckpt["down.bias"].double()).half().double()
    ref = h @ ckpt["head.weight"].double().T + ckpt["head.bias"].double()
    err = float((out - ref).abs().max() / ref.abs().max())
    print(f"max relative difference to dequantize-then-matmul: {err:.2e}")
    assert err < 1e-2


if __name__ == "__main__":
    main()
