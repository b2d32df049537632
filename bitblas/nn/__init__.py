"""PyTorch modules: ``Linear`` and ``QuantLinear``, GPTQ / AWQ importers, whole-model conversion and
tensor-parallel layers, all calling the operator through the ``torch.ops.bitblas.matmul`` custom op
(see :mod:`bitblas.torch_op`)."""
from .checkpoint import AWQ_ORDER, ImportedWeight, from_awq, from_compressed_tensors, from_gptq, unpack_int32
from .convert import (QuantizationConfig, check_state_dict, find_linear_layers, load_awq_model,
                      load_compressed_tensors_model, load_gptq_model, quantize_model)
from .linear import Linear
from .parallel import ColumnParallelLinear, RowParallelLinear, shard_linear
from .quant_linear import QuantLinear

__all__ = ["Linear", "QuantLinear", "QuantizationConfig", "quantize_model", "load_gptq_model", "load_awq_model",
           "load_compressed_tensors_model", "from_compressed_tensors",
           "find_linear_layers", "check_state_dict", "from_gptq", "from_awq", "unpack_int32", "ImportedWeight",
           "AWQ_ORDER",
           "ColumnParallelLinear", "RowParallelLinear", "shard_linear"]
