"""GPU timing that does not measure the L2 cache: CUDA-graph replays cycling over weight copies.

``time_graph(fns)``: ``fns`` is a list of zero-argument callables, each reading its own copy of
the weights (enough copies that their bytes together exceed the L2). One graph holds ``reps``
passes over all of them; replays are timed with CUDA events and the median per call is returned
in microseconds. Falls back to timing plain launches when a callable cannot be captured.
``max_graph_ms`` caps one replay's length (fewer passes for slow kernels, so a large-M row does not
take minutes). ``time_host(fns)``: the CPU counterpart (a host clock around back-to-back calls).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional, Sequence

import torch

__all__ = ["time_graph", "time_host", "copies_for", "copy_bandwidth"]


def copies_for(bytes_per_copy: int, l2_bytes: int = 60 << 20, factor: float = 4.0, max_copies: int = 64) -> int:
    """How many weight copies to cycle over so that they exceed ``factor`` x the L2."""
    return max(2, min(max_copies, int(factor * l2_bytes / max(bytes_per_copy, 1)) + 1))


def _time_events(run: Callable[[], None], n_calls: int, trials: int) -> float:
    times = []
    for _ in range(trials):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / n_calls)
    return statistics.median(times)


def time_graph(fns: Sequence[Callable[[], object]], target_calls: int = 400, trials: int = 7,
               use_graph: bool = True, max_graph_ms: Optional[float] = None) -> float:
    """Median µs per call over ``trials`` replays of a graph of ~``target_calls`` calls (fewer when
    ``max_graph_ms`` is given and that many calls would take longer; at least one pass over ``fns``)."""
    fns = list(fns)
    reps = max(1, target_calls // len(fns))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # warm up (builds, module loads, cuBLAS handles)
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if max_graph_ms is not None:
        def one_pass():
            for f in fns:
                f()
        pass_ms = _time_events(one_pass, 1, 1) / 1e3       # µs per pass -> ms
        reps = max(1, min(reps, int(max_graph_ms / max(pass_ms, 1e-6))))
    n_calls = reps * len(fns)
    if use_graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(reps):
                    for f in fns:
                        f()
            g.replay()
            torch.cuda.synchronize()
            return _time_events(g.replay, n_calls, trials)
        except Exception as e:  # pragma: no cover - report and fall back
            print(f"[timing] graph capture failed ({type(e).__name__}: {str(e)[:200]}); timing launches")
            torch.cuda.synchronize()

    def run():
        for _ in range(reps):
            for f in fns:
                f()
    run()
    return _time_events(run, n_calls, trials)


def time_host(fns: Sequence[Callable[[], object]], target_calls: int = 400, trials: int = 7,
              max_ms: float = 200.0) -> float:
    """CPU counterpart of :func:`time_graph`: median µs per call over ``trials`` timings (host clock)
    of passes over ``fns``, ~``target_calls`` calls each, or fewer where a pass is slow."""
    fns = list(fns)
    for f in fns:                          # warm up
        f()
    t0 = time.perf_counter()
    for f in fns:
        f()
    pass_ms = (time.perf_counter() - t0) * 1e3
    reps = max(1, min(target_calls // len(fns), int(max_ms / max(pass_ms, 1e-6))))
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(reps):
            for f in fns:
                f()
        times.append((time.perf_counter() - t0) * 1e6 / (reps * len(fns)))
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, device: str = "cuda") -> float:
    """Copy bandwidth of ``device`` in TB/s (bytes read + bytes written), one ``nbytes`` buffer into another."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    a.random_(0, 255)
    if device == "cpu":
        us = time_host([lambda: b.copy_(a)], target_calls=20, trials=5)
    else:
        us = time_graph([lambda: b.copy_(a)], target_calls=20, trials=5)
    return 2 * nbytes / (us * 1e-6) / 1e12
