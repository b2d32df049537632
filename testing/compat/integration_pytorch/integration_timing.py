"""Wall-clock timing of a forward call, as the integration/pytorch examples' tests take it (written here)."""
import time

import torch


def forward_ms(call, min_warmup_s=1.0):
    """Mean wall time of ``call()`` in ms, CUDA-synchronised: warm up for ``min_warmup_s``, then run
    for about a second."""
    def timed(n):
        start = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3 / n

    deadline = time.perf_counter() + min_warmup_s
    while time.perf_counter() < deadline:
        timed(1)
    return timed(max(1, int(1000 / timed(1))))
