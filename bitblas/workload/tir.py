"""Find the matmuls of a TVM IRModule (Relax or TIR): the same workloads, for models compiled with TVM.

:class:`FindMatmuls` is a module pass (it returns the module unchanged and keeps what it found in
``.found``); :func:`find_matmuls` runs it, legalizing Relax operators (``R.matmul``,
``R.linear``...) to TIR first when the module has Relax functions and no PrimFunc for them yet.

In every PrimFunc, a block is a matmul when it has one or more reduction iterators and its body
is ``C[...] = C[...] + x * y`` (casts allowed around the loads) where x and y load two different
buffers. Its spatial iterators are classified by which operands they index: both -> batch, only
the first -> M, only the second -> N; the reduction iterators -> K. Extents are reported as ints
when static, else as the symbolic expression (``seq_len``, ``n * 2``...), with the free variables
listed. When the PrimFunc is called from Relax, the number of call sites is counted.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from .._tvm import tvm

__all__ = ["FindMatmuls", "find_matmuls", "workload_from_module"]


def _children(stmt):
    """Child statements of a TIR statement (the node types of TVM 0.27's tirx / s_tir)."""
    seq = getattr(stmt, "seq", None)
    if seq is not None:
        return list(seq)
    out = []
    for f in ("body", "block", "then_case", "else_case", "init"):
        c = getattr(stmt, f, None)
        if isinstance(c, (tvm.tirx.Stmt, tvm.s_tir.SBlock)):
            out.append(c)
    return out


def _walk(stmt, visit):
    visit(stmt)
    for c in _children(stmt):
        _walk(c, visit)


def _is_load(e) -> bool:
    return isinstance(e, tvm.ir.TensorLoad)         # TVM 0.27: tirx.BufferLoad builds an ir.TensorLoad


def _buf(load):
    return getattr(load, "buffer", None) or load.source


def _strip_cast(e):
    while isinstance(e, tvm.tirx.Cast):
        e = e.value
    return e


def _vars_in(expr) -> set:
    """The Vars an expression uses."""
    out = set()

    def rec(e):
        if isinstance(e, tvm.tirx.Var):
            out.add(e)
            return
        for f in ("a", "b", "value", "condition", "true_value", "false_value"):
            c = getattr(e, f, None)
            if c is not None and isinstance(c, tvm.tirx.Expr):
                rec(c)
        for a in getattr(e, "args", []) or []:
            if isinstance(a, tvm.tirx.Expr):
                rec(a)
    rec(expr)
    return out


def _extent(e):
    """int for a static extent, else (str expression, [free variable names])."""
    if isinstance(e, tvm.tirx.IntImm):
        return int(e.value), []
    names = sorted(v.name for v in _vars_in(e))
    return str(e), names


def _match_matmul(block) -> Optional[dict]:
    reduce_vars = [iv for iv in block.iter_vars if int(iv.iter_type) == 2]     # CommReduce
    if not reduce_vars:
        return None
    body = block.body
    if not isinstance(body, tvm.tirx.BufferStore):
        return None
    val = body.value
    if not isinstance(val, tvm.tirx.Add):
        return None
    acc, prod = val.a, val.b
    if _is_load(_strip_cast(prod)) and isinstance(acc, tvm.tirx.Mul):
        acc, prod = prod, acc
    acc, prod = _strip_cast(acc), _strip_cast(prod)
    if not (_is_load(acc) and _buf(acc).same_as(body.buffer) and isinstance(prod, tvm.tirx.Mul)):
        return None
    x, y = _strip_cast(prod.a), _strip_cast(prod.b)
    if not (_is_load(x) and _is_load(y)) or _buf(x).same_as(_buf(y)):
        return None
    xb, yb = _buf(x), _buf(y)
    xv = set().union(*[_vars_in(i) for i in x.indices]) if x.indices else set()
    yv = set().union(*[_vars_in(i) for i in y.indices]) if y.indices else set()
    dims = {"batch": [], "M": [], "N": [], "K": []}
    for iv in block.iter_vars:
        v = iv.var
        role = "K" if int(iv.iter_type) == 2 else ("batch" if v in xv and v in yv else
                                                    "M" if v in xv else "N" if v in yv else None)
        if role is not None:
            dims[role].append(iv)
    if not dims["K"] or not (dims["M"] or dims["N"]):
        return None
    # layout of the second operand: N index before K index -> "nt" ([N, K]), else "nn"
    pos = {}
    for i, idx in enumerate(y.indices):
        for v in _vars_in(idx):
            pos.setdefault(v, i)
    n_pos = min((pos[iv.var] for iv in dims["N"] if iv.var in pos), default=None)
    k_pos = min((pos[iv.var] for iv in dims["K"] if iv.var in pos), default=None)
    layout = "nt" if (n_pos is not None and k_pos is not None and n_pos < k_pos) else "nn"
    out = {"block": block.name_hint, "A": xb.name, "B": yb.name, "C": body.buffer.name,
           "A_dtype": str(xb.dtype), "B_dtype": str(yb.dtype), "C_dtype": str(body.buffer.dtype),
           "layout": layout, "symbols": []}
    symbols = set()
    for role, ivs in dims.items():
        static, exprs = 1, []
        for iv in ivs:
            val, names = _extent(iv.dom.extent)
            if isinstance(val, int):
                static *= val
            else:
                exprs.append(val)
                symbols.update(names)
        out[role] = static if not exprs else " * ".join(([str(static)] if static != 1 else []) + exprs)
    out["symbols"] = sorted(symbols)
    out["B_static"] = all(isinstance(_extent(s)[0], int) for s in yb.shape)
    return out


def _call_counts(mod) -> Dict[str, int]:
    """How many times Relax functions call each PrimFunc (call_tir and friends)."""
    counts: Dict[str, int] = {}
    try:
        from tvm import relax
    except ImportError:  # pragma: no cover
        return counts

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name.startswith("relax.call_tir"):
            gv = e.args[0]
            if isinstance(gv, tvm.ir.GlobalVar):
                counts[gv.name_hint] = counts.get(gv.name_hint, 0) + 1

    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f.body, visit)
    return counts


