"""GPU timing that does not measure the L2 cache: CUDA-graph replays cycling over weight copies.

``time_graph(fns)``: ``fns`` is a list of zero-argument callables, each reading its own copy of
the weights (enough copies that their bytes together exceed the L2). One graph holds ``reps``
passes over all of them; replays are timed with CUDA events and the median per call is returned
in microseconds. Falls back to timing plain launches when a callable cannot be captured.
"""
from __future__ import annotations

import statistics
from typing import Callable, List, Sequence

import torch

__all__ = ["time_graph", "copies_for", "copy_bandwidth"]


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
               use_graph: bool = True) -> float:
    """Median µs per call over ``trials`` replays of a graph of ~``target_calls`` calls."""
    fns = list(fns)
    reps = max(1, target_calls // len(fns))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # warm up (builds, module loads, cuBLAS handles)
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
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


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in TB/s (bytes read + bytes written)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    us = time_graph([lambda: b.copy_(a)], target_calls=20, trials=5)
    return 2 * nbytes / (us * 1e-6) / 1e12
