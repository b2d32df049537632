"""The format registry: one frozen record per activation or weight format.

Everything that needs to know what a format is (config checks, the plan, the TensorIR emitter,
the packers, the quantizers and the torch reference) looks the record up here; nobody else
branches on format names.

Decoding rules (the value a code stands for, before scales and zeros):

* ``kind == "float"``: a native IEEE tensor (float16, bfloat16, float32), taken as is.
* ``kind == "int"``:   a B-bit signed integer q in [-2**(B-1), 2**(B-1) - 1].
* ``kind == "uint"``:  B-bit unsigned, value in [0, 2**B - 1].
* ``kind == "table"``: the code indexes ``table`` (nf4, fp4_e2m1, nvfp4 codes, float8 bit patterns).

Storage (:func:`code_storage`, Microsoft BitBLAS's byte layouts): the B-bit field ``u`` stored for
a code is

* ``"offset"`` (offset-binary, ``u = q + 2**(B-1)``, decoded ``u - 2**(B-1)``): signed weights of
  1, 2 and 4 bits, as BitBLAS's ``transform_weight`` stores them (int1: u 0 / 1 = -1 / 0);
* ``"twos"`` (two's complement): int8 weights, int4 activations, and every int weight with int4
  activations (BitBLAS multiplies int4 x int4 natively, mma ``.s4``, stores both as they are, and
  widens int2 / int1 fields to int4 without an offset);
* ``"plain"`` (``u`` = the code): unsigned and table formats.

Sub-byte codes are packed along K into int8 storage, little-endian inside each byte: code ``k``
sits at bit offset ``(k % codes_per_byte) * bits`` of byte ``k // codes_per_byte``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["Format", "FORMATS", "WEIGHT_FORMATS", "ACTIVATION_FORMATS", "get_format", "NF4_TABLE", "STORAGES",
           "code_storage"]


def _minifloat_table(exp_bits: int, man_bits: int, bias: int, ieee_special: bool, fn_nan: bool) -> Tuple[float, ...]:
    """Values of every bit pattern of a small float (sign | exponent | mantissa), lowest code first.

    ieee_special: the top exponent encodes inf (mantissa 0) and NaN (else), as in float8_e5m2.
    fn_nan: only the all-ones pattern (per sign) is NaN, as in float8_e4m3fn.
    """
    nbits = 1 + exp_bits + man_bits
    emax = (1 << exp_bits) - 1
    out = []
    for code in range(1 << nbits):
        s = (code >> (nbits - 1)) & 1
        e = (code >> man_bits) & emax
        m = code & ((1 << man_bits) - 1)
        if ieee_special and e == emax:
            v = math.inf if m == 0 else math.nan
        elif fn_nan and e == emax and m == (1 << man_bits) - 1:
            v = math.nan
        elif e == 0:
            v = m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            v = (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
        out.append(-v if s else v)
    return tuple(out)


# QLoRA's NormalFloat4 levels (bitsandbytes' table), code 0 .. 15.
NF4_TABLE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
E2M1_TABLE = _minifloat_table(2, 1, 1, ieee_special=False, fn_nan=False)
E4M3_TABLE = _minifloat_table(4, 3, 7, ieee_special=False, fn_nan=True)
E5M2_TABLE = _minifloat_table(5, 2, 15, ieee_special=True, fn_nan=False)


@dataclass(frozen=True)
class Format:
    """One data format. See the module docstring for what ``kind`` means."""

    name: str
    bits: int
    kind: str                           # "float" | "int" | "uint" | "table"
    roles: Tuple[str, ...]              # "A" (activation), "W" (weight)
    description: str
    table: Optional[Tuple[float, ...]] = None
    torch_dtype: Optional[str] = None   # torch dtype users hand over when it is not packed int8 storage
    scale: str = "optional"             # "none" | "optional" | "required" (as a weight)
    zeros: bool = False                 # takes zero points (as a weight)
    group_size: Optional[int] = None    # group size the format fixes (nvfp4: 16)
    scale_format: Optional[str] = None  # scale dtype the format fixes (nvfp4: float8_e4m3)
    global_scale: bool = False          # takes an optional float32 tensor-wide scale

    @property
    def packed(self) -> bool:
        """Sub-byte codes, packed along K into int8 storage."""
        return self.bits < 8

    @property
    def codes_per_byte(self) -> int:
        return 8 // self.bits if self.bits < 8 else 1

    @property
    def integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def code_range(self) -> Tuple[int, int]:
        """Inclusive range of the integer codes (table formats: table indices)."""
        if self.kind == "int":
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        if self.kind in ("uint", "table"):
            return 0, (1 << self.bits) - 1
        raise TypeError(f"{self.name} has no integer codes")

    @property
    def storage(self) -> str:
        """How a weight code of this format is stored with float or int8 activations (see
        :func:`code_storage`): "offset", "twos" or "plain"."""
        return code_storage(self)

    @property
    def max_abs(self) -> float:
        """Largest finite magnitude a code decodes to (used to pick scales)."""
        if self.kind == "table":
            return max(abs(v) for v in self.table if math.isfinite(v))
        lo, hi = self.code_range
        return float(max(-lo, hi))


def _entries():
    A, W, AW = ("A",), ("W",), ("A", "W")
    yield Format("float16", 16, "float", AW, "IEEE half, taken as is", torch_dtype="float16", scale="none")
    yield Format("bfloat16", 16, "float", AW, "bfloat16, taken as is", torch_dtype="bfloat16", scale="none")
    yield Format("float32", 32, "float", A, "IEEE single, taken as is", torch_dtype="float32", scale="none")
    for b in (8, 4, 2, 1):
        lo, hi = -(1 << (b - 1)), (1 << (b - 1)) - 1
        roles = AW if b in (8, 4) else W
        stored = "two's complement" if b == 8 else f"weights stored offset-binary q + {1 << (b - 1)}"
        yield Format(f"int{b}", b, "int", roles, f"{b}-bit signed q in [{lo}, {hi}] ({stored}); q * s, (q - z) * s or "
                     "q * s - z", zeros=True)
    for b in (8, 4, 2, 1):
        yield Format(f"uint{b}", b, "uint", AW if b == 4 else W, f"{b}-bit unsigned q in [0, {(1 << b) - 1}]; q, q * s, (q - z) * s or q * s - z",
                     zeros=True)
    yield Format("nf4", 4, "table", W, "4-bit index into the NormalFloat4 table (QLoRA), times s", table=NF4_TABLE)
    yield Format("fp4_e2m1", 4, "table", W, "4-bit float e2m1 (sign, 2 exponent bits, 1 mantissa bit; 0..6), times s",
                 table=E2M1_TABLE)
    yield Format("float8_e4m3", 8, "table", AW, "float8 e4m3fn bit pattern (torch.float8_e4m3fn), times s",
                 table=E4M3_TABLE, torch_dtype="float8_e4m3fn")
    yield Format("float8_e5m2", 8, "table", AW, "float8 e5m2 bit pattern (torch.float8_e5m2), times s",
                 table=E5M2_TABLE, torch_dtype="float8_e5m2")
    yield Format("nvfp4", 4, "table", W,
                 "e2m1 code times a float8_e4m3 scale per 16 consecutive K elements, times an optional float32 global scale",
                 table=E2M1_TABLE, scale="required", group_size=16, scale_format="float8_e4m3", global_scale=True)


STORAGES = ("offset", "twos", "plain")


def code_storage(fmt: Format, role: str = "W", act: Optional[Format] = None) -> str:
    """How the codes of ``fmt`` are stored in the packed bytes (module docstring): "offset"
    (offset-binary), "twos" (two's complement) or "plain". ``role``: "W" (weights; ``act``, the
    activation format they meet, None for float activations) or "A" (activations)."""
    if fmt.kind != "int":
        return "plain"
    if role == "A" or fmt.bits == 8:
        return "twos"
    if act is not None and act.kind == "int" and act.bits == 4:
        # int4 activations: every int weight is two's complement, as Microsoft BitBLAS's int4 test
        # hands over raw int4 / int2 fields (its int2 -> int4 decode keeps the field as is)
        return "twos"
    return "offset"


FORMATS: Dict[str, Format] = {f.name: f for f in _entries()}
WEIGHT_FORMATS = tuple(n for n, f in FORMATS.items() if "W" in f.roles)
ACTIVATION_FORMATS = tuple(n for n, f in FORMATS.items() if "A" in f.roles)


def get_format(name: str, role: str = "W", arg: str = "W_dtype") -> Format:
    """The record of ``name`` for ``role`` ("A" or "W"); ValueError naming ``arg`` otherwise."""
    accepted = WEIGHT_FORMATS if role == "W" else ACTIVATION_FORMATS
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None or role not in fmt.roles:
        raise ValueError(f"{arg}={name!r} is not supported; accepted: {', '.join(accepted)}")
    return fmt