@tvm.ir.transform.module_pass(opt_level=0, name="bitblas.FindMatmuls")
class FindMatmuls:
    """Module pass: records the matmul blocks of every PrimFunc in ``self.found``; changes nothing."""

    def __init__(self):
        self.found: List[dict] = []

    def transform_module(self, mod, ctx):
        self.found = []
        calls = _call_counts(mod)
        for gv, f in mod.functions.items():
            if not isinstance(f, tvm.tirx.PrimFunc):
                continue
            hits = []

            def visit(s, hits=hits):
                if isinstance(s, tvm.s_tir.SBlock):
                    m = _match_matmul(s)
                    if m is not None:
                        hits.append(m)
            _walk(f.body, visit)
            for h in hits:
                self.found.append({"func": gv.name_hint, "calls": calls.get(gv.name_hint, 0), **h})
        return mod


def find_matmuls(mod) -> List[dict]:
    """The matmul blocks of ``mod`` (an IRModule, a PrimFunc, or a Relax module, legalized first)."""
    if isinstance(mod, tvm.tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    try:
        from tvm import relax
        if any(isinstance(f, relax.Function) for f in mod.functions.values()):
            mod = relax.transform.LegalizeOps()(mod)
    except ImportError:  # pragma: no cover
        pass
    p = FindMatmuls()
    p(mod)
    return p.found


def workload_from_module(mod, name: str = "") -> dict:
    """A workload dict (the format of :mod:`bitblas.workload.capture`) from a TVM module: each
    matmul whose second operand has a static shape is a weight matmul; a symbolic M becomes
    ``"M": null`` (dynamic: the default buckets)."""
    from .capture import SCHEMA
    out = []
    for s in find_matmuls(mod):
        M, N, K = s["M"], s["N"], s["K"]
        static_nk = isinstance(N, int) and isinstance(K, int)
        weight = s["B_static"] and static_nk and s["batch"] == 1
        out.append({"name": f"{s['func']}/{s['block']}", "op": "tir", "N": N, "K": K,
                    "batch": s["batch"], "A_dtype": s["A_dtype"], "W_dtype": s["B_dtype"], "out_dtype": s["C_dtype"],
                    "layout": s["layout"], "weight": weight, "with_bias": False,
                    "M": [M] if isinstance(M, int) else None, "M_expr": None if isinstance(M, int) else M,
                    "dynamic": not isinstance(M, int), "symbols": s["symbols"], "count": max(1, s["calls"])})
    return {"schema": SCHEMA, "source": "tvm", "model": name, "workloads": out}
