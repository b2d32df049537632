"""``bitblas.QuantLinear``: GPTQ-style weight-only quantized linear, a drop-in for AutoGPTQ's QuantLinear.

Unsigned ``bits``-bit codes with per-group scales and zero points, ``w = (q - z) * s`` (zeros kept as
float16 values, so GPTQ's "+1" zeros up to 2**bits fit), optional act-order permutation. It
differs from :class:`bitblas.Linear` in what it accepts:

* float inputs of any dtype: cast to the layer's activation dtype (float16 by default), the output
  cast back to the input's dtype;
* AutoGPTQ spellings: ``infeatures`` / ``outfeatures`` keywords and attributes, ``pack(linear,
  scales, zeros, g_idx)``, ``post_init()``, ``repack_from_gptq(module)``;
* ``load_state_dict`` of a GPTQ checkpoint's tensors (``qweight`` int32 [K*bits/32, N], ``qzeros``,
  ``scales`` [groups, N], ``g_idx``, ``bias``), converted on load; ``state_dict()`` then holds
  bitblas's packed tensors.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..formats import FORMATS
from .checkpoint import ImportedWeight, groups_check, from_gptq
from .linear import Linear

__all__ = ["QuantLinear"]

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


class QuantLinear(Linear):
    """QuantLinear(in_features, out_features, bits=4, bias=True, group_size=-1).

    ``dtype``: activation dtype of the kernel (torch.float16 or torch.bfloat16). ``zeros_mode``:
    "original" (default, any zero point), "rescale" or "quantized" (zero points 0..2**bits-1 only).
    ``checkpoint_format``: "gptq" (zeros stored minus 1, the classic format) or "gptq_v2", for GPTQ
    tensors given to ``load_state_dict`` / ``repack_from_gptq``. Other AutoGPTQ / BitBLAS knobs
    (``fast_decoding``, ``propagate_a``, ``propagate_b``, ``layout``, ``trainable``) are accepted
    and ignored: the plan decides layouts.
    """

    def __init__(self, in_features: Optional[int] = None, out_features: Optional[int] = None, bits: int = 4,
                 bias: bool = True, group_size: Optional[int] = -1, *, infeatures: Optional[int] = None,
                 outfeatures: Optional[int] = None, dtype: torch.dtype = torch.float16, zeros_mode: str = "original",
                 checkpoint_format: str = "gptq", opt_M=Linear.opt_M, enable_tuning: bool = False, target=None,
                 device=None, fast_decoding=None, propagate_a=None, propagate_b=None, layout: str = "nt",
                 trainable: bool = False):
        in_features = _alias("in_features", in_features, "infeatures", infeatures)
        out_features = _alias("out_features", out_features, "outfeatures", outfeatures)
        if isinstance(bits, bool) or not isinstance(bits, int) or f"uint{bits}" not in FORMATS:
            if bits in (3, 5, 6, 7):
                raise NotImplementedError(f"bits={bits} is not supported; supported: 1, 2, 4, 8")
            raise ValueError(f"bits={bits!r} is invalid; accepted: 1, 2, 4, 8")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype} is invalid; accepted: torch.float16, torch.bfloat16")
        if layout != "nt":
            raise ValueError(f"layout={layout!r} is invalid; accepted: 'nt'")
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"checkpoint_format={checkpoint_format!r} is invalid; accepted: 'gptq', 'gptq_v2'")
        if trainable:
            raise NotImplementedError("trainable=True: the bitblas kernels have no backward")
        super().__init__(in_features, out_features, bias=bias, A_dtype=_DTYPES[dtype], W_dtype=f"uint{bits}",
                         group_size=group_size, with_scaling=True, with_zeros=True, zeros_mode=zeros_mode,
                         opt_M=opt_M, enable_tuning=enable_tuning, fast_decoding=fast_decoding, target=target,
                         device=device)
        self.checkpoint_format = checkpoint_format

    @property
    def infeatures(self) -> int:
        return self.in_features

    @property
    def outfeatures(self) -> int:
        return self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x.dtype != self._a_dtype and x.dtype.is_floating_point:
            return super().forward(x.to(self._a_dtype)).to(x.dtype)
        return super().forward(x)

    def post_init(self):
        """AutoGPTQ calls this after loading; nothing to do (no per-call state to set up)."""

    @torch.no_grad()
    def pack(self, linear: torch.nn.Module, scales: torch.Tensor, zeros: torch.Tensor,
             g_idx: Optional[torch.Tensor] = None) -> "QuantLinear":
        """AutoGPTQ's ``pack``: quantize ``linear.weight`` [N, K] with GPTQ's ``scales`` and integer-valued
        ``zeros`` (both [N, groups]; ``q = round(w / s + z)``) and optional act-order ``g_idx`` [K]."""
        W = linear.weight.detach().to(torch.float32)
        N, K = self.out_features, self.in_features
        if list(W.shape) != [N, K]:
            raise ValueError(f"linear.weight: expected shape {[N, K]}, got {list(W.shape)}")
        if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.shape[0] != N:
            raise ValueError(f"scales: expected shape [{N}, groups], got {list(getattr(scales, 'shape', []))}")
        if not isinstance(zeros, torch.Tensor) or zeros.shape != scales.shape:
            raise ValueError(f"zeros: expected shape {list(scales.shape)}, got {list(getattr(zeros, 'shape', []))}")
        G = scales.shape[1]
        gs = groups_check(K, G, self.group_size, "scales")
        s, z = scales.to(torch.float32).to(W.device), zeros.to(torch.float32).to(W.device)
        g = torch.arange(K, device=W.device) // gs if g_idx is None else g_idx.to(W.device, torch.long)
        if list(g.shape) != [K] or (g.numel() and (int(g.min()) < 0 or int(g.max()) >= G)):
            raise ValueError(f"g_idx: expected [{K}] group indices in [0, {G - 1}]")
        sq = s.to(torch.float16).to(torch.float32)        # the scales as the kernel will hold them
        q = torch.round(W / sq[:, g] + z[:, g]).clamp(0, (1 << self.bits) - 1).to(torch.int16)
        perm = None
        if not torch.equal(g.cpu(), torch.arange(K) // gs):
            perm = torch.argsort(g, stable=True)
            if not torch.equal(g[perm].cpu(), torch.arange(K) // gs):
                raise NotImplementedError(f"g_idx assigns groups of unequal sizes; each group must hold {gs} rows")
            q = q[:, perm]
        imp = ImportedWeight(q.contiguous(), s.to(torch.float16), z, perm, self.bits, gs)
        return self.load_imported(imp, getattr(linear, "bias", None))

    def repack_from_gptq(self, gptq_module=None, *, qweight=None, qzeros=None, scales=None, g_idx=None, bias=None,
                         checkpoint_format: Optional[str] = None) -> "QuantLinear":
        return super().repack_from_gptq(gptq_module, qweight=qweight, qzeros=qzeros, scales=scales, g_idx=g_idx,
                                        bias=bias, checkpoint_format=checkpoint_format or self.checkpoint_format)

    def _convert_foreign(self, state_dict, prefix):
        qw, qz = state_dict.get(prefix + "qweight"), state_dict.get(prefix + "qzeros")
        if qz is None or not isinstance(qw, torch.Tensor) or qw.dtype != torch.int32:
            return False
        scales = state_dict.get(prefix + "scales")
        g_idx = state_dict.pop(prefix + "g_idx", None)
        imp = from_gptq(qw, qz, scales, g_idx, bits=self.bits, in_features=self.in_features,
                        out_features=self.out_features, group_size=self.group_size,
                        checkpoint_format=self.checkpoint_format)
        bias = state_dict.get(prefix + "bias")
        new = self._prepare_imported(imp, bias if self.config.with_bias else None)
        del state_dict[prefix + "qzeros"]
        state_dict.update({prefix + k: v for k, v in new.items()})
        if imp.perm is not None:
            state_dict[prefix + "perm"] = imp.perm
        return True


def _alias(name, value, alias, alias_value):
    if alias_value is not None:
        if value is not None and value != alias_value:
            raise ValueError(f"{name}={value} and {alias}={alias_value} disagree; give one")
        value = alias_value
    if value is None:
        raise TypeError(f"QuantLinear: {name} is required")
    return value
