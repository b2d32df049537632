"""Tensor-core CUDA schedule: mma.sync for float16 / bfloat16 (m16n8k16, fp32 accumulate), int8
(m16n8k32 s8, int32 accumulate) and float8 (m16n8k32 e4m3 / e5m2, fp32 accumulate) activations.

Applies to every weight format (the ``B_decode`` block of :mod:`bitblas.ir.matmul` is generic):

* the iteration domain of ``C`` is padded to whole tiles with ``pad_einsum`` (rows M, static or
  symbolic; N; K), so the tensorized core sees only full 16x16x16 tiles; the padding becomes
  predicates at the edges: zero-filled ``cp.async`` for activation rows, guarded weight loads, a
  guarded decode (padded weights are 0) and a guarded epilogue store. Nothing reads or writes out
  of bounds;
* per BK-wide k step: the activation tile and the raw weight tile go global -> shared with
  ``cp.async`` (a ``stages``-deep ring); quantized weights are then decoded (scales, zeros,
  tables) into their own ``"shared"`` fp16/bf16 tile; float weights are the tile itself;
* ``ldmatrix.x4`` -> ``mma.sync.m16n8k16`` per warp, accumulators in registers;
* epilogue: accumulators -> shared (fp32) -> the fused ``D`` block (bias, global scale, cast),
  vectorized and predicated global stores.

:func:`MMAHint.default` returns None where no path applies (other activation dtypes,
``layout="nn"``, K or row strides that the vector copies cannot keep aligned, fp8 below sm_89);
the caller then uses the simple schedule. :func:`mma_reason` says why.

int8 activations (W8A8, and W4A8 / W2A8 with weights decoded to int8 in shared memory; integer
weights whose values fit int8, per-channel scales or none): ``mma.sync.m16n8k32`` s8 x s8 -> s32,
int32 accumulators, the per-channel weight x per-token activation scales in the epilogue (see
:func:`mma_int8_unsupported_reason`). BK must be a multiple of 32 there. The decoded weights are
stored int8 (``unsafe_set_dtype`` on ``B_decode``: exact, the values fit); int8 weights still take the
decode step (a plain copy into the static tile). Edge tiles (rows past M, columns past N) load
synchronously: TVM 0.27 emits predicated zero-filling cp.async only for float tiles.

float8 activations and weights (float8_e4m3 / float8_e5m2, any pairing; per-channel weight scale,
per-token activation scale, bias in the epilogue; sm_89+, see :func:`mma_fp8_unsupported_reason`):
the int8 path's structure with the bits as int8 tiles (identical m16n8k32 8-bit fragments and
ldmatrix), ``mma.sync.m16n8k32.row.col.f32.<a>.<b>.f32`` (TVM 0.27's ``ptx_mma`` codegen emits the
e4m3 / e5m2 variants) and fp32 accumulators. The IR is emitted with ``fp8_values=True``
(:func:`bitblas.ir.matmul.emit_matmul`): ``C`` multiplies ``reinterpret``-ed float8 values, the
pattern the fp8 mma intrinsic below describes; no table lookup or conversion reaches the kernel.
Precision: Ada / Hopper fp8 mma keep 13 mantissa bits in the accumulator (low bits truncated per
mma) and the k loop accumulates there (no promotion to a CUDA-core fp32 sum every few k steps,
as DeepGEMM does): relative error up to about K/32 * 2**-13, fine for bf16 outputs, visible in
float32 ones.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from .._tvm import tvm, tensor_intrin_cuda
from ..arch import FP8_MIN_SM, arch_of, as_arch
from ..ir.matmul import e4m3_codes

__all__ = ["MMAHint", "schedule_cuda_mma", "mma_reason", "mma_unsupported_reason", "mma_int8_unsupported_reason",
           "mma_fp8_unsupported_reason", "ir_options", "MIN_ROWS", "FP8_MIN_SM"]

logger = logging.getLogger(__name__)

# Static row counts up to this are left to the GEMV / simple schedules.
MIN_ROWS = 16
_THREADS_PER_WARP = 32


@dataclass(frozen=True)
class MMAHint:
    """Block tile BM x BN x BK, warp tile WM x WN, ``stages``-deep cp.async ring.

    (BM / WM) * (BN / WN) warps per block; BM, BN, WM, WN multiples of 16 with WM | BM, WN | BN;
    BK a multiple of 16 (of 32 for 8-bit activations: int8, float8); stages >= 2 (3 or more with
    ``inner_pipeline`` on float weights).
    ``vec_decode``: contiguous decoded elements per thread step (half2 vectors, unrolled).
    """

    BM: int = 128
    BN: int = 128
    BK: int = 32
    WM: int = 64
    WN: int = 64
    stages: int = 4
    vec_decode: int = 8
    inner_pipeline: Optional[bool] = None   # double-buffer ldmatrix fragments (None: float weights only)

    @property
    def warps(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN)

    @property
    def threads(self) -> int:
        return self.warps * _THREADS_PER_WARP

    def check(self):
        for name in ("BM", "BN", "WM", "WN", "BK"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v % 16:
                raise ValueError(f"MMAHint.{name}={v!r}: a positive multiple of 16 is required")
        if self.BM % self.WM or self.BN % self.WN:
            raise ValueError(f"MMAHint: WM={self.WM} must divide BM={self.BM} and WN={self.WN} divide BN={self.BN}")
        if not isinstance(self.stages, int) or self.stages < 2:
            raise ValueError(f"MMAHint.stages={self.stages!r}: an int >= 2 is required")
        if self.threads > 1024:
            raise ValueError(f"MMAHint: {self.warps} warps exceed 1024 threads")
        return self

    @classmethod
    def default(cls, plan, target=None) -> Optional["MMAHint"]:
        """The default tile for a plan, or None where the tensor-core template does not apply.

        Rule: rows <= 32 -> 32x128 blocks (4 warps of 32x32), rows <= 64 -> 64x128 (2x2 warps of
        32x64), both BK=32 with a 4-stage ring; more rows (and symbolic M) -> 128x128 (2x2 warps of
        64x64), BK=64, 3 stages, and for quantized weights with > 128 rows (or symbolic M) 256x128
        (4x2 warps of 64x64), BK=64, 3 stages (the best of a small sweep on the H200 for fp16 and
        W4A16 at 4096^3); N <= 64 -> 64-wide blocks. Quantized weights: 8 codes decoded per
        thread step.
        ``target`` (a CUDA Target): needs sm_80+ (sm_89+ for float8, which also needs the target),
        and stages / tiles shrink until the shared memory fits its ``max_shared_memory_per_block``.
        Every path (fp16/bf16, int8, float8; see the module docstring) uses the same rule.
        """
        if mma_reason(plan, arch_of(target)) is not None:
            return None
        return cls._pick(plan, target)

    @classmethod
    def _pick(cls, plan, target) -> Optional["MMAHint"]:
        arch = arch_of(target)
        smem_limit = arch.smem_per_block
        if not arch.mma:
            return None                      # cp.async and mma.m16n8k16 need sm_80
        m, N = plan.m, plan.config.N
        # (BM, BN, WM, WN, BK, stages), preferred first
        if m is not None and m <= 32:
            tiles = [(32, 128, 32, 32, 32, 4)]
        elif m is not None and m <= 64:
            tiles = [(64, 128, 32, 64, 32, 4)]
        elif plan.w.kind != "float" and (m is None or m > 128):
            tiles = [(256, 128, 64, 64, 64, 3), (128, 128, 64, 64, 64, 3), (128, 128, 64, 64, 32, 4)]
        else:
            tiles = [(128, 128, 64, 64, 64, 3), (128, 128, 64, 64, 32, 4)]
        if N <= 64:
            tiles = [(bm, 64, min(wm, 32), 32, bk, st) for bm, _, wm, _, bk, st in tiles]
        tiles += [(64, 128, 32, 64, 32, 4), (64, 128, 32, 64, 32, 3), (32, 128, 32, 32, 32, 4),
                  (32, 128, 32, 32, 32, 3), (32, 64, 32, 32, 32, 3), (32, 64, 32, 32, 32, 2)]
        for bm, bn, wm, wn, bk, stages in tiles:
            stages = max(2, min(stages, _max_stages(plan.config.K, bk)))     # short K (copy_plan)
            hint = cls(BM=bm, BN=bn, WM=wm, WN=wn, BK=bk, stages=stages, vec_decode=8)
            if copy_plan(plan, hint) is None:
                continue
            if smem_limit is None or hint.smem_bytes(plan) <= smem_limit:
                return hint
        return None

    def smem_bytes(self, plan) -> int:
        """Shared memory the kernel allocates (pipeline ring and epilogue tile share the dynamic buffer)."""
        w = plan.w
        eb = _elem_bytes(plan)
        row = (self.BK + _pad_elems(plan)) * eb         # storage_align pads each row by 16 bytes
        ring = self.stages * self.BM * row
        static = 0
        if w.kind == "float":
            ring += self.stages * self.BN * row
        else:
            ring += self.stages * self.BN * self.BK * w.bits // 8
            static = self.BN * row                      # the decoded tile
        return max(ring, self.BM * self.BN * 4) + static


def mma_reason(plan, sm=None) -> Optional[str]:
    """Why no tensor-core path takes this plan (None: the one for its activation dtype does).
    ``sm``: the target's :class:`bitblas.arch.Arch` (or compute capability, 90 for sm_90; None:
    unknown), which the float8 path needs (``Arch.fp8_mma``)."""
    if _int8(plan):
        return mma_int8_unsupported_reason(plan)
    if is_fp8(plan):
        return mma_fp8_unsupported_reason(plan, sm)
    return mma_unsupported_reason(plan)


def mma_unsupported_reason(plan) -> Optional[str]:
    """Why the float16 / bfloat16 tensor-core path cannot take this plan (None: it can)."""
    c = plan.config
    if c.A_dtype not in ("float16", "bfloat16"):
        return f"A_dtype={c.A_dtype} (tensor-core template: float16 / bfloat16 activations)"
    if plan.decode_dtype != c.A_dtype or plan.accum != "float32":
        return "weights are not decoded to the activation dtype"
    return _shared_reason(plan, 8, "16-byte activation rows")


def _shared_reason(plan, k_multiple: int, why_k: str) -> Optional[str]:
    """The conditions the fp16/bf16, int8 and float8 paths share (None: met)."""
    c = plan.config
    if plan.target_kind != "cuda":
        return "not a CUDA plan"
    if c.layout != "nt":
        return "layout='nn'"
    if plan.m is not None and plan.m <= MIN_ROWS:
        return f"M={plan.m} <= {MIN_ROWS} rows"
    if c.K % k_multiple:
        return f"K={c.K} is not a multiple of {k_multiple} ({why_k})"
    return None


# Weight formats whose decoded values fit int8 (uint8 does not; tables pair with float activations).
INT8_MMA_WEIGHTS = ("int8", "int4", "int2", "int1", "uint4", "uint2", "uint1")


def mma_int8_unsupported_reason(plan) -> Optional[str]:
    """Why the int8 tensor-core path cannot take this plan (None: it can)."""
    c = plan.config
    if c.A_dtype != "int8":
        return f"A_dtype={c.A_dtype} (int8 tensor-core path: int8 activations)"
    if c.W_dtype not in INT8_MMA_WEIGHTS:
        return f"W_dtype={c.W_dtype} (int8 tensor-core path: weights whose values fit int8: {INT8_MMA_WEIGHTS})"
    if plan.accum != "int32" or (c.with_scaling and not plan.scale_in_epilogue):
        return "group-scaled weights need per-group partial sums (not implemented)"
    return _shared_reason(plan, 32, "the k32 int8 mma")


# PTX names of the float8 formats (by their torch / TVM dtype)
PTX_FP8 = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def mma_fp8_unsupported_reason(plan, sm=None) -> Optional[str]:
    """Why the float8 tensor-core path cannot take this plan on ``sm`` (an Arch or a compute
    capability; None: unknown) (None: it can)."""
    c = plan.config
    if plan.a.torch_dtype not in PTX_FP8:
        return f"A_dtype={c.A_dtype} (float8 tensor-core path: float8 activations)"
    if plan.w.torch_dtype not in PTX_FP8 and not e4m3_codes(plan):
        return (f"W_dtype={c.W_dtype} (float8 tensor-core path: float8_e4m3 / float8_e5m2 weights, or int / uint "
                f"codes of at most 4 bits with float8_e4m3 activations)")
    if c.with_scaling and not plan.scale_in_epilogue:
        return "group-scaled weights need per-group partial sums (not implemented)"
    arch = as_arch(sm)
    if not arch.known:
        return f"float8 mma needs sm_{FP8_MIN_SM}+ (the target's arch is not known)"
    if not arch.fp8_mma:
        return f"sm_{arch.sm} < sm_{FP8_MIN_SM} (float8 mma needs sm_{FP8_MIN_SM}+)"
    return _shared_reason(plan, 32, "the k32 float8 mma")


def ir_options(plan, hint) -> dict:
    """Keyword arguments of :func:`bitblas.ir.matmul.emit_matmul` that this template needs: the
    float8 path multiplies float8 values (``fp8_values``), where its scales can apply (epilogue)."""
    c = plan.config
    fp8 = isinstance(hint, MMAHint) and is_fp8(plan) and (plan.w.torch_dtype in PTX_FP8 or e4m3_codes(plan))
    return {"fp8_values": True} if fp8 and (not c.with_scaling or plan.scale_in_epilogue) else {}


def _int8(plan) -> bool:
    return plan.config.A_dtype == "int8"


def is_fp8(plan) -> bool:
    return plan.a.torch_dtype in PTX_FP8


def is_eight_bit(plan) -> bool:
    """8-bit activations (int8 or float8): m16n8k32 fragments, 1-byte tiles."""
    return _int8(plan) or is_fp8(plan)


def _elem_bytes(plan) -> int:
    """Bytes of one activation element (and of one decoded weight element)."""
    return 1 if is_eight_bit(plan) else 2


def _pad_elems(plan) -> int:
    """storage_align row padding of the shared tiles, in elements (16 bytes)."""
    return 16 // _elem_bytes(plan)


def _k_tile(plan) -> int:
    """K of one mma tile: 16 (m16n8k16, 16-bit inputs) or 32 (m16n8k32, int8 / float8)."""
    return 32 if is_eight_bit(plan) else 16


# -- tensor intrinsics ---------------------------------------------------------------------------
_BF16_INTRINS = {}
_I8_INTRINS = {}


def _plan_intrinsics(plan) -> dict:
    """Names of the ldmatrix / fill / mma / store intrinsics of the plan's path."""
    if is_fp8(plan):
        # integer codes with float8_e4m3 activations are decoded to e4m3 (ir.matmul.e4m3_codes)
        return _fp8_intrinsics(PTX_FP8[plan.a.torch_dtype], PTX_FP8.get(plan.w.torch_dtype, "e4m3"))
    return _intrinsics(plan.config.A_dtype)


