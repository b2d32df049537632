"""Dynamic M: buckets of row counts, and which bucket serves a runtime m.

A config's buckets are its int M (one bucket), its list of M, or :data:`DEFAULT_BUCKETS` for
M=None. Bucket ``b`` serves the row counts ``(previous bucket, b]``; the last bucket also serves
every m above it. Each bucket is tuned at ``m = b`` and gets one kernel:

* a tensor-core (or simple) kernel symbolic in M, correct for every m, so it serves its whole
  range and, for the last bucket, everything beyond;
* for small buckets where the GEMV template wins, GEMV kernels with the bucket's hint, built as
  the range's row counts are met: the rows kernel per row count, the tensor-core kernels per
  class of row counts (``bitblas.kernels.select.row_class``); a row count above the last GEMV
  bucket is served by the default kernel. Which kernel serves a row count: ``bitblas.kernels.select``.

:class:`BucketTable` answers ``bucket_of(m)`` with one list index (m up to the last bucket) or
one comparison; the operator keeps the resolved kernel per row count, so after the first call
with a given m, dispatch is a single dict lookup.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Optional, Sequence, Tuple

from .config import MatmulConfig

__all__ = ["DEFAULT_BUCKETS", "buckets_of", "BucketTable"]

DEFAULT_BUCKETS = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


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
