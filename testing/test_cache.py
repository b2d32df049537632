"""The kernel / tuning database: keys, atomic writes, damaged entries, reload in another process,
concurrent writers."""
from __future__ import annotations

import json
import logging
import os
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
from kernel_helpers import elf_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = MatmulConfig(M=None, N=128, K=256, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True,
                   with_zeros=True)


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    monkeypatch.delenv("BITBLAS_DISABLE_CACHE", raising=False)
    bitblas.set_database_path(str(tmp_path / "db"))
    yield str(tmp_path / "db")
    bitblas.set_database_path(None)


def _run(code: str, env_extra=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=timeout)


# -- paths -------------------------------------------------------------------------------------------
def test_database_path_env_and_setter(tmp_path, monkeypatch):
    bitblas.set_database_path(None)
    monkeypatch.setenv("BITBLAS_DATABASE_PATH", str(tmp_path / "env"))
    assert bitblas.cache.get_database_path() == str(tmp_path / "env")
    bitblas.set_database_path(str(tmp_path / "set"))
    try:
        assert bitblas.get_database_path() == str(tmp_path / "set")
    finally:
        bitblas.set_database_path(None)
    monkeypatch.delenv("BITBLAS_DATABASE_PATH")
    assert bitblas.cache.get_database_path() == os.path.join(os.path.expanduser("~"), ".cache", "bitblas")
    with pytest.raises(TypeError, match="path"):
        bitblas.set_database_path(3)


def test_disable_cache(monkeypatch, db_path):
    monkeypatch.setenv("BITBLAS_DISABLE_CACHE", "1")
    assert bitblas.cache.get_database() is None


# -- records -----------------------------------------------------------------------------------------
def test_put_get_roundtrip_and_files(db_path, tmp_path):
    db = bitblas.cache.get_database()
    f = tmp_path / "k.so"
    f.write_bytes(elf_bytes(1000))
    key = {"a": 1, "b": [1, 2]}
    rec = db.put("kernel", key, {"x": 5}, {"kernel": str(f)})
    got = db.get("kernel", key)
    assert got["x"] == 5 and got["key"] == key and got["key_hash"] == rec["key_hash"]
    assert open(db.file_path("kernel", got, "kernel"), "rb").read() == f.read_bytes()
    assert db.get("kernel", {"a": 2, "b": [1, 2]}) is None
    # no temporary files left behind
    d = os.path.dirname(db.record_path("kernel", key))
    assert not [n for n in os.listdir(d) if n.startswith(".tmp-")]


def test_key_changes_with_versions(monkeypatch):
    plan = make_plan(CFG, "cpu", None)
    tdesc = {"kind": "llvm", "target": "x"}
    k1 = dbm.key_hash(km.kernel_key(plan, CPUHint(), tdesc))
    for field, value in (("bitblas", "9.9.9"), ("tvm", "0.28.0"), ("bitblas_src", "0" * 16), ("tvm_ffi", "0.2")):
        v = dict(dbm.versions())
        v[field] = value
        monkeypatch.setattr(dbm, "versions", lambda v=v: v)
        assert dbm.key_hash(km.kernel_key(plan, CPUHint(), tdesc)) != k1, field
    monkeypatch.undo()
    assert dbm.key_hash(km.kernel_key(plan, CPUHint(), tdesc)) == k1
    # and with the hint, the target, the rows and the compile flags
    assert dbm.key_hash(km.kernel_key(plan, CPUHint(n_tile=8), tdesc)) != k1
    assert dbm.key_hash(km.kernel_key(plan, CPUHint(), {"kind": "llvm", "target": "y"})) != k1
    assert dbm.key_hash(km.kernel_key(make_plan(CFG, "cpu", 7), CPUHint(), tdesc)) != k1
    monkeypatch.setattr("bitblas.build.PASS_CONFIG", {"tirx.use_async_copy": False})
    assert dbm.key_hash(km.kernel_key(plan, CPUHint(), tdesc)) != k1


