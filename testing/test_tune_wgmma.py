"""The tuner on Hopper (CPU only): WGMMAHint candidates, their cost model against the H200 tile
table measured on the H200 (MEASURED below), top-k, the bucket's default, and the buckets left to decode-then-GEMM.

    python -m pytest testing/test_tune_wgmma.py
"""
from __future__ import annotations

import math

import pytest

import bitblas
from bitblas import MatmulConfig
from bitblas.build import cuda_source, cuda_target, find_nvcc, nvcc_compile
from bitblas.dispatch import DEFAULT_BUCKETS
from bitblas.hardware import DeviceSpec
from bitblas.plan import make_plan
from bitblas.schedule import GEMVHint, MMAHint, WGMMAHint
from bitblas.schedule.cuda_wgmma import _S8_N
from bitblas.tune import candidates, estimate, select_topk, tuner
from kernel_helpers import ranked_candidates, A100_SPEC, H200_SPEC, TARGETS, choose, past_gemv

H200 = H200_SPEC
L40S = DeviceSpec(name="test sm_89", arch="sm_89", sm_count=142, smem_per_sm=102400, smem_per_block=101376,
                  regs_per_sm=65536, max_threads_per_sm=1536, max_blocks_per_sm=24, l2_bytes=96 * 2 ** 20,
                  dram_bandwidth=0.86e12, clock_hz=2.52e9)
E4 = "float8_e4m3"
DENSE = {
    "f16": dict(A_dtype="float16", W_dtype="float16"),
    "bf16": dict(A_dtype="bfloat16", W_dtype="bfloat16", out_dtype="bfloat16"),
    "i8": dict(A_dtype="int8", W_dtype="int8", out_dtype="int32", accum_dtype="int32"),
    "e4m3": dict(A_dtype=E4, W_dtype=E4, out_dtype="float16", with_scaling=True, group_size=-1),
}
W4A16 = dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True)


@pytest.fixture
def db_path(tmp_path):
    bitblas.set_database_path(str(tmp_path / "db"))
    yield str(tmp_path / "db")
    bitblas.set_database_path(None)


def _ranked(cfg, bucket, spec=H200):
    return ranked_candidates(cfg, bucket, spec)


def _wgmma(cands):
    return [c for c in cands if isinstance(c.hint, WGMMAHint)]


# -- candidates ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fam", list(DENSE))
@pytest.mark.parametrize("M", [None, 4096])
def test_wgmma_candidates_on_sm90(fam, M):
    cfg = MatmulConfig(M=M, N=4096, K=4096, **DENSE[fam])
    cands = _wgmma(candidates(cfg, "cuda", 4096, H200))
    assert cands
    for c in cands:
        assert c.plan_m == M                                # as the mma.sync kernels: static for an int M > 16
        plan = make_plan(cfg, "cuda", c.plan_m)
        c.hint.check(plan)
        assert c.hint.smem_bytes(plan) <= H200.smem_per_block
        assert c.hint.group_m == 8
    hints = [c.hint for c in cands]
    bns = {h.BN for h in hints}
    assert bns == ({64, 128, 192} if fam == "i8" else {64, 128, 192, 256})
    assert fam != "i8" or bns <= set(_S8_N)
    assert {h.consumers for h in hints} == {1, 2} and {h.persistent for h in hints} == {True, False}
    assert min(h.stages for h in hints) == 2 and max(h.stages for h in hints) == 8
    # every ring depth that fits: the 128 x 256 ring (48 KB per stage) stops at 4 stages in 227 KB
    if fam != "i8":
        assert max(h.stages for h in hints if (h.BM, h.BN) == (128, 256)) == 4
    assert {h.stages for h in hints if (h.BM, h.BN) == (64, 64)} == set(range(2, 9))


def test_wgmma_candidates_follow_the_device_smem():
    cfg = MatmulConfig(M=None, N=4096, K=4096, **DENSE["f16"])
    small = DeviceSpec(**{**H200.to_dict(), "smem_per_block": 100 * 1024})
    hints = [c.hint for c in _wgmma(candidates(cfg, "cuda", 256, small))]
    assert hints and all(h.smem_bytes() <= 100 * 1024 for h in hints)
    assert max(h.stages for h in hints if (h.BM, h.BN) == (128, 256)) == 2


