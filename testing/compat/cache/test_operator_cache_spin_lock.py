"""Four threads sharing one database, each adding, saving, clearing and reloading the same
operator through global_operator_cache; the operator left in the cache is then run.

Mirrors microsoft/BitBLAS testing/python/cache/test_operator_cache_spin_lock.py. BitBLAS asserts
inside its threads (where a failure is only a warning); here every thread's exception is collected
and fails the test, and the cache size after reload is checked once the threads have joined (a
thread's own check races with the others' clear()).
"""
import os
import tempfile
import threading

import torch

import bitblas
from bitblas import Matmul, MatmulConfig
from bitblas.cache import global_operator_cache

TARGET = bitblas.utils.auto_detect_nvidia_target()


def _worker(config, database, errors):
    try:
        op = Matmul(config=config, target=TARGET, enable_tuning=False)
        global_operator_cache.add(op.config, op)
        global_operator_cache.save_into_database(database, target=TARGET)
        if not os.path.exists(database):
            raise AssertionError(f"no database at {database}")
        global_operator_cache.clear()
        global_operator_cache.load_from_database(database, target=TARGET)
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        errors.append(e)


def test_global_cache_save_to_database_multithreaded(device):
    """testing/python/cache/test_operator_cache_spin_lock.py::test_global_cache_save_to_database_multithreaded"""
    global_operator_cache.clear()
    config = MatmulConfig(M=1, N=1024, K=1024, A_dtype="float16", out_dtype="float16", accum_dtype="float16",
                          with_bias=False, propagate_a=False, propagate_b=False, layout="nt")
    errors = []
    with tempfile.TemporaryDirectory() as database:
        workers = [threading.Thread(target=_worker, args=(config, database, errors)) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert not errors, errors
    assert global_operator_cache.size() > 0
    op = global_operator_cache.get(config)
    assert op is not None

    A = torch.rand(1, 1024, dtype=torch.float16).to(device)
    W = torch.rand(1024, 1024, dtype=torch.float16).to(device)
    a = A if op.input_transform is None else op.input_transform(A.cpu()).to(device)
    w = W if op.weight_transform is None else op.weight_transform(W.cpu()).to(device)
    torch.testing.assert_close(op(a, w), (A.float() @ W.float().T).half(), rtol=1e-2, atol=1e-2)
