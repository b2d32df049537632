"""Codegen fuzz: the CUDA kernels the operator would run, for random valid configs, built without a GPU.

Each seed draws a config with test_fuzz's ``draw_config`` (every activation and weight format, scales,
groups, zero modes, bias, N and K off any tile, static or dynamic M) and its row counts (one from each
class the dispatch knows). For sm_80, sm_89 (float8 tensor cores) and sm_90 the selector
(:func:`bitblas.kernels.select.select`) picks the kernel of each row count as ``Matmul`` does; the
kernel's TVM module is lowered and compiled for CUDA (decode-then-GEMM: the dequantize kernel and
the dense GEMM), and with nvcc found each distinct source is compiled to a cubin (sm_80 / sm_89 /
sm_90a) within the 60 s a kernel may take (without nvcc the TVM half still runs). A valid config
must get a kernel on every arch: any exception, a refusal included, fails the test (the operator
would otherwise fall back, with a warning, to the last-resort kernel, or raise).

    python -m pytest testing/test_codegen_fuzz.py
"""
from __future__ import annotations

import random
import time

import pytest

from bitblas.build import cuda_target, find_nvcc, nvcc_compile
from bitblas.kernels.select import DEQUANT_GEMM, choice_sources, select
from bitblas.ops.compat import kernel_config
from kernel_helpers import TARGETS
from test_fuzz import draw_config, row_counts

CODEGEN_FUZZ_SEEDS = tuple(range(40))
ARCHS = ("sm_80", "sm_89", "sm_90")
_NVCC_ARCH = {"sm_80": "sm_80", "sm_89": "sm_89", "sm_90": "sm_90a"}


def kernel_sources(cfg, m: int, arch: str):
    """(choice, CUDA sources) of the kernels that serve ``m`` rows of ``cfg`` on ``arch`` (as ``Matmul``
    picks and builds them: decode-then-GEMM is two kernels)."""
    kc = kernel_config(cfg)
    tgt = cuda_target(TARGETS[arch])
    c = select(kc, "cuda", m, tgt)
    return c, choice_sources(kc, c, tgt)


@pytest.mark.nvcc
@pytest.mark.parametrize("chunk", range(4))
def test_codegen_fuzz(chunk):
    """A quarter of the seeds each: every (seed, arch, row count) gets its kernel's CUDA sources, and
    nvcc (where found) compiles each distinct one within 60 s."""
    nvcc = find_nvcc() is not None
    done, failures = set(), []
    for seed in CODEGEN_FUZZ_SEEDS[chunk::4]:
        rng = random.Random(seed)
        cfg = draw_config(rng)
        for arch in ARCHS:
            for m in row_counts(rng, cfg):
                try:
                    c, sources = kernel_sources(cfg, m, arch)
                    for src in sources:
                        if not nvcc or src in done:
                            continue
                        done.add(src)
                        t0 = time.perf_counter()
                        assert nvcc_compile(src, _NVCC_ARCH[arch])[:4] == b"\x7fELF"
                        assert time.perf_counter() - t0 < 60, f"nvcc took {time.perf_counter() - t0:.0f} s"
                except Exception as e:  # noqa: BLE001 - every failure is collected with its case
                    failures.append(f"seed {seed} {arch} m={m} {cfg}: {type(e).__name__}: {str(e)[:400]}")
    assert not failures, "\n".join(failures)


def test_codegen_fuzz_covers_the_templates():
    """The seeds reach every CUDA template family the selector has for the fuzz's formats (so the
    fuzz is not all the simple kernel): the GEMV rows and mma kernels, the mma GEMM, and on sm_90
    the fused wgmma GEMM and decode-then-GEMM."""
    seen = set()
    for seed in CODEGEN_FUZZ_SEEDS:
        rng = random.Random(seed)
        cfg = draw_config(rng)
        kc = kernel_config(cfg)
        for arch in ARCHS:
            for m in row_counts(rng, cfg):
                seen.add((arch, select(kc, "cuda", m, cuda_target(TARGETS[arch])).template))
    want = {("sm_80", "gemv-rows"), ("sm_80", "gemv-mma"), ("sm_80", "mma"), ("sm_90", "gemv-rows"),
            ("sm_90", "gemv-mma"), ("sm_90", "fused-wgmma"), ("sm_90", DEQUANT_GEMM)}
    assert want <= seen, sorted(want - seen)
