"""The per-call hot path (bitblas.Linear.forward -> BoundMatmul._try, cached per row count) keeps
every input check: after good calls have filled its caches, bad input still raises naming what
is wrong, and a new row count (or rank) dispatches to a kernel that computes the right result."""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas.config import MatmulConfig

N, K = 48, 64


@pytest.fixture
def db_path(tmp_path):
    bitblas.set_database_path(str(tmp_path / "db"))
    yield str(tmp_path / "db")
    bitblas.set_database_path(None)


def _layer(seed=0):
    lin = bitblas.Linear(K, N, bias=True, A_dtype="float16", W_dtype="uint4", group_size=32, with_zeros=True)
    g = torch.Generator().manual_seed(seed)
    lin.load_and_transform_weight(torch.randn(N, K, generator=g) * 0.05,
                                  bias=torch.randn(N, generator=g).to(torch.float16) * 0.1)
    return lin


def _ref(lin, x):
    y = x.double() @ lin.dequantized_weight().double().T + lin.bias.double()
    return y.to(torch.float16)


def _x(*shape, seed=1):
    return torch.randn(*shape, K, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


@pytest.fixture(scope="module")
def lin():
    layer = _layer()
    layer(_x(1))                       # fill the caches: bound operator, rows=1 dispatch
    assert layer._bound is not None
    return layer


def test_rows_change_dispatches(lin):
    """1 row, then other row counts and ranks, then 1 row again: each matches the reference."""
    for shape in [(1,), (3,), (17,), (2, 5), (1, 1), (3,), (1,)]:
        x = _x(*shape, seed=sum(shape))
        y = lin(x)
        assert y.shape == (*shape, N) and y.dtype == torch.float16 and y.is_contiguous()
        torch.testing.assert_close(y.float(), _ref(lin, x).float(), rtol=2e-2, atol=2e-2)
    assert {1, 3, 17, 10} <= set(lin._bound._rows)


def test_fresh_outputs(lin):
    """Each call returns a new tensor (the output template is never handed out)."""
    x = _x(1)
    a, b = lin(x), lin(x)
    assert a.data_ptr() != b.data_ptr()
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bad, exc, names", [
    pytest.param(lambda: _x(1).float(), TypeError, ("dtype", "float32"), id="dtype"),
    pytest.param(lambda: _x(1).to(torch.bfloat16), TypeError, ("dtype", "bfloat16"), id="bf16"),
    pytest.param(lambda: torch.zeros(1, K + 2, dtype=torch.float16), ValueError, ("last dimension",), id="last-dim"),
    pytest.param(lambda: torch.zeros(1, K // 2, dtype=torch.float16), ValueError, ("last dimension",), id="half-dim"),
    pytest.param(lambda: torch.zeros((), dtype=torch.float16), ValueError, ("last dimension",), id="0-d"),
    pytest.param(lambda: torch.zeros(1, K, dtype=torch.float16, device="meta"), ValueError, ("meta",), id="meta"),
    pytest.param(lambda: [[0.0] * K], TypeError, ("torch.Tensor",), id="list"),
])
def test_bad_input_after_good_call(lin, bad, exc, names):
    lin(_x(1))
    with pytest.raises(exc) as e:
        lin(bad())
    for n in names:
        assert n in str(e.value)
    lin(_x(1))                                   # and the hot path still works afterwards


def test_non_contiguous_input(lin):
    """Linear takes a non-contiguous input (copied); the bound operator refuses it, naming A."""
    x = _x(2, seed=3).repeat(1, 2)[:, ::2]
    assert not x.is_contiguous()
    torch.testing.assert_close(lin(x).float(), _ref(lin, x).float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match=r"\bA\b.*contiguous"):
        lin._bound(x)


def test_bad_output_after_good_call(lin):
    x = _x(2)
    out = torch.empty(2, N, dtype=torch.float16)
    assert lin(x, output=out) is out
    with pytest.raises(TypeError, match="output"):
        lin(x, output=torch.empty(2, N, dtype=torch.float32))
    with pytest.raises(ValueError, match="output"):
        lin(x, output=torch.empty(3, N, dtype=torch.float16))
    with pytest.raises(ValueError, match="output"):
        lin(x, output=torch.empty(2, 2 * N, dtype=torch.float16)[:, ::2])


def test_replaced_buffer_rebinds():
    """Replacing a buffer (not in place) after good calls: the next call uses the new tensor."""
    lin = _layer(seed=4)
    x = _x(1)
    y0 = lin(x)
    lin.bias = torch.zeros_like(lin.bias)           # register_buffer's setattr replaces the tensor
    torch.testing.assert_close(lin(x).float(), (y0.double() - _layer(seed=4).bias.double()).float(),
                               rtol=2e-2, atol=2e-2)


def test_retune_clears_fast_dispatch(db_path):
    """Tuning changes which kernel serves a row count: the bound operators' tables are emptied."""
    cfg = MatmulConfig(M=(1, 4), N=32, K=64, A_dtype="float16", W_dtype="int8")
    op = bitblas.Matmul(cfg, target="llvm")
    W = torch.randint(-8, 8, (32, 64), dtype=torch.int8)
    bound = op.bind(op.transform_weight(W))
    x = torch.randn(4, 64).to(torch.float16)
    y = bound(x)
    assert 4 in bound._rows
    op.hardware_aware_finetune(topk=1, parallel_build=False, progress=False, kind="cpu")
    assert 4 not in bound._rows
    torch.testing.assert_close(bound(x), y)
    assert bound._rows[4][0] is op._kernel("cpu", 4)[1]
