"""Tensor parallelism over torch.distributed: column- and row-parallel bitblas layers.

* :class:`ColumnParallelLinear`: rank ``r`` holds output features ``[r * N/tp, (r+1) * N/tp)``: rows of
  the packed weight, of its scales / zeros and of the bias. The output is all-gathered along the last
  dimension (``gather_output=True``) or left sharded (to feed a row-parallel layer).
* :class:`RowParallelLinear`: rank ``r`` holds input features ``[r * K/tp, (r+1) * K/tp)``: a slice of
  the packed weight along K and the scale / zero groups of that slice, so ``K/tp`` must be a multiple
  of ``group_size`` (groups never straddle ranks); per-channel scales (group_size=-1) are copied to
  every rank. The partial outputs are all-reduced (summed), then the bias is added once.

Build them from a full ``bitblas.Linear`` (every rank holds the full layer first) with
``from_linear``, or from a float / code weight with ``load_and_transform_weight`` (each rank takes its
shard of the full tensors). Collectives use torch's functional collectives, which torch.compile traces.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from ..formats import FORMATS
from .linear import Linear

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "shard_linear"]

_LINEAR_FIELDS = ("A_dtype", "W_dtype", "out_dtype", "group_size", "with_scaling", "with_zeros", "zeros_mode")


def _rank_world(group, rank, world_size) -> Tuple[int, int]:
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("rank and world_size are required when torch.distributed is not initialized")
        rank = dist.get_rank(group) if rank is None else rank
        world_size = dist.get_world_size(group) if world_size is None else world_size
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} is invalid; accepted: a positive int")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r} is invalid; accepted: 0 .. {world_size - 1}")
    return rank, world_size


def _linear_kwargs(linear: Linear) -> dict:
    kw = {k: getattr(linear, k) for k in _LINEAR_FIELDS}
    kw["opt_M"] = linear.config.M
    return kw


def _all_gather_last(t: torch.Tensor, group, world: int) -> torch.Tensor:
    if world == 1:
        return t
    import torch.distributed._functional_collectives as funcol
    g = group if group is not None else dist.group.WORLD
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor   # name of torch >= 2.12
    out = funcol.wait_tensor(gather(t.contiguous(), 0, g))        # [world * rows, ..., N / world]
    return torch.cat(out.chunk(world, dim=0), dim=-1)


def _all_reduce(t: torch.Tensor, group, world: int) -> torch.Tensor:
    if world == 1:
        return t
    import torch.distributed._functional_collectives as funcol
    g = group if group is not None else dist.group.WORLD
    return funcol.wait_tensor(funcol.all_reduce(t, "sum", g))


def shard_linear(linear: Linear, dim: str, rank: int, world_size: int) -> dict:
    """The tensors rank ``rank`` of ``world_size`` holds of ``linear``, unpacked: ``codes``, ``scale``,
    ``zeros``, ``global_scale``, ``bias``, ``perm`` (``dim`` "out": column-parallel, "in": row-parallel,
    where ``perm`` becomes ``index``: the input columns this rank reads)."""
    if not isinstance(linear, Linear):
        raise TypeError(f"linear: expected a bitblas.Linear, got {type(linear).__name__}")
    u = linear.unpacked()
    c = linear.config
    N, K = c.N, c.K
    if dim == "out":
        if N % world_size:
            raise ValueError(f"out_features={N} is not divisible by world_size={world_size}")
        n = N // world_size
        sl = slice(rank * n, (rank + 1) * n)
        return {"codes": u["codes"][sl], "scale": None if u["scales"] is None else u["scales"][sl],
                "zeros": None if u["zeros"] is None else u["zeros"][sl], "global_scale": u["global_scale"],
                "bias": None if u["bias"] is None else u["bias"][sl], "perm": u["perm"]}
    if dim != "in":
        raise ValueError(f"dim={dim!r} is invalid; accepted: 'out' (column-parallel), 'in' (row-parallel)")
    if K % world_size:
        raise ValueError(f"in_features={K} is not divisible by world_size={world_size}")
    k = K // world_size
    w = FORMATS[c.W_dtype]
    if w.packed and k % w.codes_per_byte:
        raise ValueError(f"in_features / world_size = {k} must be a multiple of {w.codes_per_byte} for "
                         f"W_dtype={c.W_dtype!r}")
    grouped = c.with_scaling and c.group_size != -1 and c.group_size != K
    if grouped and k % c.group_size:
        raise ValueError(f"in_features / world_size = {k} is not a multiple of group_size={c.group_size}: scale "
                         "groups would straddle ranks; use a world size that keeps groups whole")
    sl = slice(rank * k, (rank + 1) * k)

    def groups(t):
        if t is None:
            return None
        if not grouped:
            return t                                   # per-channel: every rank keeps all of it
        g = k // c.group_size
        return t[:, rank * g:(rank + 1) * g]

    perm = u["perm"]
    index = (perm[sl] if perm is not None else
             torch.arange(rank * k, (rank + 1) * k, device=u["codes"].device))
    return {"codes": u["codes"][:, sl], "scale": groups(u["scales"]), "zeros": groups(u["zeros"]),
            "global_scale": u["global_scale"], "bias": u["bias"], "perm": perm, "index": index}


class _Parallel(nn.Module):
    @classmethod
    def _from_linear(cls, linear: Linear, group, rank, world_size, **kind_kwargs):
        """This rank's shard of a loaded ``Linear`` (same formats, on the same device)."""
        dev = linear._buffers[linear._weight_name].device
        self = cls(linear.in_features, linear.out_features, bias=linear.config.with_bias, group=group, rank=rank,
                   world_size=world_size, device=dev, **kind_kwargs, **_linear_kwargs(linear))
        self._load_shard(linear)
        return self

    def _setup(self, group, rank, world_size):
        self.group = group
        self.rank, self.world_size = _rank_world(group, rank, world_size)

    def _load_shard(self, full: Linear):
        raise NotImplementedError

    @torch.no_grad()
    def load_and_transform_weight(self, weight, scales=None, zeros=None, bias=None, global_scale=None, *,
                                  method: str = "mse"):
        """Load the full layer's weight (as ``bitblas.Linear.load_and_transform_weight`` takes it); this
        rank keeps its shard."""
        full = Linear(self.in_features, self.out_features, bias=bias is not None or self._has_bias,
                      **self._kwargs)
        full.load_and_transform_weight(weight, scales, zeros, bias, global_scale, method=method)
        self._load_shard(full)
        return self


