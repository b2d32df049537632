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
    shapes = [(h.BM, h.BN, h.cluster) for h in wg]
    assert max(shapes.count(s) for s in shapes) <= 2        # tile shape = (BM, BN, CTA pair): stages etc. are knobs
    assert len(set(shapes)) >= 3
    assert any(h.cluster == 2 for h in wg)                  # CTA pairs are measured too


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


@pytest.mark.parametrize("fused_wins", [False, True])
def test_tuner_tunes_past_gemv_buckets_against_the_untuned_choice(db_path, monkeypatch, fused_wins):
    """On sm_90 a W4A16 operator with buckets (1, 16, 48, 256): 1, 16 and 48 (the GEMV's rows, its
    tensor-core kernel in chunks of 16 above 16 rows) are tuned as before; 256, past the GEMV, is
    tuned over the fused GEMM's tiles (``past_gemv``). Where the untuned decode + wgmma GEMM measured
    fastest the bucket is skipped and its rows keep the untuned choice; where a fused tile won, it
    serves the bucket's rows past the GEMV's 64 (fewer keep the GEMV), and as the last bucket the
    rows above it."""
    import torch
    import bitblas.hardware
    from bitblas.schedule import FusedWgmmaHint
    cfg = MatmulConfig(M=[1, 16, 48, 256], N=1024, K=1024, **W4A16)
    h = GEMVHint(rows_per_warp=1, warps=4, unroll=2)
    hm = GEMVHint(rows_per_warp=32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2)
    hf = FusedWgmmaHint(row_tile=256, warpgroups=1, stages=4)
    tuned_buckets, past = [], {}

    def fake_tune_bucket(config, kind, bucket, *a, past_gemv=None, **k):
        tuned_buckets.append(bucket)
        past[bucket] = past_gemv
        if bucket == 256:
            if fused_wins:
                return tuner.TuneResult(bucket, None, hf, 0.010, 0.012, 0.0, False)
            return tuner.TuneResult(bucket, None, None, 0.010, 0.010, 0.0, False,
                                    skipped="decode + wgmma GEMM measured fastest")
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
    assert sorted(res) == tuned_buckets == [1, 16, 48, 256]
    assert past[1] is past[16] is past[48] is None and "past the GEMV" in past[256]
    assert res[1].skipped is None and res[16].skipped is None and res[48].skipped is None
    assert choose(op, "cuda", 16) == (16, h) and choose(op, "cuda", 5) == (5, h)
    # the tensor-core GEMV takes its row count at run time: one kernel per class (17..32, 33..48)
    assert choose(op, "cuda", 17) == (32, hm) and choose(op, "cuda", 33) == (48, hm)
    assert choose(op, "cuda", 48) == (48, hm)
    assert choose(op, "cuda", 64) == (64, None)          # past the last GEMV bucket: the default GEMV
    if fused_wins:
        assert res[256].skipped is None and set(op._tuned["cuda"]) == {1, 16, 48, 256}
        assert sorted(loaded) == [1, 16, 48, 256]
        for rows in (65, 100, 256, 5000):
            assert choose(op, "cuda", rows) == (None, hf), rows
            assert op.choice("cuda", rows).tuned
    else:
        assert res[256].skipped and res[256].hint is None and res[256].latency_ms == 0.010
        assert set(op._tuned["cuda"]) == {1, 16, 48} and sorted(loaded) == [1, 16, 48]
        for rows in (65, 100, 256, 5000):
            m, choice = choose(op, "cuda", rows)
            assert m is None and past_gemv(choice), rows
    # on an A100 nothing runs past the GEMV (no wgmma): every bucket is tuned as before
    tuned_buckets.clear()
    past.clear()
    monkeypatch.setattr(bitblas.hardware, "query_device", lambda *a: A100_SPEC)
    op80 = bitblas.Matmul(cfg, target=TARGETS["sm_80"])
    monkeypatch.setattr(op80, "_kernel", lambda kind, rows: None)
    op80.hardware_aware_finetune(kind="cuda", progress=False, force=True)
    assert tuned_buckets == [1, 16, 48, 256] and not any(past.values())


