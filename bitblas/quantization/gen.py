"""``gen_quant4``: Microsoft BitBLAS's generator of a 4-bit GPTQ-style test layer."""
from __future__ import annotations

import torch

__all__ = ["gen_quant4"]


def gen_quant4(k: int, n: int, groupsize: int = -1):
    """A random float16 weight [k, n] quantized to 4 bits, symmetric, per group of ``groupsize`` rows
    of k (-1: one group), as Microsoft BitBLAS's helper of the same name.

    Returns ``(original_w, linear, s, q)``: the float16 weight [k, n]; an ``nn.Linear(k, n,
    bias=False)`` whose weight is the dequantized ``q * s`` (transposed, [n, k]); the scales
    [k / groupsize, n] (float16); the signed codes ``q`` [k, n] (int32, -8..7). Unlike BitBLAS's,
    the unsigned storage code ``q + 8`` is clamped to 0..15, so every code fits in 4 bits.
    """
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} is invalid; accepted: a positive int")
    if groupsize == -1:
        groupsize = k
    if isinstance(groupsize, bool) or not isinstance(groupsize, int) or groupsize < 1 or k % groupsize:
        raise ValueError(f"groupsize={groupsize!r} is invalid; accepted: -1 or a positive divisor of k={k}")
    maxq = 2 ** 4
    w = torch.randn((k, n), dtype=torch.half)
    original_w = w.clone()
    g = w.reshape(k // groupsize, groupsize, n)                      # [groups, groupsize, n]
    s = g.abs().amax(dim=1, keepdim=True) * (2 / maxq)               # [groups, 1, n]
    code = torch.clamp(torch.round(g / s).int() + maxq // 2, 0, maxq - 1)
    q = (code - maxq // 2).reshape(k, n)
    ref = ((code - maxq // 2).half() * s).reshape(k, n)
    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = ref.t()
    return original_w, linear, s.reshape(-1, n).contiguous(), q
