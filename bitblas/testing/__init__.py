"""Test helpers under Microsoft BitBLAS's names (``bitblas.testing``), for test files written
against BitBLAS: ``main``, ``torch_assert_close``, ``requires_cuda_compute_version``,
``requires_package``, ``requires_cuda``. Importing this module imports pytest."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys

import pytest

__all__ = ["main", "torch_assert_close", "requires_cuda_compute_version", "requires_package", "requires_cuda"]


def main():
    """Run pytest on the calling test file (``if __name__ == "__main__": bitblas.testing.main()``)."""
    test_file = inspect.getsourcefile(sys._getframe(1))
    sys.exit(pytest.main([test_file] + sys.argv[1:]))


def torch_assert_close(tensor_a, tensor_b, rtol=1e-2, atol=1e-3, max_mismatched_ratio=0.001, verbose=False):
    """Assert that at most ``max_mismatched_ratio`` of the elements differ by more than
    ``atol + rtol * |tensor_b|`` (AssertionError with the count otherwise); returns True."""
    import torch
    diff = torch.abs(tensor_a - tensor_b)
    mismatched = diff > atol + rtol * torch.abs(tensor_b)
    bad = int(mismatched.sum().item()) + int(torch.isnan(diff).sum().item()) - \
        int((torch.isnan(diff) & mismatched).sum().item())
    total = tensor_a.numel()
    allowed = int(total * max_mismatched_ratio)
    if verbose:
        print(f"Number of mismatched elements: {bad} / {total} (allowed: {allowed})")
    if bad > allowed:
        raise AssertionError(
            f"Too many mismatched elements: {bad} > {allowed} ({max_mismatched_ratio * 100:.2f}% allowed, but get "
            f"{bad / total * 100:.2f}%). Greatest absolute difference: {diff.max().item()}, Greatest relative "
            f"difference: {(diff / (torch.abs(tensor_b) + 1e-12)).max().item()}.")
    return True


def _cuda_capability():
    import torch
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def requires_cuda(func=None):
    """Skip unless a CUDA GPU is visible (usable with or without parentheses)."""
    mark = pytest.mark.skipif(_cuda_capability() is None, reason="needs a CUDA GPU")
    return mark(func) if func is not None else mark


def requires_cuda_compute_version(major_version, minor_version=0, mode="ge"):
    """Skip unless a CUDA GPU of compute capability >= (major, minor) ("ge"; "lt": below it) is visible."""
    if mode not in ("ge", "lt"):
        raise ValueError(f"mode={mode!r} is invalid; accepted: 'ge', 'lt'")
    cap = _cuda_capability()
    want = (major_version, minor_version)
    ok = cap is not None and (cap >= want if mode == "ge" else cap < want)
    return pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU of compute capability {'>=' if mode == 'ge' else '<'} "
                                             f"{major_version}.{minor_version}")


def _importable(name: str) -> bool:
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - installed but broken (e.g. an incompatible dependency)
        return False
    return True


def requires_package(*packages):
    """Skip unless every named package imports."""
    missing = [p for p in packages if not _importable(p)]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (not installed or does not import)")
