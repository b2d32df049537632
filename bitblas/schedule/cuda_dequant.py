"""The dequantize kernel: decode a quantized weight once into ``W_decoded[N, K]`` (the activation dtype).

For large M the matmul is compute-bound, and the fastest path is to decode the weight once into a
temporary float16/bfloat16 buffer and hand it to a dense tensor-core GEMM. This module builds the
decode half of that path, for plans with float16/bfloat16 activations, layout "nt" and any
quantized weight format the registry pairs with them (int8/4/2/1, uint8/4/2/1, nf4, fp4_e2m1,
float8_e4m3/e5m2, nvfp4), with or without scales, zeros (every ``zeros_mode``) and global scale.

Values: ``W_decoded[n, k]`` is ``decoded_weight(plan, ...)(n, k)`` from :mod:`bitblas.ir.matmul`,
the expression the fused matmul's ``B_decode`` block uses, evaluated in ``plan.decode_dtype``
(float16/bfloat16 for a CUDA plan: the same per-operation rounding as the fused kernel; float32 for
a CPU plan, as the CPU matmul), then cast to ``A_dtype``. Two things differ from what the fused matmul does, and their rounding is:

* nvfp4's global scale: the fused kernel multiplies the float32 accumulator by it in the
  epilogue; here it multiplies each decoded weight, ``float32(v * s) * global_scale`` rounded to
  ``A_dtype``. ``v * s`` (e2m1 value times float8_e4m3 scale, at most 6 significant bits) is
  exact in float16/bfloat16, the float32 product is rounded once to float32 and once more to
  ``A_dtype``; that double rounding is off the correctly rounded value by one ulp in the rare case
  where the float32 product lands exactly half-way between two ``A_dtype`` values. The GEMM then
  sums ``a * round(w * g)`` where the fused kernel sums ``round(a * w) * g``: the same error budget
  as any float16 weight, and a weight times global scale that overflows/underflows ``A_dtype``
  (only possible for a global scale far from the one :func:`bitblas.quantization.quantize` picks)
  saturates to inf / loses precision here while the fused kernel would not.
* The compiler may contract ``v * s - z`` (zeros_mode "rescale") into one fused multiply-add in
  either kernel; where one kernel does and the other does not, the two round differently (one ulp
  of ``v * s``). Every other form rounds the same way in both.

Against the float64 torch reference :func:`bitblas.quantization.quantize.dequantize` cast to
``A_dtype``, the result is bit-identical whenever one rounding happens (no scales; integer codes
and e2m1 / float8 values times a scale; quantized zeros, whose difference ``v - z`` is an exact
integer) and otherwise within one ulp of the largest intermediate term (|v * s|, |z * s| or |z|):
nf4 table values rounded to ``A_dtype`` before the scale, float zeros (``v - z`` rounded), rescale
(``v * s`` rounded, then cancelled against ``z``), the global scale's double rounding; the argument
and the check are in ``testing/test_dequant.py``.

CUDA schedule (:func:`schedule_cuda_dequant`): per 8 consecutive K outputs of a row one vector
load of their packed bytes (8 / codes-per-byte bytes), 8 values decoded in registers, one 16-byte
store (``uint4``); each thread does ``PER_THREAD`` of them, ``threads`` (128 or 256, the block)
apart, the tail predicated. The output is 2 bytes per
element against 0.125..1 byte read, so the vector store is what sets the speed. Lookup tables
(``w_table``) are read through the L1 cache. Needs K % 8 == 0 (16-byte aligned rows) and
N * K < 2**31 (32-bit indexing); :func:`dequant_unsupported` says so. The output buffer must be
16-byte aligned and W aligned to its vector size, as every torch allocation is.

CPU schedule (:func:`schedule_cpu_dequant`): rows in parallel, K vectorised; it compiles the same
IR for LLVM, which is how the tests check the values without a GPU. float16 arithmetic there rounds
per operation as on the GPU; TVM computes bfloat16 arithmetic in float32 on LLVM targets (one
rounding at the end), so bfloat16 results on the CPU can be closer to the reference than the GPU's.
"""
from __future__ import annotations

