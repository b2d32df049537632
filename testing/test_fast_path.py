"""The per-call hot path (bitblas.Linear.forward -> BoundMatmul._try, cached per row count) keeps
every input check: after good calls have filled its caches, bad input still raises naming what
is wrong, and a new row count (or rank) dispatches to a kernel that computes the right result."""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas.config import MatmulConfig
from bitblas.ops.bound import BoundMatmul

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


# -- the unbound call: Matmul.__call__ (op(A, W, ...), BitBLAS's positional form included) ----------

@pytest.fixture(scope="module")
def unbound():
    """A uint4 g32 operator with scales, zeros and bias, its packed tensors, and a float64 reference."""
    cfg = MatmulConfig(M=(1, 4, 16), N=N, K=K, A_dtype="float16", W_dtype="uint4", group_size=32,
                       with_scaling=True, with_zeros=True, zeros_mode="original", with_bias=True)
    op = bitblas.Matmul(cfg, target="llvm")
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.int8)
    scale = (torch.rand(N, K // 32, generator=g) * 0.02 + 0.01).to(torch.float16)
    zeros = (torch.rand(N, K // 32, generator=g) * 4 + 6).to(torch.float16)
    bias = (torch.randn(N, generator=g) * 0.1).to(torch.float16)
    Wq = op.transform_weight(codes)
    deq = (codes.double() - zeros.double().repeat_interleave(32, 1)) * scale.double().repeat_interleave(32, 1)

    def ref(x):
        return (x.double().reshape(-1, K) @ deq.T + bias.double()).reshape(*x.shape[:-1], N).to(torch.float16)
    return op, Wq, scale, zeros, bias, ref


def _close(y, want):
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_unbound_fast_path_matches(unbound):
    """Keyword and positional calls, fresh and given outputs, several row counts and ranks: each
    matches the reference, before and after the per-shape entry exists, and the fast path is taken."""
    op, Wq, scale, zeros, bias, ref = unbound
    for shape in [(1,), (3,), (1,), (2, 5), (16,), (3,)]:
        x = _x(*shape, seed=sum(shape) + 11)
        y = op(x, Wq, scale=scale, zeros=zeros, bias=bias)
        assert y.shape == (*shape, N) and y.is_contiguous() and y.stride()[-1] == 1
        _close(y, ref(x))
        out = torch.full((*shape, N), float("nan"), dtype=torch.float16)
        assert op(x, Wq, scale, zeros, bias, out) is out          # BitBLAS's positional order
        _close(out, ref(x))
        assert op._calls[(x.device, x.shape)] is not None
    a, b = op(_x(1), Wq, scale, zeros, bias), op(_x(1), Wq, scale, zeros, bias)
    assert a.data_ptr() != b.data_ptr()


def test_unbound_other_legal_forms_after_fast_calls(unbound):
    """Forms the fast path does not take itself still work through the general checks: float32 scales
    and zeros where the plan wants float16 are refused or converted exactly as before, and a
    non-contiguous W is refused naming W."""
    op, Wq, scale, zeros, bias, ref = unbound
    x = _x(2, seed=5)
    _close(op(x, Wq, scale, zeros, bias), ref(x))
    with pytest.raises(TypeError, match=r"scale.*dtype"):
        op(x, Wq, scale.float(), zeros, bias)
    with pytest.raises(ValueError, match=r"W.*contiguous|W.*shape"):
        op(x, torch.cat([Wq, Wq], 1)[:, ::2], scale, zeros, bias)
    _close(op(x, Wq, scale, zeros, bias), ref(x))


@pytest.mark.parametrize("call, exc, names", [
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z), ValueError, ("bias", "required"), id="missing-bias"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W.float(), s, z, b), TypeError, ("W", "dtype"), id="W-dtype"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s[:, :1], z, b), ValueError, ("scale", "shape"), id="scale-shape"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z, b, a_scale=torch.ones(2)), ValueError, ("a_scale",),
                 id="a_scale-not-taken"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z, b, torch.empty(2, N)), TypeError, ("output", "dtype"),
                 id="out-dtype"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z, b, torch.empty(3, N, dtype=torch.float16)),
                 ValueError, ("output",), id="out-shape"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z, b, torch.empty(2, N, dtype=torch.float16), 1),
                 TypeError, ("positional",), id="too-many"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z, b=b, bias=b), TypeError, ("b",), id="bad-keyword"),
    pytest.param(lambda op, x, W, s, z, b: op(x, W, s, z, b, bias=b), TypeError, ("bias", "both"), id="twice"),
    pytest.param(lambda op, x, W, s, z, b: op(x.float(), W, s, z, b), TypeError, ("A", "dtype"), id="A-dtype"),
])
def test_unbound_bad_input_after_good_call(unbound, call, exc, names):
    op, Wq, scale, zeros, bias, ref = unbound
    x = _x(2, seed=9)
    _close(op(x, Wq, scale, zeros, bias), ref(x))      # the entry for [2, K] exists
    with pytest.raises(exc) as e:
        call(op, x, Wq, scale, zeros, bias)
    for n in names:
        assert n in str(e.value)
    _close(op(x, Wq, scale, zeros, bias), ref(x))


