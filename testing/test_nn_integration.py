"""The integration/pytorch examples run (CPU, small sizes)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from nn_helpers import ROOT

EXAMPLES = os.path.join(ROOT, "integration", "pytorch")


def _load(name):
    sys.path.insert(0, EXAMPLES)
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(EXAMPLES)


@pytest.mark.parametrize("name", ["gptq_checkpoint", "bitnet"])
def test_example_runs(name, capsys):
    _load(name).main(["--device", "cpu"])
    assert "max relative difference" in capsys.readouterr().out


def test_decode_loop_runs():
    res = _load("decode_loop").main(["--device", "cpu", "--steps", "4", "--layers", "1", "--no-overhead"])
    assert res["prefill_logits"]["cosine"] > 0.9 and res["tokens_per_s"]["bitblas eager"] > 0
