"""Our own checks of the BitBLAS-compatible surface (beyond what the ported tests reach): the
config's spellings and errors, the operator's BitBLAS properties, BitBLAS-only computations
(zeros without scales, int8 output), target strings, the operator cache, GPTQ repacking and the
module fixes."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import bitblas
from bitblas import Matmul, MatmulConfig
from gptq_data import make_gptq


def _ref(A, Wd):
    return A.double() @ Wd.double().T


def test_version_and_reexports():
    from packaging import version
    assert version.parse(bitblas.__version__) >= version.parse("0.1.0.post1")
    import tvm
    assert bitblas.tvm is tvm
    from bitblas import tvm as t2
    assert t2 is tvm
    from bitblas.quantization import gen_quant4
    w, linear, s, q = gen_quant4(256, 64, 128)
    assert w.shape == (256, 64) and s.shape == (2, 64) and q.shape == (256, 64)
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    torch.testing.assert_close(linear.weight.data.T, (q.half() * s.repeat_interleave(128, 0)))


def test_config_bitblas_spellings(naming):
    c = MatmulConfig(M=1, N=64, K=64, A_dtype="e4m3_float8", W_dtype="e5m2_float8", accum_dtype="float32",
                     out_dtype="float32", with_bias=None, group_size=None, with_scaling=None, with_zeros=None,
                     zeros_mode=None, propagate_a=False, propagate_b=2, fast_decoding=False)
    assert (c.A_dtype, c.W_dtype, c.group_size, c.zeros_mode) == ("float8_e4m3", "float8_e5m2", -1, "original")
    assert (c.with_bias, c.with_scaling, c.with_zeros) == (False, False, False)
    assert c == MatmulConfig(M=1, N=64, K=64, A_dtype="float8_e4m3", W_dtype="float8_e5m2", accum_dtype="float32",
                             out_dtype="float32", propagate_a=False, propagate_b=2, fast_decoding=False)
    {c: 1}                                             # hashable
    with naming(ValueError, "propagate_b"):
        MatmulConfig(N=64, K=64, propagate_b=7)
    with naming(ValueError, "out_dtype"):
        MatmulConfig(N=64, K=64, A_dtype="float16", out_dtype="int8")
    with naming(NotImplementedError, "out_dtype"):
        MatmulConfig(N=64, K=64, A_dtype="int8", W_dtype="int8", out_dtype="int8", with_scaling=True)


def test_matmul_bitblas_properties():
    c = MatmulConfig(M=[1, 16], N=128, K=256, A_dtype="float16", W_dtype="int4", with_scaling=True,
                     group_size=128, propagate_b=True)
    op = Matmul(c, backend="tl")
    assert (op.M, op.N, op.K, op.A_dtype, op.W_dtype, op.group_size) == ((1, 16), 128, 256, "float16", "int4", 128)
    assert (op.source_format, op.bit) == ("int", 4)
    assert op.BITBLAS_TRICK_DTYPE_MAP["e4m3_float8"] == ("fp_e4m3", 8)
    assert op.propagate_b == 0 and op.propagate_a == 0 and op.config.propagate_b is True
    # BitBLAS's value for the config: the weights this operator takes are lop3-interleaved as BitBLAS's
    assert op.fast_decoding is True and bitblas.quantization.bitblas_fast_decoding(c) is True
    assert op.storage_dtype == "int8" and op.zeros_mode == "original"
    assert op.retrieve_weight_shape() == [128, 128]
    assert op.input_transform is None and op.lut is None and op.dynamic_range == {"m": [1, 16]}
    assert op.torch_output_dtype == torch.float16
    with pytest.raises(ValueError, match="backend"):
        Matmul(c, backend="cutlass")
    cpu_op = Matmul(MatmulConfig(M=4, N=64, K=128, A_dtype="float16", W_dtype="uint4"), target="llvm")
    assert len(cpu_op.prim_func.params) == 3                           # A, W, output
    sched = cpu_op.scheduled_ir_module                                 # the CPU GEMV kernel (schedule/cpu_gemv.py)
    assert len(sched["main"].params) == 3 and "T.parallel" in sched.script()
    assert cpu_op.get_source("cpu") == cpu_op.get_source(kind="cpu")
    nf4 = Matmul(MatmulConfig(M=1, N=64, K=64, A_dtype="float16", W_dtype="nf4"))
    assert nf4.lut.dtype == torch.float16 and nf4.lut.shape == (16,)
    assert Matmul(MatmulConfig(M=1, N=64, K=64)).weight_transform is None


def test_weight_transform_takes_offset_binary_codes():
    c = MatmulConfig(M=3, N=64, K=128, A_dtype="float16", W_dtype="int2", with_scaling=True, group_size=64)
    op = Matmul(c)
    q = torch.randint(-2, 2, (64, 128), dtype=torch.int8)
    assert torch.equal(op.weight_transform(q + 2), op.transform_weight(q))
    A = torch.randn(3, 128, dtype=torch.float16)
    s = torch.rand(64, 2, dtype=torch.float16) + 0.5
    out = op(A, op.weight_transform(q + 2), s)
    Wd = q.double() * s.double().repeat_interleave(64, 1)
    torch.testing.assert_close(out.double(), _ref(A, Wd), rtol=1e-2, atol=1e-2)
    with pytest.raises(TypeError, match="weight"):
        op.weight_transform(torch.zeros(64, 128))


def test_zeros_without_scaling():
    """BitBLAS's with_zeros=True, with_scaling=False: (q - z)."""
    c = MatmulConfig(M=2, N=64, K=128, A_dtype="float16", W_dtype="uint4", with_scaling=False, with_zeros=True,
                     group_size=32, zeros_mode="original")
    op = Matmul(c)
    q = torch.randint(0, 16, (64, 128), dtype=torch.int8)
    z = torch.randint(0, 16, (64, 4)).to(torch.float16)
    A = torch.randn(2, 128, dtype=torch.float16)
    out = op(A, op.transform_weight(q), z)                      # zeros is the first extra slot
    Wd = q.double() - z.double().repeat_interleave(32, 1)
    torch.testing.assert_close(out.double(), _ref(A, Wd), rtol=1e-2, atol=0.5)
    with pytest.raises(ValueError, match="scale"):
        op(A, op.transform_weight(q), zeros=z, scale=torch.ones(64, 4, dtype=torch.float16))


