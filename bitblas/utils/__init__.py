"""Utilities under Microsoft BitBLAS's names: target detection (defined in bitblas/build.py)."""
from __future__ import annotations

from ..build import DEFAULT_ARCH, auto_detect_nvidia_target

__all__ = ["auto_detect_nvidia_target", "DEFAULT_ARCH"]