W4A16_8K = MatmulConfig(M=None, N=8192, K=8192, **W4A16)


@pytest.mark.parametrize("fmt", ["u4", "u2", "u8", "nf4"])
def test_fused_space_holds_valid_tiles_and_the_defaults(fmt):
    """The fused GEMM's tuning space: every tile passes the kernel's own checks, no tile twice, the
    untuned defaults of every row count are in it; none below 65 rows (the GEMV's), on sm_80, for
    int8 activations with 8-bit weights (the dense int8 GEMM's) or without device facts; int8
    activations with 4-bit weights get their own tiles (at most 128 rows with group scales). The
    cost model gives every tile a finite estimate."""
    from bitblas.arch import Arch
    from bitblas.kernels import by_name
    from bitblas.schedule.fused_wgmma import fused_default, fused_wgmma_unsupported
    W = {"u4": "uint4", "u2": "uint2", "u8": "uint8", "nf4": "nf4"}[fmt]
    fused = by_name("fused-wgmma")
    arch = Arch.from_spec(H200)
    for N, K in ((8192, 8192), (1000, 1536)):
        cfg = MatmulConfig(M=None, N=N, K=K, A_dtype="float16", W_dtype=W, group_size=128, with_scaling=True)
        plan = make_plan(cfg, "cuda", None)
        space = [c.hint for c in fused.space(plan, 256, arch)]
        assert space and len(space) == len(set(space))
        assert all(c.plan_m is None for c in fused.space(plan, 256, arch))
        assert all(fused_wgmma_unsupported(plan, h) is None for h in space)
        for rows in (65, 128, 256, 1024, 2048):
            d = fused_default(plan, rows)
            assert d is None or d in space, (rows, d)
        assert all(math.isfinite(estimate(plan, h, rows, H200)) for h in space for rows in (65, 1024, 4096))
        assert fused.space(plan, 64, arch) == [] and fused.space(plan, 256, None) == []
        assert fused.space(plan, 256, Arch.from_spec(A100_SPEC)) == []
    static = MatmulConfig(M=512, N=1024, K=1024, A_dtype="float16", W_dtype=W, group_size=128, with_scaling=True)
    assert {c.plan_m for c in fused.space(make_plan(static, "cuda", 512), 512, arch)} == {512}
    w4a8 = make_plan(MatmulConfig(M=None, N=1024, K=1024, A_dtype="int8", W_dtype="int4", group_size=128,
                                  with_scaling=True), "cuda", None)
    space = [c.hint for c in fused.space(w4a8, 256, arch)]
    assert space and all(h.row_tile <= 128 and not h.overlap for h in space)
    assert all(fused_default(w4a8, rows) in space for rows in (65, 256, 1024))
    assert all(math.isfinite(estimate(w4a8, h, 1024, H200)) for h in space)
    w8a8 = MatmulConfig(M=None, N=1024, K=1024, A_dtype="int8", W_dtype="int8", with_scaling=True)
    assert fused.space(make_plan(w8a8, "cuda", None), 256, arch) == []


def test_fused_cost_counts_waves():
    """Twice the rows on the same tile: one wave becomes two (128-row split-K tiles at 8192^2: 128
    blocks, one per SM); every estimate grows with the rows."""
    from bitblas.schedule import FusedWgmmaHint
    plan = make_plan(W4A16_8K, "cuda", None)
    h = FusedWgmmaHint(row_tile=128, warpgroups=2, split_k=True, overlap=True, stages=4, ring=4)
    one, two = estimate(plan, h, 128, H200), estimate(plan, h, 256, H200)
    assert 1.7 < two / one < 2.1
    assert estimate(plan, h, 1024, H200) > two


