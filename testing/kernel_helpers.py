"""Helpers shared by the kernel tests: CUDA codegen targets with the devices' real limits, and the
GPU check of one built kernel against the float64 reference."""
from __future__ import annotations

import os
import random
import struct
from typing import Optional

import torch

from bitblas.hardware import DeviceSpec
from bitblas.quantization.quantize import TORCH_DTYPES
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance

# Codegen targets with the devices' shared-memory limits (a bare "sm_90" string assumes 48 KB).
TARGETS = {
    arch: {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": smem, "max_threads_per_block": 1024,
           "thread_warp_size": 32}
    for arch, smem in (("sm_80", 166912), ("sm_89", 101376), ("sm_90", 232448))
}

# Devices described as data (what query_device reads from an H200 / an A100), for the cost model
# and the tuner's search space on any machine.
H200_SPEC = DeviceSpec(name="test H200", arch="sm_90", sm_count=132, smem_per_sm=233472, smem_per_block=232448,
                       regs_per_sm=65536, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=50 * 2 ** 20,
                       dram_bandwidth=4.8e12, clock_hz=1.98e9)
A100_SPEC = DeviceSpec(name="test A100", arch="sm_80", sm_count=108, smem_per_sm=167936, smem_per_block=166912,
                       regs_per_sm=65536, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=40 * 2 ** 20,
                       dram_bandwidth=2.0e12, clock_hz=1.41e9)


def check_kernel(cfg, plan, fn, m: int, tol: Optional[float] = None, report: bool = False) -> Optional[str]:
    """Run the built kernel ``fn`` of ``plan`` on fresh random inputs of ``m`` rows into a poisoned
    output (NaN; -12345 for int32) and compare with the reference: int32 outputs exactly, others
    within ``tol`` (default: the tolerance table). None, or an error line naming the seed."""
    from bitblas.tune.tuner import kernel_args
    seed = random.randrange(2 ** 31)
    inputs = random_inputs(cfg, m, device="cuda", seed=seed)
    dt = TORCH_DTYPES[cfg.out_dtype]
    out = torch.full((m, cfg.N), float("nan") if dt.is_floating_point else -12345, dtype=dt, device="cuda")
    fn(*kernel_args(plan, inputs, out))
    torch.cuda.synchronize()
    ref = reference_matmul(cfg, **inputs)
    if cfg.out_dtype == "int32":
        if not torch.equal(out.cpu(), ref.to(torch.int32)):
            bad = int((out.cpu() != ref.to(torch.int32)).sum())
            return f"m={m} seed={seed}: {bad} of {out.numel()} int32 outputs differ"
        return None
    err = relative_error(out.cpu(), ref)
    tol = tolerance(cfg) if tol is None else tol
    if report:
        print(f"{cfg.A_dtype}x{cfg.W_dtype}->{cfg.out_dtype} m={m} N={cfg.N} K={cfg.K}: rel. err {err:.3e} "
              f"(table {tolerance(cfg):.1e}, bound {tol:.1e})")
    return None if err <= tol else f"m={m} seed={seed}: rel. err {err:.3e} > {tol:.1e}"


def shifted_view(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in a view that starts one element past its buffer's start (off the 16-byte
    boundary every kernel's vector loads need, so the operator must realign it)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v


def fp8_mma_tolerance(cfg) -> float:
    """The table's tolerance, widened by the fp8 tensor cores' accumulator: mma / wgmma
    f32.e4m3/e5m2 on Ada and Hopper keep 13 mantissa bits (an "FP22" accumulator; the low 10 bits
    are truncated at every instruction, as measured by SageAttention2), and the templates add all
    K / 32 instructions of a k loop in that accumulator (no promotion to a CUDA-core fp32 sum): at
    most 2**-13 of |acc| per instruction."""
    return max(tolerance(cfg), cfg.K / 32 * 2.0 ** -13)


def ranked_candidates(cfg, bucket: int, spec):
    """The tuner's candidates for ``bucket`` of ``cfg`` on ``spec`` with a finite cost estimate, cheapest first."""
    import math
    from bitblas.plan import make_plan
    from bitblas.tune.space import estimate
    from bitblas.tune.space import Candidate, candidates
    out = []
    for c in candidates(cfg, "cuda", bucket, spec):
        cost = estimate(make_plan(cfg, "cuda", c.plan_m), c.hint, bucket, spec)
        if math.isfinite(cost):
            out.append(Candidate(c.plan_m, c.hint, cost))
    return sorted(out, key=lambda c: c.cost)


def elf_bytes(n: int) -> bytes:
    """A complete 64-bit little-endian ELF header (no segments or sections) and ``n`` random bytes:
    what the database takes as a library file."""
    head = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, 0, 0, 64, 56, 0, 64, 0, 0)
    assert len(head) == 64
    return head + os.urandom(n)