def _fp8_intrinsics(a_ptx: str, b_ptx: str) -> dict:
    """float8: the int8 ldmatrix intrinsics (the tiles hold the bits as int8), fp32 fill and store,
    and an m16n8k32 mma for the (A, B) float8 pairing, registered here."""
    from tvm.s_tir import TensorIntrin
    tc = tensor_intrin_cuda()
    i8 = _intrinsics("int8")
    name = f"bitblas_mma_{a_ptx}{b_ptx}f32_bits_trans_b"
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, *_mma_fp8_bits_trans_b(a_ptx, b_ptx))
    return {"ld_a_dyn": i8["ld_a_dyn"], "ld_b": i8["ld_b"], "ld_b_dyn": i8["ld_b_dyn"], "mma": name,
            "fill": tc.MMA_fill_16x16_f32_INTRIN, "store": tc.MMA_store_16x16_f32_shared_dyn_INTRIN_SIMPLE}


def _intrinsics(dtype: str) -> dict:
    """Names of the ldmatrix / mma intrinsics for ``dtype`` (bf16 ones are registered here:
    TVM 0.27 registers float16 only)."""
    tc = tensor_intrin_cuda()
    if dtype == "float16":
        return {"ld_a_dyn": tc.LDMATRIX_f16_A_DYN_INTRIN, "ld_b": tc.LDMATRIX_f16_B_TRANS_INTRIN,
                "ld_b_dyn": tc.LDMATRIX_f16_B_TRANS_DYN_INTRIN, "mma": tc.MMA_f16f16f32_TRANS_B_INTRIN,
                "fill": tc.MMA_fill_16x16_f32_INTRIN, "store": tc.MMA_store_16x16_f32_shared_dyn_INTRIN_SIMPLE}
    if dtype == "int8":
        if not _I8_INTRINS:
            _register_int8(tc)
        return _I8_INTRINS
    if dtype != "bfloat16":
        raise ValueError(dtype)
    if not _BF16_INTRINS:
        _register_bf16(tc)
    return _BF16_INTRINS


