"""Progress: a tqdm bar on a terminal; elsewhere (a pipe, a log file, a notebook's captured stderr)
progress lines, so a long run is visible in the logs.

``progress_bar(enabled=None)``: a bar when stderr is a terminal, else :class:`LogProgress` when a
``logger`` is given: one line when a stage starts, then at most one every ``interval_s`` seconds,
and one at the end, as INFO records of ``logger`` where INFO is enabled (the application set a
level, or ``bitblas.set_log_level("INFO")``), else written to stderr as the bar would have been.
``enabled=True``: a bar even off a terminal; ``False``: nothing.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Optional

__all__ = ["progress_bar", "LogProgress"]


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


class LogProgress(_Silent):
    """A progress bar's interface (``total``, ``update``, ``set_postfix_str``, ``close``) that emits
    ``desc: n/total unit (postfix), elapsed``: when the postfix names a new stage, then at most
    every ``interval_s`` seconds, and when closed; an INFO record of ``logger`` where that level is
    enabled, else a line on stderr."""

    def __init__(self, logger: logging.Logger, desc: str = "", total=0, unit: str = "it",
                 interval_s: float = 30.0, **_):
        super().__init__(total)
        self.logger, self.desc, self.unit, self.interval_s = logger, desc, unit, interval_s
        self.postfix = ""
        self.t0 = self.last = time.monotonic()
        self._emit(f"{desc}: started")

    def _emit(self, line: str):
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info("%s", line)
        else:
            print(f"[bitblas] {line}", file=sys.stderr, flush=True)

    def _line(self) -> str:
        total = f"/{self.total}" if self.total else ""
        post = f" ({self.postfix})" if self.postfix else ""
        return f"{self.desc}: {self.n}{total} {self.unit}{post}, {time.monotonic() - self.t0:.0f} s"

    def _maybe(self, force: bool = False):
        now = time.monotonic()
        if force or now - self.last >= self.interval_s:
            self.last = now
            self._emit(self._line())

    def update(self, n=1):
        super().update(n)
        self._maybe()

    def set_postfix_str(self, s):
        stage = s.split(" ", 1)[0]
        new_stage = stage != self.postfix.split(" ", 1)[0]
        self.postfix = s
        self._maybe(force=new_stage)

    def close(self):
        self._emit(self._line() + " - done")


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(iterable=None, enabled: Optional[bool] = None, logger: Optional[logging.Logger] = None,
                 **kwargs):
    """``tqdm(iterable, **kwargs)`` on a terminal; off a terminal (``enabled`` None) a
    :class:`LogProgress` on ``logger`` (when given; for an iterable, the iterable itself)."""
    if enabled is None and not _on_terminal() and logger is not None and iterable is None:
        kw = {k: v for k, v in kwargs.items() if k in ("desc", "total", "unit")}
        return LogProgress(logger, **kw)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm missing on a bare host
        return iterable if iterable is not None else _Silent(**kwargs)
    return tqdm(iterable, disable=None if enabled is None else not enabled, **kwargs)
