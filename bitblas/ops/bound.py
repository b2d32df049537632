"""A Matmul with its weight tensors checked once: the hot path of nn modules.

``op.bind(W, scale=..., zeros=..., bias=..., global_scale=...)`` checks the weight-side tensors
against the plan (dtype, shape, device, contiguity) and fetches the constant tables once. Calling
the result with activations checks only those (dtype, device, last dimension, contiguity, the
per-token scale and the output) and then calls the kernel serving that row count (``op._kernel``,
so tuning and dispatch apply). Anything off the common path (an unexpected dtype or layout, a
non-contiguous view, zero rows) goes through the operator's general call, which checks everything
and raises naming the argument.
"""
from __future__ import annotations

import torch

from ..plan import Plan
from ..quantization.quantize import TORCH_DTYPES

__all__ = ["BoundMatmul"]


class BoundMatmul:
    """``bound(A, a_scale=None, output=None)`` = ``op(A, W, scale, zeros, bias, ..., a_scale, output)``."""

    def __init__(self, op, W, scale=None, zeros=None, bias=None, global_scale=None):
        from .matmul import _check_tensor, _why_not
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
                raise ValueError(f"{name} given, but the config takes none ({_why_not(name)})")
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
            t = _check_tensor(spec.name, t, spec, 1, device)
            if kind == "cuda" and spec.name == "W" and t.data_ptr() % 16:
                t = t.clone()               # the GEMV kernel reads W in 16-byte vectors
            part.append(t)
        self.op, self.device, self.kind = op, device, kind
        self._given = tensors
        self._pre, self._post = tuple(pre), tuple(post)
        self._act = plan0.arg("a_scale") is not None
        a = plan0.args[0]
        self._a_dtype = TORCH_DTYPES[a.user_dtype]
        self._a_bits = a.dtype == "int8" and a.user_dtype != "int8"     # float8: the kernel reads the bits
        self._cols = a.shape[1]
        self._n = op.config.N
        self._out_dtype = TORCH_DTYPES[plan0.args[-1].user_dtype]
        self._gemv = op._gemv_rows if kind == "cuda" else None
        self.device_index = W.get_device()      # -1 on the CPU: a cheap per-call device comparison

    def _general(self, A, a_scale, output):
        g = dict(self._given)
        W = g.pop("W")
        return self.op._run(A, W, dict(g, a_scale=a_scale, output=output))

    def __call__(self, A, a_scale=None, output=None):
        if not (type(A) is torch.Tensor and A.dtype == self._a_dtype and A.get_device() == self.device_index
                and A.dim() >= 1 and A.shape[-1] == self._cols and A.is_contiguous()):
            return self._general(A, a_scale, output)
        return self._launch(A, a_scale, output)

    def _launch(self, A, a_scale, output):
        """The call once A is known to be a contiguous tensor of the right dtype, device and width."""
        nd = A.dim()
        rows = A.shape[0] if nd == 2 else A.numel() // self._cols
        if rows == 0:
            return self._general(A, a_scale, output)
        if self._act:
            if not (type(a_scale) is torch.Tensor and a_scale.dtype == torch.float32 and a_scale.numel() == rows
                    and a_scale.device == self.device and a_scale.is_contiguous()
                    and (a_scale.shape == A.shape[:-1] or a_scale.dim() == 1)):
                return self._general(A, a_scale, output)
            if a_scale.dim() != 1:
                a_scale = a_scale.view(rows)
        elif a_scale is not None:
            return self._general(A, a_scale, output)
        if output is None:
            out = torch.empty((rows, self._n), dtype=self._out_dtype, device=self.device)
            ret = out if nd == 2 else out.view(*A.shape[:-1], self._n)
        else:
            if not (type(output) is torch.Tensor and output.dtype == self._out_dtype and output.device == self.device
                    and output.is_contiguous() and output.shape == (*A.shape[:-1], self._n)):
                return self._general(A, a_scale, output)
            ret = output
            out = output if nd == 2 else output.view(rows, self._n)
        plan, fn = self.op._kernel(self.kind, rows)
        if nd != 2:
            A = A.view(rows, self._cols)
        if self._a_bits:
            A = A.view(torch.int8)
        if self._gemv is not None and self._gemv.get(plan.m) and A.data_ptr() % 16:
            A = A.clone()                   # the GEMV kernel reads A in 16-byte vectors
        if self._act:
            fn(A, *self._pre, a_scale, *self._post, out)
        else:
            fn(A, *self._pre, *self._post, out)
        return ret