def _register_bf16(tc):
    from tvm.s_tir import TensorIntrin
    names = {"ld_a_dyn": ("bitblas_mma_ldmatrix_bf16_a_dyn", "A", "shared.dyn"),
             "ld_b": ("bitblas_mma_ldmatrix_bf16_b_trans", "B", "shared"),
             "ld_b_dyn": ("bitblas_mma_ldmatrix_bf16_b_trans_dyn", "B", "shared.dyn")}
    for key, (name, which, scope) in names.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *_ldmatrix_b16(tc, "bfloat16", which, scope))
        _BF16_INTRINS[key] = name
    name = "bitblas_mma_bf16bf16f32_trans_b"
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, *_mma_b16_trans_b(tc, "bfloat16", "bf16"))
    _BF16_INTRINS["mma"] = name
    _BF16_INTRINS["fill"] = tc.MMA_fill_16x16_f32_INTRIN
    _BF16_INTRINS["store"] = tc.MMA_store_16x16_f32_shared_dyn_INTRIN_SIMPLE


def _register_int8(tc):
    """int8 intrinsics: TVM 0.27 registers ldmatrix (A, B trans) for "shared" only and no int32
    store into shared memory; the variants the template needs are registered from its generators."""
    from tvm.s_tir import TensorIntrin
    tcu = tc
    made = {"ld_a_dyn": ("bitblas_mma_ldmatrix_i8_a_dyn", lambda: tcu.get_ldmatrix_intrin(32, "int8", "A", False,
                                                                                           "shared.dyn")),
            "ld_b": ("bitblas_mma_ldmatrix_i8_b_trans", lambda: tcu.get_ldmatrix_intrin(32, "int8", "B", True,
                                                                                         "shared")),
            "ld_b_dyn": ("bitblas_mma_ldmatrix_i8_b_trans_dyn", lambda: tcu.get_ldmatrix_intrin(32, "int8", "B", True,
                                                                                                 "shared.dyn")),
            "store": ("bitblas_mma_store_16x16_i32_shared_dyn_simple",
                      lambda: tcu.get_mma_store_intrin("int32", 8, "shared.dyn", False))}
    for key, (name, gen) in made.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *gen())
        _I8_INTRINS[key] = name
    _I8_INTRINS["mma"] = tc.MMA_i8i8i32_TRANS_B_INTRIN
    _I8_INTRINS["fill"] = tc.MMA_fill_16x16_i32_INTRIN


