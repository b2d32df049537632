"""The Microsoft BitBLAS compatibility suite (see README.md in this folder).

Tests that run tensors take a ``device`` fixture: "cpu" (our LLVM backend, runs in CI) and "cuda"
(marked ``gpu``, skipped without a CUDA GPU), where BitBLAS's own tests hard-code ``.cuda()``.
This folder is on sys.path (no __init__.py), so tests import compat_helpers / compat_marks /
gptq_data directly.
"""
from __future__ import annotations

import logging

import pytest
import torch

from compat_marks import CPU_AND_GPU  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_case: a case that runs on CUDA tensors only (compat_marks.gpu_only)")


@pytest.fixture(params=CPU_AND_GPU)
def device(request):
    if request.param == "cpu" and request.node.get_closest_marker("gpu_case") is not None:
        pytest.skip("GPU only: this case runs on CUDA tensors (its CPU run would take minutes)")
    return request.param


@pytest.fixture(autouse=True)
def _seeded():
    """Random inputs differ between tests but repeat between runs."""
    torch.manual_seed(0)


_LEVEL = logging.getLogger("bitblas").level


@pytest.fixture(autouse=True, scope="module")
def _restore_bitblas_log_level():
    """The QuickStart and issue tests call bitblas.set_log_level("Debug") as BitBLAS users do: the
    other tests keep the level the session started with."""
    logging.getLogger("bitblas").setLevel(_LEVEL)
    yield
    logging.getLogger("bitblas").setLevel(_LEVEL)
