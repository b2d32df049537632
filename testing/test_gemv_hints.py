"""The GEMV kernels' hints (bitblas/schedule/gemv/hints.py): one hint per kernel body with only the
fields that body reads, and the one-hint spelling ``GEMVHint(...)`` mapping to the kernel it
selected (benchmark --hints / --gemv-hints, stored {"class": "GEMVHint", ...} dicts)."""
from __future__ import annotations

import dataclasses

import pytest

from bitblas import MatmulConfig
from bitblas.hardware import DeviceSpec
from bitblas.schedule import (GEMVHint, GEMVKSplitHint, GEMVMmaHint, GEMVRowsHint, GEMVWgmmaHint, hint_from_dict,
                              hint_to_dict)
from bitblas.schedule.gemv.hints import LEGACY_FIELDS, from_legacy, to_legacy
from bitblas.tune.space import candidates

H200 = DeviceSpec(name="H200", arch="sm_90", sm_count=132, smem_per_sm=233472, smem_per_block=232448,
                  regs_per_sm=65536, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=50 * 2 ** 20,
                  dram_bandwidth=4.8e12, clock_hz=1.98e9)


def _fields(cls):
    return {f.name for f in dataclasses.fields(cls)}


def test_each_kernel_has_its_own_fields():
    common = {"rows_per_warp", "vec_bytes", "min_blocks", "pdl"}
    assert _fields(GEMVRowsHint) == common | {"warps", "unroll", "stages", "act_smem", "l2_prefetch"}
    assert _fields(GEMVKSplitHint) == common | {"k_warps", "grid"}
    assert _fields(GEMVMmaHint) == common | {"k_warps", "unroll", "stages", "chunk_loop"}
    assert _fields(GEMVWgmmaHint) == common | {"k_warps", "stages"}
    for cls in (GEMVRowsHint, GEMVKSplitHint, GEMVMmaHint, GEMVWgmmaHint):
        h = cls()
        assert isinstance(h, GEMVHint) and h.tensor_cores == (cls in (GEMVMmaHint, GEMVWgmmaHint))
        with pytest.raises(dataclasses.FrozenInstanceError):
            h.rows_per_warp = 8
        with pytest.raises(TypeError):
            cls(mma=True)                        # no flags: the class is the kernel


def test_one_hint_spelling_selects_the_kernel():
    assert GEMVHint(4, 1, 4, 16) == GEMVRowsHint(rows_per_warp=4, warps=1, unroll=4, vec_bytes=16)
    assert GEMVHint(2, 4, 2, 8, 4, 264) == GEMVKSplitHint(rows_per_warp=2, k_warps=4, grid=264, vec_bytes=8)
    assert GEMVHint(rows_per_warp=32, k_warps=8, mma=True, chunk_loop=True) == \
        GEMVMmaHint(rows_per_warp=32, k_warps=8, unroll=4, chunk_loop=True)
    assert GEMVHint(rows_per_warp=16, k_warps=4, unroll=1, stages=2, mma=True, wgmma=True, pdl=True) == \
        GEMVWgmmaHint(rows_per_warp=16, k_warps=4, stages=2, pdl=True)
    assert GEMVHint(act_smem=True, warps=8) == GEMVRowsHint(warps=8, act_smem=True)
    # fields the selected kernel never read are dropped (they never changed its code)
    assert GEMVHint(rows_per_warp=32, warps=8, k_warps=4, mma=True) == GEMVMmaHint(rows_per_warp=32, k_warps=4,
                                                                                   unroll=4)
    # a flag of another kernel, an unknown field: named
    for kw, word in ((dict(mma=True, act_smem=True), "act_smem"), (dict(k_warps=4, act_smem=True), "act_smem"),
                     (dict(chunk_loop=True), "chunk_loop"), (dict(wgmma=True), "mma=True"),
                     (dict(mma=True, wgmma=True, chunk_loop=True), "chunk_loop")):
        with pytest.raises(ValueError, match=word):
            GEMVHint(**kw)
    with pytest.raises(TypeError, match="'bogus'"):
        GEMVHint(bogus=1)
    with pytest.raises(TypeError, match="both"):
        GEMVHint(4, rows_per_warp=4)
    with pytest.raises(TypeError, match="got object"):
        to_legacy(object())


def test_stored_one_hint_dicts_load_as_the_same_kernel():
    """A {"class": "GEMVHint", ...} dict (a tuned-operator record or tuning entry of the one-hint
    code) loads as the hint of the kernel it named; new dicts name the kernel's class."""
    old = dict(LEGACY_FIELDS, rows_per_warp=32, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1,
               chunk_loop=True, pdl=True)
    h = hint_from_dict({"class": "GEMVHint", **old})
    assert h == GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=2, stages=1, min_blocks=1, chunk_loop=True, pdl=True)
    assert hint_to_dict(h)["class"] == "GEMVMmaHint" and hint_from_dict(hint_to_dict(h)) == h
    assert to_legacy(h) == old


@pytest.mark.parametrize("cfg", [
    dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True),
    dict(A_dtype="int8", W_dtype="int4", with_scaling=True, with_act_scaling=True)], ids=["w4a16", "w4a8"])
def test_every_tuner_hint_round_trips(cfg):
    """Every GEMV candidate of the tuner maps to the one-hint fields and back to itself."""
    c = MatmulConfig(M=None, N=8192, K=8192, **cfg)
    seen = set()
    for bucket in (1, 4, 16, 32, 64):
        for cand in candidates(c, "cuda", bucket, H200):
            if isinstance(cand.hint, GEMVHint):
                assert from_legacy(**to_legacy(cand.hint)) == cand.hint
                seen.add(type(cand.hint))
    assert seen == ({GEMVRowsHint, GEMVKSplitHint, GEMVMmaHint, GEMVWgmmaHint} if cfg["A_dtype"] == "float16"
                    else {GEMVRowsHint, GEMVMmaHint})
