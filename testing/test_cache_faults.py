"""Faults of the kernel database (issue 26, items 4-8 and 12): a database the process cannot write
(read-only, as another user's is, or a regular file), kernel files damaged at their size, truncated
libraries whose record matches, file modes, and the CPU tuner's own inputs. The CUDA variant of the
damaged-entry checks is marked ``gpu``."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.cache import database as dbm
from bitblas.cache import kernels as km
from bitblas.plan import make_plan
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import CPUHint
from bitblas.tune.tuner import kernel_args
from kernel_helpers import elf_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = MatmulConfig(M=None, N=64, K=128, A_dtype="float16", W_dtype="uint4", group_size=64, with_scaling=True,
                   with_zeros=True)
HINT = CPUHint(n_tile=16, k_vec=16)


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    monkeypatch.delenv("BITBLAS_DISABLE_CACHE", raising=False)
    path = str(tmp_path / "db")
    monkeypatch.setenv("BITBLAS_DATABASE_PATH", path)     # the subprocesses' database too
    bitblas.set_database_path(path)
    getattr(dbm, "_UNWRITABLE", {}).clear()
    yield path
    bitblas.set_database_path(None)
    getattr(dbm, "_UNWRITABLE", {}).clear()


def _check(cfg, fn_or_op, plan=None, m=3):
    inp = random_inputs(cfg, m)
    if plan is None:
        out = fn_or_op(**inp)
    else:
        out = torch.full((m, cfg.N), float("nan"), dtype=torch.float16)
        fn_or_op(*kernel_args(plan, inp, out))
    assert relative_error(out, reference_matmul(cfg, **inp)) <= tolerance(cfg)


def _stored_kernel(plan, hint=HINT):
    """(database, record, kernel file path) of ``plan``'s kernel, built and stored now."""
    km.get_kernel(plan, hint, persist=True)
    db = bitblas.cache.get_database()
    key = km.kernel_key(plan, hint, km.target_desc(plan.target_kind))
    rec = db.get("kernel", key)
    assert rec is not None
    return db, key, rec, db.file_path("kernel", rec, "kernel")