def test_int8_output_wraps_like_a_c_cast():
    c = MatmulConfig(M=4, N=32, K=64, A_dtype="int8", W_dtype="int8", accum_dtype="int32", out_dtype="int8",
                     with_bias=True)
    op = Matmul(c)
    A = torch.randint(-100, 100, (4, 64), dtype=torch.int8)
    W = torch.randint(-100, 100, (32, 64), dtype=torch.int8)
    bias = torch.randint(-100, 100, (32,), dtype=torch.int8)
    exact = A.to(torch.int64) @ W.to(torch.int64).T + bias.to(torch.int64)
    want = ((exact + 128) % 256 - 128).to(torch.int8)
    out = torch.full((4, 32), 7, dtype=torch.int8)
    assert op(A, W, bias, out) is out
    assert torch.equal(out, want)
    assert torch.equal(op(A, W, bias=bias), want)
    with pytest.raises(TypeError, match="output"):
        op(A, W, bias, torch.empty(4, 32, dtype=torch.int32))


def test_cli_target_strings(monkeypatch):
    from bitblas.build import cuda_target
    assert str(cuda_target("cuda -arch=sm_80").attrs["arch"]) == "sm_80"
    t = cuda_target("cuda -arch=sm_90a -max_shared_memory_per_block=232448")
    assert str(t.attrs["arch"]) == "sm_90a" and int(t.attrs["max_shared_memory_per_block"]) == 232448
    with pytest.raises(ValueError, match="target"):
        cuda_target("cuda -arch")
    monkeypatch.setenv("TVM_TARGET", "cuda -arch=sm_86")
    assert str(bitblas.auto_detect_nvidia_target().attrs["arch"]) == "sm_86"
    op = Matmul(MatmulConfig(M=1, N=64, K=64), target="cuda -arch=sm_80")
    assert "__global__" in op.get_source(target="cuda -arch=sm_89")


