"""Marks shared by the compatibility tests (importable: this folder is on sys.path via conftest)."""
from __future__ import annotations

import pytest
import torch

_no_cuda = not torch.cuda.is_available()
GPU = [pytest.mark.gpu, pytest.mark.skipif(_no_cuda, reason="needs a CUDA GPU")]
CPU_AND_GPU = ["cpu", pytest.param("cuda", marks=GPU)]


def gpu_only(*values, reason: str, id=None):
    """A parametrize case that runs only on the GPU host (``reason``: why not on CI's CPU)."""
    return pytest.param(*values, id=id, marks=[pytest.mark.gpu, pytest.mark.gpu_case,
                                               pytest.mark.skipif(_no_cuda, reason=f"GPU only: {reason}")])


def out_of_scope(what: str):
    return pytest.mark.skip(reason=f"out of scope: {what}")