def _rewrite_record(db, key, rec, data: bytes):
    """Make the record describe ``data`` (as if it had been written for a damaged file)."""
    rec["files"]["kernel"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(db.record_path("kernel", key), "w") as f:
        f.write(json.dumps(rec))


def _count_compiles(monkeypatch):
    import bitblas.build as b
    calls = []
    orig = b.compile_plan
    monkeypatch.setattr(b, "compile_plan", lambda *a, **k: (calls.append(1), orig(*a, **k))[1])
    return calls


# -- item 5: a damaged kernel file of the right size is repaired -------------------------------------
def test_same_size_damage_is_repaired(db_path, caplog, monkeypatch):
    plan = make_plan(CFG, "cpu", None)
    db, key, rec, kfile = _stored_kernel(plan)
    good = open(kfile, "rb").read()
    bad = bytearray(good)
    bad[len(bad) // 2: len(bad) // 2 + 64] = bytes(64)          # damaged, same size
    assert bytes(bad) != good
    with open(kfile, "wb") as f:
        f.write(bad)
    km.clear_memory()
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        fn, _ = km.get_kernel(plan, HINT, persist=True)         # detected, rebuilt, stored again
    assert "sha256" in caplog.text
    _check(CFG, fn, plan)
    assert open(kfile, "rb").read() == good                      # the file itself was rewritten
    # a new process (here: an empty memory cache) loads it without a warning or a compile
    km.clear_memory()
    caplog.clear()
    calls = _count_compiles(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        fn, _ = km.get_kernel(plan, HINT, persist=True)
    assert calls == [] and "bitblas cache" not in caplog.text
    _check(CFG, fn, plan)


# -- item 6: a truncated library is never loaded ---------------------------------------------------
_LOAD_TRUNCATED = """
    import json, logging, torch
    logging.basicConfig(level=logging.WARNING)
    from bitblas import MatmulConfig
    from bitblas.cache import kernels as km
    from bitblas.plan import make_plan
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    from bitblas.schedule import CPUHint
    from bitblas.tune.tuner import kernel_args
    cfg = MatmulConfig.from_dict(json.loads({cfg!r}))
    plan = make_plan(cfg, "cpu", None)
    fn, _ = km.get_kernel(plan, CPUHint(n_tile=16, k_vec=16), persist=True)
    inp = random_inputs(cfg, 3)
    out = torch.full((3, cfg.N), float("nan"), dtype=torch.float16)
    fn(*kernel_args(plan, inp, out))
    print("ERR", relative_error(out, reference_matmul(cfg, **inp)), tolerance(cfg))
"""


def test_truncated_library_with_matching_record_is_not_loaded(db_path):
    """A record written for an already truncated library (its sha256 and size match the file): the
    file is checked as a library before it is loaded; loading it would kill the process (SIGBUS)."""
    plan = make_plan(CFG, "cpu", None)
    db, key, rec, kfile = _stored_kernel(plan)
    data = open(kfile, "rb").read()[: len(open(kfile, "rb").read()) * 2 // 5]
    with open(kfile, "wb") as f:
        f.write(data)
    _rewrite_record(db, key, rec, data)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD_TRUNCATED.format(cfg=json.dumps(CFG.to_dict())))],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 0, f"returncode {r.returncode} (-7: SIGBUS)\n{r.stderr[-3000:]}"
    assert "truncated" in r.stderr
    err, tol = map(float, r.stdout.split("ERR")[1].split())
    assert err <= tol
    assert dbm.elf_problem(open(kfile, "rb").read()) is None       # rebuilt and stored whole


def test_put_refuses_an_incomplete_library(db_path, tmp_path, caplog):
    plan = make_plan(CFG, "cpu", None)
    _, _, _, kfile = _stored_kernel(plan)
    cut = tmp_path / "cut.so"
    cut.write_bytes(open(kfile, "rb").read()[:3000])
    db = bitblas.cache.get_database()
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        assert db.put("kernel", {"k": "cut"}, {}, {"kernel": str(cut)}) is None
    assert "truncated" in caplog.text
    assert not os.path.exists(db.record_path("kernel", {"k": "cut"}))


def test_record_written_only_after_the_file_reads_back(db_path, tmp_path, monkeypatch, caplog):
    """A kernel file that is not what was written (a short write, a full disk that lied) gets no record."""
    plan = make_plan(CFG, "cpu", None)
    _, _, _, kfile = _stored_kernel(plan)
    src = tmp_path / "k.so"
    src.write_bytes(open(kfile, "rb").read())
    orig = dbm._atomic_write

    def short_write(path, data):
        orig(path, data if path.endswith(".json") else data[: len(data) // 2])

    monkeypatch.setattr(dbm, "_atomic_write", short_write)
    db = bitblas.cache.get_database()
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        assert db.put("kernel", {"k": "short"}, {}, {"kernel": str(src)}) is None
    assert not os.path.exists(db.record_path("kernel", {"k": "short"}))
    assert "after it was written" in caplog.text


# -- item 7: modes follow the umask ----------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_files_follow_the_umask(db_path, tmp_path, umask):
    src = tmp_path / "k.so"
    src.write_bytes(elf_bytes(100))
    old = os.umask(umask)
    try:
        db = bitblas.cache.get_database()
        rec = db.put("kernel", {"k": umask}, {}, {"kernel": str(src)})
        with db.lock("kernel", {"k": umask}):
            pass
    finally:
        os.umask(old)
    files = [db.record_path("kernel", {"k": umask}), db.file_path("kernel", rec, "kernel"),
             db.record_path("kernel", {"k": umask})[:-5] + ".lock"]
    for p in files:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o666 & ~umask, p
    assert stat.S_IMODE(os.stat(os.path.dirname(files[0])).st_mode) == 0o777 & ~umask


# -- item 8: the tuner's own random inputs raise no warning ----------------------------------------
def test_cpu_tuning_logs_no_clamping_warning(db_path, caplog):
    cfg = MatmulConfig(M=2, N=64, K=128, A_dtype="float16", W_dtype="uint4", group_size=64, with_scaling=True)
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        op = bitblas.Matmul(cfg, target="llvm")
        op.hardware_aware_finetune(topk=1, parallel_build=False, progress=False)
    assert "clamped" not in caplog.text
    _check(cfg, op, m=2)


# -- item 4: a database this process cannot write ----------------------------------------------------
_TUNE = """
    import glob, json, logging, os, time, torch
    records = []
    class H(logging.Handler):
        def emit(self, r):
            records.append(r.getMessage())
    logging.getLogger("bitblas").addHandler(H())
    import bitblas
    from bitblas import MatmulConfig
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    import bitblas.build as b
    calls = []
    orig = b.compile_plan
    b.compile_plan = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    cfg = MatmulConfig.from_dict(json.loads({cfg!r}))
    op = bitblas.Matmul(cfg, target="llvm", enable_tuning=True)
    inp = random_inputs(cfg, 4)
    err = relative_error(op(**inp), reference_matmul(cfg, **inp))
    print(json.dumps({{"err": err, "tol": tolerance(cfg), "compiles": len(calls),
                      "cached": [r.from_cache for r in op.tuning_results["cpu"].values()],
                      "warnings": [m for m in records if "bitblas cache" in m]}}))
"""


def _read_only(path: str):
    """Make ``path`` read-only for a subprocess: its folders and files lose their write bits, and
    where this process is root (which ignores permission bits) the subprocess runs without the
    capabilities that override them. Returns (preexec_fn, undo)."""
    modes = []
    for d, dirs, files in os.walk(path):
        for p in [d] + [os.path.join(d, f) for f in files]:
            modes.append((p, os.stat(p).st_mode))
            os.chmod(p, stat.S_IMODE(os.stat(p).st_mode) & ~0o222)

    def undo():
        for p, mode in reversed(modes):
            os.chmod(p, mode)

    def drop_overrides():
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2, 3):        # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
            if libc.prctl(24, cap, 0, 0, 0) != 0:      # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return (drop_overrides if os.geteuid() == 0 else None), undo


def _run_tune(cfg, db_path, preexec=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), BITBLAS_DATABASE_PATH=db_path)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_TUNE.format(cfg=json.dumps(cfg.to_dict())))],
                       capture_output=True, text=True, timeout=600, env=env, preexec_fn=preexec, cwd="/")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_read_only_database_loads_what_it_can(db_path):
    """Entries tuned into a database, then read by a process that cannot write it (read-only; the
    same as another user's): loaded, no
    compile, no warning, no lock file created; a config with no entry is tuned into memory, with
    one warning."""
    cfg = CFG.replace(M=[2, 8])
    op = bitblas.Matmul(cfg, target="llvm")
    op.hardware_aware_finetune(topk=1, parallel_build=False, progress=False)
    locks = {os.path.join(d, f) for d, _, fs in os.walk(db_path) for f in fs if f.endswith(".lock")}
    for p in locks:
        os.unlink(p)                                  # a database as shipped: no lock files
    preexec, undo = _read_only(db_path)
    try:
        out = _run_tune(cfg, db_path, preexec)
        assert out["cached"] == [True, True] and out["compiles"] == 0 and out["warnings"] == []
        assert out["err"] <= out["tol"]
        assert not [f for _, _, fs in os.walk(db_path) for f in fs if f.endswith(".lock")]
        other = cfg.replace(N=96)                     # nothing stored: tuned, kept in memory
        out = _run_tune(other, db_path, preexec)
        assert out["cached"] == [False, False] and out["err"] <= out["tol"]
        assert len(out["warnings"]) == 1 and db_path in out["warnings"][0], out["warnings"]
    finally:
        undo()
    assert bitblas.cache.list_entries("tuning") and len(bitblas.cache.list_entries("tuning")) == 2


