"""Record the matmuls a torch model runs: ``bitblas.workload.capture(model, *example_inputs)``.

Every ``F.linear`` (so every ``nn.Linear``), ``torch.matmul`` / ``@``, ``mm``, ``bmm``, ``addmm``
and ``baddbmm`` the model calls is seen through a :class:`torch.overrides.TorchFunctionMode`;
forward pre-hooks on the modules name the ``nn.Linear`` each call comes from. One site is one
(module name or op, N, K, dtypes, layout); for each it keeps the M of every call, so running the
model on several example inputs (e.g. sequence lengths 1, 7 and 128) shows how M varies.

A linear's weight ``[N, K]`` is ``layout="nt"``; ``x @ W`` with ``W`` an ``nn.Parameter`` is a
weight matmul with layout "nn"; a product of two activations (attention scores) is recorded
with ``weight=False`` (bitblas does not take it, the tuner skips it).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Dict, List, Optional

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["capture", "Workload", "save", "load", "SCHEMA"]

SCHEMA = "bitblas-workload/1"

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
           torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32"}


def _dt(t) -> str:
    return _DTYPES.get(t.dtype, str(t.dtype).replace("torch.", ""))


class Workload:
    """The sites seen, in first-seen order. ``to_dict()`` is the JSON the CLI reads."""

    def __init__(self, model_name: str = ""):
        self.model = model_name
        self.calls = 0
        self._sites: Dict[tuple, dict] = {}

    def add(self, name: str, op: str, M: int, N: int, K: int, batch: int, a_dtype: str, w_dtype: str, out_dtype: str,
            layout: str, weight: bool, bias: bool) -> None:
        """One call. A weight matmul's site is fixed by its weight (N, K); an activation product's
        (attention) N, K and batch vary with the sequence, so its site is the call site alone."""
        key = (name, op, a_dtype, w_dtype, layout, weight, bias) + ((N, K, batch) if weight else ())
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = {"name": name, "op": op, "A_dtype": a_dtype, "W_dtype": w_dtype,
                                       "out_dtype": out_dtype, "layout": layout, "weight": weight, "with_bias": bias,
                                       "shapes": [], "count": 0}
        site["count"] += 1
        if len(site["shapes"]) < 4096:
            site["shapes"].append([batch, M, N, K])

    @property
    def sites(self) -> List[dict]:
        """Per site: ``M`` the distinct row counts seen; ``N``, ``K``, ``batch`` an int when
        constant, else the distinct values; ``M_per_call`` in call order; ``dynamic`` when M varies."""
        out = []
        for s in self._sites.values():
            shapes = s["shapes"]
            cols = {k: sorted({sh[i] for sh in shapes}) for i, k in enumerate(("batch", "M", "N", "K"))}
            one = {k: (v[0] if len(v) == 1 else v) for k, v in cols.items() if k != "M"}
            out.append({**{k: v for k, v in s.items() if k != "shapes"}, **one, "M": cols["M"],
                        "M_per_call": [sh[1] for sh in shapes], "dynamic": len(cols["M"]) > 1,
                        "shapes": shapes})
        return out

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "source": "torch", "model": self.model, "calls": self.calls, "workloads": self.sites}

    def __repr__(self):
        return f"Workload({self.model!r}, {len(self._sites)} sites, {self.calls} calls)"


class _Recorder(TorchFunctionMode):
    def __init__(self, wl: Workload, stack: List[list]):
        super().__init__()
        self.wl, self.stack = wl, stack

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with contextlib.suppress(Exception):      # recording must never change what the model does
            self._record(func, args, kwargs)
        return func(*args, **kwargs)

    def _module(self) -> str:
        """Name of the module running (a Linear or MultiheadAttention names its own calls)."""
        return self.stack[-1][0] if self.stack else ""

    def _site_name(self, op: str) -> str:
        """``<module>.<op>#<i>``: the i-th such call inside the running module's forward."""
        if not self.stack:
            return op
        top = self.stack[-1]
        top[1] += 1
        return f"{top[0]}.{op}#{top[1] - 1}" if top[0] else f"{op}#{top[1] - 1}"

    def _record(self, func, args, kwargs):
        F = torch.nn.functional
        if func is F.linear:
            x, w = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            b = args[2] if len(args) > 2 else kwargs.get("bias")
            N, K = w.shape
            M = math.prod(x.shape[:-1])
            self.wl.add(self._module() or "linear", "linear", M, N, K, 1, _dt(x), _dt(w), _dt(x), "nt", True,
                        b is not None)
            return
        if func is F.multi_head_attention_forward:
            self._record_mha(args, kwargs)
            return
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
            batch = math.prod(q.shape[:-2])
            name = self._site_name("sdpa")
            self.wl.add(f"{name}.qk", "sdpa", L, S, E, batch, _dt(q), _dt(k), _dt(q), "nt", False, False)
            self.wl.add(f"{name}.pv", "sdpa", L, Ev, S, batch, _dt(q), _dt(v), _dt(q), "nn", False, False)
            return
        names = {torch.matmul: "matmul", torch.Tensor.__matmul__: "matmul", torch.Tensor.matmul: "matmul",
                 torch.mm: "mm", torch.Tensor.mm: "mm", torch.bmm: "bmm", torch.Tensor.bmm: "bmm",
                 torch.addmm: "addmm", torch.baddbmm: "baddbmm"}
        op = names.get(func)
        if op is None:
            return
        a, b = (args[1], args[2]) if op in ("addmm", "baddbmm") else (args[0], args[1])
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 1 or b.dim() < 2:
            return
        K, N = b.shape[-2], b.shape[-1]
        M = math.prod(a.shape[:-1]) if b.dim() == 2 else a.shape[-2]
        batch = 1 if b.dim() == 2 else math.prod(b.shape[:-2])
        weight = isinstance(b, torch.nn.Parameter)
        self.wl.add(self._site_name(op), op, M, N, K, batch, _dt(a), _dt(b), _dt(a), "nn", weight,
                    op in ("addmm", "baddbmm"))


    def _record_mha(self, args, kwargs):
        """F.multi_head_attention_forward (nn.MultiheadAttention, nn.Transformer*): its projections
        run inside the functional, so they are recorded from its arguments. Inputs are (L, B, E)."""
        names = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
                 "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias")
        a = dict(zip(names, args))
        a.update(kwargs)
        q, k = a["query"], a["key"]
        E, H = a["embed_dim_to_check"], a["num_heads"]
        Lq = q.shape[0]
        Lk = k.shape[0]
        B = q.shape[1] if q.dim() == 3 else 1
        base = self._module() or "mha"
        bias = a.get("in_proj_bias") is not None
        if a.get("in_proj_weight") is not None and not a.get("use_separate_proj_weight", False):
            w = a["in_proj_weight"]
            if q is k:
                self.wl.add(f"{base}.in_proj", "linear", Lq * B, 3 * E, E, 1, _dt(q), _dt(w), _dt(q), "nt", True, bias)
            else:
                self.wl.add(f"{base}.q_proj", "linear", Lq * B, E, E, 1, _dt(q), _dt(w), _dt(q), "nt", True, bias)
                self.wl.add(f"{base}.kv_proj", "linear", Lk * B, 2 * E, E, 1, _dt(k), _dt(w), _dt(q), "nt", True, bias)
        else:
            for n, t, L in (("q_proj", q, Lq), ("k_proj", k, Lk), ("v_proj", k, Lk)):
                w = a.get(f"{n[0]}_proj_weight")
                if w is not None:
                    self.wl.add(f"{base}.{n}", "linear", L * B, w.shape[0], w.shape[1], 1, _dt(t), _dt(w), _dt(q),
                                "nt", True, bias)
        hd = E // H
        self.wl.add(f"{base}.qk", "bmm", Lq, Lk, hd, B * H, _dt(q), _dt(q), _dt(q), "nt", False, False)
        self.wl.add(f"{base}.pv", "bmm", Lq, hd, Lk, B * H, _dt(q), _dt(q), _dt(q), "nn", False, False)
        wo = a.get("out_proj_weight")
        if wo is not None:
            self.wl.add(f"{base}.out_proj", "linear", Lq * B, wo.shape[0], wo.shape[1], 1, _dt(q), _dt(wo), _dt(q),
                        "nt", True, a.get("out_proj_bias") is not None)


