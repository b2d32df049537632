"""Shared helpers for the CPU test suite.

Every test runs against a temporary kernel database (``_session_database``): the suite never
reads or writes the user's ``~/.cache/bitblas`` (or the folder BITBLAS_DATABASE_PATH names).
Every nvcc compile of a generated kernel is timed (``_nvcc_time_bound``): a kernel whose
compile takes more than ``NVCC_CPU_SECONDS`` of compiler CPU time fails the test that built it,
and the slowest compiles are listed at the end of the run.

Under pytest-xdist (the README's command: ``-n 2``) each worker gets its share of the cores for
torch's and TVM's thread pools (``pytest_configure``) unless OMP_NUM_THREADS / TVM_NUM_THREADS say
otherwise: every worker taking every core oversubscribed a GPU host's CPU several times over. The
workers' nvcc times reach the controller's summary (``pytest_testnodedown``).
"""
from __future__ import annotations

import os
import re
import resource
import time

import pytest

# compiler CPU time (nvcc, cicc, ptxas) allowed for one generated kernel; CPU time, not wall time,
# so that a loaded CI machine does not fail it (the slowest kernel measured: see docs/tuning.md)
NVCC_CPU_SECONDS = 60.0
_NVCC_TIMES = []                 # (cpu seconds, wall seconds, test id, kernel name)
_USER_DATABASES = [os.path.join(os.path.expanduser("~"), ".cache", "bitblas")]   # never used by a test


def pytest_configure(config):
    """An xdist worker's thread pools: the cores divided among the workers (at least 1)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (os.environ.get("PYTEST_XDIST_WORKER") and workers and workers.isdigit()):
        return
    share = str(max(1, (os.cpu_count() or 1) // int(workers)))
    for name in ("OMP_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ.setdefault(name, share)
    import torch
    n = os.environ["OMP_NUM_THREADS"]
    torch.set_num_threads(int(n) if n.isdigit() and int(n) > 0 else int(share))


def raises_naming(exc_type, name: str):
    """``pytest.raises(exc_type)`` whose message must name ``name`` as a whole word.

    Usage: ``with raises_naming(ValueError, "group_size"): ...``
    """
    return pytest.raises(exc_type, match=rf"(?<![\w.]){re.escape(name)}(?![\w])")


@pytest.fixture
def naming():
    return raises_naming


@pytest.fixture(scope="session", autouse=True)
def _session_database(tmp_path_factory):
    """One temporary database for the whole run: the environment variable (inherited by the
    subprocesses tests start) and the process's path both point at it; a test's own
    ``set_database_path(None)`` falls back to it."""
    import bitblas
    path = str(tmp_path_factory.mktemp("bitblas-db"))
    saved = os.environ.get("BITBLAS_DATABASE_PATH")
    if saved:
        _USER_DATABASES.append(os.path.abspath(os.path.expanduser(saved)))
    os.environ["BITBLAS_DATABASE_PATH"] = path
    bitblas.set_database_path(path)
    yield path
    bitblas.set_database_path(None)
    if saved is None:
        os.environ.pop("BITBLAS_DATABASE_PATH", None)
    else:
        os.environ["BITBLAS_DATABASE_PATH"] = saved


@pytest.fixture(autouse=True)
def _database_stays_temporary(_session_database):
    """Before each test: the database is a temporary one (a test that changed it must restore it)."""
    from bitblas.cache import get_database_path
    path = get_database_path()
    for user in _USER_DATABASES:
        if os.path.commonpath([path, user]) == user:
            pytest.fail(f"the kernel database points at the user's {path}; tests must use a temporary one")


@pytest.fixture(autouse=True)
def _nvcc_time_bound(request, monkeypatch):
    """Time every nvcc compile of the test (bitblas.build._nvcc); fail the test when one takes more
    than NVCC_CPU_SECONDS of compiler CPU time."""
    import bitblas.build as build
    orig = build._nvcc
    slow = []

    def timed(source, arch, timeout, extra=()):
        c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        try:
            return orig(source, arch, timeout, extra)
        finally:
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
            m = re.search(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(", source)
            name = f"{arch}:{m.group(1) if m else '?'}:{len(source)}B"
            _NVCC_TIMES.append((cpu, time.perf_counter() - t0, request.node.nodeid, name))
            if cpu > NVCC_CPU_SECONDS:
                slow.append(f"{name} took {cpu:.1f} s of compiler CPU time")

    monkeypatch.setattr(build, "_nvcc", timed)
    yield
    if slow:
        pytest.fail(f"generated kernels compile too slowly (limit {NVCC_CPU_SECONDS:g} s): {'; '.join(slow)}")


def pytest_sessionfinish(session):
    """An xdist worker hands its nvcc times to the controller, which prints the summary."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["nvcc_times"] = [list(t) for t in _NVCC_TIMES]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(pytest-xdist, in the controller) a worker's nvcc times, for the summary."""
    _NVCC_TIMES.extend(tuple(t) for t in getattr(node, "workeroutput", {}).get("nvcc_times", ()))


def pytest_terminal_summary(terminalreporter):
    if not _NVCC_TIMES:
        return
    times = sorted(_NVCC_TIMES, reverse=True)
    terminalreporter.write_sep("-", f"nvcc: {len(times)} compiles, {sum(t[0] for t in times):.0f} s of compiler CPU "
                                    f"time; the slowest")
    for cpu, wall, test, name in times[:5]:
        terminalreporter.write_line(f"{cpu:7.1f} s cpu {wall:7.1f} s wall  {name}  {test}")
