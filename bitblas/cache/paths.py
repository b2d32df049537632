"""Where the database lives (a leaf of bitblas.cache: kernels and operators read it)."""
from __future__ import annotations

import os
from typing import Optional

from .. import env
from .database import Database

__all__ = ["get_database_path", "get_database", "set_path_override"]

_PATH_OVERRIDE: Optional[str] = None


def get_database_path() -> str:
    """The database folder: set_database_path's, else BITBLAS_DATABASE_PATH, else ~/.cache/bitblas."""
    return _PATH_OVERRIDE or os.path.abspath(os.path.expanduser(env.database_path()))


def set_path_override(path: Optional[str]) -> None:
    """Record ``path`` (already checked and absolute) as the folder; None: back to the default.
    ``bitblas.cache.set_database_path`` is the user's entry (it also drops the in-memory kernels)."""
    global _PATH_OVERRIDE
    _PATH_OVERRIDE = path


def get_database() -> Optional[Database]:
    """The Database at the current path (None when BITBLAS_DISABLE_CACHE is set)."""
    return None if env.cache_disabled() else Database(get_database_path())
