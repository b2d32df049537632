"""One-off H200 probe: copy bandwidth, TVM-FFI stream facts, torch baselines for small-M matmuls."""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from benchmark.timing import copies_for, copy_bandwidth, time_graph  # noqa: E402


def main():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name} sms={p.multi_processor_count} l2={getattr(p, 'L2_cache_size', 0) >> 20}MB")
    print(f"copy bandwidth {copy_bandwidth():.2f} TB/s")
    import tvm_ffi
    dev = tvm_ffi.device("cuda:0")
    s = torch.cuda.Stream()
    print("tvm_ffi env stream outside:", tvm_ffi.get_raw_stream(dev), "torch current:", torch.cuda.current_stream().cuda_stream)
    with torch.cuda.stream(s):
        print("inside torch.cuda.stream(s):", tvm_ffi.get_raw_stream(dev), "s:", s.cuda_stream)
    rows = []
    for N, K in ((8192, 8192), (28672, 8192)):
        wbytes = N * K * 2
        nc = copies_for(wbytes)
        Ws = [torch.randn(N, K, dtype=torch.half, device="cuda") for _ in range(nc)]
        for m in (1, 16):
            x = torch.randn(m, K, dtype=torch.half, device="cuda")
            us = time_graph([lambda w=w: torch.nn.functional.linear(x, w) for w in Ws])
            b = wbytes + m * K * 2 + m * N * 2
            rows.append(("cublas-f16", N, K, m, us, b / us / 1e6))
        del Ws
        try:
            nc = copies_for(N * K // 2)
            packs = [torch._convert_weight_to_int4pack(
                torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda"), 8) for _ in range(nc)]
            sz = torch.randn(K // 128, N, 2, dtype=torch.bfloat16, device="cuda") * 0.01
            for m in (1, 16):
                x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
                us = time_graph([lambda w=w: torch._weight_int4pack_mm(x, w, 128, sz) for w in packs])
                b = N * K // 2 + sz.numel() * 2 + m * K * 2 + m * N * 2
                rows.append(("torch-int4pack-bf16", N, K, m, us, b / us / 1e6))
            del packs
        except Exception as e:
            print("int4pack failed:", type(e).__name__, str(e)[:300])
    # the simple bitblas schedule, for reference
    import bitblas
    from bitblas.reference import random_inputs
    cfg = bitblas.MatmulConfig(N=8192, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128,
                               with_scaling=True, with_zeros=True)
    op = bitblas.Matmul(cfg)
    t0 = time.time()
    inp = random_inputs(cfg, 1, device="cuda")
    op(**inp)
    torch.cuda.synchronize()
    print(f"bitblas build+first call {time.time() - t0:.1f}s")
    out = torch.empty(1, 8192, dtype=torch.half, device="cuda")
    us = time_graph([lambda: op(**inp, output=out)], target_calls=20, trials=3)
    rows.append(("bitblas-simple-uint4", 8192, 8192, 1, us, (8192 * 4096 + 2 * 8192 * 64 * 2) / us / 1e6))
    print(f"{'kernel':22s} {'N':>6s} {'K':>6s} {'M':>4s} {'us':>9s} {'TB/s':>6s}")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:6d} {r[2]:6d} {r[3]:4d} {r[4]:9.2f} {r[5]:6.2f}")


if __name__ == "__main__":
    main()