@pytest.mark.parametrize("spec", [A100_SPEC, L40S], ids=["sm80", "sm89"])
@pytest.mark.parametrize("fam", ["f16", "i8"])
def test_no_wgmma_candidates_below_sm90(spec, fam):
    cfg = MatmulConfig(M=None, N=4096, K=4096, **DENSE[fam])
    cands = candidates(cfg, "cuda", 4096, spec)
    assert cands and not _wgmma(cands)


def test_no_wgmma_candidates_for_decoded_weights():
    cands = candidates(MatmulConfig(M=None, N=4096, K=4096, **W4A16), "cuda", 256, H200)
    assert cands and not _wgmma(cands)                    # the weights need a decode: mma.sync only


# -- cost model against the H200 table ---------------------------------------------------------------
# measured on the H200 (fp16, N=K=4096, µs; the run is recorded in the old diary, `git show 3f6ff3c:docs/benchmarks.md`,
# "Tiles for fewer rows"): the four tile classes with the
# stages WGMMAHint.default gives them, and the measured time where there is one
TILES = {"128x256": WGMMAHint(BN=256, stages=4), "128x128": WGMMAHint(BN=128, stages=6),
         "64x128": WGMMAHint(BN=128, stages=6, consumers=1), "64x64": WGMMAHint(BN=64, stages=8, consumers=1)}
MEASURED = {
    32: {"64x128": 19.9, "64x64": 15.2},
    64: {"64x128": 20.7, "64x64": 15.2},
    128: {"128x256": 45.6, "128x128": 25.9, "64x128": 20.7, "64x64": 15.5},
    256: {"128x256": 46.4, "128x128": 25.9, "64x128": 21.7},
    512: {"128x256": 47.3, "128x128": 31.6, "64x128": 40.8},
    1024: {"128x256": 57.7, "128x128": 62.9, "64x128": 85.7},
    2048: {"128x256": 122.2, "128x128": 126.2, "64x128": 170.0},
}
F16 = MatmulConfig(M=None, N=4096, K=4096, **DENSE["f16"])


@pytest.mark.parametrize("m", list(MEASURED))
def test_wgmma_cost_orders_the_measured_tiles(m):
    """Among the tiles measured at ``m``, the estimate's fastest is the measured fastest, and the
    estimates land within 35% of the measurements from 128 rows up."""
    plan = make_plan(F16, "cuda", None)
    est = {k: estimate(plan, TILES[k], m, H200) * 1e6 for k in MEASURED[m]}
    assert min(est, key=est.get) == min(MEASURED[m], key=MEASURED[m].get), est
    if m >= 128:
        for k, us in MEASURED[m].items():
            assert abs(est[k] - us) / us < 0.35, (k, est[k], us)


@pytest.mark.parametrize("m,tile", [(32, (64, 64)), (64, (64, 64)), (128, (64, 64)), (512, (128, 128)),
                                    (1024, (128, 256)), (2048, (128, 256)), (4096, (128, 256))])
def test_wgmma_ranking_picks_the_measured_tile_class(m, tile):
    """Over every WGMMA candidate (all BN, warpgroups, stages, persistence), the best estimate
    has the tile class that measured fastest at ``m`` on the H200."""
    best = _wgmma(_ranked(F16, m))[0].hint
    assert (best.BM, best.BN) == tile, best


def test_wgmma_cost_knobs():
    plan = make_plan(F16, "cuda", None)
    # two stages: nothing is fetched ahead of the two slots the consumers hold
    assert estimate(plan, WGMMAHint(BN=128, stages=2), 1024, H200) > 1.3 * estimate(plan, WGMMAHint(BN=128, stages=5),
                                                                                  1024, H200)
    # memory-bound small tiles want a deep ring; deeper never estimates slower
    est = [estimate(plan, WGMMAHint(BN=64, stages=s, consumers=1), 128, H200) for s in range(2, 9)]
    assert est == sorted(est, reverse=True) and est[1] > est[-1]
    # persistent CTAs save the refill on every later tile; one tile per SM: no difference
    p, np_ = WGMMAHint(BN=128, stages=6), WGMMAHint(BN=128, stages=6, persistent=False)
    assert estimate(plan, p, 4096, H200) < estimate(plan, np_, 4096, H200)
    assert estimate(plan, p, 512, H200) == estimate(plan, np_, 512, H200)
    # 8-bit inputs: twice the tensor rate
    i8 = make_plan(MatmulConfig(M=None, N=4096, K=4096, **DENSE["i8"]), "cuda", None)
    assert estimate(i8, p, 4096, H200) < 0.6 * estimate(plan, p, 4096, H200)
    # not a Hopper device, or a ring that does not fit: never chosen
    assert math.isinf(estimate(plan, p, 4096, A100_SPEC))
    assert math.isinf(estimate(plan, WGMMAHint(BN=256, stages=4), 4096,
                               DeviceSpec(**{**H200.to_dict(), "smem_per_block": 100 * 1024})))


