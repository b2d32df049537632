"""A small Llama-style decoder (RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP) with a
static KV cache, written for tests and examples: random weights, a few layers, every projection an
``nn.Linear`` that ``bitblas.quantize_model`` can replace.

The forward takes token ids [B, S] and the start position as a tensor, and writes keys and values
into preallocated caches with ``index_copy_``, so one decode step has fixed shapes and no host sync:
it can be compiled with ``torch.compile(fullgraph=True)`` and captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TinyLlamaConfig:
    vocab_size: int = 256
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_seq_len: int = 64
    rope_theta: float = 10000.0
    eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rotate(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.h, self.kvh = cfg.num_heads, cfg.num_kv_heads
        self.d = cfg.hidden_size // cfg.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    def forward(self, x, cos, sin, positions, mask):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kvh, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kvh, self.d).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        self.k_cache.index_copy_(2, positions, k.to(self.k_cache.dtype))
        self.v_cache.index_copy_(2, positions, v.to(self.v_cache.dtype))
        rep = self.h // self.kvh
        kk = self.k_cache.repeat_interleave(rep, dim=1)
        vv = self.v_cache.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, kk.to(q.dtype), vv.to(q.dtype), attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, positions, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        d = cfg.hidden_size // cfg.num_heads
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)        # [max_seq_len, head_dim / 2]
        self.register_buffer("sin", ang.sin(), persistent=False)

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "TinyLlama":
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.data.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.data.copy_(torch.randn(p.shape, generator=g) * std)
        return self

    def setup_cache(self, batch: int, dtype=None, device=None):
        """Allocate the static KV caches (batch, kv heads, max_seq_len, head dim)."""
        cfg = self.cfg
        p = self.embed_tokens.weight
        d = cfg.hidden_size // cfg.num_heads
        for blk in self.layers:
            shape = (batch, cfg.num_kv_heads, cfg.max_seq_len, d)
            blk.self_attn.k_cache = torch.zeros(shape, dtype=dtype or p.dtype, device=device or p.device)
            blk.self_attn.v_cache = torch.zeros(shape, dtype=dtype or p.dtype, device=device or p.device)

    def reset_cache(self):
        """Zero the caches in place (a captured CUDA graph keeps pointing at them)."""
        for blk in self.layers:
            blk.self_attn.k_cache.zero_()
            blk.self_attn.v_cache.zero_()

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Logits [B, S, vocab] for ``tokens`` [B, S] at positions start .. start + S - 1 (``start``:
        an int64 tensor of one element)."""
        S = tokens.shape[1]
        positions = start.reshape(1) + torch.arange(S, device=tokens.device)
        x = self.embed_tokens(tokens)
        cos = self.cos.index_select(0, positions).to(x.dtype)
        sin = self.sin.index_select(0, positions).to(x.dtype)
        keys = torch.arange(self.cfg.max_seq_len, device=tokens.device)
        mask = keys.view(1, -1) <= positions.view(-1, 1)                  # [S, max_seq_len]
        for blk in self.layers:
            x = blk(x, cos, sin, positions, mask)
        return self.lm_head(self.norm(x)).float()


def greedy_decode(model: TinyLlama, prompt: torch.Tensor, steps: int, step_fn=None):
    """Prefill ``prompt`` [B, S] then decode ``steps`` tokens greedily; ``step_fn(token, pos)`` replaces
    the model call for decode steps (a compiled model or a CUDA-graph replay). Returns [B, steps]."""
    dev = prompt.device
    start = torch.zeros(1, dtype=torch.long, device=dev)
    logits = model(prompt, start)
    tok = logits[:, -1].argmax(-1, keepdim=True)
    out = [tok]
    pos = torch.full((1,), prompt.shape[1], dtype=torch.long, device=dev)
    step = step_fn or model
    for _ in range(steps - 1):
        logits = step(tok, pos)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        out.append(tok)
        pos += 1
    return torch.cat(out, dim=1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm() + 1e-30))


__all__ = ["TinyLlamaConfig", "TinyLlama", "greedy_decode", "cosine"]
