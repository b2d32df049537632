"""Microsoft BitBLAS's operator surface on :class:`~bitblas.Matmul` (a mixin, no kernels here).

BitBLAS users and integrations (vLLM, GPTQModel, BitBLAS's own modules) reach for these names:
``BITBLAS_TRICK_DTYPE_MAP``, the per-field properties of its PythonAPI.md (``op.M``, ``op.W_dtype``,
..., ``source_format``, ``bit``), ``weight_transform`` / ``input_transform``, ``transform_input``,
``retrieve_weight_shape``, ``lut``, ``lib`` / ``torch_func``, ``prim_func`` / ``scheduled_ir_module``,
``propagate_a`` / ``propagate_b``, ``dynamic_range``, ``torch_output_dtype``, ``cleanup``.

Layouts: bitblas's kernels take BitBLAS's packed weight bytes (see the README's format table),
lop3-interleaved where its fast decoding is on. ``weight_transform`` maps BitBLAS's unpacked
storage codes (signed integers stored offset-binary, ``code = q + 2**(bits-1)``) to them;
``propagate_a`` / ``propagate_b`` report ``TransformKind.NonTransform`` because no ladder
permutation is ever applied (the config keeps what was asked for).
"""
from __future__ import annotations

import enum
from typing import Optional

import torch

from ..config import MatmulConfig
from ..formats import FORMATS, NF4_TABLE

__all__ = ["TransformKind", "BITBLAS_TRICK_DTYPE_MAP", "BitBLASOperatorAPI", "kernel_config", "runs_as_given"]


class TransformKind(enum.IntEnum):
    """Microsoft BitBLAS's weight / activation layout transforms (``propagate_a`` / ``propagate_b``)."""
    NonTransform = 0
    InterWarpTransform = 1
    IntraWarpTransform = 2
    LDMatrixTransform = 3


# dtype -> (source_format, bits), as Microsoft BitBLAS's Matmul.BITBLAS_TRICK_DTYPE_MAP, plus our
# own spellings of the same formats
BITBLAS_TRICK_DTYPE_MAP = {
    "float64": ("fp", 64), "float32": ("fp", 32), "float16": ("fp", 16), "bfloat16": ("bf", 16),
    "int32": ("int", 32), "uint32": ("uint", 32), "int16": ("int", 16), "uint16": ("uint", 16),
    "int8": ("int", 8), "uint8": ("uint", 8), "int4": ("int", 4), "uint4": ("uint", 4),
    "int2": ("int", 2), "uint2": ("uint", 2), "int1": ("int", 1), "uint1": ("uint", 1),
    "nf4": ("nf", 4), "fp4_e2m1": ("fp", 4),
    "e4m3_float8": ("fp_e4m3", 8), "e5m2_float8": ("fp_e5m2", 8),
    "float8_e4m3": ("fp_e4m3", 8), "float8_e5m2": ("fp_e5m2", 8), "nvfp4": ("nvfp", 4),
}
_BITBLAS_SPELLING = {"float8_e4m3": "e4m3_float8", "float8_e5m2": "e5m2_float8"}


def kernel_config(config: MatmulConfig) -> MatmulConfig:
    """The config the kernels are built for: BitBLAS-only spellings of the same computation mapped
    onto ours. Zero points without scales, (q - z), run as (q - z) * 1; ``out_dtype="int8"`` runs
    the int32 kernel and casts (two's-complement wrap-around, as a C cast); the layout flags
    (``propagate_a`` / ``propagate_b``) do not change the kernels."""
    changes = {}
    if config.with_zeros and not config.with_scaling:
        changes["with_scaling"] = True
    if config.out_dtype == "int8":
        changes["out_dtype"] = "int32"
    if config.propagate_a is not None or config.propagate_b is not None:
        changes.update(propagate_a=None, propagate_b=None)
    return config.replace(**changes) if changes else config


def runs_as_given(config: MatmulConfig, kc: MatmulConfig) -> bool:
    """True when the kernels run ``config`` as it is: its kernel config ``kc`` differs at most in
    the layout flags, so no call needs unit scales or an int8 cast (``Matmul``'s hot path, general
    path and ``bind`` all ask this)."""
    return kc is config or (kc.with_scaling == config.with_scaling and kc.out_dtype == config.out_dtype)


class WeightTransform:
    """BitBLAS's ``Matmul.weight_transform``: unpacked storage codes [N, K] (int8; signed formats
    offset-binary, ``q + 2**(bits-1)``; nf4 / fp4 table indices) -> the packed weight the operator
    takes, on the input's device."""

    def __init__(self, op):
        self._op = op
        w = FORMATS[op.config.W_dtype]
        self._offset = (1 << (w.bits - 1)) if w.kind == "int" else 0

    def __call__(self, weight: torch.Tensor) -> torch.Tensor:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
        if weight.dtype.is_floating_point or weight.dtype == torch.bool:
            raise TypeError(f"weight: expected integer storage codes (int8), got {weight.dtype}")
        codes = weight.to(torch.int16)
        if self._offset:
            codes = codes - self._offset
        return self._op.transform_weight(codes)

    @property
    def size(self) -> int:      # BitBLAS's OPExecutorCPU: the number of transforms applied
        return 1

    def __repr__(self):
        return f"WeightTransform({self._op.config.W_dtype}: storage codes -> packed weight)"


