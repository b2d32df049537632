"""benchmark/matmul.py's hint parsers (CPU)."""
import pytest

from benchmark.matmul import parse_hint_specs, parse_hints
from bitblas.schedule import GEMVHint, MMAHint, WGMMAHint


def test_parse_hint_specs():
    got = parse_hint_specs("WGMMAHint(BN=64,stages=8,consumers=1); WGMMAHint(persistent=false);"
                           "MMAHint(BM=128,BN=128,WM=64,WN=64,BK=64,stages=3)")
    assert got == [WGMMAHint(BN=64, stages=8, consumers=1), WGMMAHint(persistent=False),
                   MMAHint(BM=128, BN=128, WM=64, WN=64, BK=64, stages=3)]
    assert parse_hint_specs("") == []


@pytest.mark.parametrize("bad", ["Nope(BN=1)", "WGMMAHint BN=64", "GEMVHint(rows_per_warp=x)"])
def test_parse_hint_specs_rejects(bad):
    with pytest.raises((SystemExit, ValueError)):
        parse_hint_specs(bad)


def test_parse_gemv_hints():
    assert parse_hints("4,1,4,16;32,4,2,16,4,0,2,1") == [GEMVHint(4, 1, 4, 16), GEMVHint(32, 4, 2, 16, 4, 0, 2, 1)]