from typing import Optional

from tvm import te, tirx

from .._tvm import tvm
from ..ir.matmul import decoded_weight, e4m3_bits, e4m3_codes, placeholders
from ..plan import Plan

__all__ = ["WEIGHT_ARGS", "weight_arg_names", "dequant_unsupported", "emit_dequant", "schedule_cuda_dequant", "schedule_cpu_dequant",
           "compile_dequant", "build_dequant", "dequant_args", "dequant_source"]

# The weight-side arguments of a plan, the dequantize kernel's inputs (in plan.args order).
WEIGHT_ARGS = ("W", "scale", "zeros", "global_scale", "w_table", "s_table")


def weight_arg_names(plan: Plan) -> tuple:
    """Names of the dequantize kernel's inputs, in ``plan.args`` order: the weight-side arguments
    (``WEIGHT_ARGS``) the plan has; only ``W`` for int8 and float8 activations (codes, scales stay
    with the GEMM)."""
    names = ("W",) if not plan.float_acts else WEIGHT_ARGS
    return tuple(s.name for s in plan.args if s.name in names)


VEC = 8               # K outputs per thread: 8 x 2 bytes = one 16-byte store
BLOCK_NAME = "W_decoded"


def dequant_unsupported(plan: Plan) -> Optional[str]:
    """None if the dequantize kernel takes ``plan``, else why not (naming the config field and value)."""
    c = plan.config
    if c.A_dtype == "int8":
        from .cuda_mma import INT8_MMA_WEIGHTS
        if c.W_dtype not in INT8_MMA_WEIGHTS:
            return (f"W_dtype={c.W_dtype!r} with int8 activations: the dequantize kernel writes int8 codes, "
                    f"for weights whose values fit int8 ({', '.join(INT8_MMA_WEIGHTS)})")
    elif c.A_dtype == "float8_e4m3":
        if not e4m3_codes(plan):
            return (f"W_dtype={c.W_dtype!r} with float8_e4m3 activations: the dequantize kernel writes e4m3 "
                    f"codes, for integer weights of at most 4 bits (exact in e4m3)")
    elif c.A_dtype not in ("float16", "bfloat16"):
        return (f"A_dtype={c.A_dtype!r}: the dequantize kernel decodes for float16, bfloat16 (or int8 / "
                f"float8_e4m3 with integer weights) activations")
    if c.layout != "nt":
        return f"layout={c.layout!r}: the dequantize kernel takes layout 'nt' (W is [N, K])"
    if plan.w.kind == "float":
        return f"W_dtype={c.W_dtype!r} is not quantized: no dequantize needed"
    if c.K % VEC:
        return f"K={c.K}: the dequantize kernel needs K a multiple of {VEC} (one 16-byte store per thread)"
    if c.N * c.K >= 2 ** 31:
        return f"N={c.N}, K={c.K}: N * K must be below 2**31 (the kernel indexes with int32)"
    return None


def _check(plan: Plan) -> None:
    reason = dequant_unsupported(plan)
    if reason is not None:
        raise NotImplementedError(f"dequantize kernel: {reason}")


def emit_dequant(plan: Plan) -> tirx.PrimFunc:
    """TensorIR of ``W_decoded[n, k] = decoded weight (n, k)`` in the activation dtype.

    Parameters: the plan's weight-side arguments in ``plan.args`` order (those of ``W``, ``scale``,
    ``zeros``, ``global_scale``, ``w_table``, ``s_table`` the plan has), then ``W_decoded`` [N, K].
    Scales and zeros apply in ``plan.decode_dtype`` exactly as in ``emit_matmul``; the nvfp4 global
    scale is folded in (float32 multiply, then the cast; see the module docstring for the rounding).
    int8 activations: ``W_decoded`` holds the integer weight values as int8 (exact; the scale
    stays with the GEMM, which applies per-channel or group scales to its integer sums), and the
    parameters are ``W`` and ``W_decoded`` only. float8_e4m3 activations: the same, with the
    integer values as e4m3 bit patterns (``ir.matmul.e4m3_bits``; the GEMM is the float8 one).
    """
    _check(plan)
    c = plan.config
    names = weight_arg_names(plan)
    ph = placeholders(plan, None, names)
    fp8 = c.A_dtype == "float8_e4m3"
    # int8 / float8 activations: integer values, no scale
    weight = decoded_weight(plan, ph, "int32" if fp8 else plan.decode_dtype)

    def decoded(n, k):
        v = weight(n, k)
        if fp8:
            return e4m3_bits(v)
        if plan.w.global_scale:
            v = v.astype("float32") * ph["global_scale"][0]
        return v.astype(c.A_dtype)

    out = te.compute((c.N, c.K), decoded, name=BLOCK_NAME)
    return te.create_prim_func([ph[n] for n in names] + [out])


