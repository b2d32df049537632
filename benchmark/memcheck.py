"""One representative kernel per family, small shapes that are no tile multiples, for
``compute-sanitizer --tool memcheck`` (GPU host; the mma_fp8 and gemv_f8 families need sm_89+):

    compute-sanitizer --tool memcheck --error-exitcode 9 python -m benchmark.memcheck [--family NAME]

Each case builds its kernel with the hint that selects the family, runs it on fresh random inputs
into a poisoned output and checks the result against the float64 reference, so a clean sanitizer
log also means the checked kernel was the one that ran.
"""
from __future__ import annotations

import argparse
import sys

import torch

from bitblas import MatmulConfig as C
from bitblas.build import build_plan, cuda_target
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.kernels import default_hint
from bitblas.schedule import FusedWgmmaHint, GEMVHint, MMAHint, SimpleCUDAHint, WGMMAHint

G = 128
S8 = dict(A_dtype="int8", with_scaling=True, with_act_scaling=True)
F8 = dict(with_scaling=True, with_act_scaling=True)
# family -> list of (config, rows, hint factory(plan, target))
FAMILIES = {
    "gemv": [(C(M=1, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), 1, None),
             (C(M=3, N=1000, K=1536, W_dtype="int2", group_size=G, with_scaling=True), 3,
              lambda p, t: GEMVHint(rows_per_warp=4, warps=1, unroll=4, stages=2)),
             (C(M=16, N=1000, K=1536, W_dtype="int8", with_scaling=True, A_dtype="bfloat16"), 16, None),
             (C(M=1, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True), 1,
              lambda p, t: GEMVHint(rows_per_warp=2, warps=4, unroll=2, k_warps=4)),
             # the activation row staged in shared memory (the m=1 default above; 8 channels per warp for
             # 2-bit codes, float32 pairs for 8-bit ones): 48 vector positions, a partial block of 32
             (C(M=1, N=1000, K=1536, W_dtype="int2", group_size=G, with_scaling=True), 1,
              lambda p, t: GEMVHint(rows_per_warp=8, warps=4, unroll=1, stages=2, min_blocks=4, act_smem=True)),
             (C(M=1, N=1000, K=1536, W_dtype="int8", with_scaling=True, A_dtype="bfloat16"), 1,
              lambda p, t: GEMVHint(rows_per_warp=2, warps=8, unroll=1, stages=3, min_blocks=4, act_smem=True))],
    "gemv_mma": [(C(M=9, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), 9, None),
                 (C(M=3, N=1000, K=1056, W_dtype="int2", group_size=32, with_scaling=True), 3,
                  lambda p, t: GEMVHint(rows_per_warp=32, k_warps=2, unroll=4, stages=2, mma=True)),
                 (C(M=16, N=1000, K=1536, A_dtype="bfloat16", W_dtype="int4", group_size=G, with_scaling=True,
                    out_dtype="bfloat16"), 16, None),
                 # the default tiles from 2 rows: 8 K warps under 2 blocks per SM (4-bit), the base tile (2-bit)
                 (C(M=2, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True), 2, None),
                 (C(M=2, N=1000, K=1056, W_dtype="uint2", group_size=32, with_scaling=True, with_zeros=True), 2, None),
                 # 17..64 rows: the chunk loop (every 16-row chunk in the block; the last one partly past m)
                 (C(M=40, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), 40, None),
                 (C(M=33, N=1000, K=1056, W_dtype="uint2", group_size=32, with_scaling=True), 33, None),
                 (C(M=64, N=1000, K=1536, W_dtype="nf4", group_size=G, with_scaling=True), 64, None),
                 (C(M=20, N=1000, K=1536, W_dtype="uint1", group_size=G, with_scaling=True, with_zeros=True), 20,
                  None),
                 # 64 channels per warp (the default from N=16896 up to 48 rows): blocks past N=1000
                 (C(M=40, N=1000, K=1536, W_dtype="int2", group_size=G, with_scaling=True), 40,
                  lambda p, t: GEMVHint(rows_per_warp=64, k_warps=4, unroll=8, stages=1, vec_bytes=4, mma=True,
                                        min_blocks=1, chunk_loop=True)),
                 # the row count at run time: kernels built for the top of a class, called with fewer rows
                 (C(M=8, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True), 3, None),
                 (C(M=48, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), 35,
                  None)],
    # the wgmma GEMV (sm_90): permute kernel + TMA / wgmma main kernel; channels past N=1000, rows
    # past the call's count (TMA zero fill), K split over warpgroups (shared-memory reduction)
    "gemv_wgmma": [(C(M=24, N=1000, K=4096, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), 17,
                    lambda p, t: GEMVHint(rows_per_warp=16, k_warps=1, unroll=1, stages=4, mma=True, wgmma=True,
                                          pdl=True)),
                   (C(M=64, N=1000, K=4096, W_dtype="int2", group_size=G, with_scaling=True), 61,
                    lambda p, t: GEMVHint(rows_per_warp=32, k_warps=1, unroll=1, stages=2, mma=True, wgmma=True)),
                   (C(M=40, N=1000, K=4096, A_dtype="bfloat16", W_dtype="int8", with_scaling=True,
                      out_dtype="bfloat16"), 40,
                    lambda p, t: GEMVHint(rows_per_warp=16, k_warps=4, unroll=1, stages=2, mma=True, wgmma=True))],
    # the fused mixed-input GEMM (FusedWgmmaHint, sm_90): row tiles past the call's rows (TMA zero fill),
    # channels past N=1000, two warpgroups sharing a ring / splitting K, 2-bit codes on the 256-row tile
    "fused_wgmma": [(C(M=None, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
                     257, lambda p, t: FusedWgmmaHint(row_tile=128, stages=4)),
                    (C(M=None, N=1000, K=1536, W_dtype="int2", group_size=G, with_scaling=True), 300,
                     lambda p, t: FusedWgmmaHint(row_tile=256, warpgroups=2)),
                    (C(M=None, N=1000, K=1536, A_dtype="bfloat16", W_dtype="int8", with_scaling=True,
                       out_dtype="bfloat16"), 100,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True)),
                    # w_smem: weight vectors and raw 2-byte / 4-byte scales staged by cp.async (the scale
                    # word read at its 4-byte-aligned address)
                    (C(M=None, N=1000, K=1536, W_dtype="int2", group_size=G, with_scaling=True), 100,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, w_smem=True)),
                    (C(M=None, N=1000, K=1536, W_dtype="int4", group_size=G, **S8), 130,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4,
                                                 w_smem=True)),
                    # k_ctas=2: a 2-CTA cluster per tile, the second CTA's sums stored into the first's
                    # shared memory (distributed shared memory)
                    (C(M=None, N=1000, K=2048, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
                     200, lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True,
                                                      stages=4, ring=4, k_ctas=2)),
                    # ... behind the permute kernel without PDL, int8 activations with group scales
                    (C(M=None, N=1000, K=2048, W_dtype="int4", group_size=G, **S8), 100,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, ring=4,
                                                 w_smem=True, pdl=False, k_ctas=2)),
                    # nf4 in natural K order (the table decoder after the codes' transpose), clustered
                    (C(M=None, N=1000, K=2048, W_dtype="nf4", group_size=G, with_scaling=True), 100,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True, stages=4,
                                                 ring=4, permute=False, k_ctas=2)),
                    # nvfp4 and 8-bit codes in natural K order, weights staged (block scales gathered per quad)
                    (C(M=None, N=1000, K=1536, W_dtype="nvfp4", group_size=16, with_scaling=True), 100,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, w_smem=True,
                                                 permute=False)),
                    (C(M=None, N=1000, K=1536, A_dtype="bfloat16", W_dtype="float8_e4m3", with_scaling=True,
                       out_dtype="bfloat16"), 130,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, w_smem=True,
                                                 permute=False, k_ctas=2)),
                    # 2-bit codes in natural order, groups of half a slab (scales and offsets per half), clustered
                    (C(M=None, N=1000, K=2048, W_dtype="uint2", group_size=G, with_scaling=True, with_zeros=True,
                       zeros_mode="quantized"), 100,
                     lambda p, t: FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, stages=4, w_smem=True,
                                                 permute=False, k_ctas=2))],
    "gemv_table": [(C(M=1, N=1000, K=1536, W_dtype="nf4", group_size=G, with_scaling=True), 1, None),
                   (C(M=3, N=1000, K=1536, A_dtype="bfloat16", W_dtype="fp4_e2m1", group_size=G, with_scaling=True,
                      out_dtype="bfloat16"), 3, None),
                   (C(M=16, N=1000, K=1536, W_dtype="float8_e4m3", with_scaling=True), 16, None),
                   (C(M=5, N=1000, K=1536, W_dtype="nvfp4", group_size=16, with_scaling=True), 5, None)],
    # int8 activations: the dp4a rows kernel (forced at 16 rows) and the tensor-core GEMV
    "gemv_int8": [(C(M=1, N=1000, K=1536, W_dtype="int4", group_size=G, **S8), 1, None),
                  (C(M=1, N=1000, K=1536, W_dtype="int2", group_size=G, **S8), 1, None),      # staged row
                  (C(M=5, N=1000, K=1536, W_dtype="uint2", group_size=G, **S8), 5, None),
                  (C(M=16, N=1000, K=1536, W_dtype="int8", **S8), 16,
                   lambda p, t: GEMVHint(rows_per_warp=4, warps=1, unroll=2, stages=1)),
                  # the m16n8k32 tensor-core GEMV (int8 x int8 at 5 rows forced: its default there is the rows kernel)
                  (C(M=9, N=1000, K=1536, W_dtype="int4", group_size=G, **S8), 9, None),
                  (C(M=16, N=1000, K=1664, W_dtype="uint2", **S8), 16, None),
                  (C(M=5, N=1000, K=1536, W_dtype="int8", **S8), 5,
                   lambda p, t: GEMVHint(rows_per_warp=32, k_warps=8, unroll=2, stages=2, mma=True, min_blocks=2)),
                  # 17..64 rows: chunks of 16 rows
                  (C(M=40, N=1000, K=1536, W_dtype="int4", group_size=G, **S8), 40, None),
                  (C(M=17, N=1000, K=1664, W_dtype="int8", **S8), 17, None),
                  (C(M=32, N=1000, K=1536, W_dtype="int4", group_size=G, **S8), 20, None),      # run-time rows
                  # group-scaled int8 x int8 up to 32 rows: the chunk loop (since the 12th session)
                  (C(M=24, N=1000, K=1536, W_dtype="int8", group_size=G, **S8), 24, None),
                  # 64 channels per warp (the default from N=16896): blocks past N=1000
                  (C(M=40, N=1000, K=1536, W_dtype="int4", **S8), 40,
                   lambda p, t: GEMVHint(rows_per_warp=64, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1,
                                         chunk_loop=True))],
    # float8_e4m3 activations x 4- / 2-bit codes through Matmul (sm_89+): one row the rows kernel with the row
    # converted to float16 pairs, 5..16 rows the m16n8k32 .e4m3 GEMV
    "gemv_f8": [(C(M=m, N=1000, K=1536, A_dtype="float8_e4m3", W_dtype=w, out_dtype="bfloat16", **F8, **g), m, "op")
                for m, w, g in ((1, "int4", dict(group_size=G)), (9, "int4", dict(group_size=G)),
                                (16, "uint2", {}), (5, "int4", {}))],
    # Hopper: group-scaled 8-bit GEMMs (partial sums promoted per K tile / group with staged scales)
    # and W4A8 through Matmul (codes decoded to int8, then the group-scaled int8 wgmma)
    "wgmma_group": [(C(M=None, N=1000, K=1536, W_dtype="int8", group_size=G, **S8), 333, WGMMAHint.default),
                    (C(M=None, N=1000, K=1536, A_dtype="float8_e4m3", W_dtype="float8_e4m3", group_size=G,
                       out_dtype="bfloat16", **F8), 1000, WGMMAHint.default),
                    (C(M=None, N=1000, K=1536, W_dtype="int4", group_size=G, **S8), 300, "op")],
    # mma.sync, forced: on sm_90 the defaults are wgmma (dense) and decode-then-wgmma (Matmul, rows > 16)
    "mma": [(C(M=None, N=1000, K=1536), 17, MMAHint.default),
            (C(M=None, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True), 1000,
             MMAHint.default),
            (C(M=None, N=1000, K=1536, A_dtype="bfloat16", W_dtype="nf4", group_size=G, with_scaling=True), 17,
             MMAHint.default)],
    # Hopper (sm_90): TMA + wgmma; rows that are no tile multiples, N and K that are none either
    "wgmma": [(C(M=None, N=1000, K=1000), 17, lambda p, t: WGMMAHint(BN=64, stages=8, consumers=1)),
              (C(M=None, N=1000, K=1536, A_dtype="bfloat16", W_dtype="bfloat16", with_bias=True,
                 out_dtype="bfloat16"), 1000, None),
              (C(M=None, N=1000, K=1008, W_dtype="int8", **S8), 333, lambda p, t: WGMMAHint(BN=128, stages=6)),
              (C(M=None, N=1000, K=1536, A_dtype="float8_e4m3", W_dtype="float8_e4m3", out_dtype="bfloat16",
                 with_bias=True, **F8), 1000, lambda p, t: WGMMAHint(persistent=False))],
    # Hopper, through Matmul: dequantize into a temporary buffer, then the dense wgmma GEMM
    "dequant_gemm": [(C(M=None, N=1000, K=1536, W_dtype="uint4", group_size=G, with_scaling=True, with_zeros=True),
                      300, "op"),
                     (C(M=None, N=1000, K=1024, A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True,
                        out_dtype="bfloat16", with_bias=True), 1000, "op")],
    "mma_int8": [(C(M=None, N=1000, K=1536, W_dtype="int8", **S8), 17, MMAHint.default),
                 (C(M=None, N=1000, K=1536, W_dtype="int4", **S8), 1000, MMAHint.default)],
    # bf16 outputs: the fp8 tensor cores accumulate in 13 mantissa bits (see testing/test_mma_fp8.py)
    "mma_fp8": [(C(M=None, N=1000, K=1536, A_dtype="float8_e4m3", W_dtype="float8_e4m3", out_dtype="bfloat16", **F8),
                 17, MMAHint.default),
                (C(M=None, N=1000, K=1536, A_dtype="float8_e5m2", W_dtype="float8_e4m3", out_dtype="bfloat16",
                   with_bias=True, **F8), 1000, MMAHint.default)],
    # the simple schedule, forced: int8 and (sm_89+) float8 plans default to tensor cores now
    "simple": [(C(M=None, N=1000, K=1536, W_dtype="int8", **S8), 5, lambda p, t: SimpleCUDAHint.default(p)),
               (C(M=None, N=1000, K=1536, A_dtype="float8_e4m3", W_dtype="float8_e4m3", with_scaling=True,
                  with_act_scaling=True, out_dtype="bfloat16"), 17, lambda p, t: SimpleCUDAHint.default(p)),
               (C(M=3, N=1000, K=1536, W_dtype="nvfp4", group_size=16, with_scaling=True), 3,
                lambda p, t: SimpleCUDAHint.default(p))],
    # NVFP4 x NVFP4 (ops/nvfp4.py): the batched GEMV on the permuted views (48 vector positions,
    # a partial block of 32), the GEMV at 3 rows, in row chunks (13), decode-then-wgmma (40, sm_90)
    "nvfp4": [(None, 1, "nvfp4_gemv")] + [
        (C(M=None, N=1000, K=1536, A_dtype="nvfp4", W_dtype="nvfp4", group_size=16, with_scaling=True,
           with_act_scaling=True), m, "op") for m in (3, 13, 40)],
}