def _measured_list(cfg, bucket, topk=20):
    """What ``tune_bucket`` would build and measure for ``bucket`` (the choice table's compile stop,
    testing/choice_table.py): (the decode-then-GEMM default it builds itself as (rows, hint), or
    None; the candidates given to the compiler), or the result where it returns before compiling."""
    import choice_table as ct
    tgt = cuda_target(TARGETS["sm_90"])
    past = tuner.composite_serves(cfg, "cuda", bucket, tgt)
    seen = []
    with ct._no_compile(seen):
        try:
            return tuner.tune_bucket(cfg, "cuda", bucket, tgt, H200, topk=topk, parallel=False, workdir="unused",
                                     past_gemv=past)
        except ct._Stop as stop:
            dq = [x[1:] for x in seen if isinstance(x, tuple)]
            return (dq[0] if dq else None), stop.cands


def test_past_gemv_buckets_measure_fused_tiles_against_the_untuned_choice():
    """A bucket past the GEMV is tuned over the fused GEMM's tiles only, the untuned choice of its
    rows measured first: the fused default tile where it serves the rows (256), else decode + the
    dense wgmma GEMM (4096: the decode-then-GEMM callable, built by the tuner itself); W4A8 over
    its int8 tiles, its default first. A config no fused tile takes (2-bit codes with int8
    activations in groups of 128: a slab spans two groups) is skipped without building anything."""
    from bitblas.schedule import FusedWgmmaHint, WGMMAHint
    from bitblas.schedule.fused_wgmma import fused_default
    from bitblas.tune.space import candidates as all_candidates
    plan = make_plan(W4A16_8K, "cuda", None)
    dq, cands = _measured_list(W4A16_8K, 256)
    assert dq is None and cands[0].hint == fused_default(plan, 256)
    assert all(isinstance(c.hint, FusedWgmmaHint) for c in cands) and 2 < len(cands) <= 21
    assert len({c.hint for c in cands}) == len(cands)
    assert any(isinstance(c.hint, MMAHint) for c in all_candidates(W4A16_8K, "cuda", 256, H200))   # left out
    dq, cands = _measured_list(W4A16_8K, 4096)
    assert fused_default(plan, 4096) is None and dq is not None and isinstance(dq[1], WGMMAHint)
    assert all(isinstance(c.hint, FusedWgmmaHint) for c in cands) and 2 < len(cands) <= 20
    w4a8 = MatmulConfig(M=None, N=1024, K=1024, A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True)
    dq, cands = _measured_list(w4a8, 256)
    assert dq is None and cands[0].hint == fused_default(make_plan(w4a8, "cuda", None), 256)
    assert all(isinstance(c.hint, FusedWgmmaHint) for c in cands) and len(cands) > 2
    w2a8 = MatmulConfig(M=None, N=1024, K=1024, A_dtype="int8", W_dtype="int2", group_size=128, with_scaling=True)
    res = _measured_list(w2a8, 256)
    assert isinstance(res, tuner.TuneResult) and res.hint is None and res.latency_ms is None
    assert "no fused wgmma tile" in res.skipped


def test_measured_skip_is_stored_and_loaded(db_path):
    """A bucket where decode + wgmma GEMM measured fastest is stored with its times and loaded
    back as skipped, with no kernel to load; an unmeasured skip is not stored."""
    from bitblas.cache import get_database
    db = get_database()
    cfg = W4A16_8K
    key = tuner.tuning_key(cfg, "cuda", 4096, {"target": "test"})
    res = tuner.TuneResult(4096, None, None, 0.9, 0.9, 12.0, False, [{"template": "dequant-gemm", "ms": 0.9}],
                           skipped="decode + wgmma GEMM measured fastest", measured_rows=4096)
    tuner._store(cfg, "cuda", res, key, None, db)
    back = tuner._from_database(cfg, "cuda", 4096, db, key, None)
    assert back.from_cache and back.skipped == res.skipped and back.hint is None and back.latency_ms == 0.9
    key2 = tuner.tuning_key(cfg, "cuda", 2048, {"target": "test"})
    tuner._store(cfg, "cuda", tuner.TuneResult(2048, None, None, None, None, 0.0, False, skipped="no tile"), key2,
                 None, db)
    assert db.get("tuning", key2) is None


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
