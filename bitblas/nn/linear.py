"""``bitblas.Linear``: an nn.Module around one shared :class:`~bitblas.Matmul`.

The module holds the tensors the operator takes as buffers (``qweight`` packed codes, or ``weight``
for unquantized float16/bfloat16 weights; ``scales``, ``zeros``, ``bias``, ``global_scale``; ``perm``
for act-order checkpoints), so ``state_dict()`` / ``load_state_dict()`` carry exactly the packed
tensors and ``.to(device)`` moves them like nn.Linear's weights. Dtype casts (``.half()``,
``.float()``) leave them as they are: the formats are fixed when the layer is built.

The forward takes ``x`` of shape [..., in_features]; float activations must have the layer's
``A_dtype`` (QuantLinear casts instead); for integer / float8 ``A_dtype`` a float ``x`` is quantized
per token on the fly (or pass the quantized codes with ``a_scale``).
"""
from __future__ import annotations

import json
import logging
from typing import Dict, Optional, Sequence, Union

import torch
import torch.nn as nn

from .. import torch_op
from ..config import MatmulConfig
from ..formats import FORMATS, get_format
from ..plan import make_plan
from ..quantization.quantize import (TORCH_DTYPES, pack_weight, pack_zeros, quantize_activation, quantize_weight,
                                     unpack_zeros)
from ..quantization.utils import bitblas_weight_order, reorder_codes, unpack_codes
from .checkpoint import ImportedWeight, from_awq, from_gptq

__all__ = ["Linear"]

_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack     # 0 outside any TorchDispatchMode (see torch_op.is_eager)

logger = logging.getLogger(__name__)

# The format record's version. /1 (bitblas 0.1.x): signed 1/2/4-bit codes two's complement,
# quantized zero points [N, groups * bits / 8]; /2: BitBLAS's layouts (offset-binary signed codes,
# quantized zero points [groups, N * bits / 8]) with qweight in natural code order; /3: as /2 with
# qweight in the kernels' code order, which is Microsoft BitBLAS's (lop3-interleaved inside each
# 32-bit word where its fast decoding is on: Plan.w_order, bitblas.code_order). /1 and /2
# checkpoints are migrated on load; a state dict without a record is Microsoft BitBLAS's Linear's,
# whose bytes the kernels read as they are.
_FORMAT_TAG = "bitblas.Linear/3"
_FORMAT_V2 = "bitblas.Linear/2"
_FORMAT_V1 = "bitblas.Linear/1"
# plan argument -> buffer name (W: "qweight" for quantized formats, "weight" for float16/bfloat16)
_BUFFERS = {"scale": "scales", "zeros": "zeros", "bias": "bias", "global_scale": "global_scale"}
# fields of the extra state a checkpoint must agree on
_STATE_FIELDS = ("in_features", "out_features", "A_dtype", "W_dtype", "out_dtype", "group_size", "with_scaling",
                 "with_zeros", "zeros_mode", "with_bias")


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}={v!r} is invalid; accepted: a positive int")


