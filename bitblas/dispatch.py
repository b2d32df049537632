"""Dynamic M: buckets of row counts, and which bucket serves a runtime m.

A config's buckets are its int M (one bucket), its list of M, or :data:`DEFAULT_BUCKETS` for
M=None. Bucket ``b`` serves the row counts ``(previous bucket, b]``; the last bucket also serves
every m above it. Each bucket is tuned at ``m = b`` and gets one kernel:

* a tensor-core (or simple) kernel symbolic in M, correct for every m, so it serves its whole
  range and, for the last bucket, everything beyond;
* for small buckets where the GEMV template wins, GEMV kernels with the bucket's hint, built as
  the range's row counts are met: the rows kernel per row count, the tensor-core kernels per
  class of row counts (:func:`gemv_kernel_rows`); a row count above the last GEMV bucket is
  served by the default kernel.

:class:`BucketTable` answers ``bucket_of(m)`` with one list index (m up to the last bucket) or
one comparison; the operator keeps the resolved kernel per row count, so after the first call
with a given m, dispatch is a single dict lookup.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Optional, Sequence, Tuple

from .config import MatmulConfig

__all__ = ["DEFAULT_BUCKETS", "buckets_of", "BucketTable", "default_rows", "gemv_hint_takes", "gemv_kernel_rows",
           "gemv_rows"]

DEFAULT_BUCKETS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def gemv_rows(config: MatmulConfig, kind: str, rows: int, target=None) -> bool:
    """Whether the *untuned* kernel for ``rows`` is a GEMV kernel for exactly that many rows (CUDA,
    1..64 rows where the template takes the plan and wins: ``gemv.gemv_default_takes``;
    ``target``: the CUDA Target, None = assume sm_80+)."""
    from .plan import make_plan
    from .schedule.gemv import GEMV_MMA_MAX_ROWS, gemv_default_takes
    return (kind == "cuda" and 1 <= rows <= GEMV_MMA_MAX_ROWS
            and gemv_default_takes(make_plan(config, kind, rows), target))


def default_rows(config: MatmulConfig, kind: str, rows: int, target=None) -> Optional[int]:
    """Rows the *untuned* kernel for ``rows`` is built for (None: symbolic in M): where a GEMV
    kernel serves them (:func:`gemv_rows`), ``rows`` itself for the rows kernel and the top of
    their class for a tensor-core one (:func:`gemv_kernel_rows`); else the config's int M when
    ``rows`` equals it."""
    if gemv_rows(config, kind, rows, target):
        # the default tiles are the same for every row count of a class (testing/test_dispatch.py),
        # so the class top's untuned kernel is the one ``rows`` would get
        from .plan import make_plan
        from .schedule import default_hint
        return gemv_kernel_rows(config, kind, rows, default_hint(make_plan(config, kind, rows), target))
    return config.M if isinstance(config.M, int) and rows == config.M else None


def gemv_hint_takes(config: MatmulConfig, kind: str, rows: int, hint) -> bool:
    """Whether a GEMV kernel with ``hint`` builds for a plan of ``rows`` rows (the template takes
    the plan and the hint's kernel shape: e.g. above 16 rows only tensor-core hints)."""
    from .plan import make_plan
    from .schedule.gemv import gemv_hint_unsupported, gemv_unsupported
    plan = make_plan(config, kind, rows)
    return gemv_unsupported(plan) is None and gemv_hint_unsupported(plan, hint) is None


def gemv_kernel_rows(config: MatmulConfig, kind: str, rows: int, hint) -> int:
    """Rows of the GEMV kernel with ``hint`` that serves ``rows``: the tensor-core kernels take
    their row count at run time, so the one built for the top of the class
    (``gemv.row_class``: 8, 16, 32, 48, 64) serves every row count of it (5 kernels for 2..64
    rows instead of 63); the wgmma GEMV's B operand is 8 rows wide per step, so its classes are
    8 rows wide (``gemv.wgmma_rows``: a kernel built for 32 rows took 67.6 µs at 17 rows
    against 56.2 for the one built for 24; H200, W4A16 28672x8192); the rows kernel is built per
    row count."""
    from .schedule.gemv import row_class
    from .schedule.gemv import wgmma_rows
    if not getattr(hint, "mma", False):
        return rows
    top = wgmma_rows(rows) if getattr(hint, "wgmma", False) else row_class(rows)
    return top if top == rows or gemv_hint_takes(config, kind, top, hint) else rows


def buckets_of(config: MatmulConfig) -> Tuple[int, ...]:
    """The buckets of a config, ascending."""
    M = config.M
    if isinstance(M, int):
        return (M,)
    if M is None:
        return DEFAULT_BUCKETS
    return tuple(sorted(set(M)))


class BucketTable:
    """``bucket_of(m)``: the smallest bucket >= m, or the last bucket for m above it."""

    def __init__(self, buckets: Sequence[int]):
        if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets={list(buckets)!r}: a non-empty ascending list of distinct positive ints")
        self.buckets = tuple(buckets)
        self.last = self.buckets[-1]
        # a lookup table up to the last bucket (bisect beyond 64K rows keeps it small)
        top = min(self.last, 1 << 16)
        self._table = [self.buckets[bisect_left(self.buckets, m)] for m in range(top + 1)]

    def bucket_of(self, m: int) -> int:
        if m < len(self._table):
            return self._table[m]
        return self.buckets[bisect_left(self.buckets, m)] if m <= self.last else self.last

    def range_of(self, bucket: int) -> Tuple[int, Optional[int]]:
        """(lowest, highest) m served by ``bucket`` (highest None: unbounded)."""
        i = self.buckets.index(bucket)
        lo = self.buckets[i - 1] + 1 if i else 1
        return lo, (None if bucket == self.last else bucket)

    def __repr__(self):
        return f"BucketTable({list(self.buckets)})"