def test_global_operator_cache_round_trip(tmp_path):
    from bitblas.cache import global_operator_cache as cache
    cache.clear()
    cfgs = [MatmulConfig(M=1, N=64, K=128, A_dtype="float16", W_dtype="uint4", with_scaling=True, group_size=64),
            MatmulConfig(M=[1, 8], N=32, K=64)]
    ops = [Matmul(c, target="cuda -arch=sm_80") for c in cfgs]
    for c, o in zip(cfgs, ops):
        cache.add(c, o)
    assert cache.size() == 2 and cache.get(cfgs[0]) is ops[0] and cache.get(MatmulConfig(N=8, K=8)) is None
    assert cache.save_into_database(str(tmp_path), target="cuda -arch=sm_80") == 2
    cache.clear()
    assert cache.size() == 0
    assert cache.load_from_database(str(tmp_path), target="cuda -arch=sm_90") == 0      # other arch
    assert cache.load_from_database(str(tmp_path), target="cuda -arch=sm_80") == 2
    op = cache.get(cfgs[0])
    assert op is not None and op is not ops[0] and op.config == cfgs[0]
    A = torch.randn(1, 128, dtype=torch.float16)
    q = torch.randint(0, 16, (64, 128), dtype=torch.int8)
    s = torch.rand(64, 2, dtype=torch.float16)
    torch.testing.assert_close(op(A, op.transform_weight(q), s), ops[0](A, ops[0].transform_weight(q), s))
    with pytest.raises(TypeError, match="config"):
        cache.add("not a config", op)
    cache.clear()


def test_layout_ops():
    from bitblas.ops import LadderPermutate, LadderPermutateConfig, LOP3Permutate, LOP3PermutateConfig
    from bitblas.ops.quant_compress import QuantCompress, QuantCompressConfig
    from bitblas.quantization import general_compress, interleave_weight
    w = torch.randint(0, 4, (16, 64), dtype=torch.int8)
    qc = QuantCompress(QuantCompressConfig(M=16, N=64, dequantize_bits=2))
    assert np.array_equal(qc(w).numpy(), general_compress(w.numpy(), 2))
    with pytest.raises(ValueError, match="weight"):
        qc(torch.full((16, 64), 5, dtype=torch.int8))
    packed = torch.from_numpy(general_compress(torch.randint(0, 16, (16, 64)).numpy(), 4))
    lop3 = LOP3Permutate(LOP3PermutateConfig(M=16, N=64, datatype="float16", dequantize_bits=4))
    assert torch.equal(lop3(packed), interleave_weight(packed, 4, "float16"))
    with pytest.raises(NotImplementedError, match="transform_weight"):
        LadderPermutate(LadderPermutateConfig(M=16, N=64))


# -- modules ------------------------------------------------------------------------------------
def test_linear_parameter_assignment_and_data_swap():
    lin = bitblas.Linear(64, 32, bias=True, A_dtype="float16", W_dtype="float16", opt_M=[1, 4])
    ref = nn.Linear(64, 32, bias=True).half()
    x = torch.randn(3, 64, dtype=torch.float16)
    lin(x)                                             # bind the operator to the current buffers
    lin.weight = nn.Parameter(ref.weight.detach().clone())
    lin.bias = nn.Parameter(ref.bias.detach().clone())
    assert "bias" in dict(lin.named_buffers()) and "weight" in dict(lin.named_buffers())
    torch.testing.assert_close(lin(x), ref(x), rtol=1e-2, atol=1e-2)
    new_w = torch.randn(32, 64, dtype=torch.float16) * 0.1
    lin.weight.data = new_w.clone()                    # BitBLAS's module test swaps .data
    torch.testing.assert_close(lin(x), x @ new_w.T + ref.bias.detach(), rtol=1e-2, atol=1e-2)
    assert set(lin.state_dict()) >= {"weight", "bias"}


