"""Microsoft BitBLAS test files that test its TileLang / TIR internals or FlashAtten, not the
user-facing operator API: each of their test functions is listed here, skipped with the reason.

bitblas keeps BitBLAS's user-facing names (Matmul, MatmulConfig, Linear, the cache, the
quantization helpers); its kernels are generated differently (see docs/architecture.md), so
BitBLAS's scheduler classes, TileLang programs, TIR script emitters and permutation kernels have
no counterpart here.
"""
import pytest

_OUT = {
    "operators/test_general_flashatten_ops.py": (
        ['test_flashatten_forward'],
        'bitblas.FlashAtten'),
    "operators/test_general_flashatten_ops_backend_tl.py": (
        ['test_fa_codegen_default'],
        'bitblas.FlashAtten'),
    "operators/test_general_flashatten_tilelang_scheduler.py": (
        ['test_scheduler_simplify'],
        'bitblas.FlashAtten and its TileLang scheduler'),
    "operators/test_general_matmul_tile_schedule.py": (
        ['test_assert_correctness_with_block_reduce', 'test_assert_correctness_with_ladder_ldmatrix_propagate', 'test_assert_dequant_correctness_with_block_reduce', 'test_assert_dequantize_correctness_with_ladder_ldmatrix_propagate'],
        "BitBLAS's TIR schedules (bitblas.ops.general_matmul.tirscript, bitblas.gpu rules)"),
    "operators/test_general_matmul_tilelang_impl.py": (
        ['test_matmul_blocked', 'test_matmul_macro_tensorcore', 'test_tl_matmul_with_ladder_weight_only_transform'],
        'bitblas.tl (TileLang matmul programs)'),
    "operators/test_general_matmul_tilelang_kernel.py": (
        ['test_matmul_blocked', 'test_matmul_fine_grained', 'test_matmul_int4_fine_grained', 'test_matmul_int4_weight_propagation', 'test_matmul_int4xint2_fine_grained', 'test_matmul_int4_weight_transform_dequant', 'test_matmul_weight_propagation', 'test_matmul_blocked_dequant_with_default', 'test_matmul_fine_grained_dequant_with_default', 'test_matmul_weight_transform_dequant_with_default'],
        'bitblas.tl (TileLang kernels)'),
    "operators/test_general_matmul_tilelang_scheduler.py": (
        ['test_scheduler_simplify', 'test_dequantize_scheduler_simplify', 'test_matmul_scheduler_with_default', 'test_matmul_scheduler_get_hints'],
        'bitblas.ops.general_matmul.tilelang schedulers'),
    "operators/test_ladder_permutate_ops.py": (
        ['test_ladder_permutate_profile_latency', 'test_ladder_permutate_profile_latency_cuda'],
        "BitBLAS's ladder permutation kernels (bitblas.ops.ladder_permutate)"),
    "operators/test_lop3_permutate_ops.py": (
        ['test_lop3_permutate_profile_latency'],
        "BitBLAS's LOP3 permutation TIR kernel (bitblas.ops.lop3_permutate)"),
    "operators/test_tir_script_emitter.py": (
        ['test_check_eual_ref_scripts_with_emitter'],
        "BitBLAS's TIR script emitter (bitblas.ops.impl)"),
}
CASES = [pytest.param(f, t, why, id=f"{f.split('/')[-1][:-3]}::{t}") for f, (tests, why) in _OUT.items() for t in tests]


@pytest.mark.parametrize("path,test,what", CASES)
def test_bitblas_internal(path, test, what):
    pytest.skip(f"out of scope: {what} (BitBLAS testing/python/{path}::{test})")
