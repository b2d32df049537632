"""The tests' one interpreter of generated CUDA helpers (written here).

The decode, gather, dot and staging helpers the GEMV kernels call are straight-line C; the tests
check them bit for bit by running their source text on Python ints and floats. ``run_c`` takes one
helper (signature line, body, closing brace) and an environment: scalars, and arrays as Python
lists or dicts (``Ptr`` for the ``uint4`` pointers of the permute helpers). Every statement must
have a form it knows; anything else fails the test (teach the form here, do not skip it).

Known forms: declarations with or without initialisers (``unsigned``, ``int``, ``float``,
``uint4``, pointers; several declarators per statement), assignments to names and array elements,
``return``; inline asm ``prmt.b32`` / ``lop3.b32`` / ``dp4a.{u32,s32}.s32`` with register or
immediate operands; the calls ``__byte_perm``, ``__dp4a``, ``__vsub4``, ``fmaf``, ``__ldg`` (of a
``Ptr``), ``make_uint4``, ``reinterpret_cast``, the ``bb_prmt_`` lambda of the nvfp4 helpers; the
casts ``(int)``, ``(unsigned)`` and ``(float)(..)``.
"""
from __future__ import annotations

import functools
import re
from collections import namedtuple

import numpy as np

from bitblas.schedule.gemv.decode import _emu_lop3, _emu_prmt

M32 = 0xFFFFFFFF
U4 = namedtuple("U4", "x y z w")


def i32(x: int) -> int:
    """``x`` as a C ``int`` (two's complement, 32 bits)."""
    x &= M32
    return x - (1 << 32) if x >> 31 else x


def dp4a(a: int, b: int, c: int, a_signed: bool = True, b_signed: bool = True) -> int:
    """``c`` + the dot product of the 4 bytes of ``a`` and ``b``, as a C ``int``."""
    def byte(x, i, sgn):
        v = (x >> (8 * i)) & 0xFF
        return v - 256 if sgn and v >= 128 else v
    return i32(c + sum(byte(a, i, a_signed) * byte(b, i, b_signed) for i in range(4)))


def vsub4(a: int, b: int) -> int:
    """Byte-wise ``a - b`` modulo 256 (``__vsub4``)."""
    return sum((((a >> (8 * i)) - (b >> (8 * i))) & 0xFF) << (8 * i) for i in range(4))


def fmaf(a, b, c) -> float:
    """float32 ``a * b + c`` rounded once."""
    return float(np.float32(np.float64(a) * np.float64(b) + np.float64(c)))


def f32(v) -> float:
    return float(np.float32(v))


class Ptr:
    """A ``uint4`` pointer into ``data`` (a list or dict of ``U4`` chunks): ``p + k``, ``p[k]``,
    ``p[k] = v`` and ``__ldg(p)``."""

    def __init__(self, data, off: int = 0):
        self.data, self.off = data, off

    def __add__(self, k: int) -> "Ptr":
        return Ptr(self.data, self.off + k)

    def __getitem__(self, k):
        return self.data[self.off + k]

    def __setitem__(self, k, v):
        self.data[self.off + k] = v


FUNCS = {"__byte_perm": _emu_prmt, "bb_prmt_": _emu_prmt, "__dp4a": dp4a, "__vsub4": vsub4, "fmaf": fmaf,
         "_f32": f32, "__ldg": lambda p: p[0], "make_uint4": lambda *v: U4(*v)}

_TYPE = r"(?:const )?(?:unsigned short|unsigned|int|float|uint4|auto)\b\*?"
_DECL = re.compile(rf"({_TYPE})\s*(.+)")
_ASSIGN = re.compile(r"(\w+)(?:\[(.+?)\])?\s*=\s*(.+)")
_ASM = re.compile(r'asm(?: volatile)?\("([\w.]+) ([^;"]*);"\s*:\s*(.*?)\s*:\s*(.*)\)')
_OPERAND = re.compile(r'"([=+]?)r"\((.+?)\)(?=, "|$)')


def _py(expr: str) -> str:
    """A C expression as Python text."""
    e = re.sub(r"reinterpret_cast<[^>]*>", "", expr)
    e = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uU]\b", r"\1", e)
    e = re.sub(r"\b(\d+\.\d*(?:e[-+]?\d+)?)f\b", r"\1", e)             # float literals
    e = e.replace("(float)(", "_f32(").replace("(int)", "").replace("(unsigned)", "")
    assert re.fullmatch(r"[\w\[\]\(\)\., ^&|~>*+<-]+", e), f"expression the interpreter does not know: {expr!r}"
    return e


@functools.lru_cache(maxsize=None)
def _code(expr: str):
    """The compiled Python of a C expression (helpers repeat their expressions across runs)."""
    return compile(_py(expr), "<helper>", "eval")


