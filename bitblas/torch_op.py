"""The bitblas matmul as a torch custom op: ``torch.ops.bitblas.matmul``.

    out = torch.ops.bitblas.matmul(A, W, scale, zeros, bias, a_scale, global_scale, key)

``key`` names the operator: the JSON of its :class:`MatmulConfig` and target, as :func:`operator_key`
writes it. Operators are shared per key (every layer of one shape and format uses one
:class:`Matmul`, so its kernels are built once), and a key seen for the first time (a graph traced in
another process) makes its operator on the spot. The fake implementation gives the output's shape
and dtype without building anything, so ``torch.compile(..., fullgraph=True)`` and ``torch.export``
see the call as one opaque node.

:func:`matmul` is what modules call: in eager mode it calls the operator directly (a custom op's
dispatch costs a few microseconds per call); under ``torch.compile``, a tracing mode or a tensor
subclass (fake tensors) it goes through the custom op. The operator checks its arguments either way.
The op is for inference: it has no autograd formula.
"""
from __future__ import annotations

import json
import threading
from typing import Dict, Optional, Tuple

import torch
from torch._C import _len_torch_dispatch_stack

from .config import MatmulConfig
from .ops.matmul import Matmul
from .quantization.quantize import TORCH_DTYPES

__all__ = ["operator_key", "get_operator", "matmul"]

_OPERATORS: Dict[str, Matmul] = {}
_LOCK = threading.Lock()


def _target_name(target) -> Optional[str]:
    if target is None or isinstance(target, str):
        return target
    if isinstance(target, dict):
        return json.dumps(target, sort_keys=True)
    return str(target)           # a tvm Target: its string form parses back


def operator_key(config: MatmulConfig, target=None) -> str:
    """The string that names ``Matmul(config, target)`` in ``torch.ops.bitblas.matmul`` calls."""
    if not isinstance(config, MatmulConfig):
        raise TypeError(f"config: expected a bitblas.MatmulConfig, got {type(config).__name__}")
    return json.dumps({"config": config.to_dict(), "target": _target_name(target)}, sort_keys=True)


def get_operator(config: MatmulConfig, target=None) -> Tuple[Matmul, str]:
    """The shared operator for (config, target) and its key (made on first use; nothing is built)."""
    key = operator_key(config, target)
    return operator_by_key(key), key


def operator_by_key(key: str) -> Matmul:
    op = _OPERATORS.get(key)
    if op is None:
        with _LOCK:
            op = _OPERATORS.get(key)
            if op is None:
                d = json.loads(key)
                target = d["target"]
                if isinstance(target, str) and target.startswith("{"):
                    target = json.loads(target)
                op = _OPERATORS[key] = Matmul(MatmulConfig.from_dict(d["config"]), target=target)
    return op


# Defined with torch.library.Library rather than @torch.library.custom_op: custom_op wraps every call
# in a Python autograd kernel and a per-call output-aliasing check, which cost several times the
# dispatcher itself; a schema with one CompositeExplicitAutograd kernel is dispatched in C++. The op
# has no autograd formula (inference only), as before.
_LIB = torch.library.Library("bitblas", "DEF")
_LIB.define("matmul(Tensor A, Tensor W, Tensor? scale, Tensor? zeros, Tensor? bias, Tensor? a_scale, "
            "Tensor? global_scale, str key) -> Tensor")


def _matmul_impl(A, W, scale, zeros, bias, a_scale, global_scale, key):
    op = _OPERATORS.get(key) or operator_by_key(key)
    return op.apply(A, W, scale, zeros, bias, a_scale, global_scale)


_LIB.impl("matmul", _matmul_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("bitblas::matmul", lib=_LIB)
def _matmul_fake(A, W, scale, zeros, bias, a_scale, global_scale, key):
    op = operator_by_key(key)
    c = op.config
    # also reached eagerly when one real tensor is on the meta device: never an unwritten result
    for name, t in (("W", W), ("scale", scale), ("zeros", zeros), ("bias", bias), ("a_scale", a_scale),
                    ("global_scale", global_scale)):
        if t is not None and t.device != A.device:
            raise ValueError(f"{name} is on {t.device} but A is on {A.device}; put all tensors on one device")
    cols = op._base_plan("cpu").args[0].shape[-1]
    if A.dim() < 1 or A.shape[-1] != cols:
        raise ValueError(f"A: expected shape [..., {cols}] (K={c.K}), got {list(A.shape)}")
    return A.new_empty((*A.shape[:-1], c.N), dtype=TORCH_DTYPES[c.out_dtype])


def is_eager(A) -> bool:
    """True when a direct call is safe: a plain tensor, no compiler tracing, no dispatch mode (the
    dispatch-mode stack, infra modes such as FakeTensorMode included, is empty)."""
    return type(A) is torch.Tensor and not torch.compiler.is_compiling() and not _len_torch_dispatch_stack()


def matmul(A: torch.Tensor, W: torch.Tensor, scale=None, zeros=None, bias=None, a_scale=None, global_scale=None,
           *, key: str, output: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``Matmul`` named by ``key`` on these tensors: directly in eager mode, else through the custom op.

    ``output`` (eager only; under tracing the result is copied into it) receives the result.
    """
    if is_eager(A):
        op = _OPERATORS.get(key) or operator_by_key(key)
        return op.apply(A, W, scale, zeros, bias, a_scale, global_scale, output)
    out = torch.ops.bitblas.matmul(A, W, scale, zeros, bias, a_scale, global_scale, key)
    if output is not None:
        output.copy_(out)
        return output
    return out
