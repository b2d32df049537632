"""The hints of the GEMV kernels: one frozen hint per kernel body, each with only the fields that
body reads (a leaf: no other module of the package is imported here).

=====================  ==========  ==============================================================
hint                   body        fields
=====================  ==========  ==============================================================
:class:`GEMVRowsHint`   rows.py     rows_per_warp, warps, unroll, vec_bytes, stages, min_blocks,
                                   pdl, act_smem
:class:`GEMVKSplitHint` ksplit.py   rows_per_warp, k_warps, grid, vec_bytes, min_blocks, pdl
:class:`GEMVMmaHint`    mma.py,     rows_per_warp, k_warps, unroll, stages, vec_bytes, min_blocks,
                       mma_int8.py pdl, chunk_loop
:class:`GEMVWgmmaHint`  wgmma.py    rows_per_warp, k_warps, stages, vec_bytes, min_blocks, pdl
=====================  ==========  ==============================================================

A field means the same in every hint that has it (``rows_per_warp``: output channels per warp, for
the tensor-core kernels 16 per mma tile; ``k_warps``: warps, for the wgmma GEMV warpgroups, that
split K; ``stages``: register slots of weights; ``min_blocks``: ``__launch_bounds__`` minimum
blocks per SM, 0 none; ``pdl``: programmatic dependent launch, sm_90+).

:class:`GEMVHint` is their common base (``isinstance(h, GEMVHint)``: a GEMV kernel's hint; the
default kernel's hint: template.py's ``default_gemv_hint(plan, target)``). Called with the
fields of the one hint the GEMV had before (``GEMVHint(rows_per_warp=32, k_warps=8, mma=True)``,
positional in its field order too, as ``benchmark/matmul.py --gemv-hints`` passes them), it
returns the hint of the kernel those flags selected (:func:`from_legacy`): ``wgmma`` (with ``mma``)
the wgmma GEMV, ``mma`` the mma GEMV, ``k_warps > 0`` the k-split kernel, else the rows kernel.
Fields that kernel never read are dropped (they never changed its code); a flag of another kernel
(``act_smem`` with ``mma`` or ``k_warps``, ``chunk_loop`` without ``mma``, ``wgmma`` without
``mma``) is a ValueError. :func:`to_legacy` maps back (the one-hint fields of a hint).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["GEMVHint", "GEMVRowsHint", "GEMVKSplitHint", "GEMVMmaHint", "GEMVWgmmaHint", "GEMV_HINTS",
           "LEGACY_FIELDS", "from_legacy", "to_legacy"]


class _LegacyCall(type):
    """``GEMVHint(...)`` (the base itself) maps the one-hint spelling to a kernel's hint; the
    kernels' hint classes construct as dataclasses."""

    def __call__(cls, *args, **kwargs):
        if cls is GEMVHint:
            return from_legacy(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class GEMVHint(metaclass=_LegacyCall):
    """Base of the GEMV kernels' hints (see the module docstring); ``GEMVHint(**old_fields)``: the
    hint those fields select (:func:`from_legacy`)."""

    tensor_cores: ClassVar[bool] = False   # the kernel takes its row count at run time (a class of rows)
    block_scales: ClassVar[bool] = False   # float8 block scales (nvfp4) applied per decoded pair: a vector may
                                           # hold two 16-code blocks (emit.vec_blocks)
    block_dots: ClassVar[bool] = False     # the same, each block's dot product scaled on its own in float32
                                           # (emit.block_dot_helpers)
    f8_halves: ClassVar[bool] = False      # float8_e4m3 activations converted to float16 pairs as they are paired
                                           # (emit.half_acts; else only the m16n8k32 .e4m3 GEMV takes them)
    __slots__ = ()


@dataclass(frozen=True)
class GEMVRowsHint(GEMVHint):
    """The rows kernel (rows.py): a warp owns ``rows_per_warp`` output channels; its lanes walk K
    in weight vectors of ``vec_bytes`` bytes (0: the largest that fits), ``unroll`` per channel and
    step, through ``stages`` register slots (``stages - 1`` steps in flight while one decodes);
    ``warps`` per block. ``act_smem`` (one row): the block stages the activation row in shared
    memory once, paired for the decoder, in a conflict-free lane order. ``l2_prefetch``: the
    first steps of each warp's weight rows (and their scales) prefetched into L2 at entry, before
    the PDL wait (a prefetch binds no value: the loads after the wait see an earlier kernel's
    writes)."""
    rows_per_warp: int = 2
    warps: int = 4
    unroll: int = 4
    block_dots: ClassVar[bool] = True
    f8_halves: ClassVar[bool] = True
    vec_bytes: int = 0
    stages: int = 2
    min_blocks: int = 0
    pdl: bool = False
    act_smem: bool = False
    l2_prefetch: int = 0


@dataclass(frozen=True)
class GEMVKSplitHint(GEMVHint):
    """The k-split kernel (ksplit.py, float activations): ``k_warps`` (>= 1) warps of a block split
    K, each lane keeps its slice of the activations in registers; blocks walk batches of
    ``rows_per_warp`` channels (``grid`` blocks, 0: one per batch) and meet in shared memory."""
    rows_per_warp: int = 2
    k_warps: int = 4
    grid: int = 0
    vec_bytes: int = 0
    min_blocks: int = 0
    pdl: bool = False


@dataclass(frozen=True)
class GEMVMmaHint(GEMVHint):
    """The mma GEMV (mma.py for float activations, m16n8k16; mma_int8.py for int8 ones, m16n8k32):
    blocks of ``rows_per_warp`` channels (tiles of 16), ``k_warps`` warps splitting K (0 as 1),
    ``unroll`` vectors per lane and step, the next step in flight with ``stages >= 2``.
    ``chunk_loop`` (17..64 rows): a block serves every 16-row chunk of its channel tile, the
    weights decoded once (else one block per chunk)."""
    tensor_cores: ClassVar[bool] = True
    rows_per_warp: int = 32
    k_warps: int = 4
    unroll: int = 2
    stages: int = 2
    vec_bytes: int = 0
    min_blocks: int = 0
    pdl: bool = False
    chunk_loop: bool = False


@dataclass(frozen=True)
class GEMVWgmmaHint(GEMVHint):
    """The wgmma GEMV (wgmma.py, sm_90a): ``rows_per_warp / 16`` tiles of 64 channels per
    warpgroup (16: 64 channels, 32: 128), ``k_warps`` warpgroups splitting K (1, 2 or 4; 0 as 1),
    ``stages`` register slots of decoded weights; ``vec_bytes`` must give 16-byte vectors."""
    tensor_cores: ClassVar[bool] = True
    block_scales: ClassVar[bool] = True
    rows_per_warp: int = 16
    k_warps: int = 1
    stages: int = 4
    vec_bytes: int = 0
    min_blocks: int = 0
    pdl: bool = False


GEMV_HINTS = (GEMVRowsHint, GEMVKSplitHint, GEMVMmaHint, GEMVWgmmaHint)

# The one hint's fields, in its order, with their defaults (positional arguments follow this order).
LEGACY_FIELDS = (("rows_per_warp", 2), ("warps", 4), ("unroll", 4), ("vec_bytes", 0), ("k_warps", 0),
                 ("grid", 0), ("stages", 2), ("mma", False), ("min_blocks", 0), ("pdl", False),
                 ("chunk_loop", False), ("wgmma", False), ("act_smem", False), ("l2_prefetch", 0))
_FLAGS = ("mma", "wgmma", "act_smem", "chunk_loop")


def from_legacy(*args, **kwargs) -> GEMVHint:
    """The hint of the kernel that ``GEMVHint(*args, **kwargs)`` of the one-hint GEMV selected
    (see the module docstring)."""
    names = [n for n, _ in LEGACY_FIELDS]
    if len(args) > len(names):
        raise TypeError(f"GEMVHint takes at most {len(names)} positional fields ({', '.join(names)}); "
                        f"got {len(args)}")
    f = dict(LEGACY_FIELDS)
    for name, value in zip(names, args):
        f[name] = value
    for name, value in kwargs.items():
        if name not in f:
            raise TypeError(f"GEMVHint got an unknown field {name!r}; its fields: {', '.join(names)}")
        if name in names[:len(args)]:
            raise TypeError(f"GEMVHint got field {name!r} both by position and by name")
        f[name] = value
    if f["wgmma"]:
        cls, kernel = GEMVWgmmaHint, "the wgmma GEMV (wgmma=True)"
        if not f["mma"]:
            raise ValueError("GEMVHint(wgmma=True): wgmma=True is a variant of the tensor-core GEMV: it needs mma=True "
                             "(or use GEMVWgmmaHint)")
    elif f["mma"]:
        cls, kernel = GEMVMmaHint, "the mma GEMV (mma=True)"
    elif f["k_warps"]:
        cls, kernel = GEMVKSplitHint, f"the k-split kernel (k_warps={f['k_warps']})"
    else:
        cls, kernel = GEMVRowsHint, "the rows kernel (mma=False, k_warps=0)"
    own = {fl.name for fl in dataclasses.fields(cls)}
    for flag in _FLAGS:
        if flag not in own and flag not in ("mma", "wgmma") and f[flag]:
            raise ValueError(f"GEMVHint({flag}=True) selects {kernel}, which has no {flag!r} option "
                             f"({flag} is an option of {'the rows kernel' if flag == 'act_smem' else 'the mma GEMV'})")
    return cls(**{k: v for k, v in f.items() if k in own})


def to_legacy(hint: GEMVHint) -> dict:
    """The one-hint GEMV's fields of ``hint`` (the inverse of :func:`from_legacy` for the hints it
    makes): the fields ``hint`` has, its kernel's flags, the one hint's defaults for the rest (a
    wgmma GEMV hint ``unroll=1``, the value every one of them had)."""
    if not isinstance(hint, GEMV_HINTS):
        raise TypeError(f"to_legacy takes a GEMV kernel's hint ({', '.join(c.__name__ for c in GEMV_HINTS)}); "
                        f"got {type(hint).__name__}")
    f = dict(LEGACY_FIELDS)
    f.update(dataclasses.asdict(hint))
    if isinstance(hint, GEMVWgmmaHint):
        f.update(mma=True, wgmma=True, unroll=1)
    elif isinstance(hint, GEMVMmaHint):
        f.update(mma=True)
    return f
