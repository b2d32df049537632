"""Helpers for the nn tests: reference GPTQ / AWQ packers (written independently of bitblas.nn's
unpackers, word by word like the AutoGPTQ / AutoAWQ packers), and the tiny Llama model."""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def load_tiny_llama():
    """The integration/pytorch/tiny_llama.py module."""
    path = os.path.join(ROOT, "integration", "pytorch", "tiny_llama.py")
    if "tiny_llama" in sys.modules:
        return sys.modules["tiny_llama"]
    spec = importlib.util.spec_from_file_location("tiny_llama", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tiny_llama"] = mod
    spec.loader.exec_module(mod)
    return mod


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit words -> int32 with the same bits."""
    return ((x + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


@dataclass
class RefQuant:
    q: torch.Tensor          # int64 codes [N, K]
    z: torch.Tensor          # int64 zero points [G, N]
    s: torch.Tensor          # float16 scales [G, N]
    g_idx: torch.Tensor      # int32 [K]
    w_deq: torch.Tensor      # float64 [N, K]: (q - z) * s


def ref_quantize(w: torch.Tensor, bits: int, group_size: int, act_order: bool = False, zmin: int = 0,
                 seed: int = 0) -> RefQuant:
    """Asymmetric min/max quantization per group; act_order: groups over a random permutation of K."""
    N, K = w.shape
    gs = K if group_size == -1 else group_size
    G = K // gs
    maxq = (1 << bits) - 1
    if act_order:
        perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty(K, dtype=torch.int32)
        g_idx[perm] = (torch.arange(K) // gs).to(torch.int32)
    else:
        g_idx = (torch.arange(K) // gs).to(torch.int32)
    wf = w.to(torch.float64)
    s = torch.empty(G, N, dtype=torch.float16)
    z = torch.empty(G, N, dtype=torch.int64)
    for g in range(G):
        cols = (g_idx == g).nonzero().flatten()
        wg = wf[:, cols]
        lo, hi = wg.min(1).values.clamp(max=0), wg.max(1).values.clamp(min=0)
        sc = ((hi - lo) / maxq).clamp(min=1e-8)
        s[g] = sc.to(torch.float16)
        z[g] = torch.round(-lo / s[g].double()).clamp(zmin, maxq).to(torch.int64)
    sk = s.double()[g_idx.long()].T          # [N, K]
    zk = z[g_idx.long()].T
    q = torch.round(wf / sk + zk).clamp(0, maxq).to(torch.int64)
    return RefQuant(q, z, s, g_idx, (q - zk).double() * sk)


def gptq_pack(r: RefQuant, bits: int, zero_offset: bool = True):
    """(qweight int32 [K*bits/32, N], qzeros int32 [G, N*bits/32]) the way GPTQ writes them."""
    per = 32 // bits
    qt = r.q.T.contiguous()                  # [K, N]
    K, N = qt.shape
    qweight = torch.zeros(K // per, N, dtype=torch.int64)
    for row in range(K // per):
        for j in range(per):
            qweight[row] |= qt[row * per + j] << (bits * j)
    zs = (r.z - 1 if zero_offset else r.z) & ((1 << bits) - 1)
    G = zs.shape[0]
    qzeros = torch.zeros(G, N // per, dtype=torch.int64)
    for col in range(N // per):
        for j in range(per):
            qzeros[:, col] |= zs[:, col * per + j] << (bits * j)
    return _to_int32(qweight), _to_int32(qzeros)


def awq_pack(r: RefQuant):
    """(qweight int32 [K, N/8], qzeros int32 [G, N/8]) the way AutoAWQ's GEMM layer writes them."""
    qt = r.q.T.contiguous()                  # [K, N]
    K, N = qt.shape
    qweight = torch.zeros(K, N // 8, dtype=torch.int64)
    qzeros = torch.zeros(r.z.shape[0], N // 8, dtype=torch.int64)
    for col in range(N // 8):
        for i in range(8):
            qweight[:, col] |= qt[:, col * 8 + AWQ_PACK_ORDER[i]] << (4 * i)
            qzeros[:, col] |= r.z[:, col * 8 + AWQ_PACK_ORDER[i]] << (4 * i)
    return _to_int32(qweight), _to_int32(qzeros)


class FakeGPTQLayer(torch.nn.Module):
    """An AutoGPTQ-style layer holding packed tensors as buffers (for repack_from_gptq / state dicts)."""

    def __init__(self, qweight, qzeros, scales, g_idx: Optional[torch.Tensor] = None, bias=None):
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("qzeros", qzeros)
        self.register_buffer("scales", scales)
        self.register_buffer("g_idx", g_idx)
        self.register_buffer("bias", bias)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    if torch.isnan(o).any():
        return float("inf")
    return float((o - r).abs().max() / r.abs().max().clamp(min=1e-30))
