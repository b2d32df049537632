"""The plan: every choice derived from a MatmulConfig, made in one place.

A plan fixes, for one config, one target kind ("cpu" or "cuda") and one row count (an int, or
None for a kernel symbolic in M): the kernel's arguments (names, shapes, dtypes, what the user
hands over for each), the accumulation dtype, the dtype weights are decoded to, and where the
scales are applied. The IR emitter, the schedules, the operator's argument checks and the torch
reference all read it, so they cannot disagree.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .config import MatmulConfig
from .code_order import weight_order
from .formats import FORMATS, Format, code_storage

__all__ = ["ArgSpec", "Plan", "make_plan", "M_VAR"]

M_VAR = "m"  # the symbolic row count in shapes


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument. ``shape`` holds ints and ``M_VAR`` for the runtime row count."""

    name: str
    shape: Tuple[Union[int, str], ...]
    dtype: str            # what the kernel sees (float8 tensors are passed as their int8 bits)
    user_dtype: str       # the torch dtype a user passes
    role: str             # "input" | "table" | "output"
    optional: bool = False
    doc: str = ""

    @property
    def per_row(self) -> bool:
        """The first dimension is the row count (symbolic, the plan's static rows, or the run-time
        rows of a GEMV tensor-core kernel): activations, activation scales and the output."""
        return self.name in ("A", "a_scale", "output")


@dataclass(frozen=True)
class Plan:
    config: MatmulConfig
    target_kind: str                 # "cpu" | "cuda"
    m: Optional[int]                 # static row count, or None: symbolic
    a: Format
    w: Format
    accum: str                       # "float32" | "int32": what the reduction accumulates in
    decode_dtype: str                # dtype weights are dequantized to before the multiply
    scale_dtype: Optional[str]       # dtype of the weight scale (and float zeros)
    scale_in_epilogue: bool          # per-channel weight scale applied after the reduction
    groups: int                      # scale groups along K
    args: Tuple[ArgSpec, ...]
    w_storage: str                   # how W's codes (and quantized zeros) are stored: formats.code_storage
    a_storage: str                   # how A's codes are stored
    w_order: Optional[Tuple[int, ...]] = None   # code order inside W's 32-bit words (code_order.weight_order)

    @property
    def float_acts(self) -> bool:
        return self.a.kind == "float"

    def arg(self, name: str) -> Optional[ArgSpec]:
        for a in self.args:
            if a.name == name:
                return a
        return None

    def table_values(self, name: str) -> Tuple[float, ...]:
        """The values of lookup-table argument ``name`` (role "table"): ``w_table`` (the weight
        format's), ``s_table`` (the scale format's), ``a_table`` (the activation format's)."""
        fmt = {"w_table": self.w, "a_table": self.a, "s_table": FORMATS.get(self.scale_dtype)}.get(name)
        if fmt is None or fmt.table is None:
            raise KeyError(f"{name}: not a lookup table of this plan")
        return fmt.table

    @property
    def nvfp4_acts(self) -> bool:
        """NVFP4 activations (with NVFP4 weights): the hand-written kernels of
        bitblas/schedule/nvfp4.py, batched over ``config.batch`` (their arguments: ``nvfp4_args``)."""
        return self.a.name == "nvfp4"

    @property
    def input_names(self) -> Tuple[str, ...]:
        return tuple(a.name for a in self.args if a.role == "input")

    def key(self) -> str:
        c = self.config.to_dict()
        return f"{self.target_kind}|m={self.m}|" + "|".join(f"{k}={c[k]}" for k in sorted(c))


def _kernel_dtype(name: str) -> Tuple[str, str]:
    """(dtype the kernel sees, torch dtype the user passes) for a format or plain dtype name."""
    fmt = FORMATS.get(name)
    if fmt is None or fmt.kind == "float":
        return name, name
    if fmt.torch_dtype:                 # float8: the kernel reads the bit patterns as int8
        return "int8", fmt.torch_dtype
    return "int8", "int8"               # integer codes, packed below 8 bits


