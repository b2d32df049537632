"""GPTQ checkpoint tensors for the integration tests (written here, not taken from GPTQ code):
codes packed 32 // bits per int32 along K (qweight [K * bits / 32, N]) and zero points packed
along N (qzeros [groups, N * bits / 32]); "gptq" (v1) stores each zero point minus 1, "gptq_v2"
as is. Symmetric checkpoints have zero point 2**(bits-1) everywhere."""
import torch


def pack_int32(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned ``bits``-bit codes along ``dim`` into int32 words, low bits first."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per, per)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    words = ((c & ((1 << bits) - 1)) << shifts).sum(-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def make_gptq(K: int, N: int, group_size: int, bits: int = 4, sym: bool = False, v2: bool = False, seed: int = 0):
    """(tensors, reference weight [N, K] float64): tensors has qweight, qzeros, scales (float16), g_idx."""
    g = torch.Generator().manual_seed(seed)
    G = K // group_size
    hi = (1 << bits) - 1
    codes = torch.randint(0, hi + 1, (K, N), generator=g)
    zeros = torch.full((G, N), 1 << (bits - 1)) if sym else torch.randint(1, hi, (G, N), generator=g)
    scales = (torch.rand(G, N, generator=g) * 0.02 + 0.005).to(torch.float16)
    gi = torch.arange(K) // group_size
    ref = ((codes - zeros[gi]).double() * scales[gi].double()).T.contiguous()      # [N, K]
    stored = zeros if v2 else zeros - 1
    return {"qweight": pack_int32(codes, bits, 0), "qzeros": pack_int32(stored, bits, 1), "scales": scales,
            "g_idx": gi.to(torch.int32)}, ref


def unpack_fields(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The ``bits``-wide fields of each integer along the last axis, lowest first, as int8 values in
    [0, 2**bits): [..., n] words of w bits -> [..., n * w / bits]."""
    per = words.element_size() * 8 // bits
    shifts = torch.arange(per, dtype=torch.int64, device=words.device) * bits
    fields = (words.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return fields.reshape(*words.shape[:-1], -1).to(torch.int8)