def test_topk_on_sm90_includes_wgmma():
    ranked = _ranked(MatmulConfig(M=None, N=4096, K=4096, **DENSE["f16"]), 4096)
    assert isinstance(ranked[0].hint, WGMMAHint)            # compute-bound: wgmma ahead of mma.sync
    top = select_topk(ranked, 20)
    wg = [c.hint for c in top if isinstance(c.hint, WGMMAHint)]
    assert len(wg) >= 5 and any(isinstance(c.hint, MMAHint) for c in top)
    shapes = [(h.BM, h.BN) for h in wg]
    assert max(shapes.count(s) for s in shapes) <= 2        # tile shape = (BM, BN): stages etc. are knobs
    assert len(set(shapes)) >= 3


def test_tune_bucket_default_is_the_rows_tile_class(monkeypatch):
    """The always-measured default of a wgmma bucket is what an untuned operator runs for those
    rows (Matmul._wgmma_for_rows), not the symbolic plan's 128 x 256 tile."""
    seen = {}

    class Stop(Exception):
        pass

    def record(config, kind, cands, *a):
        seen["cands"] = cands
        raise Stop

    monkeypatch.setattr(tuner, "_compile_all", record)
    tgt = cuda_target(TARGETS["sm_90"])
    op = bitblas.Matmul(F16, target=TARGETS["sm_90"])
    for bucket in (128, 4096):
        with pytest.raises(Stop):
            tuner.tune_bucket(F16, "cuda", bucket, target=tgt, spec=H200, topk=4, parallel=False)
        untuned = choose(op, "cuda", bucket)
        assert untuned[0] is None and isinstance(untuned[1], WGMMAHint)
        assert any(c.hint == untuned[1] and c.plan_m is None for c in seen["cands"]), (bucket, untuned)


# -- buckets served by decode-then-GEMM ----------------------------------------------------------------
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("fmt", ["w4a16", "nf4", "f16"])
def test_composite_buckets_match_untuned_dispatch(target, fmt):
    """The tuner skips exactly the buckets an untuned operator runs as decode + wgmma GEMM."""
    kw = {"w4a16": W4A16, "nf4": dict(A_dtype="float16", W_dtype="nf4", group_size=128, with_scaling=True),
          "f16": DENSE["f16"]}[fmt]
    cfg = MatmulConfig(M=None, N=1024, K=1024, **kw)
    op = bitblas.Matmul(cfg, target=TARGETS[target])
    for b in DEFAULT_BUCKETS:
        skip = tuner.composite_serves(cfg, "cuda", b, op.target)
        composite = choose(op, "cuda", b)[1]
        assert (skip is not None) == past_gemv(composite), (b, skip, composite)
        assert (skip is not None) == (target == "sm_90" and fmt != "f16" and b > 64), b   # <= 64: the GEMV
    # a static M above the GEMV's rows takes the same path (test_dequant_gemm), so is skipped alike
    static = cfg.replace(M=256)
    assert (tuner.composite_serves(static, "cuda", 256, op.target) is not None) == (target == "sm_90" and fmt != "f16")
    assert tuner.composite_serves(cfg, "cpu", 256) is None


