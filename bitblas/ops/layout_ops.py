"""Microsoft BitBLAS's small CPU weight operators, under its names and module paths:

* ``QuantCompress`` (``bitblas.ops.quant_compress``): pack unsigned low-bit codes into int8 bytes
  along the last axis, as :func:`bitblas.quantization.general_compress`.
* ``LOP3Permutate`` (``bitblas.ops.lop3_permutate``): BitBLAS's fast-decoding interleave of the
  codes inside each 32-bit word (:func:`bitblas.quantization.utils.lop3_permute`: float16 / int8 as
  :func:`bitblas.quantization.interleave_weight`, bfloat16 the lane order alone, as BitBLAS's).
* ``LadderPermutate`` (``bitblas.ops.ladder_permutate``): BitBLAS's tensor-core tile permutation
  of weights (``propagate_b``). bitblas's kernels never take permuted weights, so constructing one
  raises NotImplementedError naming the alternative.

Each takes a config and an optional ``target`` (accepted, as BitBLAS's "llvm": these run in torch on
the CPU tensors given), is called on a tensor, and has ``profile_latency()`` (median ms of a call on
random input).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Literal, Optional

import torch

__all__ = ["QuantCompressConfig", "QuantCompress", "LOP3PermutateConfig", "LOP3Permutate",
           "LadderPermutateConfig", "LadderPermutate"]


def _check_dims(cls, M, N):
    for name, v in (("M", M), ("N", N)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{cls}: {name}={v!r} is invalid; accepted: a positive int")


def _check_bits(cls, bits, accepted=(1, 2, 4)):
    if bits not in accepted:
        raise ValueError(f"{cls}: dequantize_bits={bits!r} is invalid; accepted: {', '.join(map(str, accepted))}")


class _CPUOp:
    config = None

    def _random_input(self) -> torch.Tensor:
        raise NotImplementedError

    def profile_latency(self, repeats: int = 10) -> float:
        x = self._random_input()
        times = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            self(x)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


@dataclass(frozen=True)
class QuantCompressConfig:
    M: int
    N: int
    input_dtype: str = "int8"
    storage_dtype: str = "int8"
    dequantize_bits: int = 4

    def __post_init__(self):
        _check_dims("QuantCompressConfig", self.M, self.N)
        _check_bits("QuantCompressConfig", self.dequantize_bits)
        for name in ("input_dtype", "storage_dtype"):
            if getattr(self, name) not in ("int8", "uint8"):
                raise ValueError(f"QuantCompressConfig: {name}={getattr(self, name)!r} is invalid; "
                                 "accepted: 'int8', 'uint8'")
        if self.N % (8 // self.dequantize_bits):
            raise ValueError(f"QuantCompressConfig: N={self.N} must be a multiple of {8 // self.dequantize_bits} "
                             f"for dequantize_bits={self.dequantize_bits}")


class QuantCompress(_CPUOp):
    """``QuantCompress(config)(weight)``: codes [M, N] (0..2**bits-1) -> bytes [M, N * bits / 8]."""

    def __init__(self, config: QuantCompressConfig, name: str = "quant_compress", target=None,
                 enable_tuning: bool = False, from_database: bool = False):
        if not isinstance(config, QuantCompressConfig):
            raise TypeError(f"config: expected a QuantCompressConfig, got {type(config).__name__}")
        self.config, self.name, self.target = config, name, target

    def forward(self, weight: torch.Tensor, output: Optional[torch.Tensor] = None) -> torch.Tensor:
        from ..quantization.utils import pack_codes
        c = self.config
        if not isinstance(weight, torch.Tensor) or list(weight.shape) != [c.M, c.N]:
            raise ValueError(f"weight: expected a tensor of shape {[c.M, c.N]}, got "
                             f"{list(getattr(weight, 'shape', [])) or type(weight).__name__}")
        q = weight.to(torch.int32) & 0xFF
        hi = (1 << c.dequantize_bits) - 1
        if q.numel() and int(q.max()) > hi:
            raise ValueError(f"weight: codes must lie in [0, {hi}] for dequantize_bits={c.dequantize_bits}, "
                             f"got up to {int(q.max())}")
        packed = pack_codes(q, f"uint{c.dequantize_bits}")
        if c.storage_dtype == "uint8":
            packed = packed.view(torch.uint8)
        if output is not None:
            output.copy_(packed.view(output.dtype))
            return output
        return packed

    def _random_input(self):
        c = self.config
        return torch.randint(0, 1 << c.dequantize_bits, (c.M, c.N), dtype=torch.int8)


@dataclass(frozen=True)
class LOP3PermutateConfig:
    M: int
    N: int
    datatype: Literal["float16", "bfloat16", "int8"] = "float16"
    storage_dtype: Literal["int8", "uint8", "int32", "uint32"] = "int8"
    dequantize_bits: int = 4

    def __post_init__(self):
        _check_dims("LOP3PermutateConfig", self.M, self.N)
        _check_bits("LOP3PermutateConfig", self.dequantize_bits)
        if self.storage_dtype not in ("int8", "uint8", "int32", "uint32"):
            raise ValueError(f"LOP3PermutateConfig: storage_dtype={self.storage_dtype!r} is invalid; accepted: "
                             "'int8', 'uint8', 'int32', 'uint32'")


class LOP3Permutate(_CPUOp):
    """``LOP3Permutate(config)(qweight)``: packed weight [M, N * bits / 8 bytes] -> the same bytes
    with the codes of each 32-bit word interleaved for fast decoding (BitBLAS's order)."""

    _TARGETS = ("float16", "bfloat16", "int8")     # bfloat16: the lane order alone, as BitBLAS's kernel

    def __init__(self, config: LOP3PermutateConfig, name: str = "lop3_permutate", target=None,
                 enable_tuning: bool = False, from_database: bool = False):
        if not isinstance(config, LOP3PermutateConfig):
            raise TypeError(f"config: expected a LOP3PermutateConfig, got {type(config).__name__}")
        if config.datatype not in self._TARGETS:
            raise NotImplementedError(f"LOP3Permutate: datatype={config.datatype!r} (decoding to it) is not "
                                      f"supported; supported: {', '.join(self._TARGETS)}")
        self.config, self.name, self.target = config, name, target

    def forward(self, weight: torch.Tensor, output: Optional[torch.Tensor] = None) -> torch.Tensor:
        from ..quantization.utils import lop3_permute
        c = self.config
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
        raw = weight.contiguous().view(torch.int8)
        if raw.numel() != c.M * c.N * c.dequantize_bits // 8:
            raise ValueError(f"weight: expected {c.M} x {c.N} {c.dequantize_bits}-bit codes "
                             f"({c.M * c.N * c.dequantize_bits // 8} bytes), got {raw.numel()} bytes")
        out = lop3_permute(raw.reshape(c.M, -1), c.dequantize_bits, c.datatype).view(weight.dtype).reshape(weight.shape)
        if output is not None:
            output.copy_(out)
            return output
        return out

    def _random_input(self):
        c = self.config
        return torch.randint(-128, 128, (c.M, c.N * c.dequantize_bits // 8), dtype=torch.int8)


@dataclass(frozen=True)
class LadderPermutateConfig:
    M: int
    N: int
    datatype: str = "float16"
    dequantize_bits: int = -1
    storage_dtype: str = "float16"
    propagate_kind: Literal["A", "B"] = "B"
    transpose_matrix: bool = False
    transform_kind: int = 2
    target_instruction: str = "nvidia-mma"


class LadderPermutate:
    """BitBLAS's tensor-core tile permutation of weights: not supported (see the module docstring)."""

    def __init__(self, config: LadderPermutateConfig, name: str = "ladder_permutate", target=None,
                 enable_tuning: bool = False, from_database: bool = False):
        raise NotImplementedError(
            "LadderPermutate: BitBLAS's ladder-permuted weight layouts (transform_kind 1-3, propagate_b) are not "
            "supported; bitblas's kernels take weights in the plain packed layout: use Matmul.transform_weight "
            "(or Matmul.weight_transform on storage codes) instead")