PER_THREAD = 2        # vectors per thread (H200, 8192 x 8192 unless named, µs for 1 / 2 / 4 / 8: uint4 g128
                      # 44.6 / 43.5 / 44.1 / 45.4, with zeros 45.7 / 43.8 / 45.3 / 46.2, 28672 x 8192 151.1 /
                      # 147.3 / 149.2 / 153.5, nf4 49.8 / 44.2 / 44.7 / 45.9, uint2 41.8 / 40.1 / 40.9 / 42.5,
                      # int8 52.1 / 50.7 / 51.8 / 52.6)


def schedule_cuda_dequant(func: tirx.PrimFunc, plan: Plan, threads: int = 256,
                          per_thread: int = PER_THREAD) -> "tvm.IRModule":
    """8 consecutive K outputs at a time: a vector load of their packed W bytes, 8 decodes in
    registers, one 16-byte store; ``threads`` (128 or 256) per block. ``per_thread``: vectors per
    thread, ``threads`` apart (each one a coalesced block-wide store), unrolled, so that a thread
    has more than one load in flight."""
    if threads not in (128, 256):
        raise ValueError(f"threads={threads!r} is invalid; accepted: 128, 256")
    if per_thread not in (1, 2, 4, 8):
        raise ValueError(f"per_thread={per_thread!r} is invalid; accepted: 1, 2, 4, 8")
    _check(plan)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    blk = sch.get_sblock(BLOCK_NAME)
    # the loops are split on the store (registers -> global, one 16-byte vector store per thread) and
    # the decode is computed inside them: the split's tail predicate (threads past N * K / 8) then
    # guards the store too. (Splitting the decode block and reverse_compute_at-ing the store left the
    # store unpredicated: the last block's idle threads wrote 16 bytes each past W_decoded.)
    store = sch.cache_write(blk, 0, "local")
    n, k = sch.get_loops(store)
    ko, ki = sch.split(k, [None, VEC])
    bx, it, tx = sch.split(sch.fuse(n, ko), [None, per_thread, threads])
    sch.reorder(tx, it)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(it)
    sch.compute_at(blk, it)
    sch.vectorize(ki)
    # the thread's packed bytes (8 codes) with one vector load
    load = sch.cache_read(blk, "W", "local")
    sch.compute_at(load, it)
    inner = sch.get_loops(load)[-1]
    if plan.w.codes_per_byte < VEC:       # one byte (1-bit codes) needs no vector
        sch.vectorize(inner)
    sch.unroll(sch.get_loops(blk)[-1])
    return sch.mod


def schedule_cpu_dequant(func: tirx.PrimFunc, plan: Plan) -> "tvm.IRModule":
    """Rows in parallel, K split by 8 and vectorised (LLVM); for tests and CPU use."""
    _check(plan)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    blk = sch.get_sblock(BLOCK_NAME)
    n, k = sch.get_loops(blk)
    _, ki = sch.split(k, [None, VEC])
    sch.parallel(n)
    sch.vectorize(ki)
    return sch.mod


