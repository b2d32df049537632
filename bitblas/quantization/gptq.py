"""Calibrated weight quantization: GPTQ-style error compensation from the layer's inputs.

``gptq_quantize_weight(weight, H, ...)`` quantizes a float weight [N, K] column by column (Frantar et
al., "GPTQ", 2022: optimal brain surgeon updates with a Cholesky factor of the inverse Hessian, lazy
batched over blocks of columns). ``H = 2 X^T X / n`` is the Hessian of the layer's squared output
error over the calibration inputs X [n, K] (:class:`HessianAccumulator` collects it); the rounding
error of each column is spread over the columns not yet quantized so that ``X W^T`` changes least.

The grid is bitblas's own (:func:`~bitblas.quantization.quantize_weight`): when the first column of
a group is reached, that group's scale (and zero point) is chosen from the group's current, already
updated weights by ``quantize_weight`` itself with the same ``method`` ("rtn" or "mse"), format,
``with_zeros`` / ``zeros_mode`` and scale dtype; each column is then rounded to that grid. The result
is a :class:`~bitblas.quantization.QuantizedWeight` like ``quantize_weight``'s, in the plain per-group
layout every consumer takes (``Linear.load_and_transform_weight``, ``pack_weight``).

``act_order=True`` quantizes columns in order of decreasing ``H`` diagonal; groups stay the plain
consecutive K ranges (a group's parameters are chosen when the first of its columns comes, from all
its columns' current values), so the layout is unchanged and no ``g_idx`` / permutation is needed.

Deviations from the reference implementation, on purpose: columns whose input is always zero (dead,
``H[k, k] == 0``) keep their weight and are rounded like the others (the reference zeroes them),
so inputs the calibration never saw still meet the float weight; if ``H`` plus dampening is not
positive definite, the dampening is raised tenfold (up to 4 times) before giving up.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..formats import get_format
from .quantize import TORCH_DTYPES, QuantizedWeight, nearest_code, safe_scale, quantize_weight
from .search import METHODS

__all__ = ["HessianAccumulator", "gptq_quantize_weight", "check_options"]


class HessianAccumulator:
    """``H = 2 X^T X / n`` of a layer's inputs, added batch by batch (float32 on ``device``).

    ``add(x)``: x [..., K], every leading dimension a sample (rows of a batch, tokens of a sequence).
    """

    def __init__(self, K: int, device=None):
        self.K = int(K)
        self.sum = torch.zeros(self.K, self.K, dtype=torch.float32, device=device)
        self.n = 0

    def add(self, x: torch.Tensor):
        if x.shape[-1] != self.K:
            raise ValueError(f"x: expected inputs with last dimension {self.K}, got shape {list(x.shape)}")
        x = x.detach().reshape(-1, self.K).to(device=self.sum.device, dtype=torch.float32)
        self.sum.addmm_(x.t(), x)
        self.n += x.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.n == 0:
            raise ValueError("no inputs were added")
        return self.sum * (2.0 / self.n)


class _Grid:
    """One group's fixed parameters and the rounding of a column to them, exactly as
    ``quantize_weight`` rounds (same arithmetic, so an un-updated column gets the same codes)."""

    def __init__(self, fmt, with_scaling: bool, with_zeros: bool, zeros_mode: str):
        self.fmt, self.scaling, self.zeros, self.mode = fmt, with_scaling, with_zeros, zeros_mode
        self.cast = TORCH_DTYPES[fmt.torch_dtype] if fmt.kind == "table" and fmt.torch_dtype else None
        if fmt.kind in ("int", "uint"):
            self.lo, self.hi = fmt.code_range
        if fmt.kind == "table" and self.cast is None:
            self.table = torch.tensor(fmt.table, dtype=torch.float32)

    def round(self, w: torch.Tensor, s: Optional[torch.Tensor],
              z: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(codes, decoded float32 values) of column ``w`` [N] with scales ``s`` / zeros ``z`` [N] (float32)."""
        fmt = self.fmt
        if fmt.kind == "table":
            x = w / safe_scale(s) if s is not None else w
            if self.cast is not None:
                lim = fmt.max_abs
                c = x.clamp(-lim, lim).to(self.cast)
                v = c.to(torch.float32)
            else:
                c = nearest_code(x, fmt)
                v = self.table.to(w.device)[c.long()]
            return c, (v * s if s is not None else v)
        if s is None:
            q = w.round().clamp(self.lo, self.hi)
            return q.to(torch.int16), q
        if not self.zeros:
            q = (w / s).round().clamp(self.lo, self.hi)
            return q.to(torch.int16), q * s
        if self.mode == "rescale":
            q = ((w + z) / s).round().clamp(self.lo, self.hi)
            return q.to(torch.int16), q * s - z
        q = (w / s + z).round().clamp(self.lo, self.hi)
        return q.to(torch.int16), (q - z) * s