def test_regular_file_as_database(db_path, caplog):
    with open(db_path, "w") as f:
        f.write("not a folder")
    cfg = CFG.replace(M=4)
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        op = bitblas.Matmul(cfg, target="llvm", enable_tuning=True)
        _check(cfg, op, m=4)
        op2 = bitblas.Matmul(cfg.replace(N=96), target="llvm", enable_tuning=True)
        _check(cfg.replace(N=96), op2, m=4)
    warned = [r for r in caplog.records if "bitblas cache" in r.getMessage()]
    assert len(warned) == 1 and db_path in warned[0].getMessage()
    assert open(db_path).read() == "not a folder"


# -- item 12: the same faults for CUDA kernels (GPU) ---------------------------------------------------
_LOAD_CUDA = """
    import json, logging, torch
    logging.basicConfig(level=logging.WARNING)
    from bitblas import MatmulConfig
    from bitblas.cache import kernels as km
    from bitblas.plan import make_plan
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    from bitblas.tune.tuner import kernel_args
    cfg = MatmulConfig.from_dict(json.loads({cfg!r}))
    plan = make_plan(cfg, "cuda", {m!r})
    fn, _ = km.get_kernel(plan)
    m = {m!r} or 40
    inp = random_inputs(cfg, m, device="cuda")
    out = torch.full((m, cfg.N), float("nan"), dtype=torch.float16, device="cuda")
    fn(*kernel_args(plan, inp, out))
    torch.cuda.synchronize()
    print("ERR", relative_error(out, reference_matmul(cfg, **inp)), tolerance(cfg))
"""
CUDA_CFG = MatmulConfig(M=None, N=1000, K=1536, A_dtype="float16", W_dtype="uint4", group_size=128,
                        with_scaling=True, with_zeros=True, with_bias=True)


