"""global_operator_cache: configs as dict keys, add / get, and a save_into_database /
load_from_database round trip, each operator then run against float32 matmul.

Mirrors microsoft/BitBLAS testing/python/cache/test_operator_cache.py.
"""
import os
import tempfile

import pytest
import torch

import bitblas
from bitblas import Matmul, MatmulConfig
from bitblas.cache import global_operator_cache

TARGET = bitblas.utils.auto_detect_nvidia_target()

# (M, enable_tuning) over a float16 1024 x 1024 "nt" problem without bias or layout hints
STATIC, DYNAMIC, DYNAMIC_TUNED = (1, False), ([1], False), ([1, 32], True)
THREE = pytest.mark.parametrize("M,enable_tuning", [STATIC, DYNAMIC, DYNAMIC_TUNED],
                                ids=["m1", "dyn1", "dyn1_32-tuned"])


def _operator(M, enable_tuning):
    global_operator_cache.clear()
    config = MatmulConfig(M=M, N=1024, K=1024, A_dtype="float16", out_dtype="float16", accum_dtype="float16",
                          with_bias=False, propagate_a=False, propagate_b=False, layout="nt")
    op = Matmul(config=config, target=TARGET)
    if enable_tuning:
        op.hardware_aware_finetune(topk=20)
    return op


def _check_forward(op, M, device):
    """The operator from the cache against float32 matmul (a dynamic-M operator at 32 rows)."""
    rows = M if isinstance(M, int) else 32
    A = torch.rand(rows, 1024, dtype=torch.float16).to(device)
    W = torch.rand(1024, 1024, dtype=torch.float16).to(device)
    a = A if op.input_transform is None else op.input_transform(A.cpu()).to(device)
    w = W if op.weight_transform is None else op.weight_transform(W.cpu()).to(device)
    expected = (A.float() @ W.float().T).half()
    torch.testing.assert_close(op(a, w), expected, rtol=1e-2, atol=1e-2)


@THREE
def test_config_hashable(M, enable_tuning):
    """testing/python/cache/test_operator_cache.py::test_config_hashable"""
    op = _operator(M, enable_tuning)
    by_config = {op.config: op}
    assert by_config[op.config] is op


@THREE
def test_global_cache_inquery(M, enable_tuning):
    """testing/python/cache/test_operator_cache.py::test_global_cache_inquery"""
    op = _operator(M, enable_tuning)
    global_operator_cache.add(op.config, op)
    assert global_operator_cache.get(op.config) is not None


@THREE
def test_global_cache_inquery_torch_forward(M, enable_tuning, device):
    """testing/python/cache/test_operator_cache.py::test_global_cache_inquery_torch_forward"""
    op = _operator(M, enable_tuning)
    global_operator_cache.add(op.config, op)
    cached = global_operator_cache.get(op.config)
    assert cached is not None
    _check_forward(cached, M, device)


@pytest.mark.parametrize("M", [1, [1, 32]], ids=["m1", "dyn1_32"])
def test_global_cache_save_to_database(M, device):
    """testing/python/cache/test_operator_cache.py::test_global_cache_save_to_database"""
    op = _operator(M, enable_tuning=False)
    global_operator_cache.add(op.config, op)
    with tempfile.TemporaryDirectory() as database:
        global_operator_cache.save_into_database(database, target=TARGET)
        assert os.path.exists(database)
        global_operator_cache.clear()
        assert global_operator_cache.size() == 0
        global_operator_cache.load_from_database(database, target=TARGET)
        assert global_operator_cache.size() > 0
    loaded = global_operator_cache.get(op.config)
    assert loaded is not None
    _check_forward(loaded, M, device)
