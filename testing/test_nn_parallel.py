"""Tensor-parallel bitblas layers: 2 processes on CPU over gloo, against the unsharded layer."""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bitblas
from bitblas.nn import ColumnParallelLinear, RowParallelLinear, shard_linear
from nn_helpers import gptq_pack, ref_quantize, rel_err

K, N = 256, 96


def _full(seed, k=K, n=N, bias=True, **kw):
    lin = bitblas.Linear(k, n, bias=bias, **kw)
    g = torch.Generator().manual_seed(seed)
    lin.load_and_transform_weight(torch.randn(n, k, generator=g) * 0.05,
                                  bias=(torch.randn(n, generator=g) * 0.1) if bias else None)
    return lin


def _act_order_full(seed):
    r = ref_quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05, 4, 64, act_order=True)
    qw, qz = gptq_pack(r, 4)
    lin = bitblas.Linear(K, N, W_dtype="uint4", group_size=64, with_zeros=True)
    return lin.repack_from_gptq(qweight=qw, qzeros=qz, scales=r.s, g_idx=r.g_idx)


FORMATS = {
    "u4g32": dict(W_dtype="uint4", group_size=32, with_zeros=True),
    "u4g64q": dict(W_dtype="uint4", group_size=64, with_zeros=True, zeros_mode="quantized"),
    "i8pc": dict(W_dtype="int8"),
    "nvfp4": dict(W_dtype="nvfp4", group_size=16),
    "w8a8": dict(A_dtype="int8", W_dtype="int8"),
}


def _leave(failed: bool):
    """End a worker without the process group's teardown: destroy_process_group() hung over NCCL
    (H200 x2, torch 2.11) and gloo's teardown aborted a rank (SIGABRT, "terminate called without an
    active exception"; twice in clean-clone CI, once after a barrier) after every check had passed,
    and a failed step can leave a collective pending. The traceback if ``failed``, the output
    flushed, exit code 1 / 0 (mp.spawn turns 1 into the test failure)."""
    if failed:
        import traceback
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)


def _worker(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        x = torch.randn(3, 5, K, generator=torch.Generator().manual_seed(1)).half()
        for i, (name, kw) in enumerate(FORMATS.items()):
            full = _full(10 + i, **kw)
            ref = full(x)
            col = ColumnParallelLinear.from_linear(full)
            assert col.local.out_features == N // world
            # the shard runs its own (N / world)-wide kernel: equal up to float16 rounding
            assert rel_err(col(x), ref) <= 1e-3, f"{name}: column-parallel differs"
            row = RowParallelLinear.from_linear(full)
            assert row.local.in_features == K // world
            # integer activations: each rank quantizes its slice of a token with its own scale, a
            # (slightly different, not worse) rounding than the full layer's
            tol = 4e-3 if kw.get("A_dtype", "float16") == "float16" else 2e-2
            err = rel_err(row(x), ref)
            assert err <= tol, f"{name}: row-parallel rel. err {err:.2e}"
        # act-order (a permuted input): both kinds
        full = _act_order_full(20)
        ref = full(x)
        assert rel_err(ColumnParallelLinear.from_linear(full)(x), ref) <= 1e-3
        assert rel_err(RowParallelLinear.from_linear(full)(x), ref) <= 4e-3
        # Megatron MLP: column (sharded output) -> row (sharded input), loaded from float weights
        up = _full(30, K, N, bias=False, W_dtype="uint4", group_size=16, with_zeros=True)
        down = _full(31, N, K, W_dtype="uint4", group_size=16, with_zeros=True)
        ref = down(torch.relu(up(x)))
        kw = dict(W_dtype="uint4", group_size=16, with_zeros=True)
        c = ColumnParallelLinear(K, N, bias=False, gather_output=False, **kw)
        r = RowParallelLinear(N, K, bias=True, input_is_parallel=True, **kw)
        g = torch.Generator().manual_seed(30)
        c.load_and_transform_weight(torch.randn(N, K, generator=g) * 0.05)
        g = torch.Generator().manual_seed(31)
        r.load_and_transform_weight(torch.randn(K, N, generator=g) * 0.05, bias=torch.randn(K, generator=g) * 0.1)
        mlp = torch.nn.Sequential(c, torch.nn.ReLU(), r)
        out = mlp(x)
        assert rel_err(out, ref) <= 1e-2, f"tp mlp rel. err {rel_err(out, ref):.2e}"
        compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), out)
        # both ranks done with their collectives before either leaves
        dist.barrier()
    except BaseException:
        _leave(failed=True)
    _leave(failed=False)