class Linear(nn.Module):
    """y = x @ dequantize(W).T (+ bias), on CPU tensors (LLVM kernels) and CUDA tensors (CUDA kernels).

    Arguments follow Microsoft BitBLAS's ``bitblas.Linear``; ``opt_M`` is the list of row counts the
    kernels are specialised / tuned for (any row count runs). ``with_scaling=None``: True for
    quantized formats. ``out_dtype=None``: ``A_dtype`` for float activations, else float16.
    ``target``: the CUDA target (None: the local GPU). Weights start as zero codes with unit scales:
    load them with :meth:`load_and_transform_weight`, :meth:`repack_from_gptq`,
    :meth:`repack_from_awq` or ``load_state_dict``.
    """

    opt_M = (1, 16, 32, 64, 128, 256, 512)

    def __init__(self, in_features: int, out_features: int, bias: bool = False, A_dtype: str = "float16",
                 W_dtype: str = "float16", accum_dtype: Optional[str] = None, out_dtype: Optional[str] = None,
                 group_size: Optional[int] = -1, with_scaling: Optional[bool] = None, with_zeros: bool = False,
                 zeros_mode: Optional[str] = None, opt_M: Union[int, Sequence[int], None] = opt_M,
                 enable_tuning: bool = False, fast_decoding: Optional[bool] = None, propagate_b: bool = False,
                 target=None, device=None):
        super().__init__()
        _positive("in_features", in_features)
        _positive("out_features", out_features)
        a = get_format(A_dtype, "A", "A_dtype")
        w = get_format(W_dtype, "W", "W_dtype")
        if a.name == "nvfp4":
            raise NotImplementedError("A_dtype='nvfp4': the nn modules take float, int or float8 activations; NVFP4 "
                                      "activations run through bitblas.Matmul or bitblas.ops.nvfp4_gemv")
        if group_size is None:
            group_size = -1
        if not isinstance(group_size, bool) and isinstance(group_size, int) and group_size > 0 \
                and in_features % group_size:
            raise ValueError(f"group_size={group_size} must divide in_features={in_features}")
        if w.packed and in_features % w.codes_per_byte:
            raise ValueError(f"in_features={in_features} must be a multiple of {w.codes_per_byte} for "
                             f"W_dtype={W_dtype!r} ({w.codes_per_byte} codes per byte)")
        if with_scaling is None:
            with_scaling = w.kind != "float"
        if out_dtype is None:
            out_dtype = A_dtype if a.kind == "float" else "float16"
        act_scaling = a.kind != "float" and out_dtype != "int32"
        if isinstance(opt_M, list):
            opt_M = tuple(opt_M)
        self.config = MatmulConfig(
            M=opt_M, N=out_features, K=in_features, A_dtype=A_dtype, W_dtype=W_dtype, accum_dtype=accum_dtype,
            out_dtype=out_dtype, with_bias=bool(bias), group_size=group_size, with_scaling=with_scaling,
            with_zeros=with_zeros, zeros_mode=zeros_mode or "original", fast_decoding=fast_decoding,
            with_act_scaling=act_scaling)
        self.in_features, self.out_features = in_features, out_features
        self.A_dtype, self.W_dtype, self.out_dtype = A_dtype, W_dtype, out_dtype
        self.group_size = group_size
        self.with_scaling, self.with_zeros, self.zeros_mode = with_scaling, with_zeros, self.config.zeros_mode
        self.bits = w.bits
        self.source_format = w.kind
        self.bitblas_matmul, self._key = torch_op.get_operator(self.config, target)
        plan = self._plan = make_plan(self.config, "cpu")
        self._weight_name = "weight" if w.kind == "float" else "qweight"
        try:        # how Microsoft BitBLAS's bytes of this weight differ (None: not at all; str: unreadable)
            self._bitblas_order = bitblas_weight_order(self.config)
        except NotImplementedError as e:
            self._bitblas_order = str(e)
        self._code_order = _FORMAT_TAG          # qweight in the kernels' code order (an unpickled layer checks it)
        self._a = a
        self._a_dtype = TORCH_DTYPES[a.torch_dtype] if a.torch_dtype else torch.int8
        self._a_cols = plan.arg("A").shape[1]
        self._quantize_input = act_scaling
        self._out_dtype = TORCH_DTYPES[out_dtype]
        for spec in plan.args:
            if spec.role != "input" or spec.per_row:
                continue
            name = self._weight_name if spec.name == "W" else _BUFFERS[spec.name]
            dtype = TORCH_DTYPES[spec.user_dtype]
            fill = 1 if spec.name in ("scale", "global_scale") else 0
            self.register_buffer(name, torch.full(spec.shape, fill, dtype=torch.float32, device=device).to(dtype)
                                 if dtype.is_floating_point else torch.zeros(spec.shape, dtype=dtype, device=device))
        if not bias:
            self.register_buffer("bias", None)
        self.register_buffer("perm", None)
        self._bound = self._bound_all = None       # see _bind
        self._bound_src = ()
        # names of the op's tensor arguments W, scale, zeros, bias, global_scale (None: not taken)
        self._arg_names = tuple(
            (self._weight_name if n == "W" else _BUFFERS[n]) if plan.arg(n) is not None else None
            for n in ("W", "scale", "zeros", "bias", "global_scale"))
        if enable_tuning:
            self.bitblas_matmul.hardware_aware_finetune()

    def __setattr__(self, name, value):
        # ``layer.bias = nn.Parameter(t)`` / ``layer.weight = nn.Parameter(t)`` (BitBLAS's module test
        # does this): torch would move the name from the buffers to the parameters; keep the tensor
        # as the buffer the operator reads (checked when the operator is next bound)
        if isinstance(value, nn.Parameter) and name in self.__dict__.get("_buffers", {}):
            self._buffers[name] = value.detach()
            return
        super().__setattr__(name, value)

    # -- forward ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, output: Optional[torch.Tensor] = None,
                a_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        if getattr(x, "requires_grad", False) and torch.is_grad_enabled() and not _is_compiling():
            # no backward: the output carries a node that raises a clear error if backward reaches it
            return _NoBackward.apply(x, Linear.forward(self, x.detach(), output, a_scale), self._name())
        # hot path (eager, activations already in A_dtype): the operator bound to this layer's tensors,
        # which were checked when bound; it is rebound whenever a buffer is replaced (.to(device), a
        # load, a new perm), so per call only the input is checked (BoundMatmul._try: None when the
        # call is off its path; the general path then checks with this layer's names)
        bound = self._bound
        if bound is not None and type(x) is torch.Tensor and not _is_compiling() and not _dispatch_modes():
            b = self._buffers
            for k, t, p in self._bound_src:
                if b[k] is not t or (p and t.data_ptr() != p):     # replaced, or its .data swapped
                    break
            else:
                out = bound._try(x, a_scale, output)
                if out is not None:
                    return out
        return self._forward(x, output, a_scale)

    def _forward(self, x, output, a_scale):
        """The general path: every check with this layer's names, act-order, activation quantization,
        and the custom op under torch.compile / tracing."""
        b = self._buffers
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self._name()}: input must be a torch.Tensor, got {type(x).__name__}")
        w = b[self._weight_name]
        if x.device != w.device:
            raise ValueError(f"{self._name()}: input is on {x.device} but the layer's weights are on {w.device}; "
                             f"move one of them (layer.to({str(x.device)!r}))")
        if self._quantize_input and x.dtype.is_floating_point and x.dtype not in (torch.float8_e4m3fn,
                                                                                    torch.float8_e5m2):
            if x.dim() < 1 or x.shape[-1] != self.in_features:
                raise ValueError(f"{self._name()}: input last dimension is {x.shape[-1] if x.dim() else None}, "
                                 f"expected in_features={self.in_features} (input shape {list(x.shape)})")
            if a_scale is not None:
                raise ValueError(f"{self._name()}: a_scale given with a float input; pass a_scale only with "
                                 f"{self.A_dtype} codes (a float input is quantized per token here)")
            p = b["perm"]
            if p is not None:
                x = x.index_select(-1, p)
            x, a_scale = quantize_activation(x, self.A_dtype)
        else:
            if x.dtype != self._a_dtype:
                hint = ("cast the input first (e.g. x.to(torch.float16)) or use bitblas.QuantLinear, which casts"
                        if self._a.kind == "float" else "pass a float input (quantized per token here) or "
                                                         f"{self._a_dtype} codes with a_scale")
                raise TypeError(f"{self._name()}: input dtype is {x.dtype}, expected {self._a_dtype} "
                                f"(A_dtype={self.A_dtype!r}); {hint}")
            if x.dim() < 1 or x.shape[-1] != self._a_cols:
                packed = " (two int4 codes per byte)" if self._a.packed else ""
                raise ValueError(f"{self._name()}: input last dimension is {x.shape[-1] if x.dim() else None}, "
                                 f"expected {self._a_cols}{packed} for in_features={self.in_features} "
                                 f"(input shape {list(x.shape)})")
            p = b["perm"]
            if p is not None:
                if self._a.kind != "float":
                    raise ValueError(f"{self._name()}: an act-order layer (perm) takes float inputs, not codes")
                x = x.index_select(-1, p)
            if self._quantize_input and a_scale is None:
                raise ValueError(f"{self._name()}: a_scale (per-token float32 scale [...]) is required with "
                                 f"{self.A_dtype} codes as input")
        x = x.contiguous()
        n = self._arg_names
        if torch_op.is_eager(x):
            bound = self._bound_all
            if bound is None or any(b[k] is not t or (p and t.data_ptr() != p) for k, t, p in self._bound_src):
                bound = self._bind()
            return bound(x, a_scale, output)
        return torch_op.matmul(x, w, b[n[1]] if n[1] else None, b[n[2]] if n[2] else None,
                               b[n[3]] if n[3] else None, a_scale, b[n[4]] if n[4] else None,
                               key=self._key, output=output)

    def _bind(self):
        """Bind the operator to the current buffers (checks them). The hot path in :meth:`forward` is
        only taken without act-order (perm is part of what it compares)."""
        b, n = self._buffers, self._arg_names
        t = [b[k] if k else None for k in n]
        bound = self.bitblas_matmul.bind(t[0], scale=t[1], zeros=t[2], bias=t[3], global_scale=t[4])
        self._bound_src = tuple((k, b[k], b[k].data_ptr() if b[k] is not None else 0) for k in n if k) + \
            (("perm", b["perm"], 0),)
        fast = b["perm"] is None and not self._quantize_input
        self._bound_all, self._bound = bound, (bound if fast else None)
        return bound

    def _name(self) -> str:
        return (f"{type(self).__name__}(in_features={self.in_features}, out_features={self.out_features}, "
                f"W_dtype={self.W_dtype!r})")

    # -- weights ---------------------------------------------------------------------------
    @torch.no_grad()
    def load_and_transform_weight(self, weight: torch.Tensor, scales: Optional[torch.Tensor] = None,
                                  zeros: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                                  global_scale: Optional[torch.Tensor] = None, *, method: str = "mse") -> "Linear":
        """Load a weight [out_features, in_features]: integer codes (with ``scales`` [N, groups] and
        ``zeros`` as the config takes them; see the README's format table), or a float weight, which
        is quantized by :func:`bitblas.quantization.quantize_weight` with ``method`` ("mse": per-group
        least-squared-error scales and zeros, the default; "rtn": round-to-nearest) (float16 /
        bfloat16 W_dtype: taken as is).

        Scales / zeros not given keep their current values. Everything is checked before any
        buffer changes. Returns self.
        """
        w = self._buffers[self._weight_name]
        if isinstance(weight, torch.Tensor) and weight.device != w.device and weight.device.type in ("cpu", "cuda") \
                and not w.is_meta:
            self.to(weight.device)      # as BitBLAS's, whose buffer becomes the given tensor: the layer follows it
        new = self._prepare(weight, scales, zeros, bias, global_scale, method)
        self._commit(new, perm=None)
        return self

    def _prepare(self, weight, scales=None, zeros=None, bias=None, global_scale=None,
                 method: str = "mse") -> Dict[str, torch.Tensor]:
        c = self.config
        w = FORMATS[c.W_dtype]
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
        if list(weight.shape) != [c.N, c.K]:
            raise ValueError(f"weight: expected shape [out_features, in_features] = {[c.N, c.K]}, "
                             f"got {list(weight.shape)}")
        float_codes = w.torch_dtype and weight.dtype == TORCH_DTYPES[w.torch_dtype]
        if weight.dtype.is_floating_point and w.kind != "float" and not float_codes:
            if scales is not None or zeros is not None or global_scale is not None:
                raise TypeError(f"weight: a float weight ({weight.dtype}) is quantized here and takes no scales / "
                                f"zeros; pass integer codes with them for W_dtype={c.W_dtype!r}")
            plan = self._plan
            sd = TORCH_DTYPES["float32" if plan.scale_dtype in (None, "float8_e4m3") else plan.scale_dtype]
            q = quantize_weight(weight.detach(), c.W_dtype, c.group_size, c.with_scaling, c.with_zeros,
                                c.zeros_mode, scale_dtype=sd, method=method)
            weight, scales, zeros, global_scale = q.codes, q.scale, q.zeros, q.global_scale
        packed = pack_weight(c, weight.detach(), None if scales is None else scales.detach(),
                             None if zeros is None else zeros.detach(),
                             None if global_scale is None else global_scale.detach(), _weight_arg="weight")
        new = {self._weight_name: packed["W"]}
        for k in ("scale", "zeros", "global_scale"):
            if k in packed:
                new[_BUFFERS[k]] = packed[k]
        if bias is not None:
            if not c.with_bias:
                raise ValueError(f"bias given, but {self._name()} was built with bias=False")
            if not isinstance(bias, torch.Tensor) or list(bias.shape) != [c.N]:
                raise ValueError(f"bias: expected a tensor of shape [{c.N}], got {list(getattr(bias, 'shape', []))}")
            from ..ops.matmul import bias_for
            new["bias"] = bias_for(c, bias.detach())
        return new

    def _commit(self, new: Dict[str, torch.Tensor], perm: Optional[torch.Tensor]):
        """Write checked tensors into the buffers (in place where possible: CUDA graphs and compiled
        graphs keep pointing at them)."""
        dev = self._buffers[self._weight_name].device
        for name, t in new.items():
            buf = self._buffers.get(name)
            if buf is None or buf.is_meta or buf.shape != t.shape or buf.dtype != t.dtype:
                self._buffers[name] = t.to(dev if not dev.type == "meta" else t.device).contiguous()
            else:
                buf.copy_(t)
        self._buffers["perm"] = None if perm is None else perm.to(device=dev, dtype=torch.long).contiguous()

    def unpacked(self) -> Dict[str, Optional[torch.Tensor]]:
        """The layer's weight unpacked: ``codes`` [N, K] (int16 codes; float / float8 weights as the
        tensor), ``scales``, ``zeros`` (codes [N, groups] for zeros_mode "quantized"), ``global_scale``,
        ``bias``, ``perm``: what :meth:`load_and_transform_weight` takes back (perm aside)."""
        c, w, b = self.config, FORMATS[self.config.W_dtype], self._buffers
        W = b[self._weight_name]
        codes = W if (w.kind == "float" or w.torch_dtype) else unpack_codes(W, w, self._plan.w_storage,
                                                                                 self._plan.w_order)
        zeros = b.get("zeros")
        if zeros is not None and c.zeros_mode == "quantized":
            zeros = unpack_zeros(c, zeros)
        return {"codes": codes, "scales": b.get("scales"), "zeros": zeros, "global_scale": b.get("global_scale"),
                "bias": b.get("bias"), "perm": b.get("perm")}

    def dequantized_weight(self) -> torch.Tensor:
        """float32 [out_features, in_features] weight in input column order (act-order undone)."""
        from ..quantization.quantize import dequantize
        b = self._buffers
        n = self._arg_names
        wd = dequantize(self.config, b[n[0]].cpu(), *(b[k].cpu() if k else None for k in (n[1], n[2])),
                        global_scale=b[n[4]].cpu() if n[4] else None).to(torch.float32)
        p = b["perm"]
        if p is not None:
            out = torch.empty_like(wd)
            out[:, p.cpu()] = wd
            wd = out
        return wd

    # -- checkpoints -------------------------------------------------------------------------
    @torch.no_grad()
    def repack_from_gptq(self, gptq_module=None, device=None, *, qweight=None, qzeros=None, scales=None, g_idx=None,
                         bias=None, checkpoint_format: str = "gptq") -> "Linear":
        """Load a GPTQ layer: a module with ``qweight``, ``qzeros``, ``scales`` (, ``g_idx``, ``bias``), or
        those tensors by keyword. A ``W_dtype=f"uint{bits}"`` layer with scales and zeros takes the
        checkpoint's zero points (stored minus 1 in "gptq" checkpoints, as is in "gptq_v2"); a
        symmetric ``W_dtype=f"int{bits}"`` layer without zeros takes the codes as ``q + 2**(bits-1)``
        and ignores qzeros (as BitBLAS's). The group size must match; act-order ``g_idx`` is
        supported. ``device`` (BitBLAS's argument): move the layer there afterwards.
        See :mod:`bitblas.nn.checkpoint`."""
        w = FORMATS[self.W_dtype]
        symmetric = w.kind == "int" and self.with_scaling and not self.with_zeros
        qweight, qzeros, scales, g_idx, bias = _from_module(gptq_module, qweight, qzeros, scales, g_idx, bias,
                                                            need_zeros=not symmetric)
        if symmetric:
            per = 32 // w.bits
            if qzeros is None:      # only the codes, scales and act-order are read: zeros of the right shape
                qzeros = torch.zeros(scales.shape[0], scales.shape[1] // per if scales.dim() == 2 else 0,
                                     dtype=torch.int32)
            imp = from_gptq(qweight, qzeros, scales, g_idx, bits=w.bits, in_features=self.in_features,
                            out_features=self.out_features, group_size=self.group_size,
                            checkpoint_format=checkpoint_format)
            if imp.groups != self._plan.groups:
                raise ValueError(f"the checkpoint has group size {imp.group_size} ({imp.groups} groups) but "
                                 f"{self._name()} has group_size={self.config.group_size}")
            if bias is not None and not self.config.with_bias:
                raise ValueError(f"the checkpoint has a bias but {self._name()} was built with bias=False")
            signed = imp.codes.to(torch.int16) - (1 << (w.bits - 1))
            self._commit(self._prepare(signed, imp.scale.to(TORCH_DTYPES[self._plan.scale_dtype]), None, bias),
                         imp.perm)
        else:
            imp = from_gptq(qweight, qzeros, scales, g_idx, bits=self._checkpoint_bits("GPTQ"),
                            in_features=self.in_features, out_features=self.out_features,
                            group_size=self.group_size, checkpoint_format=checkpoint_format)
            self.load_imported(imp, bias)
        if device is not None:
            self.to(device)
        return self

    def repack_from_gptq_v2(self, gptq_module=None, device=None, **tensors) -> "Linear":
        """:meth:`repack_from_gptq` for GPTQ v2 checkpoints (GPTQModel's format: zero points stored as is)."""
        return self.repack_from_gptq(gptq_module, device, checkpoint_format="gptq_v2", **tensors)

    @torch.no_grad()
    def repack_from_awq(self, awq_module=None, *, qweight=None, qzeros=None, scales=None, bias=None) -> "Linear":
        """Load an AWQ (GEMM) layer: a module with ``qweight``, ``qzeros``, ``scales`` (, ``bias``), or by keyword."""
        qweight, qzeros, scales, _, bias = _from_module(awq_module, qweight, qzeros, scales, None, bias)
        imp = from_awq(qweight, qzeros, scales, bits=self._checkpoint_bits("AWQ"), in_features=self.in_features,
                       out_features=self.out_features, group_size=self.group_size)
        return self.load_imported(imp, bias)

    def _checkpoint_bits(self, what: str) -> int:
        w = FORMATS[self.W_dtype]
        if w.kind != "uint" or not (self.with_scaling and self.with_zeros):
            raise ValueError(f"{self._name()}: a {what} checkpoint needs W_dtype='uint<bits>' with with_scaling=True "
                             f"and with_zeros=True; this layer has W_dtype={self.W_dtype!r}, with_scaling="
                             f"{self.with_scaling}, with_zeros={self.with_zeros}")
        return w.bits

    @torch.no_grad()
    def load_imported(self, imp: ImportedWeight, bias: Optional[torch.Tensor] = None) -> "Linear":
        """Load an :class:`~bitblas.nn.checkpoint.ImportedWeight` (codes, scales, zeros, perm)."""
        self._commit(self._prepare_imported(imp, bias), imp.perm)
        return self

    def _prepare_imported(self, imp: ImportedWeight, bias=None) -> Dict[str, torch.Tensor]:
        c = self.config
        if imp.bits != self.bits or FORMATS[c.W_dtype].kind != "uint":
            raise ValueError(f"the checkpoint has bits={imp.bits} but {self._name()} has W_dtype={c.W_dtype!r}")
        if imp.groups != self._plan.groups:
            raise ValueError(f"the checkpoint has group size {imp.group_size} ({imp.groups} groups) but "
                             f"{self._name()} has group_size={c.group_size}")
        scale = imp.scale.to(TORCH_DTYPES[self._plan.scale_dtype])
        z = imp.zeros
        if c.zeros_mode == "original":
            zeros = z
        elif c.zeros_mode == "rescale":
            zeros = z * scale.to(torch.float32)
        else:
            hi = (1 << self.bits) - 1
            if z.numel() and (float(z.min()) < 0 or float(z.max()) > hi):
                raise ValueError(f"zero points in [{float(z.min()):g}, {float(z.max()):g}] do not fit zeros_mode="
                                 f"'quantized' ({self.bits}-bit codes 0..{hi}); build the layer with "
                                 "zeros_mode='original'")
            zeros = z.round().to(torch.int16)
        if bias is not None and not c.with_bias:
            raise ValueError(f"the checkpoint has a bias but {self._name()} was built with bias=False")
        if bias is None and c.with_bias:
            logger.debug("%s: checkpoint has no bias; keeping the current one", self._name())
        return self._prepare(imp.codes, scale, zeros, bias)

    # -- state dict ----------------------------------------------------------------------------
    def _state_fields(self) -> dict:
        order = self._plan.w_order
        return {"format": _FORMAT_TAG, **{k: getattr(self.config, {"in_features": "K", "out_features": "N"}.get(k, k))
                                          for k in _STATE_FIELDS},
                "code_order": None if order is None else list(order)}

    def get_extra_state(self):
        """The layer's format as a uint8 tensor of JSON (so safetensors can store it): a checkpoint of
        another format, bit width or group size is refused on load."""
        return torch.frombuffer(bytearray(json.dumps(self._state_fields(), sort_keys=True).encode()),
                                dtype=torch.uint8)

    def set_extra_state(self, state):
        # load_state_dict checks and applies the record in _load_from_state_dict, before any tensor is
        # copied (dropped again there). A loader that assigns the buffers itself and hands the record
        # here (transformers without the quantizer's converter) leaves it for bitblas.hf to load them.
        self.__dict__["_assigned_record"] = state

    def pop_assigned_record(self):
        """The format record a loader handed to :meth:`set_extra_state` outside ``load_state_dict`` (None:
        none), cleared."""
        return self.__dict__.pop("_assigned_record", None)

    @staticmethod
    def _record(state, prefix) -> dict:
        try:
            return json.loads(bytes(state.cpu().numpy().tobytes()).decode()) if isinstance(state, torch.Tensor) \
                else dict(state)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{prefix}_extra_state: not a bitblas.Linear format record ({e})") from None

    def _check_extra(self, state, prefix):
        got = self._record(state, prefix)
        mine = self._state_fields()
        bad = [f"{k}={got.get(k)!r} (this layer: {mine[k]!r})" for k in _STATE_FIELDS if got.get(k) != mine[k]]
        if bad:
            raise ValueError(f"{prefix or 'state_dict'}: the checkpoint was saved from a layer with "
                             f"{', '.join(bad)}; build the layer with the checkpoint's settings")

    def _convert_foreign(self, state_dict, prefix) -> bool:
        """Hook for subclasses that accept other checkpoint layouts (QuantLinear: GPTQ): True when it
        replaced the tensors with ones in the kernels' layout."""
        return False

    def _migrate(self, state_dict, prefix, foreign: bool = False):
        """Bring a checkpoint to the tensors this layer holds (in ``state_dict``, new tensors; the
        caller's are not changed). A checkpoint without a record (Microsoft BitBLAS's Linear): as it
        is (its qweight is in the kernels' code order), refused where BitBLAS's bytes lose codes.
        ``bitblas.Linear/3``: as it is. ``bitblas.Linear/2``: qweight in natural code order -> the
        kernels' (``Plan.w_order``). ``bitblas.Linear/1``: signed 1/2/4-bit codes two's complement
        -> offset-binary (each field's top bit flipped), quantized zero points [N, groups * bits / 8]
        -> [groups, N * bits / 8], then as /2. ``foreign``: the tensors were converted from another
        layout (QuantLinear: GPTQ) into the kernels' already. An unknown format is refused naming it."""
        key = prefix + "_extra_state"
        state = state_dict.get(key)
        rec = None if state is None else self._record(state, prefix)
        fmt = None if rec is None else rec.get("format")
        if fmt not in (None, _FORMAT_TAG, _FORMAT_V2, _FORMAT_V1):
            raise ValueError(f"{key}: the checkpoint has format {fmt!r}; this bitblas reads {_FORMAT_V1!r}, "
                             f"{_FORMAT_V2!r} (migrated) and {_FORMAT_TAG!r}; load it with the bitblas version "
                             "that wrote it")
        mine = self._state_fields()
        if rec is not None and any(rec.get(k) != mine[k] for k in _STATE_FIELDS):
            return                            # another layer's checkpoint: _check_extra refuses it
        wkey = prefix + self._weight_name
        t = state_dict.get(wkey)
        readable = isinstance(t, torch.Tensor) and t.shape == self._buffers[self._weight_name].shape \
            and t.dtype.itemsize == 1 and not t.is_meta
        if fmt in (_FORMAT_V1, _FORMAT_V2):
            if fmt == _FORMAT_V1:
                self._migrate_v1(state_dict, prefix)
                t = state_dict.get(wkey)
            if readable and self._plan.w_order is not None:
                state_dict[wkey] = reorder_codes(t, self.bits, self._plan.w_order)
            state_dict[key] = torch.frombuffer(bytearray(json.dumps({**rec, "format": _FORMAT_TAG}, sort_keys=True)
                                                         .encode()), dtype=torch.uint8)
            return
        if fmt is None and not foreign and readable and isinstance(self._bitblas_order, str):
            raise NotImplementedError(f"{wkey}: {self._bitblas_order}")
        if fmt == _FORMAT_TAG and readable:
            # saved by a layer of another fast_decoding setting: its code order -> this layer's
            saved = rec.get("code_order")
            saved = None if saved is None else tuple(saved)
            if saved != self._plan.w_order:
                if saved is not None:
                    t = reorder_codes(t, self.bits, saved, inverse=True)
                if self._plan.w_order is not None:
                    t = reorder_codes(t, self.bits, self._plan.w_order)
                state_dict[wkey] = t

    def _migrate_v1(self, state_dict, prefix):
        c, plan = self.config, self._plan
        w = FORMATS[c.W_dtype]
        wkey = prefix + self._weight_name
        if plan.w_storage == "offset" and isinstance(state_dict.get(wkey), torch.Tensor):
            # two's complement -> offset-binary: flip the top bit of every field
            flip = sum(1 << (w.bits * (i + 1) - 1) for i in range(w.codes_per_byte))
            t = state_dict[wkey]
            state_dict[wkey] = (t.view(torch.uint8) ^ flip).view(t.dtype)
        zkey = prefix + "zeros"
        z = state_dict.get(zkey)
        if c.with_zeros and c.zeros_mode == "quantized" and isinstance(z, torch.Tensor):
            old = (c.N, -(-plan.groups // w.codes_per_byte))
            if tuple(z.shape) != old or z.dtype.itemsize != 1:
                raise ValueError(f"{zkey}: a {_FORMAT_V1} checkpoint's quantized zero points are int8 {list(old)}, "
                                 f"got {z.dtype} {list(z.shape)}")
            codes = unpack_codes(z.view(torch.int8).cpu(), w, "plain")[:, :plan.groups]    # [N, groups]
            state_dict[zkey] = pack_zeros(c, codes).to(z.device)

    def check_state_dict(self, state_dict, prefix: str = ""):
        """Raise ValueError / TypeError naming the key if ``state_dict`` (this layer's tensors under
        ``prefix``) cannot be loaded into this layer; changes nothing."""
        state_dict = {k: v for k, v in state_dict.items() if k.startswith(prefix)}
        foreign = bool(self._convert_foreign(state_dict, prefix))
        self._migrate(state_dict, prefix, foreign)
        self._check_state(state_dict, prefix)

    def _check_state(self, state_dict, prefix):
        extra_key = prefix + "_extra_state"
        if state_dict.get(extra_key) is not None:
            self._check_extra(state_dict[extra_key], prefix)
        for name, buf in self._buffers.items():
            key = prefix + name
            if key not in state_dict or buf is None:
                continue
            t = state_dict[key]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{key}: expected a tensor, got {type(t).__name__}")
            same = t.dtype == buf.dtype or (buf.dtype.is_floating_point and t.dtype.is_floating_point
                                            and buf.dtype.itemsize > 1 and t.dtype.itemsize > 1)
            if t.shape != buf.shape or not same:
                raise ValueError(f"{key}: checkpoint tensor is {t.dtype} {list(t.shape)}, but {self._name()} "
                                 f"(group_size={self.group_size}, zeros_mode={self.zeros_mode!r}) takes "
                                 f"{buf.dtype} {list(buf.shape)}")
        p = state_dict.get(prefix + "perm")
        if p is not None:
            if not isinstance(p, torch.Tensor) or p.dtype.is_floating_point or list(p.shape) != [self.in_features] \
                    or not torch.equal(p.cpu().sort().values, torch.arange(self.in_features)):
                raise ValueError(f"{prefix}perm: expected a permutation of range({self.in_features})")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # everything is checked before any tensor is copied
        foreign = bool(self._convert_foreign(state_dict, prefix))
        for name in ("scales", "zeros"):
            # Microsoft BitBLAS's Linear saves both for every quantized layer; its kernel ignores the
            # ones its config does not take, and so does this layer
            if prefix + name in state_dict and name not in self._buffers:
                state_dict.pop(prefix + name)
        self._migrate(state_dict, prefix, foreign)
        self._check_state(state_dict, prefix)
        extra_key = prefix + "_extra_state"
        if extra_key not in state_dict:
            state_dict[extra_key] = None      # a checkpoint without the record: nothing to compare
        p = state_dict.get(prefix + "perm")
        if p is not None:
            dev = self._buffers[self._weight_name].device
            self._buffers["perm"] = p.to(device=dev, dtype=torch.long).clone()
        elif self._buffers.get("perm") is not None and prefix + self._weight_name in state_dict:
            self._buffers["perm"] = None       # the checkpoint's weight is in input order
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self.__dict__.pop("_assigned_record", None)

    # -- copies and pickles: the shared operator is not copied, it is looked up again by its key --
    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        state.update(bitblas_matmul=None, _bound=None, _bound_all=None, _bound_src=())
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if "_bitblas_order" not in self.__dict__:      # pickled by an earlier bitblas
            try:
                self._bitblas_order = bitblas_weight_order(self.config)
            except NotImplementedError as e:
                self._bitblas_order = str(e)
        if self.__dict__.get("_code_order") != _FORMAT_TAG:
            # pickled by a bitblas whose layers held qweight in natural code order (/1 and /2 layers
            # hold the same codes there: the pickle keeps the buffers as the layer held them)
            self._plan = make_plan(self.config, "cpu")
            W = self._buffers.get(self._weight_name)
            if self._plan.w_order is not None and W is not None and not W.is_meta:
                self._buffers[self._weight_name] = reorder_codes(W, self.bits, self._plan.w_order)
            self._code_order = _FORMAT_TAG
        self.bitblas_matmul = torch_op.operator_by_key(self._key)

    # -- devices and dtypes -------------------------------------------------------------------
    def _apply(self, fn, recurse=True):
        def keep_dtype(t):
            r = fn(t)
            if isinstance(r, torch.Tensor) and r.dtype != t.dtype:
                return t.to(device=r.device)   # the formats are fixed: move, never cast
            return r
        return super()._apply(keep_dtype, recurse)

    def extra_repr(self) -> str:
        c = self.config
        s = (f"in_features={c.K}, out_features={c.N}, bias={c.with_bias}, A_dtype={c.A_dtype!r}, "
             f"W_dtype={c.W_dtype!r}")
        if c.with_scaling:
            s += f", group_size={c.group_size}"
        if c.with_zeros:
            s += f", zeros_mode={c.zeros_mode!r}"
        if self._buffers.get("perm") is not None:
            s += ", act_order=True"
        return s


class _NoBackward(torch.autograd.Function):
    """Identity on a layer's output whose backward raises: the kernels compute no gradients."""

    @staticmethod
    def forward(ctx, x, out, name):
        ctx.name = name
        return out

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(f"{ctx.name}: bitblas layers are inference-only and have no backward (no gradient "
                           "for the input or the quantized weights); run the model under torch.no_grad() or "
                           "torch.inference_mode(), or keep this layer out of what you differentiate (e.g. "
                           "quantize_model(..., skip=[...]))")


def _from_module(mod, qweight, qzeros, scales, g_idx, bias, need_zeros: bool = True):
    if mod is not None:
        if any(t is not None for t in (qweight, qzeros, scales)):
            raise TypeError("pass either a module or qweight/qzeros/scales, not both")
        qweight, qzeros, scales = (getattr(mod, k, None) for k in ("qweight", "qzeros", "scales"))
        g_idx = getattr(mod, "g_idx", None) if g_idx is None else g_idx
        bias = getattr(mod, "bias", None) if bias is None else bias
    for k, v in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if v is None and (k != "qzeros" or need_zeros):
            raise ValueError(f"{k} is required")
    return qweight, qzeros, scales, g_idx, bias
