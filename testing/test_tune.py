"""The tuner on the CPU: candidates, the Roller-style cost model, top-k selection, parallel
compilation in spawned workers, the reference check, measuring, two processes tuning at once;
CUDA candidates compiled (code generation only, nvcc for a few) without a GPU."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import time

import pytest

import bitblas
from kernel_helpers import ranked_candidates, H200_SPEC
from bitblas import MatmulConfig
from bitblas.build import cuda_target
from bitblas.hardware import DeviceSpec
from bitblas.plan import make_plan
from bitblas.schedule import (CPUGemvHint, CPUHint, GEMVHint, GEMVKSplitHint, GEMVMmaHint, MMAHint, SimpleCUDAHint,
                              WGMMAHint, cuda_mma)
from bitblas.schedule.gemv.template import chunk_tile
from bitblas.tune import candidates, estimate, select_topk
from bitblas.tune.space import Candidate
from bitblas.tune.tuner import _compile_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

H200 = H200_SPEC
SMALL = DeviceSpec(name="small", arch="sm_80", sm_count=20, smem_per_sm=102400, smem_per_block=49152,
                   regs_per_sm=65536, max_threads_per_sm=1536, max_blocks_per_sm=16, l2_bytes=4 * 2 ** 20,
                   dram_bandwidth=0.5e12, clock_hz=1.5e9)
W4A16 = dict(N=4096, K=4096, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True)


@pytest.fixture
def db_path(tmp_path):
    bitblas.set_database_path(str(tmp_path / "db"))
    yield str(tmp_path / "db")
    bitblas.set_database_path(None)


def _ranked(cfg, bucket, spec):
    return ranked_candidates(cfg, bucket, spec)


# -- candidates ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [H200, SMALL], ids=["h200", "small"])
def test_mma_candidates_fit_the_device(spec):
    cfg = MatmulConfig(M=None, **W4A16)
    cands = [c for c in candidates(cfg, "cuda", 256, spec) if isinstance(c.hint, MMAHint)]
    assert len(cands) > 100
    plan = make_plan(cfg, "cuda", None)
    for c in cands:
        assert c.plan_m is None                           # dynamic M: symbolic kernels
        c.hint.check()
        assert cuda_mma.copy_plan(plan, c.hint) is not None
        assert c.hint.smem_bytes(plan) <= spec.smem_per_block
    # the small device's 48 KB per block rules out the deep, wide tiles the H200 takes
    assert max(c.hint.smem_bytes(plan) for c in cands) <= 49152 or spec is H200
    knobs = {(c.hint.BM, c.hint.BN, c.hint.BK, c.hint.stages, c.hint.vec_decode) for c in cands}
    assert {k[3] for k in knobs} >= {2, 3, 4} and {k[4] for k in knobs} == {4, 8}


def test_candidate_families_by_bucket():
    cfg = MatmulConfig(M=None, **W4A16)
    kinds = lambda b: {type(c.hint).__name__ for c in candidates(cfg, "cuda", b, H200)}  # noqa: E731
    # small buckets: the GEMV kernels (rows, k-split, mma and from 9 rows wgmma GEMV) vs tensor cores
    assert kinds(1) == {"GEMVRowsHint", "GEMVKSplitHint", "GEMVMmaHint", "MMAHint"}
    assert kinds(16) == {"GEMVRowsHint", "GEMVKSplitHint", "GEMVMmaHint", "GEMVWgmmaHint", "MMAHint"}
    # 17..64: only the tensor-core GEMVs (16-row chunks; the wgmma GEMV's classes of 8 rows)
    assert kinds(17) == kinds(64) == {"GEMVMmaHint", "GEMVWgmmaHint", "MMAHint"}
    assert all(c.hint.tensor_cores for c in candidates(cfg, "cuda", 40, H200) if isinstance(c.hint, GEMVHint))
    # past the GEMV: the mma.sync tiles and on sm_90 the fused wgmma GEMM's (the tuner keeps only the
    # latter where the rows run past the GEMV: test_tune_wgmma.py)
    assert kinds(65) == {"MMAHint", "FusedWgmmaHint"}
    gemv = [c for c in candidates(cfg, "cuda", 4, H200) if isinstance(c.hint, GEMVHint)]
    assert all(c.plan_m == 4 for c in gemv)              # GEMV kernels are static in M
    ksplit = [c.hint for c in gemv if isinstance(c.hint, GEMVKSplitHint)]
    assert ksplit and any(h.grid == 4 * 132 for h in ksplit)
    # int8 activations past the GEMV's rows: the int8 tensor-core paths (k32 mma: BK a multiple of 32;
    # wgmma on sm_90), no GEMV
    i8 = MatmulConfig(M=None, N=256, K=256, A_dtype="int8", W_dtype="int8")
    all_i8 = candidates(i8, "cuda", 128, H200)
    assert {type(c.hint) for c in all_i8} == {MMAHint, WGMMAHint}     # wgmma: see test_tune_wgmma.py
    i8_cands = [c for c in all_i8 if isinstance(c.hint, MMAHint)]
    assert len(i8_cands) > 50
    i8_plan = make_plan(i8, "cuda", None)
    assert all(c.hint.BK % 32 == 0 and cuda_mma.copy_plan(i8_plan, c.hint) is not None for c in i8_cands)
    # no tensor-core path (float32 activations): the simple schedule's thread counts
    f32 = MatmulConfig(M=None, N=256, K=256, A_dtype="float32", W_dtype="float16", out_dtype="float32")
    assert {type(c.hint) for c in candidates(f32, "cuda", 64, H200)} == {SimpleCUDAHint}
    # CPU: the GEMV kernel's tiles for float activations (blocks dividing N), else N tile x K
    # vector width dividing K
    cpu = candidates(MatmulConfig(M=None, N=40, K=96, A_dtype="float16", W_dtype="int4"), "cpu", 8)
    assert {type(c.hint) for c in cpu} == {CPUGemvHint} and {c.hint.block for c in cpu} == {8}
    assert all(c.hint.check(make_plan(MatmulConfig(M=None, N=40, K=96, A_dtype="float16", W_dtype="int4"), "cpu"))
               is None for c in cpu)
    cpu = candidates(MatmulConfig(M=None, N=256, K=96, A_dtype="int8", W_dtype="int4"), "cpu", 8)
    assert {type(c.hint) for c in cpu} == {CPUHint} and {c.hint.k_vec for c in cpu} == {1, 4, 8, 16, 32}


def test_static_m_plans():
    c = candidates(MatmulConfig(M=512, **W4A16), "cuda", 512, H200)
    assert {x.plan_m for x in c} == {512}                # int M > 16: kernels specialised to it
    c = candidates(MatmulConfig(M=8, **W4A16), "cuda", 8, H200)
    assert {x.plan_m for x in c if isinstance(x.hint, MMAHint)} == {None}
    assert {x.plan_m for x in c if isinstance(x.hint, GEMVHint)} == {8}


# -- cost model ----------------------------------------------------------------------------------------
def test_cost_model_prefers_big_tiles_for_big_m_and_few_blocks_waste_sms():
    cfg = MatmulConfig(M=None, **W4A16)
    plan = make_plan(cfg, "cuda", None)
    big = MMAHint(BM=128, BN=128, BK=64, WM=64, WN=64, stages=3)
    tiny = MMAHint(BM=16, BN=32, BK=32, WM=16, WN=16, stages=3)
    # m=4096: a 16x32 tile re-decodes the weights 256x and reads A from L2 128x
    assert estimate(plan, big, 4096, H200) < estimate(plan, tiny, 4096, H200) / 2
    # m=32: a 128-row tile wastes 3/4 of its tensor-core work and leaves most SMs idle
    best32 = next(c.hint for c in _ranked(cfg, 32, H200) if isinstance(c.hint, MMAHint))
    assert best32.BM <= 64
    # wave quantisation: with one block per SM, 133 blocks take two waves on 132 SMs, 132 blocks one
    narrow = make_plan(cfg.replace(N=128), "cuda", None)
    one_per_sm = DeviceSpec(**{**H200.to_dict(), "max_blocks_per_sm": 1})
    assert estimate(narrow, big, 128 * 133, one_per_sm) > 1.5 * estimate(narrow, big, 128 * 132, one_per_sm)
    assert estimate(narrow, big, 128 * 132, one_per_sm) < 1.1 * estimate(narrow, big, 128 * 131, one_per_sm)


def test_cost_model_occupancy_and_memory():
    cfg = MatmulConfig(M=None, **W4A16)
    plan = make_plan(cfg, "cuda", None)
    h = MMAHint(BM=256, BN=128, BK=64, WM=64, WN=64, stages=4)
    assert h.smem_bytes(plan) > SMALL.smem_per_sm
    assert math.isinf(estimate(plan, h, 1024, SMALL))   # does not fit an SM: never chosen
    # GEMV: deeper loads in flight help until DRAM latency is covered; more bandwidth is faster
    g = make_plan(cfg.replace(M=1), "cuda", 1)
    shallow = GEMVHint(rows_per_warp=1, warps=2, unroll=1, vec_bytes=4)
    deep = GEMVHint(rows_per_warp=2, warps=4, unroll=4, vec_bytes=16)
    assert estimate(g, deep, 1, H200) < estimate(g, shallow, 1, H200)
    fast = DeviceSpec(**{**H200.to_dict(), "dram_bandwidth": 9.6e12})
    assert estimate(g, deep, 1, fast) < estimate(g, deep, 1, H200)


def test_select_topk_diversity():
    cfg = MatmulConfig(M=None, **W4A16)
    ranked = _ranked(cfg, 16, H200)
    top = select_topk(ranked, 20)
    assert len(top) == 20 and top == sorted(top, key=lambda c: c.cost)
    shapes = {}
    for c in top:
        k = (type(c.hint).__name__,) + ((c.hint.BM, c.hint.BN, c.hint.BK, c.hint.WM, c.hint.WN)
                                        if isinstance(c.hint, MMAHint) else
                                        (c.hint.rows_per_warp, getattr(c.hint, "warps", 0), getattr(c.hint, "k_warps", 0)))
        shapes[k] = shapes.get(k, 0) + 1
    assert max(shapes.values()) <= 2
    assert sum(isinstance(c.hint, GEMVHint) for c in top) >= 5                # both paths measured
    assert sum(isinstance(c.hint, MMAHint) for c in top) >= 5
    with pytest.raises(ValueError, match="topk"):
        select_topk(ranked, 0)


# -- compile, check, measure -----------------------------------------------------------------------------
def test_tune_cpu_parallel_end_to_end(db_path):
    cfg = MatmulConfig(M=[3, 24], N=192, K=256, A_dtype="float16", W_dtype="int4", group_size=64, with_scaling=True,
                       with_bias=True)
    op = bitblas.Matmul(cfg, target="llvm")
    res = op.hardware_aware_finetune(topk=3, parallel_build=True, progress=False)
    assert set(res) == {3, 24}
    for b, r in res.items():
        assert isinstance(r.hint, (CPUHint, CPUGemvHint)) and r.latency_ms > 0 and r.default_latency_ms > 0
        assert r.latency_ms <= min(c["ms"] for c in r.candidates if c["ok"]) + 1e-12
        assert any(c["default"] for c in r.candidates)      # the default is always measured
        assert sum(c["ok"] for c in r.candidates) >= 3
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    for m in (1, 3, 4, 24, 25, 77):
        inp = random_inputs(cfg, m)
        assert relative_error(op(**inp), reference_matmul(cfg, **inp)) <= tolerance(cfg)
    assert op.profile_latency(m=24) > 0


def test_failed_and_wrong_candidates_are_dropped(db_path, monkeypatch, caplog):
    """A candidate that does not build is recorded with its error; one that computes a wrong result
    is rejected by the reference check; the winner comes from the rest."""
    from bitblas.tune import tuner
    cfg = MatmulConfig(M=8, N=64, K=128, A_dtype="float16", W_dtype="int8", with_scaling=True)
    good = CPUHint(n_tile=16, k_vec=16)
    bad_build = CPUHint(n_tile=-4, k_vec=16)       # a negative split: the schedule raises
    wrong = CPUHint(n_tile=32, k_vec=16)
    monkeypatch.setattr(tuner, "candidates", lambda *a, **k: [Candidate(8, h) for h in (good, bad_build, wrong)])
    real = tuner._compile_all

    def compile_then_break(config, kind, cands, *a):
        out = real(config, kind, cands, *a)
        for c, r in zip(cands, out):
            if c.hint == wrong and r["ok"]:
                mod, fn = r["entry"]
                r["entry"] = (mod, lambda *args: (fn(*args), args[-1].mul_(1.5)))
        return out
    monkeypatch.setattr(tuner, "_compile_all", compile_then_break)
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        res = tuner.tune_bucket(cfg, "cpu", 8, topk=5, parallel=False)
    rows = {json.dumps(c["hint"], sort_keys=True): c for c in res.candidates}
    from bitblas.schedule import hint_to_dict
    key = lambda h: json.dumps(hint_to_dict(h), sort_keys=True)  # noqa: E731
    assert not rows[key(bad_build)]["ok"] and rows[key(bad_build)]["error"]
    assert not rows[key(wrong)]["ok"] and "wrong result" in rows[key(wrong)]["error"]
    assert "wrong result" in caplog.text
    assert res.hint != wrong and res.hint != bad_build


def test_cpu_tuning_is_bounded(db_path, monkeypatch, caplog):
    """Every default bucket (1..4096) of a CPU operator with a tiny time budget: each bucket measures
    only its default kernel (the rest are listed as not reached), on at most 64 rows; buckets past
    64 rows reuse that measurement; the run compiles the one kernel once. Progress reaches the log
    although stderr is not a terminal."""
    import bitblas.build as bb
    compiles = []
    real = bb.compile_plan
    monkeypatch.setattr(bb, "compile_plan", lambda *a, **k: (compiles.append(a[2] if len(a) > 2 else k.get("hint")),
                                                             real(*a, **k))[1])
    cfg = MatmulConfig(M=None, N=64, K=256, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True,
                       with_zeros=True)
    op = bitblas.Matmul(cfg, target="llvm")
    t0 = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="bitblas"):
        res = op.hardware_aware_finetune(topk=6, parallel_build=False, time_budget_s=0.001)
    took = time.perf_counter() - t0
    assert sorted(res) == [1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    for b, r in res.items():
        assert r.measured_rows == min(b, 64)
        assert [c["ok"] for c in r.candidates] == [True] + [False] * (len(r.candidates) - 1)
        assert r.candidates[0]["default"] and len(r.candidates) > 1
        assert all(c["error"] == "not measured: time budget" for c in r.candidates[1:])
        assert r.latency_ms == r.default_latency_ms > 0
    assert all(res[b].seconds == 0.0 and res[b].latency_ms == res[64].latency_ms for b in (128, 1024, 4096))
    assert len(compiles) == 1                   # the default kernel, once for all ten buckets
    assert took < 120
    assert "time budget of 0.001 s reached after 1 of" in caplog.text
    assert "tuning float16xuint4 N=64 K=256 (cpu, 10 M buckets): started" in caplog.text
    assert " - done" in caplog.text
    # a second operator loads every bucket from the database
    res2 = bitblas.Matmul(cfg, target="llvm").hardware_aware_finetune(topk=6, progress=False)
    assert all(r.from_cache and r.measured_rows == min(b, 64) for b, r in res2.items())


def test_tuning_progress_off_a_terminal_goes_to_stderr_when_info_is_off(db_path, capsys):
    """No logging configured, stderr not a terminal (captured): the progress lines are printed to
    stderr; progress=False prints nothing."""
    from bitblas.tune import tuner
    cfg = MatmulConfig(M=4, N=64, K=128, A_dtype="float16", W_dtype="int8", with_scaling=True)
    assert not logging.getLogger("bitblas.tune.tuner").isEnabledFor(logging.INFO)
    tuner.tune(cfg, "cpu", [4], topk=2, parallel=False)
    err = capsys.readouterr().err
    assert "[bitblas] tuning float16xint8 N=64 K=128 (cpu, 1 M buckets): started" in err
    assert " - done" in err
    tuner.tune(cfg.replace(N=32), "cpu", [4], topk=2, parallel=False, progress=False)
    assert "[bitblas]" not in capsys.readouterr().err


@pytest.mark.parametrize("kw, name", [(dict(time_budget_s=-1), "time_budget_s"),
                                      (dict(time_budget_s="1"), "time_budget_s"),
                                      (dict(max_measure_rows=0), "max_measure_rows"),
                                      (dict(max_measure_rows=2.5), "max_measure_rows")])
def test_tuning_bounds_validation(kw, name):
    op = bitblas.Matmul(MatmulConfig(M=4, N=64, K=64, A_dtype="float16", W_dtype="int8"), target="llvm")
    with pytest.raises(ValueError, match=name):
        op.hardware_aware_finetune(kind="cpu", **kw)
    with pytest.raises(TypeError, match="budget"):
        op.hardware_aware_finetune(kind="cpu", budget=3)


def test_topk_validation():
    op = bitblas.Matmul(MatmulConfig(M=4, N=64, K=64, A_dtype="float16", W_dtype="int8"), target="llvm")
    with pytest.raises(ValueError, match="topk"):
        op.hardware_aware_finetune(topk=0)
    with pytest.raises(ValueError, match="kind"):
        op.hardware_aware_finetune(kind="tpu")


_TUNER = """
    import json, sys
    import bitblas
    from bitblas import MatmulConfig
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    cfg = MatmulConfig.from_dict(json.loads({cfg!r}))
    op = bitblas.Matmul(cfg, target="llvm")
    res = op.hardware_aware_finetune(topk=3, parallel_build=False, progress=False)
    inp = random_inputs(cfg, 5)
    err = relative_error(op(**inp), reference_matmul(cfg, **inp))
    print(json.dumps({{"cached": {{str(b): r.from_cache for b, r in res.items()}}, "ok": err <= tolerance(cfg),
                      "hints": {{str(b): str(r.hint) for b, r in res.items()}}}}))