def nvfp4_args(c: MatmulConfig, rows, add) -> None:
    """The arguments of NVFP4 x NVFP4 kernels (A_dtype = W_dtype = "nvfp4"): codes two per byte
    along K, float8_e4m3 block scales per 16 K elements for both operands, optional float32
    global scales, no tables (the kernels decode e2m1 and e4m3 by arithmetic). With
    ``config.batch`` = L every tensor has the batch as its first dimension (the output too)."""
    lead = () if c.batch is None else (c.batch,)
    add("A", (*lead, rows, c.K // 2), "nvfp4", doc="activation codes (two e2m1 codes per byte along K)")
    add("W", (*lead, c.N, c.K // 2), "nvfp4", doc="weight codes [N, K/2] (two e2m1 codes per byte along K)")
    add("scale", (*lead, c.N, c.K // 16), "float8_e4m3", doc="weight block scales, one per 16 K elements")
    add("a_scale", (*lead, rows, c.K // 16), "float8_e4m3", doc="activation block scales, one per 16 K elements")
    add("global_scale", (1,), "float32", optional=True, doc="tensor-wide weight scale (default 1)")
    add("a_global_scale", (1,), "float32", optional=True, doc="tensor-wide activation scale (default 1)")
    add("output", (*lead, rows, c.N), c.out_dtype, role="output")


def make_plan(config: MatmulConfig, target_kind: str = "cpu", m: Optional[int] = None) -> Plan:
    """The plan of ``config`` for ``target_kind`` and ``m`` rows (None: symbolic in M). Plans are
    frozen and built once per (config, kind, m) (a config whose M is a list is not hashable:
    built each time)."""
    try:
        hash(config)
    except TypeError:
        return _build_plan(config, target_kind, m)
    return _cached_plan(config, target_kind, m)


def _build_plan(config: MatmulConfig, target_kind: str = "cpu", m: Optional[int] = None) -> Plan:
    if target_kind not in ("cpu", "cuda"):
        raise ValueError(f"target_kind={target_kind!r} is invalid; accepted: 'cpu', 'cuda'")
    c = config
    a, w = FORMATS[c.A_dtype], FORMATS[c.W_dtype]
    float_acts = a.kind == "float"
    groups = 1 if c.group_size == -1 else c.K // c.group_size
    if float_acts:
        accum = "float32"        # accum_dtype="float16" is computed in float32: at least as accurate
        scale_dtype = w.scale_format or c.A_dtype
        decode = "float32" if target_kind == "cpu" or c.A_dtype == "float32" else c.A_dtype
    else:
        scale_dtype = w.scale_format or "float32"
        grouped = c.with_scaling and groups > 1
        accum = "int32" if a.integer and not grouped else "float32"
        decode = "int32" if a.integer else "float32"
    scale_in_epilogue = (not float_acts) and c.with_scaling and groups == 1
    rows: Union[int, str] = m if m is not None else M_VAR

    args = []

    def add(name, shape, dtype, role="input", optional=False, doc=""):
        kd, ud = _kernel_dtype(dtype)
        args.append(ArgSpec(name, tuple(shape), kd, ud, role, optional, doc))

    if a.name == "nvfp4":
        nvfp4_args(c, rows, add)
        return Plan(c, target_kind, m, a, w, accum, decode, scale_dtype, False, groups, tuple(args), "plain", "plain")

    a_cols = c.K // a.codes_per_byte
    add("A", (rows, a_cols), c.A_dtype,
        doc="activations" + (" (two int4 codes per byte along K)" if a.packed else ""))
    if c.layout == "nn":
        add("W", (c.K, c.N), c.W_dtype, doc="weight [K, N]")
    else:
        add("W", (c.N, c.K // w.codes_per_byte), c.W_dtype,
            doc="weight [N, K]" + (f" ({w.codes_per_byte} codes per byte along K)" if w.packed else ""))
    if c.with_scaling:
        add("scale", (c.N, groups), scale_dtype, doc=f"weight scale, one per {c.group_size if groups > 1 else c.K} K elements")
    if c.with_zeros:
        if c.zeros_mode == "quantized":
            add("zeros", (groups, -(-c.N // w.codes_per_byte)), "int8",
                doc="zero-point codes [groups, N], packed along N like GPTQ's qzeros and BitBLAS")
        else:
            add("zeros", (c.N, groups), scale_dtype, doc="zero points")
    if c.with_bias:
        add("bias", (c.N,), c.out_dtype, doc="bias")
    if c.with_act_scaling:
        add("a_scale", (rows,), "float32", doc="per-token activation scale")
    if w.global_scale:
        add("global_scale", (1,), "float32", optional=True, doc="tensor-wide weight scale (default 1)")
    if w.kind == "table":
        add("w_table", (len(w.table),), "float32", role="table")
    if c.with_scaling and scale_dtype in FORMATS and FORMATS[scale_dtype].kind == "table":
        add("s_table", (len(FORMATS[scale_dtype].table),), "float32", role="table")
    if a.kind == "table":
        add("a_table", (len(a.table),), "float32", role="table")
    add("output", (rows, c.N), c.out_dtype, role="output")
    return Plan(c, target_kind, m, a, w, accum, decode, scale_dtype, scale_in_epilogue, groups, tuple(args),
                code_storage(w, "W", None if float_acts else a), code_storage(a, "A"), weight_order(c))


_cached_plan = functools.lru_cache(maxsize=4096)(_build_plan)
