"""What a kernel that only reads its bytes reaches in the graph-replay harness (benchmark/timing.py):
read-only streaming kernels (triton) over the bytes of a shape, with and without programmatic
dependent launch, beside the byte floor at 4.25 TB/s. A memory-bound kernel of ours is judged
against these: a floor no read-only kernel reaches in the harness is not a kernel's shortfall.

    python -m benchmark.probe_floor                      # issue 25's three batched-GEMV shapes, W4A16 / NVFP4 8192^2
    python -m benchmark.probe_floor --mb 33.0,66.1       # byte counts in MB

H200, the fastest config without / with PDL (µs, times the floor at 4.25 TB/s): (7168, 2048, 4)'s
33.0 MB 8.98 (1.156x) / 8.50 (1.094x); (7168, 16384, 1)'s 66.1 MB 16.20 / 15.68 (1.008x); (4096,
7168, 8)'s 132.1 MB 30.50 / 29.96 (0.964x); W4A16 g128 8192^2 (34.6 MB) 9.32 / 8.84 (1.086x);
NVFP4 weights 8192^2 (37.7 MB) 10.04 / 9.52 (1.072x). With PDL, 4 KB blocks of 128 threads were
the slowest of all (1.28-1.37x). Needs a GPU and triton.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HBM_TBPS = 4.25                   # the H200's measured copy rate: the issues' byte floors

# (name, bytes): what each shape's kernel must read (benchmark.nvfp4.gemv_bytes less the output;
# W4A16 g128: packed codes and float16 scales; NVFP4 weights: codes and e4m3 block scales)
SHAPES = [("nvfp4 gemv (7168, 2048, 4)", 7168 * 4 * (1024 + 128)),
          ("nvfp4 gemv (7168, 16384, 1)", 7168 * (8192 + 1024)),
          ("nvfp4 gemv (4096, 7168, 8)", 4096 * 8 * (3584 + 448)),
          ("w4a16 g128 8192^2", 8192 * 4096 + 8192 * 64 * 2),
          ("nvfp4 weights 8192^2", 8192 * 4096 + 8192 * 512)]
# (int32 elements per block, warps): 8 KB blocks of 256 threads were the fastest with PDL
CONFIGS = [(1024, 4), (2048, 8), (4096, 8)]


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read(p, out, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
        if PDL:                       # wait for the previous kernel, then let the next one launch
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(p + offs, mask=offs < n, other=0, cache_modifier=".cg")
        acc = tl.xor_sum(x, axis=0)
        if acc == 0x1234567:          # practically never: keeps the loads
            tl.store(out, acc)
    return triton, read


def probe(shapes, configs=CONFIGS, emit=print):
    """Per shape and config, the µs of the read-only kernel with and without PDL (rows as dicts)."""
    import torch
    from benchmark.timing import copies_for, time_graph
    triton, read = _kernel()
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    rows = []
    for name, nbytes in shapes:
        n = nbytes // 4
        bufs = [torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=torch.int32, device="cuda")
                for _ in range(copies_for(nbytes))]
        floor = nbytes / (HBM_TBPS * 1e6)
        for block, warps in configs:
            grid = (triton.cdiv(n, block),)
            for pdl in (False, True):
                us = time_graph([lambda b=b: read[grid](b, out, n, BLOCK=block, PDL=pdl, num_warps=warps,
                                                        launch_pdl=pdl) for b in bufs])
                r = dict(shape=name, bytes=nbytes, block_bytes=4 * block, warps=warps, pdl=pdl, us=us,
                         floor_us=floor, ratio=us / floor)
                rows.append(r)
                emit(f"{name:30s} {nbytes / 1e6:7.1f} MB  {4 * block:5d} B x {warps:2d} warps  pdl={pdl!s:5s} "
                     f"{us:8.2f} us  {us / floor:.3f}x floor ({floor:.2f} us)")
        del bufs
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", default="", help="comma list of byte counts in MB instead of the named shapes")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    shapes = [(f"{x} MB", int(float(x) * 1e6) // 16 * 16) for x in args.mb.split(",") if x] or SHAPES
    rows = probe(shapes)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
