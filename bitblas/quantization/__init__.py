"""Quantization: float weights and activations to every registered format, packing, dequantization."""
from .quantize import (LossyQuantizationWarning, QuantizedWeight, decode_values, dequantize, dequantize_activation,
                       e2m1_codes, nvfp4_decode, pack_weight, quantize, quantize_activation, quantize_weight, torch_dtype)
from .gen import gen_quant4
from .utils import (bitblas_fast_decoding, deinterleave_weight, from_bitblas_weight, general_compress, interleave_weight,
                    pack_codes, to_bitblas_weight, unpack_codes)

__all__ = ["LossyQuantizationWarning", "QuantizedWeight", "quantize_weight", "quantize", "pack_weight", "dequantize", "decode_values",
           "quantize_activation", "dequantize_activation", "pack_codes", "unpack_codes", "general_compress",
           "interleave_weight", "deinterleave_weight", "bitblas_fast_decoding", "from_bitblas_weight",
           "to_bitblas_weight", "torch_dtype", "gen_quant4", "nvfp4_decode", "e2m1_codes"]
