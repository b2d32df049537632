"""A Matmul with its weight tensors checked once: the hot path of nn modules.

``op.bind(W, scale=..., zeros=..., bias=..., global_scale=...)`` checks the weight-side tensors
against the plan (dtype, shape, device, contiguity) and fetches the constant tables once. Calling
the result with activations checks only those (dtype, device, last dimension, contiguity, the
per-token scale and the output) and then calls the kernel serving that row count (``op._kernel``,
so tuning and dispatch apply), found with one dict lookup per call in the operator's per-device
table (``op._fast_entry``: kernel, alignment need, output template; emptied when tuning changes
the dispatch). The weight-side tensors are passed to tvm-ffi pre-converted, so per call only A,
a_scale and the output go through DLPack. Anything off the common path (an unexpected dtype or layout, a
non-contiguous view, zero rows) goes through the operator's general call, which checks everything
and raises naming the argument.
"""
from __future__ import annotations

import torch

from ..plan import Plan
from ..quantization.quantize import TORCH_DTYPES
from .checks import base_align, check_tensor, why_not

__all__ = ["BoundMatmul", "UnboundCall"]


class BoundMatmul:
    """``bound(A, a_scale=None, output=None)`` = ``op(A, W, scale, zeros, bias, ..., a_scale, output)``."""

    def __init__(self, op, W, scale=None, zeros=None, bias=None, global_scale=None):
        if not isinstance(W, torch.Tensor):
            raise TypeError(f"W: expected a torch.Tensor, got {type(W).__name__}")
        device = W.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"W is on {device}; accepted devices: cpu, cuda")
        kind = device.type
        if kind == "cuda" and op._cpu_only:
            raise ValueError("W is on CUDA but this Matmul was made with target='llvm' (CPU only)")
        plan0: Plan = op._base_plan(kind)
        given = {"scale": scale, "zeros": zeros, "bias": bias, "global_scale": global_scale}
        for name, t in given.items():
            if t is not None and plan0.arg(name) is None:
                raise ValueError(f"{name} given, but the config takes none ({why_not(name)})")
        tensors = {"W": W, **given}
        pre, post = [], []
        part = pre
        for spec in plan0.args:
            if spec.name == "A" or spec.role == "output":
                continue
            if spec.name == "a_scale":
                part = post                 # the per-call scale sits between the two parts
                continue
            if spec.role == "table":
                part.append(op._const(spec.name, plan0, device))
                continue
            t = tensors.get(spec.name)
            if t is None:
                if not spec.optional:
                    raise ValueError(f"{spec.name} is required by this config ({spec.doc}); pass {spec.name}=...")
                part.append(op._const(spec.name, plan0, device))
                continue
            t = check_tensor(spec.name, t, spec, 1, device)
            if kind == "cuda" and t.data_ptr() % base_align(spec.name, t.dtype):
                t = t.clone()               # W: 16-byte vector loads, TMA bases; 1-byte scales: read in pairs
            part.append(t)
        self.op, self.device, self.kind = op, device, kind
        self._given = tensors
        # the weight-side arguments as tvm-ffi tensors, converted once (the kernel call then converts
        # only A, a_scale and the output); they alias the checked torch tensors, kept in _given
        self._pre, self._post = tuple(map(_ffi_tensor, pre)), tuple(map(_ffi_tensor, post))
        self._args = self._pre + self._post
        self._act = plan0.arg("a_scale") is not None
        a = plan0.args[0]
        self._a_dtype = TORCH_DTYPES[a.user_dtype]
        self._a_bits = a.dtype == "int8" and a.user_dtype != "int8"     # float8: the kernel reads the bits
        self._cols = a.shape[1]
        self._n = op.config.N
        self._out_dtype = TORCH_DTYPES[plan0.args[-1].user_dtype]
        self._rows = op._fast_rows(device)        # rows -> (kernel, align A, output template)
        self.device_index = W.get_device()      # -1 on the CPU: a cheap per-call device comparison
        self._cuda = kind == "cuda"

    def _general(self, A, a_scale, output):
        g = dict(self._given)
        W = g.pop("W")
        return self.op._run(A, W, dict(g, a_scale=a_scale, output=output))

    def __call__(self, A, a_scale=None, output=None):
        out = self._try(A, a_scale, output)
        return self._general(A, a_scale, output) if out is None else out

    def _try(self, A, a_scale=None, output=None):
        """The result, or None (nothing done) when the call is off the common path: A not a contiguous
        plain tensor of the expected dtype, device and width, zero rows, an unexpected a_scale or
        output. The caller then takes the general path, which checks everything and raises naming
        what is wrong."""
        cuda = self._cuda
        if not (type(A) is torch.Tensor and A.dtype is self._a_dtype and A.is_contiguous()
                and ((A.get_device() == self.device_index and A.is_cuda) if cuda else A.is_cpu)):
            return None     # (get_device() alone is -1 for meta and other non-indexed devices)
        nd = A.dim()
        if nd == 2:
            rows, cols = A.shape
            if cols != self._cols:
                return None
        elif nd < 1 or A.shape[-1] != self._cols:
            return None
        else:
            rows = A.numel() // self._cols
        entry = self._rows.get(rows)
        if entry is None:
            if rows == 0:
                return None
            entry = self.op._fast_entry(self.device, rows)
        fn, align, tmpl = entry
        if self._act:
            if not (type(a_scale) is torch.Tensor and a_scale.dtype is torch.float32 and a_scale.numel() == rows
                    and a_scale.device == self.device and a_scale.is_contiguous()
                    and (a_scale.shape == A.shape[:-1] or a_scale.dim() == 1)):
                return None
            if a_scale.dim() != 1:
                a_scale = a_scale.view(rows)
        elif a_scale is not None:
            return None
        if output is None:
            out = _empty_like(tmpl) if tmpl is not None else \
                torch.empty((rows, self._n), dtype=self._out_dtype, device=self.device)
            ret = out if nd == 2 else out.view(*A.shape[:-1], self._n)
        else:
            if not (type(output) is torch.Tensor and output.dtype is self._out_dtype
                    and ((output.get_device() == self.device_index and output.is_cuda) if cuda else output.is_cpu)
                    and output.is_contiguous()
                    and output.shape == (*A.shape[:-1], self._n)):
                return None
            if align and output.data_ptr() % 16:
                return None                 # the general path realigns the output
            ret = out = output
            if nd != 2:
                out = output.view(rows, self._n)
        if nd != 2:
            A = A.view(rows, self._cols)
        if self._a_bits:
            A = A.view(torch.int8)
        if align and A.data_ptr() % 16:
            A = A.clone()                   # GEMV: 16-byte vector loads; wgmma: 16-byte aligned TMA bases
        if self._act:
            fn(A, *self._pre, a_scale, *self._post, out)
        else:
            fn(A, *self._args, out)
        return ret


_empty_like = torch.empty_like


def _ffi_tensor(t):
    """A torch tensor as a tvm-ffi Tensor (same memory; holds a reference to it)."""
    import tvm_ffi
    return tvm_ffi.from_dlpack(t)


class UnboundCall:
    """The bound interface for an operator whose config the kernels run in another spelling
    (``ops.compat.kernel_config``): every call goes through ``op.forward``."""

    def __init__(self, op, W, scale=None, zeros=None, bias=None, global_scale=None):
        self.op = op
        self._given = {"scale": scale, "zeros": zeros, "bias": bias, "global_scale": global_scale}
        self._W = W

    def __call__(self, A, a_scale=None, output=None):
        return self.op.forward(A, self._W, **self._given, a_scale=a_scale, output=output)

    def _try(self, A, a_scale=None, output=None):
        return self(A, a_scale, output)