def _describe(t) -> str:
    return f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def check_options(percdamp=0.01, block_size=128, act_order=False):
    """ValueError / TypeError for a bad ``percdamp``, ``block_size`` or ``act_order``."""
    if isinstance(percdamp, bool) or not isinstance(percdamp, (int, float)) or not (0 <= percdamp < math.inf):
        raise ValueError(f"percdamp={percdamp!r} is invalid; accepted: a finite number >= 0")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} is invalid; accepted: an integer >= 1")
    if not isinstance(act_order, bool):
        raise TypeError(f"act_order: expected a bool, got {act_order!r}")


def _inverse_cholesky(H: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp I)^-1; damp = percdamp * mean(diag H), raised if needed."""
    K = H.shape[0]
    damp = percdamp * float(torch.diag(H).mean())
    eye = torch.eye(K, dtype=H.dtype, device=H.device)
    for attempt in range(5):
        L, info = torch.linalg.cholesky_ex(H + damp * eye)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info) == 0 and bool(torch.isfinite(U).all()):
                return U
        damp = max(damp, 1e-8 * float(torch.diag(H).abs().max()) + 1e-12) * 10
    raise ValueError(f"H: not positive definite even with dampening {damp:g} (percdamp={percdamp}); "
                     "give more calibration samples or a larger percdamp")


def gptq_quantize_weight(weight: torch.Tensor, H: torch.Tensor, W_dtype: str, group_size: int = -1,
                         with_scaling: bool = True, with_zeros: bool = False, zeros_mode: str = "original",
                         scale_dtype=torch.float16, method: str = "mse", *, percdamp: float = 0.01,
                         block_size: int = 128, act_order: bool = False) -> QuantizedWeight:
    """Quantize ``weight`` [N, K] like :func:`~bitblas.quantization.quantize_weight` (same arguments,
    same result layout) with GPTQ error compensation against the inputs' Hessian ``H`` [K, K]
    (:class:`HessianAccumulator`; float32 or float64, on any device: computed on ``weight``'s).

    ``percdamp``: dampening added to the diagonal, a fraction of its mean (0.01 as GPTQ);
    ``block_size``: columns per lazy batch update (results do not depend on it beyond rounding);
    ``act_order``: quantize columns by decreasing ``H[k, k]`` (plain per-group layout kept).
    Formats without a rounding grid (float16 / bfloat16) are returned as ``quantize_weight`` does;
    nvfp4 (fixed 16-element groups with a global scale) is not supported.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid; accepted: {', '.join(map(repr, METHODS))}")
    fmt = get_format(W_dtype, "W")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError(f"weight: expected a float tensor [N, K], got {_describe(weight)}")
    N, K = weight.shape
    if not isinstance(H, torch.Tensor) or not H.dtype.is_floating_point or list(H.shape) != [K, K]:
        raise ValueError(f"H: expected a float tensor [K, K] = [{K}, {K}], got {_describe(H)}")
    if not bool(torch.isfinite(H).all()):
        raise ValueError("H: holds inf or nan")
    check_options(percdamp, block_size, act_order)
    if zeros_mode not in ("original", "rescale", "quantized"):
        raise ValueError(f"zeros_mode={zeros_mode!r} is invalid; accepted: original, rescale, quantized")
    if fmt.group_size is not None:
        raise NotImplementedError(f"gptq_quantize_weight: W_dtype={fmt.name!r} (fixed {fmt.group_size}-element "
                                  "groups with a global scale) is not supported; use quantize_weight")
    if fmt.kind == "float":
        return quantize_weight(weight, W_dtype, group_size, with_scaling, with_zeros, zeros_mode, scale_dtype,
                               method=method)
    gs = K if group_size in (-1, None) else group_size
    if not isinstance(gs, int) or gs < 1 or K % gs:
        raise ValueError(f"group_size={group_size} must divide K={K}")
    if with_zeros and not with_scaling:
        raise ValueError("with_zeros=True needs with_scaling=True")

    dev = weight.device
    W = weight.detach().to(torch.float32).clone()
    H = H.detach().to(device=dev, dtype=torch.float32).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0                      # no input there: rounded without compensation, weight kept
    perm = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else None
    if perm is not None:
        W, H = W[:, perm], H[perm][:, perm]
    Wt = W.t().contiguous()                  # [K, N]: a column is a contiguous row
    del W
    pos = torch.empty(K, dtype=torch.long)   # position (processing order) of each original column
    pos[perm.cpu() if perm is not None else torch.arange(K)] = torch.arange(K)
    order = perm.cpu().tolist() if perm is not None else list(range(K))
    U = _inverse_cholesky(H, float(percdamp))
    del H

    grid = _Grid(fmt, with_scaling, with_zeros, zeros_mode)
    groups = K // gs
    scales = torch.zeros(groups, N, dtype=torch.float32, device=dev) if with_scaling else None   # transposed
    zeros = torch.zeros(groups, N, dtype=torch.float32, device=dev) if with_zeros else None
    have = [False] * groups
    codes = torch.empty(K, N, dtype=grid.cast or torch.int16, device=dev)       # transposed
    for i1 in range(0, K, block_size):
        i2 = min(i1 + block_size, K)
        W1 = Wt[i1:i2].clone()
        Err1 = torch.zeros(i2 - i1, N, dtype=torch.float32, device=dev)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = order[i1 + i]
            g = col // gs
            if with_scaling and not have[g]:
                # the group's current values: columns in this block are up to date in W1; later
                # blocks still owe this block's updates so far
                p = pos[g * gs:(g + 1) * gs].to(dev)
                cur = torch.empty(gs, N, dtype=torch.float32, device=dev)
                inb = p < i2
                if bool(inb.any()):
                    cur[inb] = W1[p[inb] - i1]
                if bool((~inb).any()):
                    later = p[~inb]
                    cur[~inb] = Wt[later] - U[i1:i1 + i][:, later].t() @ Err1[:i]
                qw = quantize_weight(cur.t().contiguous(), W_dtype, -1, with_scaling, with_zeros, zeros_mode,
                                     scale_dtype, method=method)
                scales[g] = qw.scale[:, 0].to(torch.float32)
                if with_zeros:
                    zeros[g] = qw.zeros[:, 0].to(torch.float32)
                have[g] = True
            w = W1[i]
            c, q = grid.round(w, scales[g] if with_scaling else None, zeros[g] if with_zeros else None)
            codes[col] = c
            err = (w - q) / U1[i, i]
            W1[i:].addr_(U1[i, i:], err, alpha=-1)
            Err1[i] = err
        Wt[i2:].addmm_(U[i1:i2, i2:].t(), Err1, alpha=-1)
    codes = codes.t().contiguous()
    if not with_scaling:
        return QuantizedWeight(codes)
    zq = None
    if with_zeros:
        zeros = zeros.t().contiguous()
        zq = zeros.to(torch.int16) if zeros_mode == "quantized" else zeros.to(scale_dtype)
    return QuantizedWeight(codes, scales.t().contiguous().to(scale_dtype), zq)
