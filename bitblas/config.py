"""MatmulConfig: what the user asked for, checked on construction, nothing derived.

Field names follow Microsoft BitBLAS (``in_dtype`` is accepted as an alias of ``A_dtype``).
A bad value raises ValueError naming the field, the value and what is accepted; a valid but
unsupported combination raises NotImplementedError. Derived choices live in :mod:`bitblas.plan`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass
from typing import Optional, Tuple, Union

from .formats import ACTIVATION_FORMATS, WEIGHT_FORMATS, get_format

__all__ = ["MatmulConfig", "OUT_DTYPES", "ACCUM_DTYPES", "ZEROS_MODES", "LAYOUTS"]

OUT_DTYPES = ("float16", "bfloat16", "float32", "int32", "int8")
ACCUM_DTYPES = ("float16", "float32", "int32")
ZEROS_MODES = ("original", "rescale", "quantized")
LAYOUTS = ("nt", "nn")
STORAGE_DTYPES = ("int8",)
# Microsoft BitBLAS's dtype spellings -> ours
DTYPE_ALIASES = {"e4m3_float8": "float8_e4m3", "e5m2_float8": "float8_e5m2", "float8_e4m3fn": "float8_e4m3"}
# BitBLAS's TransformKind values for propagate_a / propagate_b (bool True means LDMatrixTransform)
TRANSFORM_KINDS = (0, 1, 2, 3)

# Activation -> weight formats it pairs with (beyond the float activations, which take every weight).
_INT_WEIGHTS = ("int8", "int4", "int2", "int1", "uint8", "uint4", "uint2", "uint1")
_PAIRS = {
    "int8": _INT_WEIGHTS,
    "int4": ("int4", "int2", "int1", "uint4", "uint2", "uint1"),
    "uint4": ("int4", "int2", "int1", "uint4", "uint2", "uint1"),     # BitBLAS's uint4 x uint4 and below
    # W4A-fp8 / W2A-fp8: 4- and 2-bit integer codes are exact e4m3 values (fp8 tensor cores)
    "float8_e4m3": ("float8_e4m3", "float8_e5m2", "int4", "uint4", "int2", "uint2"),
    "float8_e5m2": ("float8_e4m3", "float8_e5m2"),
    # NVFP4 x NVFP4 (both operands e2m1 with float8_e4m3 scales per 16 K elements). float8 weights
    # are not paired: nothing computes an e2m1 x e4m3 product natively on sm_90, and no model ships them
    "nvfp4": ("nvfp4",),
}


def _bad(field, value, accepted):
    return ValueError(f"MatmulConfig: {field}={value!r} is invalid; accepted: {accepted}")


def _check_int(field, value, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(field, value, "a positive int" + (" or None" if allow_none else ""))


@dataclass(frozen=True)
class MatmulConfig:
    """out[m, n] = epilogue(sum_k A[m, k] * decode(W)[n, k]).

    M: int (static), a list of ints (dynamic, kernels tuned for those buckets) or None (dynamic).
    W is [N, K] for layout "nt" and [K, N] for "nn". group_size=-1: one scale per output channel.
    zeros_mode: "original" (q - z) * s; "rescale" q * s - z; "quantized" (q - z_q) * s with z_q
    stored as packed codes; with zeros but no scaling: q - z (s = 1). with_act_scaling: a per-token
    float32 activation scale [M] (integer and float8 activations), applied with the per-channel
    weight scale in the epilogue; with A_dtype="nvfp4" (required there) the activations'
    float8_e4m3 block scales [M, K/16]. propagate_a / propagate_b: Microsoft BitBLAS's layout
    flags, accepted and kept (results do not depend on them).

    batch: None (a plain matmul) or L, a batched matmul as torch.bmm reads it (Microsoft
    BitBLAS's ``batch``): A [L, M, K], W [L, N, K], their scales [L, ., K/16] and the output
    [L, M, N] all carry the batch as their first dimension, out[l] = A[l] @ decode(W[l]).T.
    Supported with A_dtype = W_dtype = "nvfp4".
    """

    M: Union[int, Tuple[int, ...], None] = None
    N: int = 1024
    K: int = 1024
    A_dtype: str = "float16"
    W_dtype: Optional[str] = None
    accum_dtype: Optional[str] = None
    out_dtype: str = "float16"
    layout: str = "nt"
    with_bias: bool = False
    group_size: int = -1
    with_scaling: bool = False
    with_zeros: bool = False
    zeros_mode: str = "original"
    fast_decoding: Optional[bool] = None
    storage_dtype: str = "int8"
    with_act_scaling: bool = False
    # Microsoft BitBLAS's weight / activation layout flags (its TransformKind: None, a bool or 0-3).
    # Accepted and reported; bitblas picks its own layouts, so results do not depend on them.
    propagate_a: Union[None, bool, int] = None
    propagate_b: Union[None, bool, int] = None
    batch: Optional[int] = None
    in_dtype: InitVar[Optional[str]] = None

    def __post_init__(self, in_dtype):
        # Normalise spellings only (aliases, BitBLAS's None defaults, list -> tuple); derived
        # choices belong to the plan.
        if in_dtype is not None:
            if self.A_dtype != "float16" and self.A_dtype != in_dtype:
                raise ValueError(f"MatmulConfig: in_dtype={in_dtype!r} and A_dtype={self.A_dtype!r} disagree; give one")
            object.__setattr__(self, "A_dtype", in_dtype)
        for name in ("A_dtype", "W_dtype", "out_dtype", "accum_dtype", "storage_dtype"):
            v = getattr(self, name)
            if isinstance(v, str) and v in DTYPE_ALIASES:
                object.__setattr__(self, name, DTYPE_ALIASES[v])
        if self.W_dtype is None:
            object.__setattr__(self, "W_dtype", self.A_dtype)
        if isinstance(self.M, (list, tuple)):
            object.__setattr__(self, "M", tuple(self.M))
        if self.group_size is None:
            object.__setattr__(self, "group_size", -1)
        for name in ("with_bias", "with_scaling", "with_zeros"):      # BitBLAS: None means False
            if getattr(self, name) is None:
                object.__setattr__(self, name, False)
        if self.zeros_mode is None:                                   # BitBLAS: None means "original"
            object.__setattr__(self, "zeros_mode", "original")
        if self.storage_dtype == self.W_dtype == self.A_dtype:        # BitBLAS reports W_dtype as storage
            object.__setattr__(self, "storage_dtype", "int8")
        for name in ("propagate_a", "propagate_b"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool) and isinstance(v, int):
                object.__setattr__(self, name, int(v))                # an IntEnum (TransformKind) -> int
        self._check_values()
        self._check_combination()

    # -- checks -------------------------------------------------------------------------
    def _check_values(self):
        if isinstance(self.M, tuple):
            if not self.M:
                raise _bad("M", list(self.M), "an int, a non-empty list of positive ints, or None")
            for m in self.M:
                if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                    raise _bad("M", list(self.M), "a list of positive ints")
        else:
            _check_int("M", self.M, allow_none=True)
        _check_int("N", self.N)
        _check_int("K", self.K)
        _check_int("batch", self.batch, allow_none=True)
        if self.A_dtype not in ACTIVATION_FORMATS:
            raise _bad("A_dtype", self.A_dtype, ", ".join(ACTIVATION_FORMATS))
        if self.W_dtype not in WEIGHT_FORMATS:
            raise _bad("W_dtype", self.W_dtype, ", ".join(WEIGHT_FORMATS))
        if self.accum_dtype is not None and self.accum_dtype not in ACCUM_DTYPES:
            raise _bad("accum_dtype", self.accum_dtype, ", ".join(ACCUM_DTYPES) + " or None (derived)")
        if self.out_dtype not in OUT_DTYPES:
            raise _bad("out_dtype", self.out_dtype, ", ".join(OUT_DTYPES))
        if self.layout not in LAYOUTS:
            raise _bad("layout", self.layout, '"nt" (W is [N, K]) or "nn" (W is [K, N])')
        if self.zeros_mode not in ZEROS_MODES:
            raise _bad("zeros_mode", self.zeros_mode, ", ".join(ZEROS_MODES))
        if self.storage_dtype not in STORAGE_DTYPES:
            raise _bad("storage_dtype", self.storage_dtype, ", ".join(STORAGE_DTYPES))
        for name in ("with_bias", "with_scaling", "with_zeros", "with_act_scaling"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, getattr(self, name), "True or False")
        if self.fast_decoding is not None and not isinstance(self.fast_decoding, bool):
            raise _bad("fast_decoding", self.fast_decoding, "True, False or None")
        for name in ("propagate_a", "propagate_b"):
            v = getattr(self, name)
            if not (v is None or isinstance(v, bool) or (isinstance(v, int) and v in TRANSFORM_KINDS)):
                raise _bad(name, v, "None, True, False or a TransformKind 0-3")
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or (g != -1 and g < 1):
            raise _bad("group_size", g, "-1 (per output channel) or a positive int dividing K")
        if g != -1 and self.K % g:
            raise _bad("group_size", g, f"-1 or a divisor of K={self.K}")

    def _check_combination(self):
        a, w = get_format(self.A_dtype, "A", "A_dtype"), get_format(self.W_dtype, "W", "W_dtype")
        unsupported = NotImplementedError
        if a.kind == "float":
            if w.kind == "float" and w.name != a.name and a.name != "float32":
                raise unsupported(f"W_dtype={w.name!r} with A_dtype={a.name!r}: unquantized weights must match the "
                                  "activation dtype")
        elif w.name not in _PAIRS[a.name]:
            raise unsupported(f"A_dtype={a.name!r} pairs with W_dtype in {_PAIRS[a.name]}, not {w.name!r}")
        float_acts = a.kind == "float"
        if self.accum_dtype is not None:
            ok = ("float16", "float32") if float_acts else (("int32",) if a.integer else ("float32",))
            if self.accum_dtype not in ok:
                raise _bad("accum_dtype", self.accum_dtype, f"{', '.join(ok)} or None for A_dtype={a.name!r}")
        if self.out_dtype == "int8" and not a.integer:
            raise _bad("out_dtype", "int8", f"float16, bfloat16 or float32 for A_dtype={a.name!r} (int8 output "
                                            "needs integer activations)")
        if self.out_dtype in ("int32", "int8") and (not a.integer or self.with_scaling or self.with_act_scaling):
            raise unsupported(f"out_dtype={self.out_dtype!r} needs integer activations and weights without scales "
                              "(with_scaling=False, with_act_scaling=False)")
        if self.with_scaling and w.scale == "none":
            raise unsupported(f"with_scaling=True: W_dtype={w.name!r} is not quantized and takes no scale")
        if w.scale == "required" and not self.with_scaling:
            raise _bad("with_scaling", False, f"True (W_dtype={w.name!r} always carries scales)")
        if w.group_size is not None and self.group_size != w.group_size:
            raise _bad("group_size", self.group_size, f"{w.group_size} (fixed by W_dtype={w.name!r})")
        if self.with_zeros:
            if not w.zeros:
                raise unsupported(f"with_zeros=True: W_dtype={w.name!r} takes no zero points (integer formats do)")
            if not float_acts:
                raise unsupported(f"with_zeros=True with A_dtype={a.name!r}: zero points need float activations")
            if self.zeros_mode == "quantized" and w.kind != "uint":
                raise unsupported(f"zeros_mode='quantized' needs an unsigned weight format, not {w.name!r}")
        if self.with_act_scaling and float_acts:
            raise unsupported(f"with_act_scaling=True needs integer or float8 activations, not A_dtype={a.name!r}")
        if w.packed and self.K % w.codes_per_byte:
            raise _bad("K", self.K, f"a multiple of {w.codes_per_byte} for W_dtype={w.name!r} "
                                    f"({w.codes_per_byte} codes per byte)")
        if a.packed and self.K % a.codes_per_byte:
            raise _bad("K", self.K, f"a multiple of {a.codes_per_byte} for A_dtype={a.name!r}")
        if self.layout == "nn" and w.kind != "float":
            raise unsupported(f"layout='nn' is supported for unquantized weights (float16/bfloat16), not "
                              f"W_dtype={w.name!r}; use layout='nt'")
        if self.layout == "nn" and (self.with_scaling or self.with_zeros):
            raise unsupported("layout='nn' takes no scales or zeros; use layout='nt'")
        if a.name == "nvfp4":
            self._check_nvfp4_acts()
        elif self.batch is not None:
            raise unsupported(f"batch={self.batch}: batched configs take A_dtype='nvfp4' and W_dtype='nvfp4', "
                              f"not {a.name!r} x {w.name!r}")

    def _check_nvfp4_acts(self):
        """NVFP4 activations (with NVFP4 weights, checked by the pairing): their block scales are
        required, the kernels read whole vectors of 32 codes (two scale blocks)."""
        if not self.with_act_scaling:
            raise _bad("with_act_scaling", False, "True (A_dtype='nvfp4' always carries float8_e4m3 block scales, "
                                                  "a_scale [M, K/16])")
        if self.K % 32:
            raise _bad("K", self.K, "a multiple of 32 for A_dtype='nvfp4' (the kernels read 32 codes, two scale "
                                    "blocks, per vector)")
        if self.with_bias:
            raise NotImplementedError("with_bias=True with A_dtype='nvfp4': not supported (add the bias to the output)")
        if self.out_dtype not in ("float16", "bfloat16", "float32"):
            raise _bad("out_dtype", self.out_dtype, "float16, bfloat16 or float32 for A_dtype='nvfp4'")

    # -- helpers ------------------------------------------------------------------------
    @property
    def dynamic(self) -> bool:
        """True when M is a list of buckets or None."""
        return not isinstance(self.M, int)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if isinstance(d["M"], tuple):
            d["M"] = list(d["M"])
        if d["batch"] is None:      # unbatched configs keep the keys (plans, caches) they had before ``batch``
            del d["batch"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MatmulConfig":
        return cls(**d)

    def replace(self, **changes) -> "MatmulConfig":
        return dataclasses.replace(self, **changes)
