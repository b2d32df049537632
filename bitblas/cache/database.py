"""The on-disk database of compiled kernels and tuning results.

Layout under the database path (``<root>``; see :func:`bitblas.cache.get_database_path`)::

    <root>/v1/<type>/<h[:2]>/<h>.json          the record (key, payload, its files with sha256)
    <root>/v1/<type>/<h[:2]>/<h>.<sha8>.so     a compiled kernel (content-addressed)
    <root>/v1/<type>/<h[:2]>/<h>.lock          flock'ed while a process builds or tunes entry h

``h`` hashes the full key: the request (config, plan rows, hint or bucket), the target (CUDA arch
of the device, or the CPU's LLVM target), the compile flags, and the versions (bitblas, a hash of
bitblas's own sources, TVM, tvm-ffi). Any change gives another key, so a stale entry is never hit.

Writes are atomic: files go to a temporary name in the same folder and are ``os.replace``'d into
place, kernel files first and the record last. A kernel file already in place (its name carries
its hash) is kept when it verifies and replaced when it does not (a new inode: a process that
mapped the old one keeps a valid mapping). A file just written is read back and verified before
the record that names it is written, and a shared library is refused unless it is a complete ELF
file (a truncated one would be mapped, and the process killed by SIGBUS, when loaded). Two
writers of one key both leave complete entries; the last record wins. A record that does not
parse, whose key differs from the request, or whose files are missing, fail their size and
sha256, or are incomplete libraries is reported with a warning and removed; the caller then
rebuilds. Files and folders are created with the process's umask (a shared cache stays readable).

A database the process cannot write (read-only, another user's, a regular file in place of the
folder) is read where it can be; writes and locks are skipped with one warning per path, and
what this process builds or tunes stays in memory.
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
import secrets
import shutil
import struct
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
    from .._tvm import installed
    from ..version import __version__
    return {"bitblas": __version__, "bitblas_src": _source_hash(),
            "tvm": str(installed("apache-tvm", "tvm")), "tvm_ffi": str(installed("apache-tvm-ffi", "tvm_ffi"))}


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def key_hash(key: dict) -> str:
    return hashlib.sha256(_canonical(key).encode()).hexdigest()[:32]


def _atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to a temporary file in ``path``'s folder (mode 0666 less the umask, as any
    file the process creates; mkstemp's would be 0600) and rename it into place."""
    d = os.path.dirname(path)
    while True:
        tmp = os.path.join(d, f".tmp-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
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


def elf_problem(data: bytes) -> Optional[str]:
    """Why ``data`` is not a complete ELF file (None: it is). A library cut short loads, but its
    mapping runs past the end of the file, and the first access there kills the process (SIGBUS)."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return "not an ELF file"
    if data[4] != 2 or data[5] != 1:
        return "not a 64-bit little-endian ELF file"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    if (phnum and phentsize < 56) or (shnum and shentsize < 64):
        return "malformed ELF header"
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return f"ELF headers run past the end of the file ({len(data)} bytes): truncated"
    for i in range(phnum):
        _, _, off, _, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if off + filesz > len(data):
            return f"segment {i} ends at byte {off + filesz}, past the end of the file ({len(data)} bytes): truncated"
    return None


def file_problem(path: str, meta: dict) -> Optional[str]:
    """Why the file at ``path`` does not match its record entry ``meta`` (size, sha256; a shared
    library must also be a complete ELF file), or None."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if len(data) != meta.get("size"):
        return f"has {len(data)} bytes, its record says {meta.get('size')}"
    if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        return "fails its sha256"
    if path.endswith(".so"):
        return elf_problem(data)
    return None


_UNWRITABLE: Dict[str, str] = {}       # database root -> why it cannot be written (warned once)


class _BadFile(Exception):
    """A file that must not be stored (an incomplete library, or one that did not read back intact)."""


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
        except OSError as e:     # an unreadable folder, a regular file in place of one: as missing
            self._cannot("read", e)
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
                for meta in rec.get("files", {}).values():
                    why = file_problem(os.path.join(os.path.dirname(path), str(meta.get("name"))), meta)
                    if why is not None:
                        problem = f"has a missing or damaged file {meta.get('name')} ({why})"
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
    def _cannot(self, what: str, e: OSError) -> None:
        """Note that the database cannot be used for ``what`` ("write", "read", "lock"); the first
        time for this root, warn."""
        if self.root in _UNWRITABLE:
            return
        _UNWRITABLE[self.root] = f"{type(e).__name__}: {e.strerror or e}"
        logger.warning("bitblas cache: cannot %s the database at %s (%s); what this process builds or tunes "
                       "stays in memory. Set BITBLAS_DATABASE_PATH (or bitblas.set_database_path) to a "
                       "writable folder to keep it", what, self.root, _UNWRITABLE[self.root])

    def put(self, type_: str, key: dict, payload: dict, files: Optional[Dict[str, str]] = None) -> Optional[dict]:
        """Store ``payload`` (JSON data) and copies of ``files`` ({name: path}) under ``key``; the
        record, or None when it was not stored (an unwritable database: warned about once; a file
        that is not a complete library, or did not read back intact: warned about)."""
        try:
            return self._put(type_, key, payload, files)
        except OSError as e:
            self._cannot("write", e)
            return None
        except _BadFile as e:
            logger.warning("bitblas cache: not storing %s entry %s: %s", type_, key_hash(key), e)
            return None

    def _put(self, type_, key, payload, files):
        h = key_hash(key)
        d = self._dir(type_, h)
        os.makedirs(d, exist_ok=True)
        metas = {}
        for name, src in (files or {}).items():
            with open(src, "rb") as f:
                data = f.read()
            ext = os.path.splitext(src)[1] or ".bin"
            if ext == ".so":
                why = elf_problem(data)
                if why is not None:
                    raise _BadFile(f"{src}: {why}")
            sha = hashlib.sha256(data).hexdigest()
            fname = f"{h}.{name}.{sha[:12]}{ext}"
            dst = os.path.join(d, fname)
            meta = {"name": fname, "sha256": sha, "size": len(data)}
            if not os.path.exists(dst) or file_problem(dst, meta) is not None:
                # new, or there but damaged (its name promises this content): written, then read back
                _atomic_write(dst, data)
                why = file_problem(dst, meta)
                if why is not None:
                    raise _BadFile(f"{dst} {why} after it was written")
            metas[name] = meta
        rec = {"schema": SCHEMA, "type": type_, "key": key, "key_hash": h, "created": time.time(),
               "files": metas, **payload}
        _atomic_write(os.path.join(d, h + ".json"), _canonical(rec).encode())
        return rec

    @contextlib.contextmanager
    def lock(self, type_: str, key: dict, timeout: Optional[float] = None) -> Iterator[None]:
        """Exclusive lock on one key across processes (flock; released if the holder dies). A lock
        file that exists but cannot be opened for writing is locked read-only (flock does not need
        write access); in a database where it cannot be created, nothing is locked (no process of
        this user writes there)."""
        h = key_hash(key)
        d = self._dir(type_, h)
        lock_path = os.path.join(d, h + ".lock")
        fd = None
        try:
            os.makedirs(d, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            try:
                fd = os.open(lock_path, os.O_RDONLY)
            except OSError:
                self._cannot("lock entries of", e)
        if fd is None:
            yield
            return
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