def test_unbound_fast_path_takes_bitblas_layout_flags():
    """A config in BitBLAS's spelling whose only difference is a layout flag (propagate_a / _b, as the
    integration examples pass) takes the hot path too; one with zero points but no scales (run with
    unit scales) and one with out_dtype="int8" (run as int32 and cast) keep the general path."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, K, generator=g).to(torch.float16)
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.float16)
    op = bitblas.Matmul(MatmulConfig(M=2, N=N, K=K, A_dtype="float16", W_dtype="float16", propagate_a=False,
                                     propagate_b=False), target="llvm")
    out = torch.full((2, N), float("nan"), dtype=torch.float16)
    assert op(x, w, out) is out
    _close(out, (x.double() @ w.double().T).to(torch.float16))
    assert op._calls[(x.device, x.shape)] is not None
    # the general path (no rows; a wrong tensor) and bind run it as given too: never through _run_compat
    op._run_compat = None
    assert op(x[:0], w).shape == (0, N)
    with pytest.raises(TypeError, match="W: expected dtype torch.float16"):
        op(x, w.float())
    bound = op.bind(w)
    assert isinstance(bound, BoundMatmul)
    _close(bound(x), (x.double() @ w.double().T).to(torch.float16))
    xi = torch.randint(-8, 8, (2, K), generator=g, dtype=torch.int8)
    wi = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8)
    op8 = bitblas.Matmul(MatmulConfig(M=2, N=N, K=K, A_dtype="int8", W_dtype="int8", accum_dtype="int32",
                                      out_dtype="int8"), target="llvm")
    y = op8(xi, wi)
    assert y.dtype == torch.int8
    assert torch.equal(y, (xi.int() @ wi.int().T).to(torch.int8))
    assert op8._calls[(xi.device, xi.shape)] is None


def _op_hot_path_checks(device, naming):
    from bitblas import torch_op
    lin = _layer().to(device)
    x = _x(3).to(device)
    op, key = lin.bitblas_matmul, lin._key
    t = dict(W=lin.qweight, scale=lin.scales, zeros=lin.zeros, bias=lin.bias)
    want = _ref(lin.cpu(), x.cpu())
    lin.to(device)
    buf = torch.empty(3 * K + 1, dtype=torch.float16, device=device)
    buf[1:].copy_(x.view(-1))
    odd = buf[1:].view(3, K)                  # misaligned on CUDA: the general path
    other = "cpu" if device == "cuda" else "meta"    # a device the operator's tensors are not on
    for _ in range(2):
        for y in (op(x, **t), torch.ops.bitblas.matmul(x, *t.values(), None, None, key),
                  torch_op.matmul(x, *t.values(), key=key), op(odd, **t)):
            _close(y.cpu(), want)
        for name, bad in (("A", x.float()), ("zeros", t["zeros"].float()), ("W", t["W"][:, 1:].contiguous()),
                          ("W", t["W"].to(other)), ("scale", t["scale"].to(other))):
            a = dict(A=x, **t)
            a[name] = bad
            with naming((TypeError, ValueError), name):
                torch.ops.bitblas.matmul(*a.values(), None, None, key)
            with naming((TypeError, ValueError), name):
                op(*a.values())
        with naming((TypeError, ValueError), "output"):
            torch_op.matmul(x, *t.values(), key=key, output=torch.empty(3, N, dtype=torch.float32, device=device))
        with naming((TypeError, ValueError), "output"):
            torch_op.matmul(x, *t.values(), key=key, output=torch.empty(3, N, dtype=torch.float16, device=other))


def test_op_hot_path_checks(naming):
    """Matmul / torch.ops.bitblas.matmul / torch_op.matmul with exact tensors (the hot path, after
    the first call cached it for A's shape) compute the reference, and so does an offset A view;
    a tensor of another dtype, shape or device (the meta device: the op's fake kernel) is refused naming it."""
    _op_hot_path_checks("cpu", naming)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_op_hot_path_checks(naming):
    """test_op_hot_path_checks on CUDA (the offset A view is misaligned there)."""
    _op_hot_path_checks("cuda", naming)


def test_unbound_direct_call_leaves_checks_to_the_kernel():
    """Where every tensor goes to the kernel as given, the unbound call leaves the argument checks
    to the compiled kernel's own prologue (tvm's: dtype, shape, device, strides) and checks only what
    that does not (A, W and output alignment on CUDA). A call the kernel refuses still ends in the
    operator's error naming the argument, and turns the shortcut off for that shape: a caller whose
    tensors always need converting (float16 scales for an int8 kernel's float32 ones) gets the right
    result on every call without an exception per call."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, K, generator=g).to(torch.float16)
    w = (torch.randn(N, K, generator=g) * 0.05).to(torch.float16)
    op = bitblas.Matmul(MatmulConfig(M=2, N=N, K=K, A_dtype="float16", W_dtype="float16"), target="llvm")
    want = (x.double() @ w.double().T).to(torch.float16)
    for _ in range(3):
        out = torch.full((2, N), float("nan"), dtype=torch.float16)
        assert op(x, w, out) is out
        _close(out, want)
    cell = op._calls[(x.device, x.shape)][8]
    assert cell is not None and cell[0] is not None             # the kernel checks, nothing refused yet
    _close(op(x, w), want)                                      # fresh output through the shortcut
    assert cell[0] is not None
    picks = cell[0]
    for bad, exc, name in ((w.float(), TypeError, "W: expected dtype"), (w[:, :K // 2], ValueError, "W"),
                           (w.t(), ValueError, "W"), (torch.empty(N, K, dtype=torch.float16, device="meta"),
                                                  ValueError, "W")):
        with pytest.raises(exc, match=name):
            op(x, bad)
        assert cell[0] is None                                  # refused once: the checked path from now on
        _close(op(x, w), want)
        cell[0] = picks                                         # on again, for the next refusal
    # int8 x int8 with float32 per-channel scales: float16 scales shaped [N, 1] are converted per call
    xi = torch.randint(-8, 8, (2, K), generator=g, dtype=torch.int8)
    wi = torch.randint(-8, 8, (N, K), generator=g, dtype=torch.int8)
    s16 = (torch.rand(N, 1, generator=g) * 0.1).to(torch.float16)
    op8 = bitblas.Matmul(MatmulConfig(M=2, N=N, K=K, A_dtype="int8", W_dtype="int8", accum_dtype="int32",
                                      out_dtype="float16", with_scaling=True), target="llvm")
    want8 = ((xi.double() @ wi.double().T) * s16.double().T).to(torch.float16)
    for i in range(3):
        _close(op8(xi, wi, scale=s16), want8)
        entry = op8._calls[(xi.device, xi.shape)]
        assert entry is not None and (entry[8] is None or entry[8][0] is None)
