"""The module import graph of bitblas/: no cycles, no private names read across modules.

Static: every ``.py`` under bitblas/ is parsed with ``ast``; every ``import`` / ``from ... import``
statement counts, wherever it sits (module level, inside a function or method, under ``if
TYPE_CHECKING``), because a function-level import that exists only to dodge a cycle is still a
cycle. Relative imports are resolved against the importing module's package. ``from pkg import
name`` is an edge to ``pkg.name`` where that is a module of bitblas, else to ``pkg`` itself.
Importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` first: that is an edge too, to each
such package that is not itself a package of the importing module (those are already running).

A private name is one with a leading underscore that is not a dunder. It crosses modules when a
module of bitblas takes it from another module of bitblas: ``from .x import _name``, or
``x._name`` where ``x`` is bound by an import of a bitblas module. Private *modules* (``_tvm``)
are not counted: importing one is how a package shares it.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Dict, List, Set, Tuple

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bitblas")

# (importing module, source module, name) -> why it cannot be public or local. Keep it empty.
PRIVATE_ALLOWED: Dict[Tuple[str, str, str], str] = {}


def _modules(root: str = ROOT) -> Dict[str, str]:
    """Dotted module name -> file path, for every .py under ``root``."""
    out = {}
    base = os.path.dirname(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = os.path.join(dirpath, f)
    return out


def _is_package(path: str) -> bool:
    return os.path.basename(path) == "__init__.py"


def _resolve(mod: str, path: str, node: ast.ImportFrom) -> str:
    """The absolute module named by a ``from`` statement."""
    if not node.level:
        return node.module or ""
    pkg = mod.split(".") if _is_package(path) else mod.split(".")[:-1]
    if node.level > 1:
        pkg = pkg[:len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def scan(root: str = ROOT):
    """(edges, private): the import graph of bitblas's modules, and every private name one module
    takes from another as (importer, source, name, line)."""
    mods = _modules(root)
    edges: Dict[str, Set[str]] = {m: set() for m in mods}
    private: List[Tuple[str, str, str, int]] = []
    for mod, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        bound: Dict[str, str] = {}        # local name -> bitblas module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods:
                        edges[mod].add(a.name)
                        if a.asname:
                            bound[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, path, node)
                if src not in mods:
                    continue
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    if sub in mods:
                        edges[mod].add(sub)
                        bound[a.asname or a.name] = sub
                        continue
                    edges[mod].add(src)
                    if _private(a.name) and src != mod:
                        private.append((mod, src, a.name, node.lineno))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and _private(node.attr)
                    and f"{bound[node.value.id]}.{node.attr}" not in mods):
                private.append((mod, bound[node.value.id], node.attr, node.lineno))
        pkgs = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        if _is_package(path):
            pkgs.add(mod)
        for dst in list(edges[mod]):       # the packages an import runs on the way to its module
            parts = dst.split(".")
            edges[mod].update(p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p not in pkgs)
        edges[mod].discard(mod)
    return edges, sorted(set(private))


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def _cycle_path(edges, comp: List[str]) -> List[str]:
    """One concrete cycle through the first module of a strongly connected component."""
    start, members = comp[0], set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def test_scan_sees_the_package():
    edges, _ = scan()
    assert "bitblas.ops.matmul" in edges and "bitblas.config" in edges["bitblas.ops.matmul"]


def test_no_import_cycles():
    edges, _ = scan()
    found = cycles(edges)
    msg = "\n".join(" -> ".join(_cycle_path(edges, c)) + f"   ({len(c)} modules: {', '.join(c)})"
                    for c in found)
    print(f"import cycles: {len(found)}\n{msg}")
    assert not found, f"{len(found)} import cycle(s) in bitblas/:\n{msg}"


def test_no_private_names_across_modules():
    _, private = scan()
    crossing = [p for p in private if (p[0], p[1], p[2]) not in PRIVATE_ALLOWED]
    msg = "\n".join(f"{a}:{line} takes {b}.{n}" for a, b, n, line in crossing)
    print(f"private names across modules: {len(crossing)}\n{msg}")
    assert not crossing, f"{len(crossing)} private name(s) read across modules:\n{msg}"


def test_detector_finds_a_cycle_and_a_private_name(tmp_path):
    pkg = tmp_path / "bitblas"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .b import _g\n    return _g()\n")
    (pkg / "sub" / "b.py").write_text("from . import a\n\ndef _g():\n    return a.f\n")
    (pkg / "c.py").write_text("from .sub import b\nx = b._g\n")
    (pkg / "d").mkdir()
    (pkg / "d" / "__init__.py").write_text("from .. import e\n")      # d -> e -> d.f, which runs d first
    (pkg / "d" / "f.py").write_text("")
    (pkg / "e.py").write_text("from .d.f import *\n")
    edges, private = scan(str(pkg))
    assert cycles(edges) == [["bitblas.d", "bitblas.e"], ["bitblas.sub.a", "bitblas.sub.b"]]
    assert "bitblas.d.f" in edges["bitblas.e"] and "bitblas" not in edges["bitblas.e"]
    assert {(a, b, n) for a, b, n, _ in private} == {("bitblas.sub.a", "bitblas.sub.b", "_g"),
                                                     ("bitblas.c", "bitblas.sub.b", "_g")}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