def test_linear_loads_bitblas_state_dict_with_unused_scales_and_zeros():
    """BitBLAS's Linear registers scales and zeros for every quantized layer, taken or not."""
    lin = bitblas.Linear(128, 64, A_dtype="float16", W_dtype="uint4", with_scaling=False, opt_M=[1])
    q = torch.randint(0, 16, (64, 128), dtype=torch.int8)
    # BitBLAS's transform_weight bytes (lop3-interleaved: its fast decoding is on for uint4 x float16)
    qweight = bitblas.quantization.to_bitblas_weight(lin.config, lin.bitblas_matmul.transform_weight(q))
    theirs = {"qweight": qweight, "scales": torch.zeros(64, 1, dtype=torch.float16),
              "zeros": torch.zeros(64, 1, dtype=torch.float16)}
    lin.load_state_dict(theirs)
    x = torch.randn(2, 128, dtype=torch.float16)
    torch.testing.assert_close(lin(x).double(), x.double() @ q.double().T, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("v2,sym", [(False, False), (True, False), (True, True), (False, True)],
                         ids=["v1-asym", "v2-asym", "v2-sym", "v1-sym"])
def test_linear_repack_from_gptq(v2, sym):
    K, N, gs = 256, 64, 64
    tensors, ref_w = make_gptq(K, N, gs, 4, sym=sym, v2=v2, seed=5)
    kw = dict(W_dtype="int4", with_zeros=False) if sym else dict(W_dtype="uint4", with_zeros=True,
                                                                   zeros_mode="quantized")
    lin = bitblas.Linear(K, N, bias=False, A_dtype="float16", accum_dtype="float16", out_dtype="float16",
                         group_size=gs, with_scaling=True, opt_M=[1, 8], **kw)
    mod = nn.Module()
    for k, v in tensors.items():
        mod.register_buffer(k, v)
    (lin.repack_from_gptq_v2 if v2 else lin.repack_from_gptq)(mod)
    x = torch.randn(5, K, dtype=torch.float16)
    torch.testing.assert_close(lin(x).double(), x.double() @ ref_w.T, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("w_dtype", ["uint4", "int4", "int2"])
def test_uint4_activations(w_dtype, device):
    """BitBLAS's uint4 activations (two codes per byte, low nibble first) with integer weights."""
    op = Matmul(MatmulConfig(M=8, N=64, K=128, A_dtype="uint4", W_dtype=w_dtype, accum_dtype="int32",
                             out_dtype="int32"))
    lo, hi = {"uint4": (0, 16), "int4": (-8, 8), "int2": (-2, 2)}[w_dtype]
    a = torch.randint(0, 16, (8, 128), dtype=torch.int8)
    w = torch.randint(lo, hi, (64, 128), dtype=torch.int8)
    packed = ((a[:, ::2] & 0xF) | ((a[:, 1::2] & 0xF) << 4)).to(torch.int8)
    out = op(packed.to(device), op.transform_weight(w).to(device))
    assert torch.equal(out.cpu(), (a.long() @ w.long().T).int())


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_uint4_activation_and_int8_output_kernels_compile(arch):
    """The CUDA kernels of uint4 activations and of int8 output (an int32 kernel) compile with nvcc."""
    from bitblas.build import find_nvcc, nvcc_compile
    if find_nvcc() is None:
        pytest.skip("nvcc not found (set CUDA_HOME)")
    for cfg in (MatmulConfig(M=16, N=64, K=128, A_dtype="uint4", W_dtype="int2", accum_dtype="int32",
                             out_dtype="int32"),
                MatmulConfig(M=32, N=64, K=128, A_dtype="int8", W_dtype="int8", accum_dtype="int32",
                             out_dtype="int8")):
        src = Matmul(cfg, target=arch).get_source()
        assert nvcc_compile(src, arch)


def test_linear_zeros_without_scaling():
    lin = bitblas.Linear(128, 32, A_dtype="float16", W_dtype="uint4", with_scaling=False, with_zeros=True,
                         group_size=64, zeros_mode="original", opt_M=[1, 4])
    q = torch.randint(0, 16, (32, 128), dtype=torch.int8)
    z = torch.randint(0, 16, (32, 2)).to(torch.float16)
    lin.load_and_transform_weight(q, zeros=z)
    x = torch.randn(3, 128, dtype=torch.float16)
    ref = x.double() @ (q.double() - z.double().repeat_interleave(64, 1)).T
    torch.testing.assert_close(lin(x).double(), ref, rtol=1e-2, atol=0.5)
    # the custom op (torch.compile's path) runs the same computation
    from bitblas import torch_op  # noqa: F401 - registers torch.ops.bitblas.matmul
    torch.testing.assert_close(torch.ops.bitblas.matmul(x, lin.qweight, None, lin.zeros, None, None, None,
                                                        lin._key).double(),
                               ref, rtol=1e-2, atol=0.5)