class _TorchFunc:
    """BitBLAS's ``Matmul.torch_func``: ``torch_func(A, W, [lut], [scale], [zeros], [bias], output)``
    with every tensor positional and the output last, written in place."""

    def __init__(self, op):
        self._op = op

    def __call__(self, *args):
        if len(args) < 3:
            raise TypeError(f"torch_func takes A, W, the config's extra tensors and the output; "
                            f"got {len(args)} tensors")
        A, W, *rest = args
        out = rest.pop()
        lut = self._op.lut
        if lut is not None and rest and isinstance(rest[0], torch.Tensor) and rest[0].shape == lut.shape:
            rest.pop(0)        # the nf4 table BitBLAS passes after W: ours is built in
        self._op(A, W, *rest, output=out)
        return out


class BitBLASOperatorAPI:
    """Mixin for :class:`~bitblas.Matmul`: the names listed in the module docstring."""

    BITBLAS_TRICK_DTYPE_MAP = BITBLAS_TRICK_DTYPE_MAP
    config: MatmulConfig
    name = "matmul"
    lib = None      # no ctypes library: calls go through the operator (and torch_func)

    # -- BitBLAS's PythonAPI.md properties --------------------------------------------------
    M = property(lambda self: self.config.M)
    N = property(lambda self: self.config.N)
    K = property(lambda self: self.config.K)
    A_dtype = property(lambda self: self.config.A_dtype)
    W_dtype = property(lambda self: self.config.W_dtype)
    out_dtype = property(lambda self: self.config.out_dtype)
    accum_dtype = property(lambda self: self.config.accum_dtype or self._base_plan("cpu").accum)
    with_scaling = property(lambda self: self.config.with_scaling)
    with_zeros = property(lambda self: self.config.with_zeros)
    group_size = property(lambda self: self.config.group_size)
    with_bias = property(lambda self: self.config.with_bias)
    layout = property(lambda self: self.config.layout)
    zeros_mode = property(lambda self: self.config.zeros_mode)

    @property
    def storage_dtype(self) -> str:
        c = self.config
        return _BITBLAS_SPELLING.get(c.W_dtype, c.W_dtype) if c.W_dtype == c.A_dtype else c.storage_dtype

    @property
    def fast_decoding(self) -> bool:
        """Microsoft BitBLAS's value for the config (its rule where the config says None,
        :func:`bitblas.quantization.bitblas_fast_decoding`): where True, the weights this operator
        takes are lop3-interleaved inside each 32-bit word as BitBLAS's (``transform_weight`` returns
        them so, the kernels read them so). False where BitBLAS's interleaved bytes would lose codes
        (1-bit weights with float16 activations): the operator takes the natural order there."""
        from ..code_order import bitblas_fast_decoding, bitblas_weight_order
        try:
            bitblas_weight_order(self.config)
        except NotImplementedError:
            return False
        return bitblas_fast_decoding(self.config)

    @property
    def source_format(self) -> str:
        return BITBLAS_TRICK_DTYPE_MAP[self.config.W_dtype][0]

    @property
    def bit(self) -> int:
        return BITBLAS_TRICK_DTYPE_MAP[self.config.W_dtype][1]

    @property
    def propagate_a(self) -> TransformKind:
        return TransformKind.NonTransform

    @property
    def propagate_b(self) -> TransformKind:
        return TransformKind.NonTransform

    @property
    def torch_output_dtype(self) -> torch.dtype:
        return getattr(torch, self.config.out_dtype)

    @property
    def dynamic_range(self) -> Optional[dict]:
        M = self.config.M
        return {"m": list(M)} if isinstance(M, tuple) else None

    # -- weights and inputs -----------------------------------------------------------------
    @property
    def weight_transform(self) -> Optional[WeightTransform]:
        """None where the weight is taken as is (float, 8-bit and float8 formats), else a
        :class:`WeightTransform` (storage codes -> packed weight)."""
        w = FORMATS[self.config.W_dtype]
        return WeightTransform(self) if w.packed else None

    @property
    def input_transform(self):
        return None          # activations are never permuted (propagate_a)

    def transform_input(self, input_tensor: torch.Tensor) -> torch.Tensor:
        return input_tensor

    def retrieve_weight_shape(self):
        """The shape of the weight tensor the operator takes: [N, K / codes per byte] ([K, N] for "nn")."""
        return [int(s) for s in self._base_plan("cpu").arg("W").shape]

    @property
    def lut(self) -> Optional[torch.Tensor]:
        """nf4: the 16 NormalFloat4 levels in A_dtype (the decode table the kernels use), else None."""
        if self.config.W_dtype != "nf4":
            return None
        dtype = getattr(torch, self.config.A_dtype) if FORMATS[self.config.A_dtype].kind == "float" else torch.float16
        return torch.tensor(NF4_TABLE, dtype=dtype)

    # -- IR -------------------------------------------------------------------------------
    def _ir_plan(self):
        from ..plan import make_plan
        kind = "cpu" if self._cpu_only else "cuda"
        return make_plan(self._kc, kind, self._static_m(self.config.M if isinstance(self.config.M, int) else None))

    @property
    def prim_func(self):
        """The unscheduled TensorIR PrimFunc of the default kernel (the CUDA one unless CPU-only)."""
        from ..ir.matmul import emit_matmul
        return emit_matmul(self._ir_plan())

    @property
    def scheduled_ir_module(self):
        """The scheduled IRModule of the default kernel (the CUDA one unless CPU-only)."""
        from ..build import lower_plan
        plan = self._ir_plan()
        return lower_plan(plan, target=None if plan.target_kind == "cpu" else self._resolve_cuda_target())

    @property
    def torch_func(self) -> _TorchFunc:
        return _TorchFunc(self)

    def cleanup(self) -> None:
        """BitBLAS frees a workspace here; bitblas keeps none."""