class ColumnParallelLinear(_Parallel):
    """Output features split across ranks; see the module docstring."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, group=None,
                 rank: Optional[int] = None, world_size: Optional[int] = None, gather_output: bool = True,
                 **linear_kwargs):
        super().__init__()
        self._setup(group, rank, world_size)
        if out_features % self.world_size:
            raise ValueError(f"out_features={out_features} is not divisible by world_size={self.world_size}")
        self.in_features, self.out_features, self.gather_output = in_features, out_features, gather_output
        self._has_bias, self._kwargs = bias, dict(linear_kwargs)
        self.local = Linear(in_features, out_features // self.world_size, bias=bias, **linear_kwargs)

    @classmethod
    def from_linear(cls, linear: Linear, group=None, rank: Optional[int] = None, world_size: Optional[int] = None,
                    gather_output: bool = True) -> "ColumnParallelLinear":
        return cls._from_linear(linear, group, rank, world_size, gather_output=gather_output)

    def _load_shard(self, full: Linear):
        s = shard_linear(full, "out", self.rank, self.world_size)
        new = self.local._prepare(s["codes"], s["scale"], s["zeros"], s["bias"], s["global_scale"])
        self.local._commit(new, s["perm"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        return _all_gather_last(y, self.group, self.world_size) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"rank={self.rank}, world_size={self.world_size}, gather_output={self.gather_output}"


class RowParallelLinear(_Parallel):
    """Input features split across ranks; see the module docstring. ``input_is_parallel=True``: the
    input is already this rank's slice [..., in_features / world_size] (as a column-parallel layer
    with ``gather_output=False`` leaves it); else the full input is given and sliced here."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, *, group=None,
                 rank: Optional[int] = None, world_size: Optional[int] = None, input_is_parallel: bool = False,
                 **linear_kwargs):
        super().__init__()
        self._setup(group, rank, world_size)
        if in_features % self.world_size:
            raise ValueError(f"in_features={in_features} is not divisible by world_size={self.world_size}")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self._has_bias, self._kwargs = bias, dict(linear_kwargs)
        k = in_features // self.world_size
        gs = linear_kwargs.get("group_size", -1)
        if isinstance(gs, int) and not isinstance(gs, bool) and 0 < gs < in_features and k % gs:
            raise ValueError(f"in_features / world_size = {k} is not a multiple of group_size={gs}: scale groups "
                             "would straddle ranks")
        self.local = Linear(k, out_features, bias=False, **linear_kwargs)
        dev = linear_kwargs.get("device")
        self.register_buffer("bias", torch.zeros(out_features, dtype=self.local._out_dtype, device=dev)
                             if bias else None)
        self.register_buffer("index", torch.arange(self.rank * k, (self.rank + 1) * k, device=dev))
        self._contiguous_slice = True

    @classmethod
    def from_linear(cls, linear: Linear, group=None, rank: Optional[int] = None, world_size: Optional[int] = None,
                    input_is_parallel: bool = False) -> "RowParallelLinear":
        return cls._from_linear(linear, group, rank, world_size, input_is_parallel=input_is_parallel)

    def _load_shard(self, full: Linear):
        s = shard_linear(full, "in", self.rank, self.world_size)
        if s["perm"] is not None and self.input_is_parallel:
            raise NotImplementedError("an act-order layer (perm) reorders the whole input: row-parallel with "
                                      "input_is_parallel=True cannot apply it; give the full input")
        new = self.local._prepare(s["codes"], s["scale"], s["zeros"], None, s["global_scale"])
        self.local._commit(new, None)
        dev = self.local._buffers[self.local._weight_name].device
        k = self.in_features // self.world_size
        self.index = s["index"].to(device=dev, dtype=torch.long)
        self._contiguous_slice = s["perm"] is None
        if s["bias"] is not None:
            self.bias = s["bias"].to(device=dev, dtype=self.local._out_dtype).clone()
        self._k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.in_features:
                raise ValueError(f"RowParallelLinear: input last dimension is "
                                 f"{getattr(x, 'shape', [None])[-1] if getattr(x, 'dim', lambda: 0)() else None}, "
                                 f"expected in_features={self.in_features} (input_is_parallel=False)")
            k = self.in_features // self.world_size
            if self._contiguous_slice:
                x = x.narrow(-1, self.rank * k, k).contiguous()
            else:
                x = x.index_select(-1, self.index)
        y = _all_reduce(self.local(x), self.group, self.world_size)
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return f"rank={self.rank}, world_size={self.world_size}, input_is_parallel={self.input_is_parallel}"