def test_tensor_parallel_two_processes_gloo(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)


def test_shards_respect_group_boundaries(naming):
    full = _full(1, W_dtype="uint4", group_size=64, with_zeros=True)
    with naming(ValueError, "group_size"):          # 256 / 8 = 32 rows per rank: groups of 64 would straddle
        shard_linear(full, "in", 0, 8)
    parts = [shard_linear(full, "in", r, 4) for r in range(4)]
    assert all(p["scale"].shape == (N, 1) for p in parts)
    assert torch.equal(torch.cat([p["codes"] for p in parts], 1), full.unpacked()["codes"])
    with naming(ValueError, "world_size"):
        shard_linear(full, "out", 0, 5)
    per_channel = _full(2, W_dtype="int4")
    assert all(torch.equal(shard_linear(per_channel, "in", r, 8)["scale"], per_channel.scales) for r in range(8))


def test_parallel_layers_without_process_group(naming):
    with naming(ValueError, "world_size"):
        ColumnParallelLinear(K, N, W_dtype="uint4", group_size=32)
    col = ColumnParallelLinear.from_linear(_full(3, W_dtype="uint4", group_size=32, with_zeros=True), rank=0,
                                           world_size=1)
    x = torch.randn(2, K).half()
    assert col(x).shape == (2, N)
    with pytest.raises(NotImplementedError, match="input_is_parallel"):
        RowParallelLinear.from_linear(_act_order_full(4), rank=0, world_size=2, input_is_parallel=True)


def _nccl_worker(rank, world, init_file):
    """Each rank on its own GPU over NCCL: column / row parallel layers against the unsharded layer
    on the same GPU, at decode (1 row, the GEMV), 64 and 300 rows (Hopper: decode-then-wgmma), and a
    Megatron MLP step captured in a CUDA graph."""
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        k, n = 1024, 768
        for i, (name, kw) in enumerate(FORMATS.items()):
            full = _full(40 + i, k, n, **kw).to(dev)
            col = ColumnParallelLinear.from_linear(full).to(dev)
            row = RowParallelLinear.from_linear(full).to(dev)
            assert col.local.out_features == n // world and row.local.in_features == k // world
            for rows in (1, 64, 300):
                x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).half().to(dev)
                ref = full(x)
                assert torch.isfinite(ref).all()
                err = rel_err(col(x), ref)
                assert err <= 1e-3, f"{name} rows={rows}: column-parallel rel. err {err:.2e}"
                tol = 4e-3 if kw.get("A_dtype", "float16") == "float16" else 2e-2
                err = rel_err(row(x), ref)
                assert err <= tol, f"{name} rows={rows}: row-parallel rel. err {err:.2e}"
        kw = dict(W_dtype="uint4", group_size=128, with_zeros=True)
        c = ColumnParallelLinear(k, n, bias=False, gather_output=False, **kw)
        r = RowParallelLinear(n, k, bias=True, input_is_parallel=True, **kw)
        g = torch.Generator().manual_seed(50)
        c.load_and_transform_weight(torch.randn(n, k, generator=g) * 0.05)
        r.load_and_transform_weight(torch.randn(k, n, generator=g) * 0.05, bias=torch.randn(k, generator=g) * 0.1)
        mlp = torch.nn.Sequential(c, torch.nn.ReLU(), r).to(dev)
        x = torch.randn(4, k, generator=torch.Generator().manual_seed(4)).half().to(dev)
        eager = mlp(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            mlp(x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = mlp(x)
        x.copy_(torch.randn(4, k, generator=torch.Generator().manual_seed(5)).half().to(dev))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, mlp(x)) <= 1e-3 and rel_err(out, eager) > 1e-2      # replay used the new input
    except BaseException:
        _leave(failed=True)
    del graph
    torch.cuda.synchronize()
    _leave(failed=False)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(), reason="needs 2 GPUs and NCCL")
def test_tensor_parallel_two_gpus_nccl(tmp_path):
    mp.spawn(_nccl_worker, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)