def _resolve_target(plan: Plan, target):
    """(target, "cpu" | "cuda"): None follows the plan's target kind; "cpu"/"llvm" or an LLVM Target
    compile for this CPU; anything else goes through :func:`bitblas.build.cuda_target`."""
    from ..build import cpu_target, cuda_target   # bitblas.build imports the schedule package
    if target is None:
        return (cpu_target(), "cpu") if plan.target_kind == "cpu" else (cuda_target(None), "cuda")
    if isinstance(target, str) and target in ("cpu", "llvm"):
        return cpu_target(), "cpu"
    if isinstance(target, dict) or (isinstance(target, str) and target != "cuda" and not target.startswith("sm_")):
        try:
            target = tvm.target.Target(target)
        except Exception:  # noqa: BLE001 - cuda_target below names the bad value
            pass
    if isinstance(target, tvm.target.Target) and target.kind.name == "llvm":
        return target, "cpu"
    return cuda_target(target), "cuda"


def compile_dequant(plan: Plan, target=None, threads: int = 256):
    """Compile the dequantize kernel of ``plan``; returns the tvm Executable (``ex["main"]``).

    ``target``: None (the plan's target kind: the local GPU, or this CPU), "cpu" / "llvm" / an LLVM
    Target (the CPU schedule of the same IR: pass a CUDA plan to check the GPU's values on a CPU), or
    any CUDA target :func:`bitblas.build.cuda_target` accepts.
    """
    from ..build import PASS_CONFIG
    tgt, kind = _resolve_target(plan, target)
    func = emit_dequant(plan)
    mod = schedule_cpu_dequant(func, plan) if kind == "cpu" else schedule_cuda_dequant(func, plan, threads)
    with tvm.transform.PassContext(config=PASS_CONFIG):
        return tvm.compile(mod, target=tgt)


def build_dequant(plan: Plan, target=None, threads: int = 256):
    """The compiled dequantize kernel (callable on torch tensors): ``fn(*weight_args, W_decoded)``,
    the weight arguments in ``plan.args`` order (see :func:`emit_dequant`)."""
    return compile_dequant(plan, target, threads)["main"]


def dequant_args(plan: Plan, inputs: dict, out) -> list:
    """The kernel's argument list from operator inputs (``W``, ``scale``, ``zeros``, ``global_scale``
    as :func:`bitblas.quantization.quantize` gives them; a missing global scale is 1) and the output
    ``out`` [N, K]; the lookup tables are made on ``out``'s device.

    Checks what the compiled function does not: ``out`` 16-byte aligned and ``W`` aligned to the
    bytes one thread loads (a misaligned vector access is a fatal CUDA error). The function itself
    checks shapes, dtypes and contiguity.
    """
    import torch
    args = []
    names = weight_arg_names(plan)
    for spec in plan.args:
        if spec.name not in names:
            continue
        if spec.role == "table":
            args.append(torch.tensor(plan.table_values(spec.name), dtype=torch.float32, device=out.device))
        elif spec.name == "global_scale" and inputs.get(spec.name) is None:
            args.append(torch.ones(1, dtype=torch.float32, device=out.device))
        else:
            t = inputs.get(spec.name)
            if t is None:
                raise ValueError(f"{spec.name}: missing; the dequantize kernel of this plan takes "
                                 f"{', '.join(names)}")
            args.append((t.view(torch.int8) if spec.dtype == "int8" and t.dtype != torch.int8 else t)
                        .reshape(spec.shape))
    w_bytes = VEC * plan.w.bits // 8
    for name, t, align in (("out", out, 16), ("W", args[0], w_bytes)):   # W: the first weight argument
        if t.data_ptr() % align:
            raise ValueError(f"{name}: data pointer must be {align}-byte aligned for the dequantize kernel's "
                             f"vector accesses, got address % {align} = {t.data_ptr() % align}")
    return args + [out]


def dequant_source(plan: Plan, target=None, threads: int = 256) -> str:
    """CUDA C source of the dequantize kernel (works without a GPU)."""
    tgt, kind = _resolve_target(plan, target if target is not None else "cuda")
    if kind != "cuda":
        raise ValueError(f"dequant_source: target={target!r} is not a CUDA target")
    return compile_dequant(plan, tgt, threads).mod.imports[0].inspect_source()