def run_nvfp4_gemv_case() -> str:
    """bitblas.ops.nvfp4_gemv, M=1000, K=1536, L=3, b padded to 128 rows, c poisoned."""
    from bitblas.ops import nvfp4_gemv
    from bitblas.reference import reference_nvfp4_gemv
    M, K, L = 1000, 1536, 3
    a = torch.randint(0, 256, (L, M, K // 2), dtype=torch.uint8, device="cuda").permute(1, 2, 0)
    b = torch.randint(0, 256, (L, 128, K // 2), dtype=torch.uint8, device="cuda").permute(1, 2, 0)
    sfa = torch.rand(L, M, K // 16, device="cuda").to(torch.float8_e4m3fn).permute(1, 2, 0)
    sfb = torch.rand(L, 128, K // 16, device="cuda").to(torch.float8_e4m3fn).permute(1, 2, 0)
    c = torch.full((L, M, 1), float("nan"), dtype=torch.float16, device="cuda").permute(1, 2, 0)
    nvfp4_gemv(a, b, sfa, sfb, c)
    torch.cuda.synchronize()
    err = relative_error(c, reference_nvfp4_gemv(a, b, sfa, sfb))
    return f"{'nvfp4_gemv':15s} M={M} K={K} L={L} err={err:.2e} {'ok' if err <= 4e-3 else 'WRONG'}"


def run_matmul_case(cfg, m) -> str:
    """The case through bitblas.Matmul (the path a user's call takes for ``m`` rows)."""
    import bitblas
    op = bitblas.Matmul(cfg)
    inputs = random_inputs(cfg, m, device="cuda")
    dt = TORCH_DTYPES[cfg.out_dtype]
    out = torch.full((m, cfg.N), float("nan") if dt.is_floating_point else -12345, dtype=dt, device="cuda")
    op(**inputs, output=out)
    torch.cuda.synchronize()
    err = relative_error(out.float().cpu(), reference_matmul(cfg, **inputs))
    ok = err <= tolerance(cfg)
    if op._nv is not None:               # nvfp4 activations: their own operator (ops/nvfp4.py)
        name = "NVFP4-GEMM" if op._nv.uses_gemm(m) else "NVFP4-GEMV"
    else:
        name = type(op._kernel("cuda", m)[1]).__name__
    return f"{name:15s} m={m:<5d} {cfg.A_dtype}x{cfg.W_dtype} err={err:.2e} {'ok' if ok else 'WRONG'}"


def run_case(cfg, m, make_hint) -> str:
    if make_hint == "nvfp4_gemv":
        return run_nvfp4_gemv_case()
    if make_hint == "op":
        return run_matmul_case(cfg, m)
    plan = make_plan(cfg, "cuda", cfg.M if isinstance(cfg.M, int) else None)
    target = cuda_target()
    hint = make_hint(plan, target) if make_hint else default_hint(plan, target)
    if hint is None:
        raise SystemExit(f"{cfg}: no hint for {target} (the tensor-core family does not apply there)")
    fn = build_plan(plan, target, hint)
    from bitblas.tune.tuner import kernel_args
    inputs = random_inputs(cfg, m, device="cuda")
    dt = TORCH_DTYPES[cfg.out_dtype]
    out = torch.full((m, cfg.N), float("nan") if dt.is_floating_point else -12345, dtype=dt, device="cuda")
    fn(*kernel_args(plan, inputs, out))
    torch.cuda.synchronize()
    err = relative_error(out.float().cpu(), reference_matmul(cfg, **inputs))
    ok = err <= tolerance(cfg)
    return f"{type(hint).__name__:15s} m={m:<5d} {cfg.A_dtype}x{cfg.W_dtype} err={err:.2e} {'ok' if ok else 'WRONG'}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append")
    args = ap.parse_args(argv)
    bad = 0
    for fam in args.family or list(FAMILIES):
        for cfg, m, mk in FAMILIES[fam]:
            line = run_case(cfg, m, mk)
            bad += line.endswith("WRONG")
            print(f"{fam:9s} {line}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