def test_tuner_skips_composite_buckets_and_dispatch_keeps_them(db_path, monkeypatch):
    """On sm_90 a W4A16 operator with buckets (1, 16, 48, 256): 1, 16 and 48 (the GEMV's rows, its
    tensor-core kernel in chunks of 16 above 16 rows) are tuned; 256 is reported skipped, gets no
    tuned entry, and keeps decode + wgmma GEMM for its rows."""
    import torch
    import bitblas.hardware
    cfg = MatmulConfig(M=[1, 16, 48, 256], N=1024, K=1024, **W4A16)
    h = GEMVHint(rows_per_warp=1, warps=4, unroll=2)
    hm = GEMVHint(rows_per_warp=32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2)
    tuned_buckets = []

    def fake_tune_bucket(config, kind, bucket, *a, **k):
        tuned_buckets.append(bucket)
        return tuner.TuneResult(bucket, bucket, h if bucket <= 16 else hm, 0.01, 0.02, 0.0, False)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bitblas.hardware, "query_device", lambda *a: H200)
    monkeypatch.setattr(tuner, "tune_bucket", fake_tune_bucket)
    monkeypatch.setattr(tuner, "_store", lambda *a, **k: None)
    monkeypatch.setattr(tuner, "_gemv_rows", lambda *a, **k: None)
    op = bitblas.Matmul(cfg, target=TARGETS["sm_90"])
    loaded = []
    monkeypatch.setattr(op, "_kernel", lambda kind, rows: loaded.append(rows))
    res = op.hardware_aware_finetune(kind="cuda", progress=False)
    assert sorted(res) == [1, 16, 48, 256] and tuned_buckets == [1, 16, 48] and sorted(loaded) == [1, 16, 48]
    assert res[256].skipped and "decode" in res[256].skipped and res[256].hint is None
    assert res[256].latency_ms is None and res[256].speedup is None
    assert res[1].skipped is None and res[16].skipped is None and res[48].skipped is None
    assert set(op._tuned["cuda"]) == {1, 16, 48}
    assert choose(op, "cuda", 16) == (16, h) and choose(op, "cuda", 5) == (5, h)
    # the tensor-core GEMV takes its row count at run time: one kernel per class (17..32, 33..48)
    assert choose(op, "cuda", 17) == (32, hm) and choose(op, "cuda", 33) == (48, hm)
    assert choose(op, "cuda", 48) == (48, hm)
    assert choose(op, "cuda", 64) == (64, None)          # past the last GEMV bucket: the default GEMV
    for rows in (65, 100, 256, 5000):
        m, choice = choose(op, "cuda", rows)
        assert m is None and past_gemv(choice), rows
    # on an A100 nothing is skipped (no wgmma)
    tuned_buckets.clear()
    monkeypatch.setattr(bitblas.hardware, "query_device", lambda *a: A100_SPEC)
    op80 = bitblas.Matmul(cfg, target=TARGETS["sm_80"])
    monkeypatch.setattr(op80, "_kernel", lambda kind, rows: None)
    res80 = op80.hardware_aware_finetune(kind="cuda", progress=False, force=True)
    assert tuned_buckets == [1, 16, 48, 256] and not any(r.skipped for r in res80.values())


def test_cli_table_marks_skipped_buckets(capsys):
    from bitblas.tune.cli import _print_table
    row = dict(N=1024, K=1024, format="uint4:g128:zeros", bucket=256, hint="Deq+WGMMA", default_ms=None,
               tuned_ms=None, speedup=None, cached=False, skipped="decode + wgmma", sites=["layer.0"])
    _print_table([row, dict(row, bucket=1, hint="GEMVHint", default_ms=0.02, tuned_ms=0.01, speedup=2.0,
                            skipped=None)])
    out = capsys.readouterr().out.splitlines()
    assert "skipped" in out[2] and "Deq+WGMMA" in out[2] and "tuned" in out[3]


@pytest.mark.nvcc
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_top_wgmma_candidates_compile_sm90a():
    """The best WGMMA candidate of a few buckets, and the deepest ring the space holds, compile
    for sm_90a (code generation + nvcc; running them needs the GPU host)."""
    tgt = cuda_target(TARGETS["sm_90"])
    hints = {_wgmma(_ranked(F16, m))[0].hint for m in (128, 512, 4096)}
    hints.add(max((c.hint for c in _wgmma(candidates(F16, "cuda", 512, H200))), key=lambda h: h.smem_bytes()))
    for h in hints:
        src = cuda_source(make_plan(F16, "cuda", None), tgt, h)
        assert f"m64n{h.BN}k16" in src
        assert len(nvcc_compile(src, arch="sm_90a")) > 0, h
