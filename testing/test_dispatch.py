"""Dynamic M: buckets, the bucket of every m, a tuned operator's kernel per bucket (CPU), correct
results for every m from 1 past the last bucket, dispatch cost."""
from __future__ import annotations

import time

import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.dispatch import DEFAULT_BUCKETS, BucketTable, buckets_of
from bitblas.kernels.select import kernel_rows as default_rows, row_class as gemv_kernel_rows
from bitblas.build import cuda_target
from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
from bitblas.schedule import GEMVHint, GEMVWgmmaHint
from kernel_helpers import choose


@pytest.fixture
def db_path(tmp_path):
    bitblas.set_database_path(str(tmp_path / "db"))
    yield str(tmp_path / "db")
    bitblas.set_database_path(None)


def test_buckets_of_config():
    base = dict(N=64, K=64, A_dtype="float16", W_dtype="int8")
    assert buckets_of(MatmulConfig(M=None, **base)) == DEFAULT_BUCKETS
    assert DEFAULT_BUCKETS == (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert buckets_of(MatmulConfig(M=[64, 1, 16, 16], **base)) == (1, 16, 64)
    assert buckets_of(MatmulConfig(M=7, **base)) == (7,)


def test_bucket_table():
    t = BucketTable(DEFAULT_BUCKETS)
    assert [t.bucket_of(m) for m in (1, 2, 16, 17, 32, 33, 4095, 4096, 4097, 10 ** 6)] == \
        [1, 16, 16, 32, 32, 64, 4096, 4096, 4096, 4096]
    for m in range(1, 5000):                           # the smallest bucket >= m, else the last
        b = t.bucket_of(m)
        assert b == min([x for x in DEFAULT_BUCKETS if x >= m], default=4096)
    assert t.range_of(1) == (1, 1) and t.range_of(32) == (17, 32) and t.range_of(4096) == (2049, None)
    big = BucketTable((1, 100000))                     # a table beyond 64K rows bisects instead
    assert big.bucket_of(70000) == 100000 and big.bucket_of(2) == 100000 and big.bucket_of(100001) == 100000
    with pytest.raises(ValueError, match="buckets"):
        BucketTable((4, 2))


def test_default_rows_rule():
    cfg = MatmulConfig(M=None, N=256, K=256, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True)
    assert default_rows(cfg, "cuda", 1) == 1           # the rows kernel: static rows
    # the tensor-core GEMV takes its row count at run time: the kernel for the top of the class
    # (one token tile: 2..8; two: 9..16; chunks of 16 rows above)
    assert [default_rows(cfg, "cuda", m) for m in (2, 5, 8, 9, 16, 17, 32, 33, 48, 49, 64)] == \
        [8, 8, 8, 16, 16, 32, 32, 48, 48, 64, 64]
    assert default_rows(cfg, "cuda", 65) is None       # tensor cores: symbolic
    assert default_rows(cfg, "cuda", 17, cuda_target("sm_75")) is None      # the tensor-core GEMV needs sm_80
    assert default_rows(cfg, "cuda", 16, cuda_target("sm_75")) == 16        # the rows kernel does not
    assert default_rows(cfg, "cuda", 5, cuda_target("sm_75")) == 5
    i8 = MatmulConfig(M=None, N=256, K=256, A_dtype="int8", W_dtype="int8", with_scaling=True,
                      with_act_scaling=True, out_dtype="float16")
    assert default_rows(i8, "cuda", 32) == 32 and default_rows(i8, "cuda", 33) is None   # int8 x int8: wgmma above 32
    assert default_rows(i8.replace(W_dtype="int4"), "cuda", 64) == 64
    assert default_rows(i8.replace(group_size=128), "cuda", 16) == 16
    # int8 activations: the dp4a rows kernel below the tensor-core kernel's first row count (here 5)
    assert [default_rows(i8, "cuda", m) for m in (2, 5, 6, 7)] == [2, 5, 8, 8]
    assert default_rows(i8.replace(group_size=128), "cuda", 17) == 32         # group-scaled int8 x int8: the GEMV
    assert default_rows(i8.replace(group_size=128), "cuda", 33) is None       # up to 32 rows, then wgmma
    assert default_rows(cfg, "cpu", 5) is None
    assert default_rows(cfg.replace(M=40), "cuda", 40) == 48
    assert default_rows(cfg.replace(W_dtype="nf4"), "cuda", 5) == 8        # GEMV takes table formats too
    f8 = cfg.replace(A_dtype="float8_e4m3", W_dtype="float8_e4m3", group_size=-1)
    assert default_rows(f8, "cuda", 5) is None                                # float8 activations: no GEMV


def test_every_bucket_reached_and_every_m_correct(db_path):
    """A tuned operator with buckets (1, 4, 16, 48): each bucket's tuned kernel serves its range;
    m between buckets and past the last are correct."""
    buckets = (1, 4, 16, 48)
    cfg = MatmulConfig(M=list(buckets), N=96, K=256, A_dtype="float16", W_dtype="uint4", group_size=64,
                       with_scaling=True, with_zeros=True, with_bias=True)
    op = bitblas.Matmul(cfg, target="llvm")
    res = op.hardware_aware_finetune(topk=2, parallel_build=False, progress=False)
    tuned = {b: (r.plan_m, r.hint) for b, r in res.items()}
    assert set(tuned) == set(buckets)
    served = {}
    for m in list(range(1, 60)) + [100, 257]:
        inp = random_inputs(cfg, m)
        out = op(**inp)
        assert relative_error(out, reference_matmul(cfg, **inp)) <= tolerance(cfg), m
        b = op._buckets.bucket_of(m)
        assert choose(op, "cpu", m) == tuned[b]        # the bucket's tuned kernel serves m
        served.setdefault(b, set()).add(m)
    assert set(served) == set(buckets)                 # every bucket reached
    assert served[4] == {2, 3, 4} and served[48] >= {17, 48, 49, 100, 257}
    # one kernel per distinct tuned choice, not one per m
    assert len(op._kernels) == len(set(tuned.values()))


def test_gemv_bucket_dispatch_rule(db_path):
    """On CUDA a GEMV-tuned bucket serves its rows with static kernels of the bucket's hint; rows
    above the last GEMV bucket fall back to the default kernel (checked without a GPU)."""
    cfg = MatmulConfig(M=[1, 8], N=256, K=256, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True)
    op = bitblas.Matmul(cfg, target="sm_90")
    from bitblas.dispatch import BucketTable
    h = GEMVHint(rows_per_warp=1, warps=4, unroll=2)
    op._buckets = BucketTable((1, 8))
    op._tuned["cuda"] = {1: (1, h), 8: (8, h)}
    assert choose(op, "cuda", 1) == (1, h)
    assert choose(op, "cuda", 5) == (5, h)             # rows 2..8: static rows kernels, tuned hint
    assert choose(op, "cuda", 8) == (8, h)
    assert choose(op, "cuda", 9) == (16, None)         # beyond the last bucket: the default (tensor-core GEMV, 9..16)
    assert choose(op, "cuda", 40) == (48, None)        # the default GEMV (tensor cores, chunks of 16 rows)
    hm8 = GEMVHint(rows_per_warp=32, k_warps=8, unroll=2, stages=2, mma=True)
    op._tuned["cuda"] = {1: (1, h), 8: (8, hm8)}       # a tuned tensor-core hint: one kernel for rows 2..8
    assert choose(op, "cuda", 2) == (8, hm8) and choose(op, "cuda", 8) == (8, hm8)
    op._tuned["cuda"] = {1: (1, h), 8: (8, h)}
    assert choose(op, "cuda", 65) == (None, None)      # default tensor-core kernel, symbolic
    # a tuned tensor-core GEMV serves its bucket's rows where the untuned default is no GEMV
    # (group-scaled int8 x int8 at 33..48 rows: wgmma); a rows-kernel hint cannot take > 16 rows
    i8 = MatmulConfig(M=[16, 48], N=256, K=256, A_dtype="int8", W_dtype="int8", with_scaling=True,
                      group_size=128, with_act_scaling=True, out_dtype="float16")
    op8 = bitblas.Matmul(i8, target="sm_90")
    hm = GEMVHint(rows_per_warp=32, k_warps=8, unroll=4, stages=1, mma=True, min_blocks=2)
    op8._buckets = BucketTable((16, 48))
    op8._tuned["cuda"] = {16: (16, h), 48: (48, hm)}
    assert choose(op8, "cuda", 40) == (48, hm) and choose(op8, "cuda", 48) == (48, hm)
    assert choose(op8, "cuda", 12) == (12, h)
    op8._tuned["cuda"] = {16: (16, h), 48: (48, h)}
    assert choose(op8, "cuda", 40)[0] is None         # the default kernel (wgmma, symbolic)
    assert choose(op8, "cuda", 20) == (32, None)      # 17..32 rows: the default GEMV (the chunk loop)


def test_gemv_bucket_rows_are_built_ahead():
    """A GEMV bucket's other row counts get their static kernels when the bucket is tuned (here
    compiled in this process for CUDA without a GPU: code generation only)."""
    from bitblas.build import cuda_target
    from bitblas.cache import kernels
    from bitblas.plan import make_plan
    from bitblas.tune.tuner import _gemv_rows
    cfg = MatmulConfig(M=[1, 4], N=256, K=256, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True)
    tgt = cuda_target("sm_90")
    h = GEMVHint(rows_per_warp=1, warps=4, unroll=2)
    tdesc = kernels.target_desc("cuda", tgt)
    keys = [kernels.kernel_key(make_plan(cfg, "cuda", r), h, tdesc) for r in (2, 3)]
    assert not any(kernels.in_memory(k) for k in keys)
    _gemv_rows(cfg, "cuda", [2, 3], h, tgt, False, None)
    assert all(kernels.in_memory(k) for k in keys)


def test_gemv_kernel_rows_per_class():
    """Tensor-core GEMV hints: one kernel per class of row counts (the tuner builds only the class
    tops of a bucket's range); rows-kernel hints: one per row count; the tuner's kernel arguments
    take fewer rows than the plan's."""
    from bitblas.plan import make_plan
    from bitblas.reference import random_inputs
    from bitblas.tune.tuner import kernel_args
    cfg = MatmulConfig(M=None, N=256, K=256, A_dtype="float16", W_dtype="uint4", group_size=128,
                       with_scaling=True)
    hm = GEMVHint(rows_per_warp=32, k_warps=8, unroll=2, stages=2, mma=True)
    h = GEMVHint(rows_per_warp=1, warps=4, unroll=2)
    assert sorted({gemv_kernel_rows(cfg, "cuda", r, hm) for r in range(2, 16)}) == [8, 16]
    assert sorted({gemv_kernel_rows(cfg, "cuda", r, hm) for r in range(17, 64)}) == [32, 48, 64]
    assert [gemv_kernel_rows(cfg, "cuda", r, h) for r in (2, 7, 16)] == [2, 7, 16]
    i8 = MatmulConfig(M=None, N=256, K=256, A_dtype="int8", W_dtype="int8", with_scaling=True,
                      group_size=128, with_act_scaling=True, out_dtype="float16")
    assert gemv_kernel_rows(i8, "cuda", 12, hm) == 16
    plan = make_plan(cfg, "cuda", 8)
    inp = random_inputs(cfg, 3)
    args = kernel_args(plan, inp, torch.empty(3, 256, dtype=torch.float16))
    assert args[0].shape == (3, 256) and args[-1].shape == (3, 256)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_default_gemv_tile_constant_per_class(arch):
    """kernels.select.kernel_rows serves a row count with its class top's untuned kernel: that holds
    because the default tensor-core GEMV hint is the same for every row count of a class."""
    from bitblas.plan import make_plan
    from bitblas.kernels import default_hint
    from bitblas.schedule.gemv.mma import row_class
    from bitblas.schedule.gemv.wgmma import wgmma_rows
    t = cuda_target(arch)
    for kw in (dict(A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True),
               dict(A_dtype="bfloat16", W_dtype="int2", group_size=128, with_scaling=True, out_dtype="bfloat16"),
               dict(A_dtype="float16", W_dtype="nf4", group_size=128, with_scaling=True),
               dict(A_dtype="float16", W_dtype="nvfp4", group_size=16, with_scaling=True),
               dict(A_dtype="float16", W_dtype="int8", with_scaling=True),
               dict(A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True, with_act_scaling=True,
                    out_dtype="float16"),
               dict(A_dtype="int8", W_dtype="int8", with_scaling=True, with_act_scaling=True, out_dtype="float16")):
        for N in (1000, 28672):
            cfg = MatmulConfig(M=None, N=N, K=1536, **kw)
            for m in range(2, 65):
                h = default_hint(make_plan(cfg, "cuda", m), t)
                if isinstance(h, GEMVHint) and h.tensor_cores:       # the wgmma GEMV: classes of 8 rows
                    top = wgmma_rows(m) if isinstance(h, GEMVWgmmaHint) else row_class(m)
                    assert default_hint(make_plan(cfg, "cuda", top), t) == h, (kw, N, m)
                    assert default_rows(cfg, "cuda", m, t) == top


def test_row_arguments_take_the_callers_rows():
    """A kernel built for the top of a class takes fewer rows: the operator's general argument
    check (here a flat activation scale for 3-D activations) expects the caller's rows, not the
    plan's."""
    from bitblas.ops.checks import check_tensor
    from bitblas.plan import make_plan
    cfg = MatmulConfig(N=256, K=256, A_dtype="int8", W_dtype="int4", group_size=128, with_scaling=True,
                       with_act_scaling=True, out_dtype="float16")
    plan = make_plan(cfg, "cuda", 8)
    cpu = torch.device("cpu")
    assert check_tensor("a_scale", torch.ones(6), plan.arg("a_scale"), 6, cpu, lead=(2, 3)).shape == (6,)
    a = check_tensor("A", torch.zeros(2, 3, 256, dtype=torch.int8), plan.arg("A"), 6, cpu, lead=(2, 3))
    assert a.shape == (6, 256)
    with pytest.raises(ValueError, match="expected shape"):
        check_tensor("a_scale", torch.ones(5), plan.arg("a_scale"), 6, cpu, lead=(2, 3))


def test_dispatch_cost(db_path):
    """Choosing the kernel for a row count already seen is one dict lookup (well under a µs);
    the first sight of a row count is a few µs more."""
    cfg = MatmulConfig(M=None, N=64, K=64, A_dtype="float16", W_dtype="int8")
    op = bitblas.Matmul(cfg, target="llvm")
    op.hardware_aware_finetune(topk=1, parallel_build=False, progress=False)
    for m in range(1, 200):
        op._kernel("cpu", m)
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        op._kernel("cpu", 1 + i % 199)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 5e-6, per_call
    op._by_rows.clear()
    t0 = time.perf_counter()
    for m in range(1, 200):
        op._kernel("cpu", m)
    assert (time.perf_counter() - t0) / 199 < 5e-4


def test_untuned_dynamic_operator_unchanged(db_path):
    """Without tuning, a dynamic operator builds one symbolic default kernel for all m (CPU)."""
    cfg = MatmulConfig(M=None, N=64, K=128, A_dtype="float16", W_dtype="int4", with_scaling=True)
    op = bitblas.Matmul(cfg, target="llvm")
    for m in (1, 7, 300):
        inp = random_inputs(cfg, m)
        assert relative_error(op(**inp), reference_matmul(cfg, **inp)) <= tolerance(cfg)
    assert [c.rows for _, c in op._kernels] == [None]
    assert isinstance(op(torch.randn(0, 128).half(), random_inputs(cfg, 1)["W"],
                         scale=random_inputs(cfg, 1)["scale"]), torch.Tensor)