def _ldmatrix_b16(tc, dtype, which, scope):
    """ldmatrix.x4 of a 16x16 tile of a 16-bit dtype into the mma fragment layout: A not
    transposed ([M, K] tile), or B "trans" ([N, K] tile). Same description and implementation
    as TVM's float16 intrinsics (ldmatrix moves .b16 words; the dtype is only the buffers')."""
    from tvm.script import tirx as T
    index_map = tc.shared_16x16_to_ldmatrix_32x8_layout
    half = 16
    if which == "A":
        trans_in_ldmatrix = False
        smem_offset = lambda tx, stride: stride * (tx % half) + 8 * (tx // half)  # noqa: E731
    else:
        trans_in_ldmatrix = False           # B [N, K]: the "trans" B variant loads rows as they are
        smem_offset = lambda tx, stride: (stride * 8 * (tx // half) + stride * (tx % 8)  # noqa: E731
                                          + 8 * ((tx % half) // 8))

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (16, 16), dtype, align=64, offset_factor=16, scope=scope)
        warp = T.match_buffer(warp_handle, (32, 8), dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for ax0, ax1 in T.grid(16, 16):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    thread_id, local_id = T.meta_var(index_map(v0, v1))
                    T.writes(warp[thread_id, local_id])
                    warp[thread_id, local_id] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (16, 16), dtype, align=64, offset_factor=16, scope=scope,
                                strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, 8), dtype, align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(trans_in_ldmatrix, 4, ".b16", warp.data, warp.elem_offset + 8 * tx,
                                                 shared.access_ptr("r"), smem_offset(tx, s0), dtype=dtype))

    return desc, impl


def _mma_b16_trans_b(tc, dtype, abbrv):
    """mma.sync m16n8k16 (two n8 halves) for a 16-bit input dtype, B given as [N, K], fp32 accumulate."""
    from tvm.script import tirx as T
    from tvm.tirx import Cast
    index_map = tc.shared_16x16_to_ldmatrix_32x8_layout

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 8), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (32, 8), dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:8], B[0:32, 0:8])
            T.writes(C[0:32, 0:8])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    thread_id_C, local_id_C = T.meta_var(index_map(vi, vj))
                    thread_id_A, local_id_A = T.meta_var(index_map(vi, vk))
                    thread_id_B, local_id_B = T.meta_var(index_map(vj, vk))
                    T.reads(C[thread_id_C, local_id_C], A[thread_id_A, local_id_A], B[thread_id_B, local_id_B])
                    T.writes(C[thread_id_C, local_id_C])
                    C[thread_id_C, local_id_C] += Cast("float32", A[thread_id_A, local_id_A]) * \
                        Cast("float32", B[thread_id_B, local_id_B])

    return desc, _mma_impl("m16n8k16", dtype, 8, abbrv, abbrv)


