"""Kernel selection does not change: every case of the committed table is recomputed and compared.

The table (``testing/data/choice_table.json.gz``, made by ``testing/choice_table.py``) holds, for
about 20,000 cases over targets sm_80 / sm_89 / sm_90a (and TVM's ``nvidia/nvidia-h100`` tag),
every weight format with one or two scale / zero modes, every activation dtype, five N x K and
14 row counts of a dynamic-M operator plus five static Ms:

* the kernel an untuned ``Matmul`` runs for those rows (path, plan rows, hint) on CUDA and on the
  CPU, and ``default_hint`` of the plan of exactly those rows;
* for the tuner (297 buckets): whether ``tune`` leaves the bucket to decode-then-GEMM, the
  candidate list in order (length, digest, count per hint class) and the list ``tune_bucket``
  compiles and measures (the default kernel, then the cost model's top 20);
* the NVFP4 x NVFP4 operator's path and hints.

It was committed before issue 23's refactor of kernel selection; the refactor must leave it
unchanged. A failure prints the first differing cases as ``before`` (the table) and ``after``
(this code).

After an intentional change of a kernel choice, regenerate the table with one command from the
repository root:

    python -m testing.choice_table --write

and commit the new table in a commit of its own, whose message says which choices changed and
why (``python -m testing.choice_table`` without ``--write`` prints the differences first; ``--show
CASE`` prints one case in full, the whole candidate list for a tuner case, to compare two commits).
Never regenerate in the commit that changes the code: the table is what shows the change.
"""
from __future__ import annotations

import copy
import os

import pytest

import choice_table as ct


@pytest.fixture(scope="module")
def tables():
    """(the committed table, the table of this code)."""
    return ct.load(), ct.compute()


def test_table_is_small_and_covers_the_cases(tables):
    before, _ = tables
    assert os.path.getsize(ct.TABLE_PATH) < 150 * 1024      # the repo travels to the GPU host (2.5 MB in all)
    counts = ct.count_cases(before)
    assert counts["cuda"] >= 10000 and counts["cpu"] >= 3000 and counts["tune"] >= 200 and counts["nvfp4"] >= 50
    targets = {case.split("/")[0] for case in before["cuda"]}
    assert targets == set(ct.TARGETS)
    classes = {before["hints"][v[2]]["class"] for v in before["cuda"].values()}
    assert {"GEMVRowsHint", "GEMVMmaHint", "GEMVWgmmaHint", "MMAHint", "WGMMAHint", "SimpleCUDAHint"} <= classes
    assert any(v[0] == "dequant-gemm" for v in before["cuda"].values())
    assert all(v["n"] > 0 for v in before["tune"].values())
    assert sum("measured" in v for v in before["tune"].values()) >= 150


@pytest.mark.parametrize("section", ct.SECTIONS)
def test_choices_unchanged(tables, section):
    before, after = tables
    n, lines = ct.diff(before, after, sections=(section,))
    assert n == 0, (f"{n} of {len(before[section])} '{section}' kernel choices differ from {ct.TABLE_PATH}:\n"
                    + "\n".join(lines) + "\n(intentional? see this file's docstring to regenerate the table)")


def test_diff_reports_a_changed_choice(tables):
    """The comparison itself: one changed hint field, one changed tuner list and one missing case
    are reported, with the case and both values."""
    before, _ = tables
    after = copy.deepcopy(before)
    case = "sm_90a/f16.u4.g128.zo/4096x4096/Mdyn/r1"
    hint = dict(after["hints"][after["cuda"][case][2]])
    hint["warps"] += 1
    after["hints"].append(hint)
    after["cuda"][case] = [*after["cuda"][case][:2], len(after["hints"]) - 1, after["cuda"][case][3]]
    tcase = next(iter(after["tune"]))
    after["tune"][tcase] = {**after["tune"][tcase], "sha": "0" * 16}
    gone = next(iter(after["cpu"]))
    del after["cpu"][gone]
    n, lines = ct.diff(before, after)
    assert n == 3
    text = "\n".join(lines)
    assert f"cuda {case}" in text and f"'warps': {hint['warps']}" in text.replace('"', "'")
    assert f"tune {tcase}" in text and "0" * 16 in text
    assert f"cpu {gone}" in text and "<no such case>" in text
