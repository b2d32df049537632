"""Tuning, dynamic-M dispatch and the kernel cache on a CUDA GPU (skipped without one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
W4A16 = dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True)


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("gpu_db"))
    bitblas.set_database_path(p)
    yield p
    bitblas.set_database_path(None)


def test_device_spec_is_read_from_the_device():
    from bitblas.hardware import query_device
    spec = query_device()
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert spec.source == "device" and spec.arch == f"sm_{p.major}{p.minor}"
    assert spec.sm_count == p.multi_processor_count and spec.l2_bytes > 0
    assert spec.dram_bandwidth > 1e11 and spec.smem_per_block >= 48 * 1024 and spec.clock_hz > 1e8


@pytest.fixture(scope="module")
def tuned(db_path):
    cfg = MatmulConfig(M=[1, 16, 48, 256], N=1024, K=2048, **W4A16)
    op = bitblas.Matmul(cfg)
    res = op.hardware_aware_finetune(topk=6, progress=False)
    return cfg, op, res


def test_tuned_dynamic_operator_every_m(tuned):
    cfg, op, res = tuned
    assert set(res) == {1, 16, 48, 256}
    for b, r in res.items():
        if r.skipped:   # sm_90, past the GEMV's 64 rows: decode + wgmma GEMM measured faster than the fused tiles
            assert torch.cuda.get_device_capability() == (9, 0) and b > 64 and "measured fastest" in r.skipped
            assert r.hint is None and r.latency_ms > 0 and r.candidates[0].get("template") == "dequant-gemm"
            continue
        if b > 64 and torch.cuda.get_device_capability() == (9, 0):    # a fused tile won over the untuned choice
            assert type(r.hint).__name__ == "FusedWgmmaHint" and op.choice("cuda", b).tuned
        assert r.latency_ms > 0 and r.default_latency_ms > 0
        assert r.latency_ms <= r.default_latency_ms * 1.10     # the default is among the measured
    for m in [1, 2, 3, 7, 15, 16, 17, 33, 48, 49, 100, 256, 257, 1000]:
        inp = random_inputs(cfg, m, device="cuda")
        out = torch.full((m, cfg.N), float("nan"), dtype=torch.float16, device="cuda")
        op(**inp, output=out)
        assert relative_error(out, reference_matmul(cfg, **inp)) <= tolerance(cfg), m


def test_profile_latency_is_a_stable_median(tuned):
    _, op, _ = tuned
    a, b = op.profile_latency(m=256), op.profile_latency(m=256)
    assert 0 < a < 10 and abs(a - b) / a < 0.25


_LOAD = """
    import json, time
    t_import = time.perf_counter()
    import bitblas, torch
    from bitblas import MatmulConfig
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    import bitblas.build as b
    calls = []
    orig = b.compile_plan
    b.compile_plan = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    cfg = MatmulConfig.from_dict(json.loads({cfg!r}))
    torch.cuda.init()
    t0 = time.perf_counter()
    op = bitblas.Matmul(cfg, enable_tuning=True)
    dt = time.perf_counter() - t0
    inp = random_inputs(cfg, 20, device="cuda")
    err = relative_error(op(**inp), reference_matmul(cfg, **inp))
    print(json.dumps({{"seconds": dt, "compiles": len(calls), "ok": err <= tolerance(cfg),
                      "cached": all(r.from_cache for r in op.tuning_results["cuda"].values()
                                    if r.latency_ms is not None)}}))
"""


def test_second_process_loads_tuned_operator_without_compiling(tuned, db_path):
    cfg, _, _ = tuned
    env = dict(os.environ, BITBLAS_DATABASE_PATH=db_path,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD.format(cfg=json.dumps(cfg.to_dict())))],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cached"] and out["ok"] and out["compiles"] == 0, out
    assert out["seconds"] <= 1.0, out


def test_untuned_cuda_kernels_are_cached_on_disk(db_path):
    from bitblas.cache import kernels
    cfg = MatmulConfig(M=None, N=512, K=1024, **W4A16)
    op = bitblas.Matmul(cfg)
    inp = random_inputs(cfg, 100, device="cuda")     # past the GEMV's rows: a kernel symbolic in M
    op(**inp)
    recs = [e for e in bitblas.cache.list_entries("kernel") if e["config"]["N"] == 512 and e["m"] is None]
    assert recs, "the default CUDA kernel was not written to the database"
    kernels.clear_memory()
    op2 = bitblas.Matmul(cfg)
    import bitblas.build as b
    orig, calls = b.compile_plan, []
    b.compile_plan = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    try:
        assert relative_error(op2(**inp), reference_matmul(cfg, **inp)) <= tolerance(cfg)
    finally:
        b.compile_plan = orig
    assert not calls