def _mma_fp8_bits_trans_b(a_ptx: str, b_ptx: str):
    """mma.sync m16n8k32 (two n8 halves) of float8 operands held as int8 bits, B given as [N, K],
    fp32 accumulate. The description multiplies the ``reinterpret``-ed float8 values (the C block of
    ``emit_matmul(plan, fp8_values=True)``); the fragments are the s8 m16n8k32 ones (16 bytes per
    thread, ``shared_16x32_to_ldmatrix_32x16_layout``), the PTX operand types are ``a_ptx`` /
    ``b_ptx`` ("e4m3" / "e5m2")."""
    from tvm.script import tirx as T
    from tvm.tirx import Cast, reinterpret
    tc = tensor_intrin_cuda()
    dtypes = {v: k for k, v in PTX_FP8.items()}
    a_dt, b_dt = dtypes[a_ptx], dtypes[b_ptx]
    map_ab = tc.shared_16x32_to_ldmatrix_32x16_layout
    map_c = tc.shared_16x16_to_ldmatrix_32x8_layout

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 16), "int8", align=64, offset_factor=32, scope="warp")
        B = T.match_buffer(b, (32, 16), "int8", align=64, offset_factor=32, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:16], B[0:32, 0:16])
            T.writes(C[0:32, 0:8])
            for i, j, k in T.grid(16, 16, 32):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    thread_id_C, local_id_C = T.meta_var(map_c(vi, vj))
                    thread_id_A, local_id_A = T.meta_var(map_ab(vi, vk))
                    thread_id_B, local_id_B = T.meta_var(map_ab(vj, vk))
                    T.reads(C[thread_id_C, local_id_C], A[thread_id_A, local_id_A], B[thread_id_B, local_id_B])
                    T.writes(C[thread_id_C, local_id_C])
                    C[thread_id_C, local_id_C] += Cast("float32", reinterpret(a_dt, A[thread_id_A, local_id_A])) * \
                        Cast("float32", reinterpret(b_dt, B[thread_id_B, local_id_B]))

    return desc, _mma_impl("m16n8k32", "int8", 16, a_ptx, b_ptx)