"""


def test_two_processes_tuning_the_same_operator(db_path):
    """Both finish with correct results; the per-key lock makes one tune each bucket and the other
    load it; the database holds exactly one valid result per bucket."""
    cfg = MatmulConfig(M=[2, 16], N=128, K=256, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True, with_zeros=True)
    code = textwrap.dedent(_TUNER.format(cfg=json.dumps(cfg.to_dict())))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), BITBLAS_DATABASE_PATH=db_path)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    res = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert all(r["ok"] for r in res)
    for b in ("2", "16"):
        assert sorted(r["cached"][b] for r in res) == [False, True]     # tuned once, loaded once
        assert res[0]["hints"][b] == res[1]["hints"][b]
    tuning = bitblas.cache.list_entries("tuning")
    assert sorted(e["m"] for e in tuning) == [2, 16]


# -- CUDA candidates without a GPU: code generation ------------------------------------------------------
def test_cuda_topk_compiles_in_workers(tmp_path):
    """The top of the ranking for a W4A16 bucket compiles in the spawned workers (CUDA code
    generation: without libcuda tvm.compile stops at the source)."""
    cfg = MatmulConfig(M=None, **W4A16)
    top = select_topk(_ranked(cfg, 128, H200), 4)
    tgt = cuda_target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": H200.smem_per_block})
    res = _compile_all(cfg, "cuda", top, tgt, True, None, str(tmp_path))
    for r in res:
        # built and exported by a worker; loading needs the CUDA runtime, absent on a machine without GPU
        assert r["path"] and os.path.getsize(r["path"]) > 0, r["error"]
        assert r["ok"] or r["error"].startswith("load:"), r["error"]
        assert r["seconds"] > 0.05


@pytest.mark.nvcc
def test_cuda_top_candidates_nvcc(tmp_path):
    from bitblas.build import cuda_source, find_nvcc, nvcc_compile
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    tgt = cuda_target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": H200.smem_per_block})
    cfg = MatmulConfig(M=None, **W4A16)
    for bucket in (1, 256):
        best = _ranked(cfg, bucket, H200)[0]
        src = cuda_source(make_plan(cfg, "cuda", best.plan_m), tgt, best.hint)
        assert len(nvcc_compile(src, arch="sm_90")) > 1000


def test_device_spec_without_a_gpu():
    import torch
    from bitblas.hardware import query_device
    tgt = cuda_target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 232448})
    spec = DeviceSpec.from_target(tgt)
    assert spec.source == "target" and spec.arch == "sm_90" and spec.smem_per_block == 232448 and spec.cc == 90
    assert DeviceSpec.from_dict(spec.to_dict()) == spec
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="GPU"):
            query_device()
        op = bitblas.Matmul(MatmulConfig(M=16, **W4A16), target="sm_90")
        with pytest.raises(RuntimeError, match="GPU"):
            op.hardware_aware_finetune(kind="cuda")


def test_cost_model_chunk_loop():
    """17..64 rows: the chunk loop streams and decodes the weights once for every 16-row chunk, so it
    ranks above the same tile run as a block per chunk; 16 channels per warp rank below 32 (each
    block reads the activations of all rows), 64 channels per warp leave too few warps per SM at
    N=8192 (H200: W4A16 64 rows 45.5 vs 53.8 us a block per chunk, 16 channels 83.7; 32 rows, 64
    channels 37.7 vs 24.8)."""
    cfg = MatmulConfig(M=64, N=8192, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True)
    plan = make_plan(cfg, "cuda", 64)

    def cost(R, kw, loop):
        return estimate(plan, GEMVHint(rows_per_warp=R, k_warps=kw, unroll=2, stages=1, mma=True, min_blocks=1,
                                       chunk_loop=loop), 64, H200)
    assert cost(32, 4, True) < cost(32, 4, False)
    assert cost(32, 4, True) < cost(16, 8, True) < math.inf
    # 64 channels per warp: 128 blocks of 4 warps at N=8192, one per SM, too few warps to keep L1 busy
    assert cost(32, 4, True) < cost(64, 4, True) < math.inf
    # L1 load wavefronts: vectors of 16 codes (a lane's activations span 32 bytes, one line per
    # token row and load) rank above 32 codes (H200: 36.1 vs 45.5 us; 2-bit 34.5 vs 81.4)
    for w, vb in (("uint4", 8), ("int2", 4)):
        p = make_plan(MatmulConfig(M=64, N=8192, K=8192, A_dtype="float16", W_dtype=w, group_size=128,
                                   with_scaling=True), "cuda", 64)
        span = GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=32 // vb, stages=1, min_blocks=1, chunk_loop=True,
                           vec_bytes=vb)
        wide = GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=2, stages=1, min_blocks=1, chunk_loop=True,
                           vec_bytes=16)
        assert estimate(p, span, 64, H200) < estimate(p, wide, 64, H200), w
        # the default tile is in the tuner's space (with programmatic dependent launch on sm_90)
        default = dataclasses.replace(chunk_tile(p), pdl=True)
        assert default in [c.hint for c in candidates(p.config, "cuda", 64, H200)], w
    # N=28672, 32 rows: 64 channels per warp (448 blocks, 8 warps per SM) rank above 32 (H200: 79.7
    # vs 92.6 us); chunk_tile takes them there
    p28 = make_plan(MatmulConfig(M=32, N=28672, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128,
                                 with_scaling=True), "cuda", 32)
    t28 = chunk_tile(p28)
    assert t28.rows_per_warp == 64
    assert estimate(p28, t28, 32, H200) < estimate(p28, dataclasses.replace(t28, rows_per_warp=32), 32, H200)
    # 16 rows or fewer: the flag changes nothing
    p16 = make_plan(cfg, "cuda", 16)
    h = GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=2, stages=1, min_blocks=1)
    assert estimate(p16, h, 16, H200) == estimate(p16, dataclasses.replace(h, chunk_loop=True), 16, H200)


def test_topk_includes_staged_rows():
    """Bucket 1: the rows kernel with a staged activation row is a template family of its own in the
    top-k (the cost model ranks it low), the default staged tile included."""
    from bitblas.schedule import GEMVRowsHint
    from bitblas.tune.tuner import select_topk
    cfg = MatmulConfig(M=None, N=8192, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True)
    ranked = ranked_candidates(cfg, 1, H200)
    staged = [c for c in ranked if isinstance(c.hint, GEMVRowsHint) and c.hint.act_smem]
    # 2/4/8 channels x 4/8 warps x 1-3 steps in flight under 4 blocks per SM; 4 channels with more registers;
    # the two wave tiles (nvfp4 x float16's defaults where they fill a wave)
    assert len(staged) == 22, len(staged)
    assert {(h.rows_per_warp, h.warps, h.stages, h.min_blocks) for h in (c.hint for c in staged)} >= {
        (4, 8, 3, 2), (4, 16, 2, 1), (2, 32, 3, 1), (1, 16, 3, 2)}
    top = select_topk(ranked, 12)
    top_staged = [c.hint for c in top if isinstance(c.hint, GEMVRowsHint) and c.hint.act_smem]
    assert len(top_staged) >= 3, [c.hint for c in top]
    assert any(not (isinstance(c.hint, GEMVRowsHint) and c.hint.act_smem) for c in top)