def choose(op, kind: str, rows: int):
    """``op.choice(kind, rows)`` as (plan rows, hint): the hint None for the plain default of the
    plan (the registry's first template), ("dequant-gemm", dense GEMM hint) for decode-then-GEMM;
    a tuned hint or a row-class hint (the wgmma tiles of a symbolic kernel) as it is."""
    from bitblas.plan import make_plan
    from bitblas.kernels import default_hint
    c = op.choice(kind, rows)
    if c.template == "dequant-gemm":
        return c.rows, ("dequant-gemm", c.hint)
    if c.template == "wgmma" and c.rows is None:       # the tile class of the rows, always explicit
        return c.rows, c.hint
    if not c.tuned and c.hint == default_hint(make_plan(op._kc, kind, c.rows), op.arch if kind == "cuda" else None):
        return c.rows, None
    return c.rows, c.hint


def past_gemv(choice) -> bool:
    """Whether a :func:`choose` hint is the path for quantized weights past the GEMV on sm_90:
    decode-then-GEMM, or the fused wgmma GEMM where it is the default (schedule/fused_wgmma.py)."""
    from bitblas.schedule import FusedWgmmaHint
    return isinstance(choice, FusedWgmmaHint) or (isinstance(choice, tuple) and choice[0] == "dequant-gemm")


# the table formats of the wgmma GEMV and the fused wgmma GEMM tests (the mma GEMV's decoders; nf4
# pairs adjacent codes, so its activations are permuted differently): group / per-channel / no
# scales, bias, bfloat16 and float32 outputs
WGMMA_TABLE_FORMATS = {
    "nf4-g128": dict(W_dtype="nf4", group_size=128, with_scaling=True),
    "bf16-nf4-chan-bias": dict(A_dtype="bfloat16", W_dtype="nf4", with_scaling=True, with_bias=True,
                               out_dtype="bfloat16"),
    "fp4-g64": dict(W_dtype="fp4_e2m1", group_size=64, with_scaling=True),
    "bf16-fp4-noscale-f32": dict(A_dtype="bfloat16", W_dtype="fp4_e2m1", out_dtype="float32"),
    "e4m3-chan": dict(W_dtype="float8_e4m3", with_scaling=True),
    "bf16-e4m3-g128": dict(A_dtype="bfloat16", W_dtype="float8_e4m3", group_size=128, with_scaling=True,
                           out_dtype="bfloat16"),
    "e5m2-g128-bias": dict(W_dtype="float8_e5m2", group_size=128, with_scaling=True, with_bias=True),
    "e5m2-noscale-f32": dict(W_dtype="float8_e5m2", out_dtype="float32"),
    # nvfp4: two float8_e4m3 block scales per 16-byte vector (per decoded pair), global scale at the store
    "nvfp4": dict(W_dtype="nvfp4", group_size=16, with_scaling=True),
    "bf16-nvfp4-bias": dict(A_dtype="bfloat16", W_dtype="nvfp4", group_size=16, with_scaling=True, with_bias=True,
                            out_dtype="bfloat16"),
}


def run_fdec(src: str, w: list) -> list:
    """Run a generated code decoder (``bb_fdec`` / ``bb_mdec``: weight words ``w`` in, words ``d``
    out) through the tests' interpreter; returns the output words."""
    from c_interp import run_c
    d = run_c(src, {"w": list(w), "d": {}})["d"]
    return [d[i] for i in range(len(d))]


# A warp on the host, for the CUDA helpers that shuffle (tests compile them with g++ and run each lane as
# a thread: ``threadIdx.x`` per thread, ``__shfl_xor_sync`` through a shared array and a barrier)
HOST_WARP = r"""
#include <barrier>
#include <cstdio>
#include <cstring>
#include <thread>
struct Dim { unsigned x; };
static thread_local Dim threadIdx;
static std::barrier<> sync_point(32);
static unsigned exchange[32];
// a warp's __shfl_xor_sync: every lane publishes its value, then reads its partner's
static unsigned __shfl_xor_sync(unsigned, unsigned v, int mask) {
  exchange[threadIdx.x] = v;
  sync_point.arrive_and_wait();
  unsigned r = exchange[threadIdx.x ^ mask];
  sync_point.arrive_and_wait();
  return r;
}
"""
