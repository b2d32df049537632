"""The one answer to "which kernel serves ``rows`` rows of this config on this arch".

:func:`select` returns a frozen :class:`~bitblas.kernels.base.KernelChoice` (template, hint, the
rows its plan is built for), which the operator uses as its kernel-cache key. The rules, in order:

1. a tuned bucket's kernel where it serves the rows (a GEMV hint: the rows kernel of exactly those
   rows, or the tensor-core GEMV of their class; a static-rows kernel only its own rows);
2. the untuned kernel: the GEMV for 1..64 static rows where it takes the plan and wins
   (:func:`kernel_rows`); else, for a kernel symbolic in M, the wgmma template's tile class of the
   rows; quantized weights from ``DEQUANT_GEMM_MIN_ROWS`` rows on sm_90: the fused wgmma GEMM
   where it serves those rows (``fused-wgmma``), else "dequant-gemm" (decode, then the dense wgmma
   GEMM, :mod:`bitblas.dequant_gemm`); else the registry's default.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

from ..config import MatmulConfig
from ..plan import Plan, make_plan
from . import by_name, default_hint, template_of
from ._gemv import serves_untuned as _gemv_serves_untuned
from .base import KernelChoice

__all__ = ["select", "kernel_rows", "row_class", "gemv_serves", "composite_serves", "DEQUANT_GEMM",
           "DEQUANT_GEMM_MIN_ROWS", "dense_config", "dequant_gemm_plans", "dequant_gemm_reason",
           "choice_sources"]

DEQUANT_GEMM = "dequant-gemm"
_WGMMA = by_name("wgmma")
_FUSED = by_name("fused-wgmma")


# -- the decode-then-GEMM path (dequant_gemm.py builds it): which plans and rows it serves ------
DEQUANT_GEMM_MIN_ROWS = 17         # quantized weights from this many rows on sm_90: decode, then wgmma


def _past_gemv_rows(config, rows: int) -> bool:
    """Rows the GEMV leaves to the paths past it (from ``DEQUANT_GEMM_MIN_ROWS``)."""
    return rows >= DEQUANT_GEMM_MIN_ROWS


def dense_config(config: MatmulConfig) -> MatmulConfig:
    """The config of the GEMM half: the same shape, activations, bias and output, float weights;
    for int8 activations int8 weights (the decoded integer values) with the original per-channel
    or group scales and activation scales; for float8_e4m3 activations e4m3 weights (the integer
    values' bit patterns) with the same scales."""
    if config.A_dtype in ("int8", "float8_e4m3"):
        return MatmulConfig(M=config.M, N=config.N, K=config.K, A_dtype=config.A_dtype, W_dtype=config.A_dtype,
                            out_dtype=config.out_dtype, accum_dtype=config.accum_dtype, layout=config.layout,
                            with_bias=config.with_bias, with_scaling=config.with_scaling,
                            group_size=config.group_size, with_act_scaling=config.with_act_scaling)
    return MatmulConfig(M=config.M, N=config.N, K=config.K, A_dtype=config.A_dtype, W_dtype=config.A_dtype,
                        out_dtype=config.out_dtype, layout=config.layout, with_bias=config.with_bias)


def dequant_gemm_plans(config: MatmulConfig, rows: Optional[int]) -> Tuple[Plan, Plan]:
    """The two plans of the decode-then-GEMM path for ``rows`` rows of ``config`` (None: symbolic
    M): the dequantize kernel's (one for every M: it depends on the weights only) and the dense
    GEMM's (:func:`dense_config` at ``rows``)."""
    return make_plan(config, "cuda", None), make_plan(dense_config(config), "cuda", rows)


def choice_sources(config: MatmulConfig, choice: KernelChoice, target=None) -> list:
    """CUDA C sources of the kernels that ``choice`` runs for ``config``, in call order (works
    without a GPU): for decode-then-GEMM the dequantize kernel and the dense GEMM with the choice's
    hint (:func:`dequant_gemm_plans`, as ``DequantGemm`` builds them); else the one kernel of
    ``config`` at the choice's rows. ``Matmul.get_source`` prints them, the codegen fuzz compiles
    them."""
    from ..build import cuda_source
    from ..schedule.cuda_dequant import dequant_source
    if choice.template == DEQUANT_GEMM:
        deq, dense = dequant_gemm_plans(config, choice.rows)
        return [dequant_source(deq, target), cuda_source(dense, target, choice.hint)]
    return [cuda_source(make_plan(config, "cuda", choice.rows), target, choice.hint)]


def dequant_gemm_reason(plan: Plan, target) -> Optional[str]:
    """Why the decode-then-GEMM path does not take ``plan`` on ``target`` (None: it does)."""
    from ..schedule.cuda_dequant import dequant_unsupported
    c = plan.config
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if plan.w.kind == "float" or (c.A_dtype == "int8" and c.W_dtype == "int8"):
        return f"W_dtype={c.W_dtype}: nothing to decode"
    why = dequant_unsupported(plan)
    if why:
        return why
    dense = dequant_gemm_plans(c, plan.m)[1]
    if template_of(default_hint(dense, target)) is not _WGMMA:
        return "the dense GEMM of this target is not the wgmma template (sm_90 with its shared memory)"
    return None


def _static_m(config, rows):
    M = config.M
    return M if isinstance(M, int) and rows == M else None


def gemv_serves(config, kind: str, rows: int, arch=None) -> bool:
    """Whether the *untuned* kernel for ``rows`` is a GEMV kernel (CUDA, 1..64 rows where the
    template takes the plan and wins)."""
    return kind == "cuda" and _gemv_serves_untuned(config, rows, arch)


def kernel_rows(config, kind: str, rows: Optional[int], arch=None) -> Optional[int]:
    """Rows the *untuned* kernel for ``rows`` is built for (None: symbolic in M): where a GEMV
    kernel serves them, ``rows`` itself for the rows kernel and the top of their class for a
    tensor-core one; else the config's int M when ``rows`` equals it."""
    return _untuned_rows(config, kind, rows, arch)[0]


def _untuned_rows(config, kind, rows, arch):
    """(rows of the untuned kernel, its hint when the GEMV serves them, else None)."""
    if kind == "cuda" and rows is not None and gemv_serves(config, kind, rows, arch):
        # the default tiles are the same for every row count of a class (testing/test_dispatch.py),
        # so the class top's untuned kernel is the one ``rows`` would get
        hint = default_hint(make_plan(config, kind, rows), arch)
        top = template_of(hint).kernel_rows(config, rows, hint)
        return top, (hint if top == rows else default_hint(make_plan(config, kind, top), arch))
    return _static_m(config, rows), None


def row_class(config, kind: str, rows: int, hint) -> int:
    """Rows of the kernel with ``hint`` that serves ``rows`` (the tensor-core GEMVs take their row
    count at run time: the kernel built for the top of the class serves all of it)."""
    t = template_of(hint)
    return t.kernel_rows(config, rows, hint) if hasattr(t, "kernel_rows") else rows


def _dequant_gemm_reason(config, arch) -> Optional[str]:
    try:
        return _dequant_reason_cached(config, arch)
    except TypeError:               # an unhashable config (M as a list)
        return _dequant_reason(config, arch)


def _dequant_reason(config, arch) -> Optional[str]:
    return dequant_gemm_reason(make_plan(config, "cuda", None), arch)


_dequant_reason_cached = functools.lru_cache(maxsize=1024)(_dequant_reason)


def _dequant_gemm(config, rows: int, arch):
    """The dense GEMM's hint of the decode-then-GEMM path for ``rows``, or None where it does not apply."""
    if not _past_gemv_rows(config, rows) or not arch.wgmma or _dequant_gemm_reason(config, arch) is not None:
        return None
    return _WGMMA.default(make_plan(dense_config(config), "cuda", rows), arch)


def _past_the_gemv(config, rows: int, arch, m: Optional[int]) -> Optional[KernelChoice]:
    """Quantized weights past the GEMV on sm_90, where decode-then-GEMM applies: the fused wgmma
    GEMM where it serves the rows by default, else decode-then-GEMM; None where neither applies."""
    dq = _dequant_gemm(config, rows, arch)
    if dq is None:
        return None
    fused = _FUSED.for_rows(make_plan(config, "cuda", None), rows, arch)
    return KernelChoice(_FUSED.name, fused, m) if fused is not None else KernelChoice(DEQUANT_GEMM, dq, m)


def select(config, kind: str, rows: int, arch, tuned=None, composite: bool = True) -> KernelChoice:
    """The kernel that serves ``rows`` rows of ``config`` (a kernel config, ``ops.compat.kernel_config``)
    on ``arch`` (an :class:`bitblas.arch.Arch`; for ``kind="cpu"`` the host's).

    ``tuned``: None, or (``BucketTable``, {bucket: (plan rows, hint)}) of a tuned operator.
    ``composite``: whether the decode-then-GEMM path may serve (the tuner's own default: not)."""
    from ..arch import as_arch, cpu_arch
    arch = cpu_arch() if kind == "cpu" else as_arch(arch)
    default_m, gemv_hint = _untuned_rows(config, kind, rows, arch)
    if tuned is not None:
        table, by_bucket = tuned
        bucket = table.bucket_of(rows)
        entry = by_bucket.get(bucket)               # None: the bucket was not tuned (or skipped)
        if entry is not None:
            m, hint = entry
            t = template_of(hint)
            serves = getattr(t, "tuned_rows", None)
            ok, krows = serves(config, kind, rows, bucket, hint) if serves else (m is None or m == rows, m)
            if ok:
                return KernelChoice(t.name, hint, krows, tuned=True)
    if kind == "cuda" and default_m is None:
        base = make_plan(config, kind, None)
        hint = default_hint(base, arch)
        if template_of(hint) is _WGMMA:            # the tile class of these rows, not of large M
            wg = _WGMMA.default(base, arch, rows)
            if wg is not None:
                return KernelChoice(_WGMMA.name, wg, None)
        if composite:
            c = _past_the_gemv(config, rows, arch, None)
            if c is not None:
                return c
        return KernelChoice(template_of(hint).name, hint, None)
    if gemv_hint is not None:
        return KernelChoice(template_of(gemv_hint).name, gemv_hint, default_m)
    if composite and kind == "cuda" and _past_gemv_rows(config, default_m):
        c = _past_the_gemv(config, rows, arch, default_m)     # a static M (the config's int) past the GEMV
        if c is not None:
            return c
    hint = default_hint(make_plan(config, kind, default_m), arch)
    return KernelChoice(template_of(hint).name, hint, default_m)


def composite_serves(config, kind: str, bucket: int, arch) -> Optional[str]:
    """Why ``bucket``'s rows run past the GEMV (None: they do not).

    An untuned operator runs rows >= ``DEQUANT_GEMM_MIN_ROWS`` of quantized weights on sm_90 that
    the GEMV does not serve as the fused wgmma GEMM where its default tile serves them, else as
    decode + dense wgmma GEMM (a kernel symbolic in M), both several times faster than the
    mma.sync tiles. The tuner tunes such a bucket over the fused GEMM's tiles only, against that
    untuned choice (bitblas.tune.tuner.tune_bucket's ``past_gemv``)."""
    from ..arch import as_arch
    if kind != "cuda" or not _past_gemv_rows(config, bucket):
        return None
    arch = as_arch(arch)             # an Arch or a tvm Target (tuner.composite_serves takes any spelling)
    if gemv_serves(config, kind, bucket, arch):    # the GEMV serves these rows (up to 64)
        return None
    m = kernel_rows(config, kind, bucket, arch)
    if dequant_gemm_reason(make_plan(config, kind, m), arch) is not None:
        return None
    return (f"rows {bucket} run past the GEMV (the fused wgmma GEMM or decode + wgmma GEMM, faster than the "
            "mma.sync tiles)")

