"""QuantCompress on the llvm target: timing, and its bytes against ``general_compress``.

Mirrors microsoft/BitBLAS testing/python/operators/test_quant_compress_ops.py.
"""
import pytest
import torch

import bitblas.quantization
from bitblas import tvm
from bitblas.ops.quant_compress import QuantCompress, QuantCompressConfig


def _compressor(N, K, bits):
    config = QuantCompressConfig(M=N, N=K, input_dtype="int8", storage_dtype="int8", dequantize_bits=bits)
    return QuantCompress(config=config, target=tvm.target.Target("llvm"))


@pytest.mark.parametrize("bits", [4, 2, 1])
def test_quant_compress_profile_latency(bits):
    """testing/python/operators/test_quant_compress_ops.py::test_quant_compress_profile_latency"""
    assert _compressor(1024, 1024, bits).profile_latency()


@pytest.mark.parametrize("bits", [4, 2, 1])
def test_quant_compress_correctness(bits):
    """testing/python/operators/test_quant_compress_ops.py::test_quant_compress_correctness"""
    weight = torch.randint(0, 2 ** bits - 1, (1024, 1024), dtype=torch.int8)
    packed = _compressor(1024, 1024, bits)(weight)
    expected = bitblas.quantization.general_compress(weight.numpy(), bits)
    torch.testing.assert_close(packed.numpy(), expected, rtol=1e-3, atol=1e-3)