@pytest.mark.parametrize("damage", ["truncated-json", "garbage-json", "stale-key", "truncated-file", "missing-file"])
def test_damaged_entry_warns_and_is_rebuilt(db_path, tmp_path, caplog, damage):
    db = bitblas.cache.get_database()
    f = tmp_path / "k.so"
    f.write_bytes(elf_bytes(4096))
    key = {"k": damage}
    rec = db.put("kernel", key, {"x": 1}, {"kernel": str(f)})
    path = db.record_path("kernel", key)
    kfile = db.file_path("kernel", rec, "kernel")
    if damage == "truncated-json":
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[: len(raw) // 2])
    elif damage == "garbage-json":
        open(path, "wb").write(b"\x00\x01not json")
    elif damage == "stale-key":
        r = json.load(open(path))
        r["key"] = {"k": "other"}
        open(path, "w").write(json.dumps(r))
    elif damage == "truncated-file":
        open(kfile, "r+b").truncate(100)
    else:
        os.unlink(kfile)
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        assert db.get("kernel", key) is None
    assert "rebuilding" in caplog.text
    assert not os.path.exists(path)
    db.put("kernel", key, {"x": 2}, {"kernel": str(f)})      # rebuilt entry works again
    assert db.get("kernel", key)["x"] == 2


def test_corrupt_kernel_library_is_rebuilt_with_correct_results(db_path, caplog):
    """A kernel file that passes the checksum but does not load (overwritten consistently) is
    rebuilt, and the operator still computes the right thing."""
    plan = make_plan(CFG, "cpu", None)
    fn, hint = km.get_kernel(plan, CPUHint(n_tile=16, k_vec=16), persist=True)
    db = bitblas.cache.get_database()
    key = km.kernel_key(plan, hint, km.target_desc("cpu"))
    rec = db.get("kernel", key)
    kfile = db.file_path("kernel", rec, "kernel")
    junk = elf_bytes(300)       # a complete ELF header (it passes the database's checks), no library
    os.chmod(kfile, 0o644)
    open(kfile, "wb").write(junk)
    import hashlib
    rec["files"]["kernel"].update(size=len(junk), sha256=hashlib.sha256(junk).hexdigest())
    open(db.record_path("kernel", key), "w").write(json.dumps(rec))
    km.clear_memory()
    with caplog.at_level(logging.WARNING, logger="bitblas"):
        fn2, _ = km.get_kernel(plan, CPUHint(n_tile=16, k_vec=16), persist=True)
    assert "does not load" in caplog.text
    inp = random_inputs(CFG, 5)
    out = torch.empty(5, CFG.N, dtype=torch.float16)
    from bitblas.tune.tuner import kernel_args
    fn2(*kernel_args(plan, inp, out))
    assert relative_error(out, reference_matmul(CFG, **inp)) <= tolerance(CFG)


def test_list_and_clear(db_path):
    op = bitblas.Matmul(CFG.replace(M=[4, 16]), target="llvm")
    op.hardware_aware_finetune(topk=2, parallel_build=False, progress=False)
    entries = bitblas.cache.list_entries()
    tuning = bitblas.cache.list_entries("tuning")
    assert {e["m"] for e in tuning} == {4, 16}
    assert all(e["latency_ms"] > 0 and e["hint"]["class"] in ("CPUHint", "CPUGemvHint") for e in tuning)
    assert len(bitblas.cache.list_entries("kernel")) >= 1
    with pytest.raises(ValueError, match="type"):
        bitblas.cache.list_entries("bogus")
    assert bitblas.cache.clear() == len(entries)
    assert bitblas.cache.list_entries() == []


# -- other processes ---------------------------------------------------------------------------------
_RELOAD = """
    import json, logging, time, torch
    import bitblas
    from bitblas import MatmulConfig
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    cfg = MatmulConfig.from_dict(json.loads({cfg!r}))
    import bitblas.build as b
    calls = []
    orig = b.compile_plan
    b.compile_plan = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    t0 = time.perf_counter()
    op = bitblas.Matmul(cfg, target="llvm", enable_tuning=True)
    dt = time.perf_counter() - t0
    inp = random_inputs(cfg, 7)
    err = relative_error(op(**inp), reference_matmul(cfg, **inp))
    print(json.dumps({{"seconds": dt, "compiles": len(calls), "err": err, "tol": tolerance(cfg),
                      "cached": [r.from_cache for r in op.tuning_results["cpu"].values()]}}))
"""


def test_cache_hit_after_reload_in_another_process(db_path):
    cfg = CFG.replace(M=[1, 8])
    op = bitblas.Matmul(cfg, target="llvm")
    res = op.hardware_aware_finetune(topk=2, parallel_build=False, progress=False)
    assert not any(r.from_cache for r in res.values())
    r = _run(_RELOAD.format(cfg=json.dumps(cfg.to_dict())), {"BITBLAS_DATABASE_PATH": db_path})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cached"] == [True, True]
    assert out["compiles"] == 0                    # loaded, not compiled
    assert out["seconds"] < 1.0
    assert out["err"] <= out["tol"]


def test_cache_miss_when_version_changes(db_path, monkeypatch):
    cfg = CFG.replace(M=4)
    bitblas.Matmul(cfg, target="llvm").hardware_aware_finetune(topk=1, parallel_build=False, progress=False)
    v = dict(dbm.versions())
    v["bitblas"] = "0.0.0-other"
    monkeypatch.setattr(dbm, "versions", lambda: v)
    km.clear_memory()
    res = bitblas.Matmul(cfg, target="llvm").hardware_aware_finetune(topk=1, parallel_build=False, progress=False)
    assert not res[4].from_cache                   # another version: tuned again, not reused
    monkeypatch.undo()
    res = bitblas.Matmul(cfg, target="llvm").hardware_aware_finetune(topk=1, parallel_build=False, progress=False)
    assert res[4].from_cache


_UNTUNED = """
    import json, sys, time, torch
    import tvm
    import bitblas
    import bitblas.build as b
    calls = []
    orig_plan, orig_compile = b.compile_plan, tvm.compile
    b.compile_plan = lambda *a, **k: (calls.append("compile_plan"), orig_plan(*a, **k))[1]
    tvm.compile = lambda *a, **k: (calls.append("tvm.compile"), orig_compile(*a, **k))[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 96), torch.nn.ReLU(), torch.nn.Linear(96, 128))
    x = torch.randn(3, 256)
    ref = model(x)
    t0 = time.perf_counter()
    bitblas.quantize_model(model, dict(W_dtype="int4", group_size=32), skip=())
    out = model(x).float()
    dt = time.perf_counter() - t0
    print(json.dumps({"calls": calls, "seconds": dt,
                      "cos": torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), 0).item()}))
"""


def test_untuned_cpu_kernels_load_in_a_second_process(db_path):
    """quantize_model + a forward pass on CPU: the first process compiles its kernels and writes
    them to the database; a second process with the same database loads them, compiling nothing."""
    runs = []
    for _ in range(2):
        r = _run(_UNTUNED, {"BITBLAS_DATABASE_PATH": db_path})
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert "tvm.compile" in first["calls"]           # the first process did compile (a fresh database)
    assert second["calls"] == []                     # loaded from the database, nothing compiled
    assert second["cos"] > 0.99 and abs(second["cos"] - first["cos"]) < 1e-6
    assert len(bitblas.cache.list_entries("kernel")) >= 2


_WRITER = """
    import os, sys
    from bitblas.cache import Database
    db = Database(sys.argv[1] if len(sys.argv) > 1 else {path!r})
    me = os.getpid()
    for i in range(40):
        db.put("tuning", {{"shared": 1}}, {{"writer": me, "i": i, "pad": "x" * 20000}})
        db.put("tuning", {{"own": me, "i": i}}, {{"writer": me}})
        r = db.get("tuning", {{"shared": 1}})
        assert r is not None and r["i"] in range(40), r
    print("ok")
"""


def test_concurrent_writers_never_corrupt_or_lose(db_path):
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER.format(path=db_path))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    db = bitblas.cache.get_database()
    assert db.get("tuning", {"shared": 1})["i"] == 39           # a complete record of some writer
    pids = {p.pid for p in procs}
    for pid in pids:                                           # every writer's own entries survive
        for i in range(40):
            assert db.get("tuning", {"own": pid, "i": i})["writer"] == pid
