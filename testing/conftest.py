"""Shared helpers for the CPU test suite."""
from __future__ import annotations

import re

import pytest


def raises_naming(exc_type, name: str):
    """``pytest.raises(exc_type)`` whose message must name ``name`` as a whole word.

    Usage: ``with raises_naming(ValueError, "group_size"): ...``
    """
    return pytest.raises(exc_type, match=rf"(?<![\w.]){re.escape(name)}(?![\w])")


@pytest.fixture
def naming():
    return raises_naming