def _mma_impl(shape: str, dtype: str, per_thread: int, a_ptx: str, b_ptx: str):
    """The implementation side of a two-n8-halves mma intrinsic: per thread ``per_thread``
    elements of A and of B (``dtype``, warp scope), 8 float32 accumulators, two ``mma.sync``
    (``shape``, operand types ``a_ptx`` / ``b_ptx``) on B's two halves."""
    from tvm.script import tirx as T
    half, factor = per_thread // 2, 2 * per_thread

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, per_thread), dtype, align=64, offset_factor=factor, scope="warp")
        B = T.match_buffer(b, (32, per_thread), dtype, align=64, offset_factor=factor, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:per_thread], B[0:32, 0:per_thread])
            T.writes(C[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.mma(shape, "row", "col", a_ptx, b_ptx, "fp32",
                                            A.data, A.elem_offset + tx * per_thread, B.data,
                                            B.elem_offset + tx * per_thread,
                                            C.data, C.elem_offset + tx * 8, False, dtype="float32"))
                T.evaluate(T.ptx_legacy.mma(shape, "row", "col", a_ptx, b_ptx, "fp32",
                                            A.data, A.elem_offset + tx * per_thread, B.data,
                                            B.elem_offset + tx * per_thread + half,
                                            C.data, C.elem_offset + tx * 8 + 4, False, dtype="float32"))

    return impl


# -- copy geometry -------------------------------------------------------------------------------
def _vec(row_elems: int, stride_elems: int, rows: int, elem_bytes: float, threads: int,
         max_bytes: int = 16) -> Optional[int]:
    """Elements per thread-step for a cooperative tile copy: the widest vector (<= max_bytes) that
    stays inside a tile row, keeps every global row aligned (row stride) and splits the tile evenly
    over the threads. None if even one element does not split evenly."""
    total = rows * row_elems
    v = max(1, int(max_bytes / elem_bytes))
    while v >= 1:
        if row_elems % v == 0 and stride_elems % v == 0 and total % (threads * v) == 0:
            return v
        v //= 2
    return None


def _max_stages(K: int, BK: int) -> int:
    """The deepest cp.async ring K fills: its prologue loads stages - 1 K tiles, and with fewer
    tiles than that TVM's pipeline leaves cp.async.wait_group a run-time operand and CUDA codegen
    fails (K <= 64 at BK=64 with 3 stages: codegen fuzz seed 2784)."""
    return -(-K // BK) + 1


def copy_plan(plan, hint: MMAHint) -> Optional[dict]:
    """Vector widths of the block's copies, or None when the geometry does not fit the hint."""
    c, w = plan.config, plan.w
    t = hint.threads
    eb = _elem_bytes(plan)
    if hint.BK % _k_tile(plan):
        return None
    if hint.stages > _max_stages(c.K, hint.BK):
        return None
    # int8 / float8 rows past M: TVM 0.27 turns only float zero-fills into predicated cp.async, and its CUDA
    # codegen breaks on a 16 x int8 zero vector; such tiles are loaded synchronously, 4 bytes a step
    a_pad = is_eight_bit(plan) and (plan.m is None or plan.m % hint.BM != 0)
    a_vec = _vec(hint.BK, c.K, hint.BM, eb, t, max_bytes=4 if a_pad else 16)
    if w.kind == "float":
        w_vec = _vec(hint.BK, c.K, hint.BN, 2, t)
        dec_vec = None
    else:
        cpb = w.codes_per_byte
        if hint.BK % cpb:
            return None
        w_vec = _vec(hint.BK // cpb, c.K // cpb, hint.BN, 1, t)
        dec_vec = _vec(hint.BK, hint.BK, hint.BN, eb, t, max_bytes=eb * hint.vec_decode)
    # the epilogue computes in float32: at most 4 lanes (TVM's CUDA codegen mishandles float32x8)
    o_vec = _vec(hint.WN, c.N, hint.WM, 4, _THREADS_PER_WARP)
    if None in (a_vec, w_vec, o_vec) or (w.kind != "float" and dec_vec is None):
        return None
    # cp.async moves 4, 8 or 16 bytes; narrower copies would be synchronous: not worth the template
    if a_vec * eb < 4 or (w_vec * (2 if w.kind == "float" else 1)) < 4:
        return None
    return {"a": a_vec, "w": w_vec, "dec": dec_vec, "out": o_vec}


# -- the schedule --------------------------------------------------------------------------------
def schedule_cuda_mma(func, plan, hint: MMAHint, target=None):
    """``func``: ``emit_matmul(plan, **ir_options(plan, hint))``; ``target``: the CUDA Target (the
    float8 path needs sm_89+)."""
    int8, eight_bit = _int8(plan), is_eight_bit(plan)
    reason = mma_reason(plan, arch_of(target))
    if reason is not None:
        raise ValueError(f"tensor-core schedule does not apply: {reason}")
    hint.check()
    vecs = copy_plan(plan, hint)
    if vecs is None:
        raise ValueError(f"tensor-core schedule: {hint} does not fit N={plan.config.N}, K={plan.config.K}, "
                         f"W_dtype={plan.config.W_dtype}")
    intr = _plan_intrinsics(plan)
    tc = tensor_intrin_cuda()
    kt = _k_tile(plan)                    # K of one mma tile
    pad = _pad_elems(plan)
    BM, BN, BK, WM, WN, stages = hint.BM, hint.BN, hint.BK, hint.WM, hint.WN, hint.stages
    c, w = plan.config, plan.w
    nw = hint.warps

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    C = sch.get_sblock("C")
    if is_fp8(plan) and str(sch.get(sch.get_sblock("B_decode")).writes[0].source.dtype) != "int8":
        # the table-lookup IR: B_decode holds values, not the bits the fp8 mma multiplies
        raise ValueError("float8 tensor-core schedule: emit the IR with emit_matmul(plan, **ir_options(plan, hint))")
    pad_m = plan.m is None or plan.m % BM != 0
    if pad_m or c.N % BN or c.K % BK:
        sch.pad_einsum(C, [BM, BN, BK])
    blocks = _blocks(sch, "A_pad", "B_decode", "B_decode_pad", "C_pad")
    if "B_decode_pad" in blocks:
        sch.compute_inline(blocks["B_decode"])
        Bd = blocks["B_decode_pad"]
    else:
        Bd = blocks["B_decode"]
    if int8:
        # the plan decodes integer weights to int32; their values fit int8 (INT8_MMA_WEIGHTS): store
        # the decoded tile as int8 so that C reads int32(A_i8) * int32(B_i8), the s8 mma's pattern
        sch.unsafe_set_dtype(Bd, 0, "int8")
    if "C_pad" in blocks:
        sch.compute_inline(blocks["C_pad"])    # D reads the padded accumulator directly

    i, j, k = sch.get_loops(C)
    i, i_tc = sch.split(i, [None, 16])
    j, j_tc = sch.split(j, [None, 16])
    k, k_tc = sch.split(k, [None, kt])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    C_o = sch.blockize(i_tc)
    i0, i1, i2 = sch.split(i, [None, BM // WM, WM // 16])
    j0, j1, j2 = sch.split(j, [None, BN // WN, WN // 16])
    k0, k1 = sch.split(k, [None, BK // kt])
    sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
    sch.bind(i0, "blockIdx.y")
    sch.bind(j0, "blockIdx.x")
    warp = sch.fuse(i1, j1)
    sch.bind(warp, "threadIdx.y")

    def coop(blk, vec, max_lanes=None):
        """Spread a block's own loops below ``k0`` (its two innermost; one where the tile has a single
        row, e.g. N=1 weights, whose loop of extent 1 TVM drops) over all threads of the block,
        ``vec`` contiguous elements per thread-step: vectorized ``max_lanes`` at a time, unrolled above that."""
        loops = sch.get_loops(blk)
        k0_loop = sch.get(k0)
        own = loops[next(i for i, lp in enumerate(loops) if sch.get(lp).same_as(k0_loop)) + 1:]
        fused = sch.fuse(*own[-2:]) if len(own) > 1 else own[0]
        _, ty, tx, v = sch.split(fused, [None, nw, _THREADS_PER_WARP, vec])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        if max_lanes is not None and vec > max_lanes:
            u, v = sch.split(v, [None, max_lanes])
            sch.unroll(u)
        sch.vectorize(v)

    # activations: global -> shared.dyn (cp.async; zero-filled rows past M)
    if "A_pad" in blocks:
        A_sh = blocks["A_pad"]
        sch.set_scope(A_sh, 0, "shared.dyn")
    else:
        A_sh = sch.cache_read(C_o, 0, "shared.dyn")
    sch.compute_at(A_sh, k0)
    coop(A_sh, vecs["a"])
    sch.storage_align(A_sh, 0, axis=-2, factor=4 * pad, offset=pad)

    if w.kind == "float":
        # float weights: the (padded) tile is a plain copy, cp.async into shared.dyn
        sch.set_scope(Bd, 0, "shared.dyn")
        sch.compute_at(Bd, k0)
        coop(Bd, vecs["w"])
        sch.storage_align(Bd, 0, axis=-2, factor=4 * pad, offset=pad)
        ld_b = intr["ld_b_dyn"]
        n_loads = 2
    else:
        # quantized: raw codes -> shared.dyn (cp.async), decode -> its own static shared tile
        sch.set_scope(Bd, 0, "shared")
        sch.compute_at(Bd, k0)
        W_idx = _read_index(sch, Bd, "W")
        Wq_sh = sch.cache_read(Bd, W_idx, "shared.dyn")
        sch.compute_at(Wq_sh, k0)
        coop(Wq_sh, vecs["w"])
        # TVM's CUDA codegen breaks on wider sub-byte decode vectors, and on any vector of codes in
        # a fast-decoding order (adjacent K positions read bytes that are not adjacent: no ramp)
        coop(Bd, vecs["dec"], max_lanes=1 if plan.w_order else 2)
        sch.storage_align(Bd, 0, axis=-2, factor=4 * pad, offset=pad)
        ld_b = intr["ld_b"]
        n_loads = 2

    A_w = sch.cache_read(C_o, 0, "warp")
    sch.compute_at(A_w, k1)
    B_w = sch.cache_read(C_o, 1, "warp")
    sch.compute_at(B_w, k1)
    C_w = sch.cache_write(C_o, 0, "warp")
    sch.reverse_compute_at(C_w, warp)
    ii, jj = sch.get_loops(C_w)[-2:]
    io, ii = sch.split(ii, [None, 16])
    jo, ji = sch.split(jj, [None, 16])
    sch.reorder(io, jo, ii, ji)
    sch.decompose_reduction(C_o, k0)

    def tile16(blk):
        a, b = sch.get_loops(blk)[-2:]
        a0, a1 = sch.split(a, [None, 16])
        b0, b1 = sch.split(b, [None, kt])
        sch.reorder(a0, b0, a1, b1)
        return a1

    la, lb = tile16(A_w), tile16(B_w)
    imap = lambda r, s: (r // 16, s // 16, *tc.shared_16x16_to_ldmatrix_32x8_layout(r % 16, s % 16))  # noqa: E731
    if eight_bit:   # A [16, 32] and B [16 (n), 32 (k)] fragments: 16 bytes per thread
        lay = tc.shared_16x32_to_ldmatrix_32x16_layout
        imap_ab = lambda r, s: (r // 16, s // 32, *lay(r % 16, s % 32))  # noqa: E731
    else:
        imap_ab = imap
    sch.transform_layout(A_w, ("write", 0), imap_ab)
    sch.transform_layout(B_w, ("write", 0), imap_ab)
    sch.transform_layout(C_w, ("read", 0), imap)
    sch.tensorize(la, intr["ld_a_dyn"])
    sch.tensorize(lb, ld_b)
    sch.tensorize(sch.get_loops(C)[-3], intr["mma"])
    sch.tensorize(sch.get_loops(sch.get_sblock("C_init"))[-2], intr["fill"])

    # epilogue: fragments -> fp32 (int32 for int8) shared tile -> fused D (bias, global scale, cast) -> global
    sch.set_scope(C_w, 0, "shared.dyn")
    D = sch.get_sblock("D")
    sch.reverse_compute_at(D, warp)
    fused = sch.fuse(*sch.get_loops(D)[-2:])
    _, tx, v = sch.split(fused, [None, _THREADS_PER_WARP, vecs["out"]])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)
    sch.tensorize(sch.get_loops(C_w)[-2], intr["store"])

    # software pipeline over k0: loads run stages-1 tiles ahead of decode + mma
    inner = hint.inner_pipeline if hint.inner_pipeline is not None else w.kind == "float"
    if inner and BK // kt > 1 and (stages >= 3 or w.kind != "float"):
        # ldmatrix fragments double-buffered over k1; InjectSoftwarePipeline rewrites k1 first, so
        # its loop counts as 3 statements (prologue, body, epilogue) in the k0 annotation
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
        if w.kind == "float":   # next tile's first fragments load while this tile's mma run
            stage = [0, 0, stages - 2, stages - 1, stages - 1]
            order = [0, 1, 3, 2, 4]
        else:
            stage = [0, 0, stages - 1, stages - 1, stages - 1, stages - 1]
            order = [0, 1, 2, 3, 4, 5]
    else:
        n_body = n_loads + (0 if w.kind == "float" else 1) + 1
        stage = [0] * n_loads + [stages - 1] * (n_body - n_loads)
        order = list(range(n_body))
    sch.annotate(k0, "software_pipeline_stage", stage)
    sch.annotate(k0, "software_pipeline_order", order)
    sch.annotate(k0, "software_pipeline_async_stages", [0])
    return sch.mod


def _blocks(sch, *names):
    """{name: block} for the named blocks that exist."""
    out = {}
    for name in names:
        try:
            out[name] = sch.get_sblock(name)
        except Exception:  # noqa: BLE001 - TVM raises its own error type for a missing block
            pass
    return out


def _read_index(sch, block, name):
    """Index of buffer ``name`` among the reads of ``block``."""
    for idx, r in enumerate(sch.get(block).reads):
        buf = getattr(r, "buffer", None) or getattr(r, "source", None)
        if getattr(buf, "name", None) == name:
            return idx
    raise ValueError(f"block {sch.get(block).name_hint} does not read {name}")
