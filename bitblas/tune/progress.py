"""Progress bars: tqdm when installed (it is a dependency), else a silent stand-in."""
from __future__ import annotations

from typing import Optional

__all__ = ["progress_bar"]


class _Silent:
    def __init__(self, total=0, **_):
        self.total = total
        self.n = 0

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, s):
        pass

    def close(self):
        pass

    def __iter__(self):  # pragma: no cover - only for iterable bars
        return iter(())


def progress_bar(iterable=None, enabled: Optional[bool] = None, **kwargs):
    """``tqdm(iterable, **kwargs)``; ``enabled`` None: shown on a terminal only."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm missing on a bare host
        return iterable if iterable is not None else _Silent(**kwargs)
    return tqdm(iterable, disable=None if enabled is None else not enabled, **kwargs)
