"""``quantize_weight(method="mse")``: per-group choice of scale (and zero point) that minimises the
group's squared reconstruction error.

Starting from round-to-nearest's parameters (absmax or min/max per group), each group tries:

- clipped ranges: the scale times r for r in ``RATIOS`` (1 down to 0.55; zero points keep the
  grid anchored where RTN put it), as AWQ's auto-clip searches clipping ratios;
- a least-squares refit of each candidate: with its codes fixed, the scale (and zero point) that
  minimise the group's squared error (``w ~ a * v + b``), as llama.cpp's ``make_qkx*_quants`` refits
  scale and min; then ``REFITS`` more refits of the best (re-rounding in between: Lloyd's
  alternation restricted to a uniform grid).

Every candidate's parameters are rounded as they are stored (float16 / bfloat16 scales and zeros,
integer zero points, nvfp4's float8 block scales) and its codes are the nearest to each weight; each
group keeps the candidate with the smallest squared error (compared in code units,
``step**2 * sum((w / step + z - v)**2)``, the same quantity). RTN's own parameters are candidate 0,
and a last check decodes the choice and RTN's as the kernel does (float32) and keeps RTN's unless
the choice is strictly better: no group gets worse than RTN. Vectorised over all groups, in row
blocks of ~1M elements whose scratch buffers are reused; weights with inf / nan keep RTN's result.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from ..formats import Format

METHODS = ("mse", "rtn")
RATIOS = (0.95, 0.9, 0.85, 0.8, 0.7, 0.55)     # clipping ratios besides RTN's 1.0
REFITS = 2
_BLOCK = 1 << 20                                        # elements per row block (4 MiB of float32)


class Grid:
    """How one format's groups decode: code values ``v`` (integer codes, table entries, float8
    values) times the scale, less the zero point: ``(v - z) * s`` (zeros "original" / "quantized"),
    ``v * s - z`` ("rescale"), ``v * s * g`` (no zeros; g: nvfp4's global scale).

    ``round_scale`` / ``round_zero``: a parameter as the kernel sees it (cast to its stored dtype);
    ``cast``: float8 dtype of scaled float8 weights; ``gscale``: nvfp4's global scale or None."""

    def __init__(self, fmt: Format, zeros_mode: Optional[str], round_scale: Callable, round_zero: Optional[Callable],
                 gscale: Optional[torch.Tensor] = None, cast: Optional[torch.dtype] = None):
        self.fmt, self.zeros_mode, self.round_scale, self.round_zero = fmt, zeros_mode, round_scale, round_zero
        self.g, self.cast = gscale, cast
        self.lookup = fmt.kind == "table" and cast is None
        if self.lookup:
            self._lookup(fmt)
        self.lo, self.hi = fmt.code_range if fmt.kind in ("int", "uint") else (None, None)

    def _lookup(self, fmt):
        """Nearest finite entry of a lookup table (nf4, fp4) without a binary search per element
        (torch.bucketize costs ~80 multiplies): cells of width ``cw`` (half the smallest gap between
        decision points) hold at most one decision point each, widened by cw/4 on both sides; the
        nearest entry of x in cell f is ``below[f] + (x > point[f])``, exact for x within cw/4 of
        its cell (far more than float32's error in computing the cell)."""
        t = torch.tensor(fmt.table, dtype=torch.float64)
        idx = torch.arange(len(t))[torch.isfinite(t)]
        order = torch.argsort(t[idx], stable=True)
        sv = t[idx][order]
        mids = ((sv[1:] + sv[:-1]) / 2).to(torch.float32).to(torch.float64)   # compared in float32
        cw = float((mids[1:] - mids[:-1]).min()) / 2 if len(mids) > 1 else float(sv[-1] - sv[0])
        left = sv[0] + cw * torch.arange(int((sv[-1] - sv[0]) / cw) + 2, dtype=torch.float64)
        lo, hi = (left - cw / 4).unsqueeze(1), (left + cw * 1.25).unsqueeze(1)
        inside = (mids >= lo) & (mids <= hi)
        if int(inside.sum(1).max()) > 1:
            raise RuntimeError(f"{fmt.name}: lookup cells hold two decision points")
        below = (mids < lo).sum(1)
        self.point = torch.where(inside, mids, torch.inf).amin(1).to(torch.float32)
        # per cell: the value and code below its decision point, and the steps across it
        above = (below + 1).clamp(max=len(sv) - 1)
        codes = idx[order].to(torch.float32)
        self.v_below, self.v_step = sv[below].to(torch.float32), (sv[above] - sv[below]).to(torch.float32)
        self.c_below, self.c_step = codes[below], codes[above] - codes[below]
        self.table = torch.tensor(fmt.table, dtype=torch.float32)
        self.origin, self.inv_cw, self.vmin, self.vmax = float(sv[0]), 1 / cw, float(sv[0]), float(sv[-1])

    def to(self, device):
        if self.lookup:
            for k in ("point", "v_below", "v_step", "c_below", "c_step", "table"):
                setattr(self, k, getattr(self, k).to(device))
        return self

    def step(self, s):
        """Value of one code unit per group (0 where the scale is 0: the group decodes to zeros)."""
        return s * self.g if self.g is not None else s

    def scaled(self, w, s, z, out):
        """``w`` in code units, into ``out``: x whose nearest code is the group's code, with
        ``w - decode(v) = step * (x - v)``."""
        if self.zeros_mode == "rescale":
            return torch.add(w, z.unsqueeze(-1), out=out).mul_(s.reciprocal().unsqueeze(-1))
        u = self.step(s)
        x = torch.mul(w, torch.where(u == 0, torch.ones_like(u), u).reciprocal().unsqueeze(-1), out=out)
        if z is not None:
            x += z.unsqueeze(-1)
        return x

    def values(self, c):
        """Code values of stored codes (float32 integer codes, table indices, float8 values)."""
        return self.table[c.long()] if self.lookup else c

    def nearest(self, x, ws):
        """Values of the codes nearest to ``x`` (into ``ws.v``; table formats leave the cell index
        and the side of its decision point in ``ws.f``, ``ws.b``)."""
        if self.fmt.kind in ("int", "uint"):
            return torch.round(x, out=ws.v).clamp_(self.lo, self.hi)
        if self.cast is not None:                   # float8 with scales: the cast rounds to nearest
            lim = self.fmt.max_abs
            return ws.v.copy_(torch.clamp(x, -lim, lim, out=ws.t).to(self.cast))
        f = torch.clamp(x, self.vmin, self.vmax, out=ws.t).sub_(self.origin).mul_(self.inv_cw).floor_()
        fi = ws.f.copy_(f).clamp_(0, len(self.point) - 1).view(-1)
        up = torch.gt(x, torch.index_select(self.point, 0, fi, out=ws.t.view(-1)).view(x.shape), out=ws.b)
        v = torch.index_select(self.v_step, 0, fi, out=ws.v.view(-1)).view(x.shape).mul_(up)
        return v.add_(torch.index_select(self.v_below, 0, fi, out=ws.t.view(-1)).view(x.shape))

    def codes(self, v, ws):
        """Stored codes of the values the last :meth:`nearest` gave (float32)."""
        if self.lookup:
            fi = ws.f.view(-1)
            return self.c_step.index_select(0, fi).view(v.shape).mul_(ws.b).add_(
                self.c_below.index_select(0, fi).view(v.shape))
        return v.clone()

    def error(self, x, v, s, sww):
        """Squared error of each group from its scaled weights ``x`` (overwritten) and code values ``v``."""
        u = self.step(s)
        return torch.where(u == 0, sww, torch.linalg.vector_norm(x.sub_(v), dim=-1).square() * (u * u))

    def exact_error(self, w, v, s, z):
        """Squared error of each group, decoding as the kernel does."""
        if self.zeros_mode is None:
            r = v * self.step(s).unsqueeze(-1)
        elif self.zeros_mode == "rescale":
            r = v * s.unsqueeze(-1) - z.unsqueeze(-1)
        else:
            r = (v - z.unsqueeze(-1)) * s.unsqueeze(-1)
        return torch.linalg.vector_norm(r.sub_(w), dim=-1).square()

    def clipped(self, s, z, r):
        """RTN's grid with its scale times ``r`` (the zero point keeps the code of w = 0)."""
        s2 = self.round_scale(s * r)
        if self.zeros_mode == "rescale":
            return s2, self.round_zero(z * r)
        return s2, z

    def refit(self, w, v, sw, tmp):
        """Least-squares (scale, zero) of ``w ~ a * v + b`` for fixed code values ``v``, and whether
        each group has one (a > 0). ``tmp``: scratch like ``w``."""
        n = w.shape[-1]
        svv, swv = torch.linalg.vector_norm(v, dim=-1).square(), torch.mul(w, v, out=tmp).sum(-1)
        one = torch.ones_like(svv)
        if self.zeros_mode is None:
            a = swv / torch.where(svv > 0, svv, one)
            ok = (svv > 0) & (a > 0)
            return self.round_scale(a / self.g if self.g is not None else a), None, ok
        sv = v.sum(-1)
        det = n * svv - sv * sv
        a = (n * swv - sv * sw) / torch.where(det > 0, det, one)
        ok = (det > 0) & (a > 0)
        a = torch.where(ok, a, one)
        b = (sw - a * sv) / n
        if self.zeros_mode == "quantized":        # integer zero point, then the scale for it
            z = (-b / a).round().clamp(self.lo, self.hi)
            sz, szz = svv - 2 * z * sv + n * z * z, swv - z * sw
            a = szz / torch.where(sz > 0, sz, one)
            ok &= (sz > 0) & (a > 0)
            return self.round_scale(a), z, ok
        s = self.round_scale(a)
        if self.zeros_mode == "rescale":
            return s, self.round_zero(-b), ok
        return s, self.round_zero(-b / s), ok


class _Scratch:
    """Buffers of one row block, reused by every candidate (a fresh multi-MiB tensor per operation
    costs more in page faults than the operation)."""

    def __init__(self, w, lookup: bool):
        self.x, self.v, self.t = torch.empty_like(w), torch.empty_like(w), torch.empty_like(w)
        if lookup:
            self.f = torch.empty(w.shape, dtype=torch.int32, device=w.device)
            self.b = torch.empty(w.shape, dtype=torch.bool, device=w.device)


def _search_block(grid: Grid, w, s0, z0, c0, ws: _Scratch):
    sw, sww = w.sum(-1), torch.linalg.vector_norm(w, dim=-1).square()
    v0 = grid.values(c0)
    s, z, e = s0, z0, grid.error(grid.scaled(w, s0, z0, ws.x), v0, s0, sww)

    def consider(s2, z2, ok=None):
        nonlocal s, z, e
        x2 = grid.scaled(w, s2, z2, ws.x)
        v2 = grid.nearest(x2, ws)
        e2 = grid.error(x2, v2, s2, sww)
        m = e2 < e
        if ok is not None:
            m &= ok
        s, e = torch.where(m, s2, s), torch.where(m, e2, e)
        if z is not None:
            z = torch.where(m, z2, z)
        return v2

    for r in RATIOS:
        v = consider(*grid.clipped(s0, z0, r))
        consider(*grid.refit(w, v, sw, ws.t))
    for _ in range(REFITS):
        consider(*grid.refit(w, grid.nearest(grid.scaled(w, s, z, ws.x), ws), sw, ws.t))
    v = grid.nearest(grid.scaled(w, s, z, ws.x), ws)
    c = grid.codes(v, ws)
    # the search compared errors in code units; keep RTN wherever, decoded as the kernel does, it is not worse
    keep = grid.exact_error(w, v0, s0, z0) <= grid.exact_error(w, v, s, z)
    s = torch.where(keep, s0, s)
    z = None if z is None else torch.where(keep, z0, z)
    c = torch.where(keep.unsqueeze(-1), c0, c)
    return s, z, c


def search(grid: Grid, wg: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor],
           codes: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Per group of ``wg`` [N, groups, gs] (float32): the best of RTN's (``s``, ``z``, ``codes``:
    float32, as the kernel sees them) and the candidates above; returns (s, z, codes) likewise.
    Weights with inf / nan keep RTN's result."""
    if not bool(torch.isfinite(wg).all()):
        return s, z, codes
    grid.to(wg.device)
    n = wg.shape[0]
    rows = max(1, _BLOCK // max(1, wg.shape[1] * wg.shape[2]))
    out_s, out_z, out_c = torch.empty_like(s), None if z is None else torch.empty_like(z), torch.empty_like(codes)
    ws = None
    for i in range(0, n, rows):
        j = slice(i, min(n, i + rows))
        if ws is None or ws.x.shape != wg[j].shape:
            ws = _Scratch(wg[j], grid.lookup)
        bs, bz, bc = _search_block(grid, wg[j], s[j], None if z is None else z[j], codes[j], ws)
        out_s[j], out_c[j] = bs, bc
        if z is not None:
            out_z[j] = bz
    return out_s, out_z, out_c
