"""Kernel timing: warm-up, batches of many launches, median.

CUDA: each sample times a batch of back-to-back launches between two CUDA events on the current
stream, sized so a batch lasts about ``batch_ms`` (per-launch CPU overhead overlaps with the GPU
work of the previous launches); the result is the median over samples of (batch time / launches).
Several argument sets (e.g. copies of the weights, enough to exceed the L2) are cycled so a
memory-bound kernel is timed reading DRAM, not L2. CPU: ``time.perf_counter`` per sample.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

__all__ = ["time_kernel"]


def time_kernel(fn: Callable, arg_sets: Sequence[Sequence], cuda: bool, samples: int = 20,
                warmup_ms: float = 20.0, batch_ms: float = 2.0, max_batch: int = 500) -> float:
    """Median milliseconds of one ``fn(*args)`` launch, cycling through ``arg_sets``."""
    n_sets = len(arg_sets)
    if n_sets == 0:
        raise ValueError("time_kernel: arg_sets is empty")
    if not cuda:
        fn(*arg_sets[0])
        times = []
        t_end = time.perf_counter() + warmup_ms * 1e-3
        while time.perf_counter() < t_end:
            fn(*arg_sets[0])
        for i in range(samples):
            t0 = time.perf_counter()
            fn(*arg_sets[i % n_sets])
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    import torch

    def run(n, start=0):
        for i in range(n):
            fn(*arg_sets[(start + i) % n_sets])

    run(1)
    torch.cuda.synchronize()
    # estimate one launch, then warm up for ~warmup_ms
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run(max(3, n_sets))
    e.record()
    e.synchronize()
    one = max(s.elapsed_time(e) / max(3, n_sets), 1e-4)
    run(min(max_batch * 4, max(1, int(warmup_ms / one))))
    batch = min(max_batch, max(1, int(batch_ms / one)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
    for i, (s, e) in enumerate(events):
        s.record()
        run(batch, i * batch)
        e.record()
    events[-1][1].synchronize()
    return statistics.median(s.elapsed_time(e) / batch for s, e in events)
