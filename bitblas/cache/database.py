"""The on-disk database of compiled kernels and tuning results.

Layout under the database path (``<root>``; see :func:`bitblas.cache.get_database_path`)::

    <root>/v1/<type>/<h[:2]>/<h>.json          the record (key, payload, its files with sha256)
    <root>/v1/<type>/<h[:2]>/<h>.<sha8>.so     a compiled kernel (content-addressed)
    <root>/v1/<type>/<h[:2]>/<h>.lock          flock'ed while a process builds or tunes entry h

``h`` hashes the full key: the request (config, plan rows, hint or bucket), the target (CUDA arch
of the device, or the CPU's LLVM target), the compile flags, and the versions (bitblas, a hash of
bitblas's own sources, TVM, tvm-ffi). Any change gives another key, so a stale entry is never hit.

Writes are atomic: files go to a temporary name in the same folder and are ``os.replace``'d into
place, kernel files first and the record last; kernel files are never overwritten (their names
carry their hash), so a process that loaded one keeps a valid mapping. Two writers of one key both
leave complete entries; the last record wins. A record that does not parse, whose key differs
from the request, or whose files are missing or fail their sha256 is reported with a warning and
removed; the caller then rebuilds.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Dict, Iterator, List, Optional

logger = logging.getLogger(__name__)

__all__ = ["Database", "versions", "key_hash", "SCHEMA"]

SCHEMA = "v1"


@functools.lru_cache(maxsize=None)
def _source_hash() -> str:
    """sha256 over bitblas's own .py files: editing the package invalidates every entry."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        if "__pycache__" in d:
            continue
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                h.update(os.path.relpath(p, root).encode())
                with open(p, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def versions() -> Dict[str, str]:
    """The versions every key carries."""
    from .. import __version__
    from .._tvm import _installed
    return {"bitblas": __version__, "bitblas_src": _source_hash(),
            "tvm": str(_installed("apache-tvm", "tvm")), "tvm_ffi": str(_installed("apache-tvm-ffi", "tvm_ffi"))}


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def key_hash(key: dict) -> str:
    return hashlib.sha256(_canonical(key).encode()).hexdigest()[:32]


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: str, data: bytes) -> None:
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Database:
    """Records of one type ("kernel" or "tuning") under ``root``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))

    # -- paths ---------------------------------------------------------------------------
    def _dir(self, type_: str, h: str) -> str:
        return os.path.join(self.root, SCHEMA, type_, h[:2])

    def record_path(self, type_: str, key: dict) -> str:
        h = key_hash(key)
        return os.path.join(self._dir(type_, h), h + ".json")

    def file_path(self, type_: str, record: dict, name: str) -> str:
        return os.path.join(self._dir(type_, record["key_hash"]), record["files"][name]["name"])

    # -- read ----------------------------------------------------------------------------
    def get(self, type_: str, key: dict) -> Optional[dict]:
        """The valid record for ``key``, or None (missing; or broken: warned about and removed)."""
        path = self.record_path(type_, key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            logger.warning("bitblas cache: cannot read %s (%s); rebuilding", path, e)
            return None
        problem = None
        try:
            rec = json.loads(raw)
        except ValueError:
            rec, problem = None, "does not parse (truncated?)"
        if rec is not None:
            if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or \
                    _canonical(rec.get("key")) != _canonical(key):
                problem = "was written for another key (stale)"
            else:
                for name, meta in rec.get("files", {}).items():
                    fp = os.path.join(os.path.dirname(path), meta["name"])
                    try:
                        ok = os.path.getsize(fp) == meta["size"] and _sha256_file(fp) == meta["sha256"]
                    except OSError:
                        ok = False
                    if not ok:
                        problem = f"has a missing or damaged file {meta['name']}"
                        break
        if problem is not None:
            logger.warning("bitblas cache: entry %s %s; removing it and rebuilding", path, problem)
            self._remove_record(path, raw)
            return None
        return rec

    def _remove_record(self, path: str, raw: bytes) -> None:
        """Remove a broken record unless another process replaced it meanwhile."""
        with contextlib.suppress(OSError):
            with open(path, "rb") as f:
                if f.read() != raw:
                    return
            os.unlink(path)

    # -- write ---------------------------------------------------------------------------
    def put(self, type_: str, key: dict, payload: dict, files: Optional[Dict[str, str]] = None) -> dict:
        """Store ``payload`` (JSON data) and copies of ``files`` ({name: path}) under ``key``."""
        h = key_hash(key)
        d = self._dir(type_, h)
        os.makedirs(d, exist_ok=True)
        metas = {}
        for name, src in (files or {}).items():
            with open(src, "rb") as f:
                data = f.read()
            sha = hashlib.sha256(data).hexdigest()
            ext = os.path.splitext(src)[1] or ".bin"
            fname = f"{h}.{name}.{sha[:12]}{ext}"
            dst = os.path.join(d, fname)
            if not (os.path.exists(dst) and os.path.getsize(dst) == len(data)):
                _atomic_write(dst, data)
            metas[name] = {"name": fname, "sha256": sha, "size": len(data)}
        rec = {"schema": SCHEMA, "type": type_, "key": key, "key_hash": h, "created": time.time(),
               "files": metas, **payload}
        _atomic_write(os.path.join(d, h + ".json"), _canonical(rec).encode())
        return rec

    @contextlib.contextmanager
    def lock(self, type_: str, key: dict, timeout: Optional[float] = None) -> Iterator[None]:
        """Exclusive lock on one key across processes (flock; released if the holder dies)."""
        h = key_hash(key)
        d = self._dir(type_, h)
        os.makedirs(d, exist_ok=True)
        fd = os.open(os.path.join(d, h + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            t0 = time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if timeout is not None else 0))
                    break
                except BlockingIOError:
                    if time.monotonic() - t0 > timeout:
                        raise TimeoutError(f"bitblas cache: key {h} stayed locked for {timeout} s") from None
                    time.sleep(0.05)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- listing and clearing --------------------------------------------------------------
    def records(self, type_: Optional[str] = None) -> List[dict]:
        """Every record that parses (of ``type_``, or all), newest first."""
        base = os.path.join(self.root, SCHEMA)
        out = []
        types = [type_] if type_ else (sorted(os.listdir(base)) if os.path.isdir(base) else [])
        for t in types:
            for d, _, files in os.walk(os.path.join(base, t)):
                for f in files:
                    if f.endswith(".json") and not f.startswith(".tmp-"):
                        try:
                            with open(os.path.join(d, f), "rb") as fh:
                                out.append(json.loads(fh.read()))
                        except (OSError, ValueError):
                            continue
        return sorted(out, key=lambda r: -r.get("created", 0))

    def clear(self) -> int:
        """Remove every entry (all schemas); returns the number of records removed."""
        n = 0
        if not os.path.isdir(self.root):
            return 0
        for d, _, files in os.walk(self.root):
            n += sum(1 for f in files if f.endswith(".json") and not f.startswith(".tmp-"))
        for name in os.listdir(self.root):
            p = os.path.join(self.root, name)
            if os.path.isdir(p) and re.fullmatch(r"v\d+", name):
                shutil.rmtree(p, ignore_errors=True)
        return n