def _split_top(text: str, sep: str = ",") -> list:
    """``text`` split at ``sep`` outside parentheses and brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "([") - (ch in ")]")
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [s.strip() for s in out if s.strip()]


def _statements(line: str) -> list:
    """The statements of one source line (a ';' inside an asm string stays)."""
    return [s.strip().strip("{} ").strip() for s in re.findall(r'(?:[^;"]|"[^"]*")+', line) if s.strip("{} ")]


def _asm_step(stmt: str, signed: set) -> tuple:
    m = _ASM.fullmatch(stmt)
    assert m, f"asm form the interpreter does not know: {stmt!r}"
    op, args, outs, ins = m.groups()
    ops = [x.strip() for _, x in _OPERAND.findall(outs)] + [x.strip() for _, x in _OPERAND.findall(ins)]
    assert len(ops) == outs.count('"') // 2 + ins.count('"') // 2, stmt
    if op == "prmt.b32":
        fn = lambda a: _emu_prmt(a[0], a[1], a[2])                     # noqa: E731
    elif op == "lop3.b32":
        fn = lambda a: _emu_lop3(a[0], a[1], a[2], a[3])               # noqa: E731
    elif op in ("dp4a.u32.s32", "dp4a.s32.s32"):
        fn = lambda a, s=op == "dp4a.s32.s32": dp4a(a[0], a[1], a[2], s, True)   # noqa: E731
    else:
        raise AssertionError(f"asm instruction the interpreter does not know: {op!r}")
    names = [t.strip() for t in args.split(",")]
    srcs = tuple(_code(ops[int(t[1:])]) if t.startswith("%") else int(t, 16) for t in names[1:])
    om = re.fullmatch(r"(\w+)(?:\[(.+)\])?", ops[int(names[0][1:])])
    return ("asm", fn, srcs, om[1], om[2] and _code(om[2]), om[1] in signed or op.startswith("dp4a"))


@functools.lru_cache(maxsize=None)
def _program(src: str, skip: frozenset) -> tuple:
    """The helper's statements as steps: ("set", name, index code, value code, signed),
    ("asm", function, operand codes or immediates, name, index code, signed), ("return", code)."""
    lines = src.strip().splitlines()
    assert lines[0].startswith("__device__") and lines[0].rstrip().endswith("{") and lines[-1].strip() == "}", src
    steps, signed = [], set()
    for line in lines[1:-1]:
        if line.strip() in skip:
            continue
        for stmt in _statements(line):
            if stmt.startswith("asm"):
                steps.append(_asm_step(stmt, signed))
                continue
            m = re.fullmatch(r"return (.+)", stmt)
            if m:
                steps.append(("return", _code(m[1])))
                continue
            m = _DECL.fullmatch(stmt)
            if m:
                is_int = re.search(r"\bint\b", m[1]) is not None
                for d in _split_top(m[2]):
                    dm = re.fullmatch(r"\*?\s*(\w+)(?:\s*=\s*(.+))?", d)
                    assert dm, f"declaration the interpreter does not know: {stmt!r}"
                    if is_int:
                        signed.add(dm[1])
                    if dm[2] is not None:
                        steps.append(("set", dm[1], None, _code(dm[2]), is_int))
                continue
            m = _ASSIGN.fullmatch(stmt)
            assert m, f"statement the interpreter does not know: {stmt!r}"
            steps.append(("set", m[1], m[2] and _code(m[2]), _code(m[3]), m[1] in signed))
    return tuple(steps)


def _store(env: dict, ns: dict, name: str, idx, value, signed: bool) -> None:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = i32(int(value)) if signed else int(value) & M32
    if idx is None:
        env[name] = ns[name] = value
    else:
        env[name][eval(idx, _GLOBALS, ns)] = value                         # noqa: S307 - our own source


_GLOBALS = {"__builtins__": {}}


def run_c(src: str, env: dict, skip_lines=()) -> dict:
    """Run the helper ``src`` (``__device__ ... {``, straight-line body, ``}``) in ``env`` (updated
    in place, also returned); a ``return`` leaves its value under ``env["return"]``. ``skip_lines``:
    whole lines that define what FUNCS already provides (the nvfp4 helpers' ``bb_prmt_`` lambda)."""
    ns = {**FUNCS, **env}
    for step in _program(src, frozenset(s.strip() for s in skip_lines)):
        kind = step[0]
        if kind == "set":
            _store(env, ns, step[1], step[2], eval(step[3], _GLOBALS, ns), step[4])   # noqa: S307
        elif kind == "asm":
            args = [eval(c, _GLOBALS, ns) if not isinstance(c, int) else c for c in step[2]]   # noqa: S307
            _store(env, ns, step[3], step[4], step[1](args), step[5])
        else:
            env["return"] = eval(step[1], _GLOBALS, ns)                      # noqa: S307
            return env
    return env


def run_permute(helper: str, words: list, nchunks: int) -> list:
    """A generated ``bb_perm(src, dst)`` (uint4 loads, ``__byte_perm``, uint4 stores) on 32-bit
    ``words`` (4 per 16-byte chunk): the words of the ``nchunks`` chunks it writes."""
    out = {}
    run_c(helper, {"src": Ptr([U4(*words[4 * k:4 * k + 4]) for k in range(len(words) // 4)]), "dst": Ptr(out)})
    assert sorted(out) == list(range(nchunks)), sorted(out)
    return [w for k in range(nchunks) for w in out[k]]