def _cuda_check(fn, plan, m):
    inp = random_inputs(CUDA_CFG, m, device="cuda")
    out = torch.full((m, CUDA_CFG.N), float("nan"), dtype=torch.float16, device="cuda")
    fn(*kernel_args(plan, inp, out))
    torch.cuda.synchronize()
    assert relative_error(out, reference_matmul(CUDA_CFG, **inp)) <= tolerance(CUDA_CFG)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 16, None], ids=["gemv-rows", "gemv-mma", "symbolic"])
@pytest.mark.parametrize("fault", ["truncated", "corrupt", "same-size", "stale"])
def test_cuda_kernel_faults_are_repaired(db_path, fault, m, caplog, monkeypatch):
    """A CUDA kernel entry (the GEMV rows kernel, the tensor-core GEMV, the symbolic GEMM) damaged
    on disk: a truncated library whose record matches it (loaded in a subprocess: SIGBUS if it
    were mapped), a library that does not load, a same-size damaged file, a record of another key.
    Each is warned about, rebuilt, stored again, and then loads without a compile and computes the
    reference."""
    plan = make_plan(CUDA_CFG, "cuda", m)
    km.get_kernel(plan)
    db = bitblas.cache.get_database()
    from bitblas.build import cuda_target
    from bitblas.kernels import default_hint
    hint = default_hint(plan, cuda_target(None))
    key = km.kernel_key(plan, hint, km.target_desc("cuda", cuda_target(None)))
    rec = db.get("kernel", key)
    assert rec is not None, "the CUDA kernel was not stored"
    kfile = db.file_path("kernel", rec, "kernel")
    good = open(kfile, "rb").read()
    if fault == "truncated":
        data = good[: len(good) * 2 // 5]
        with open(kfile, "wb") as f:
            f.write(data)
        _rewrite_record(db, key, rec, data)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(_LOAD_CUDA.format(
            cfg=json.dumps(CUDA_CFG.to_dict()), m=m))], capture_output=True, text=True, timeout=600,
            env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        assert r.returncode == 0, f"returncode {r.returncode} (-7: SIGBUS)\n{r.stderr[-3000:]}"
        assert "truncated" in r.stderr
        err, tol = map(float, r.stdout.split("ERR")[1].split())
        assert err <= tol
    else:
        if fault == "corrupt":
            data = elf_bytes(len(good) // 2)
            with open(kfile, "wb") as f:
                f.write(data)
            _rewrite_record(db, key, rec, data)
            expect = "does not load"
        elif fault == "same-size":
            bad = bytearray(good)
            bad[len(bad) // 2: len(bad) // 2 + 256] = bytes(256)
            with open(kfile, "wb") as f:
                f.write(bad)
            expect = "sha256"
        else:                                   # a record written for another key
            rec2 = dict(rec, key=dict(rec["key"], m="other"))
            with open(db.record_path("kernel", key), "w") as f:
                f.write(json.dumps(rec2))
            expect = "stale"
        km.clear_memory()
        with caplog.at_level(logging.WARNING, logger="bitblas"):
            fn, _ = km.get_kernel(plan)
        assert expect in caplog.text
        _cuda_check(fn, plan, m or 40)
    # repaired on disk: a new process (an empty memory cache) loads it, no warning, no compile
    assert open(kfile, "rb").read() == good or db.get("kernel", key) is not None
    km.clear_memory()
    caplog.clear()
    calls = _count_compiles(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        fn, _ = km.get_kernel(plan)
    assert calls == [] and "bitblas cache" not in caplog.text
    _cuda_check(fn, plan, m or 40)