def capture(model: torch.nn.Module, *example_inputs, path: Optional[str] = None, **kwargs) -> Workload:
    """Run ``model`` once per example input and record its matmuls.

    Each positional ``example_inputs`` item is one call: a tensor (``model(x)``), a tuple or list
    (``model(*args)``) or a dict (``model(**kwargs)``); ``kwargs`` go to every call. Runs under
    ``torch.no_grad()``. ``path``: also write the JSON workload file there. Returns the Workload.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not example_inputs:
        raise ValueError("capture: give at least one example input (one per model call)")
    wl = Workload(type(model).__name__)
    stack: List[list] = []            # [module name, matmuls seen in its forward] of the modules running
    handles = []

    def post(m, a, o):
        if stack:
            stack.pop()
    for name, mod in model.named_modules():
        def pre(m, a, _n=name):
            stack.append([_n, 0])
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        with torch.no_grad(), _Recorder(wl, stack):
            for x in example_inputs:
                if isinstance(x, dict):
                    model(**x, **kwargs)
                elif isinstance(x, (tuple, list)):
                    model(*x, **kwargs)
                else:
                    model(x, **kwargs)
                wl.calls += 1
                stack.clear()
    finally:
        for h in handles:
            h.remove()
    if path is not None:
        save(wl.to_dict(), path)
    return wl


def save(workload: dict, path: str) -> None:
    """Write a workload dict as JSON (atomically)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(workload, f, indent=1)
    os.replace(tmp, path)


def load(path: str) -> dict:
    """Read a workload file (from :func:`capture` or :func:`bitblas.workload.tir.find_matmuls`)."""
    with open(path) as f:
        wl = json.load(f)
    if not isinstance(wl, dict) or wl.get("schema") != SCHEMA or not isinstance(wl.get("workloads"), list):
        raise ValueError(f"{path}: not a bitblas workload file (schema {SCHEMA!r})")
    return wl
