"""The README's code blocks run as written on CPU (those whose first line is ``# fragment`` are
skipped, and must say so), and its quantize_model example keeps the float model's logits."""
from __future__ import annotations

import os
import re

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
RUNNABLE = [b for b in BLOCKS if not b.startswith("# fragment")]
# the README's own call: it clamped every negative weight before zero points became the default
README_CALL = 'bitblas.quantize_model(model, dict(W_dtype="uint4", group_size=128), skip=["lm_head"], calibration=calib)'


def _title(block: str) -> str:
    for line in block.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return re.sub(r"\W+", "_", line)[:40]
    return "block"


def test_blocks_found():
    assert len(BLOCKS) >= 4 and len(RUNNABLE) >= 3
    for b in BLOCKS:
        if b.startswith("# fragment"):
            assert b.split("\n", 1)[0].strip() != "# fragment", "a fragment says why it does not run"


@pytest.mark.parametrize("block", RUNNABLE, ids=[_title(b) for b in RUNNABLE])
def test_readme_block_runs(block, tmp_path, monkeypatch):
    if "transformers" in block:
        pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "__readme__"}
    with torch.no_grad():
        exec(compile(block, "README.md", "exec"), ns)
    if README_CALL in block:
        # the README's example: uint4 g128 with GPTQ calibration on a small random-weight transformers
        # Llama, evaluated on other ids (0.9932 measured; 0.988 without calibration on the same ids, -0.017
        # when negative weights were clamped): issue 27's goal, cosine >= 0.99
        assert ns["calib"].shape != ns["ids"].shape or not torch.equal(ns["calib"], ns["ids"])
        assert ns["cos"] >= 0.99, ns["cos"]


def test_readme_keeps_the_quantize_model_call():
    assert README_CALL in README and any(README_CALL in b for b in RUNNABLE)
