"""The dequantize kernel (bitblas/schedule/cuda_dequant.py): W_decoded[N, K] in the activation dtype.

CPU: for every weight format the registry pairs with float16 / bfloat16 activations (enumerated
from the registry) x scale / zero-point modes, the IR of the CUDA plan compiled for LLVM, run on
every code (uniformly random W bytes) with random scales / zeros / global scale from the
quantizer, against ``dequantize`` (float64) cast to the activation dtype. Code generation through
nvcc for sm_80 / sm_90 with a 16-byte store, the shared decode expression, the refusals.
GPU: the CUDA kernel on fresh random data into a NaN-poisoned output, at 4096 x 4096 and an odd
shape (N = 1000, K the multiple of the group nearest 4000).

Comparison (:func:`_mismatch`): the kernel decodes in the activation dtype with one rounding per
operation, as the fused matmul does, so it equals the correctly rounded reference bit for bit
where only one rounding happens: no scales; integer codes, e2m1 and float8 values (exact in
float16 / bfloat16) times a scale; quantized zeros (``v - z`` is an exact integer). Elsewhere two
roundings meet and the order of float operations differs from the float64 reference:

* nf4: the table value is rounded to the activation dtype before the scale multiplies it;
* float zeros ("original"): ``v - z`` is rounded before the multiply;
* "rescale": ``v * s`` is rounded before ``- z``, and the difference may cancel;
* nvfp4's global scale: a float32 product rounded again to the activation dtype.

With M the largest of |reference|, |v * s| and |z * s| (|z| for rescale), per element, the kernel
is within one ulp of M (``BOUND_ULPS``) in the activation dtype:

* nf4 / float zeros: the operand of the multiply (x = v or v - z) is off by at most ulp(x) / 2, so
  the product before its rounding is off by s * ulp(x) / 2 < ulp(x * s); two reals less than one
  grid step apart round to neighbouring (or equal) grid points: at most one ulp of the product.
* rescale: ``fl(v * s)`` is off by at most ulp(M) / 2; where v * s - z stays in M's binade both
  results are multiples of ulp(M) less than 1.5 ulps apart, below it the grid is twice as fine and
  the three half-ulp roundings add up to at most one ulp(M). (A fused multiply-add rounds once:
  exact.) Relative to the result itself the error can be large: v * s and z cancel.
* the global scale: rounding to float32 first, then to the activation dtype, lands on the correctly
  rounded value or its neighbour.

Measured on the CPU (5 seeds per case): one ulp of M at most, and no bfloat16 difference at all
there (TVM computes bfloat16 arithmetic in float32 on LLVM targets and rounds once at the end; the
GPU rounds each operation in bfloat16, which the GPU test covers).
"""
from __future__ import annotations

import random

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import cuda_target, find_nvcc, nvcc_compile
from bitblas.formats import FORMATS, WEIGHT_FORMATS
from bitblas.ir.matmul import emit_matmul
from bitblas.plan import make_plan
from bitblas.quantization.quantize import TORCH_DTYPES, decode_values, dequantize, unpack_zeros
from bitblas.quantization.utils import unpack_codes
from bitblas.reference import random_inputs
from bitblas.schedule.cuda_dequant import (PER_THREAD, build_dequant, dequant_args, dequant_source, dequant_unsupported,
                                           emit_dequant)
from kernel_helpers import TARGETS

BOUND_ULPS = 1
_skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ACTS = {"float16": "f16", "bfloat16": "bf16"}

# (group_size, with_scaling, with_zeros, zeros_mode) combinations; each format takes those its
# registry record allows (MatmulConfig refuses the others).
COMBOS = {
    "noscale": dict(),
    "chan": dict(with_scaling=True),
    "g128": dict(with_scaling=True, group_size=128),
    "g32-zeros": dict(with_scaling=True, group_size=32, with_zeros=True),
    "g128-rescale": dict(with_scaling=True, group_size=128, with_zeros=True, zeros_mode="rescale"),
    "g64-qzeros": dict(with_scaling=True, group_size=64, with_zeros=True, zeros_mode="quantized"),
    "chan-qzeros": dict(with_scaling=True, with_zeros=True, zeros_mode="quantized"),
}
N, K = 203, 384        # odd N; K a multiple of every group size above and of 8


def _config(a_dtype, w_dtype, combo, n=N, k=K):
    """The config, or None where the registry refuses the combination; formats that fix their group
    size (nvfp4) take the scaled combos with that group size."""
    kw = dict(COMBOS[combo])
    fixed = FORMATS[w_dtype].group_size
    if fixed is not None:
        if combo != "g128":
            return None
        kw["group_size"] = fixed
    try:
        return MatmulConfig(N=n, K=k, A_dtype=a_dtype, W_dtype=w_dtype, out_dtype=a_dtype, **kw)
    except (ValueError, NotImplementedError):
        return None


def _cases():
    out = []
    for a in ACTS:
        for w in WEIGHT_FORMATS:
            for combo in COMBOS:
                cfg = _config(a, w, combo)
                if cfg is not None and dequant_unsupported(make_plan(cfg, "cuda")) is None:
                    out.append(pytest.param(cfg, id=f"{ACTS[a]}x{w}-{combo}"))
    return out


CASES = _cases()


def _inputs(cfg, seed, device="cpu", global_scale=True):
    """random_inputs' scales / zeros / global scale, and W as uniformly random bytes (every code,
    float8 NaN / inf patterns included)."""
    inputs = random_inputs(cfg, 1, seed=seed)
    g = torch.Generator().manual_seed(seed)
    w = inputs["W"]
    inputs["W"] = torch.randint(-128, 128, w.shape, generator=g, dtype=torch.int8).view(w.dtype)
    if not global_scale:
        inputs.pop("global_scale", None)
    inputs.pop("A")
    return {k: v.to(device) for k, v in inputs.items()}


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ulp of |x| (float64) in ``dtype`` (subnormal spacing below the normal range)."""
    fi = torch.finfo(dtype)
    mant = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    _, e = torch.frexp(x.abs().clamp(min=fi.tiny))
    return torch.ldexp(torch.ones_like(x), (e - 1 - mant).to(torch.int32)).clamp(min=fi.smallest_normal * 2.0 ** -mant)


def _single_rounding(cfg, inputs) -> bool:
    """True where the kernel rounds once, so it must equal the rounded reference exactly."""
    w, dt = FORMATS[cfg.W_dtype], TORCH_DTYPES[cfg.A_dtype]
    if w.kind == "table":
        t = torch.tensor(w.table, dtype=torch.float64)
        t = t[torch.isfinite(t)]
        if not torch.equal(t.to(dt).to(torch.float64), t) and cfg.with_scaling:
            return False            # nf4: the table value is rounded before the scale
    if cfg.with_zeros and cfg.zeros_mode != "quantized":
        return False
    gs = inputs.get("global_scale")
    return gs is None or float(gs) == 1.0


def _terms(cfg, inputs) -> torch.Tensor:
    """M: the largest magnitude among the intermediates, per element (float64 [N, K])."""
    plan = make_plan(cfg, "cuda")
    v = decode_values(unpack_codes(inputs["W"].cpu().view(torch.int8), plan.w, plan.w_storage, plan.w_order), plan.w)
    if not cfg.with_scaling:
        return v.abs()
    gs = cfg.K if plan.groups == 1 else cfg.group_size

    def expand(t):
        return t.cpu().to(torch.float64).reshape(cfg.N, -1)[:, :plan.groups].repeat_interleave(gs, dim=1)

    s = expand(inputs["scale"])
    m = (v * s).abs()
    if cfg.with_zeros:
        if cfg.zeros_mode == "quantized":
            z = expand(unpack_zeros(cfg, inputs["zeros"].cpu()))
        else:
            z = expand(inputs["zeros"])
        m = torch.maximum(m, z.abs() if cfg.zeros_mode == "rescale" else (z * s).abs())
    if inputs.get("global_scale") is not None:
        m = m * float(inputs["global_scale"])
    return m


def _mismatch(cfg, inputs, out):
    """None, or a line saying where ``out`` leaves the reference (exact / BOUND_ULPS ulps of M)."""
    dt = TORCH_DTYPES[cfg.A_dtype]
    ref64 = dequantize(cfg, *(None if inputs.get(k) is None else inputs[k].cpu()
                               for k in ("W", "scale", "zeros", "global_scale")))
    ref = ref64.to(dt).to(torch.float64)
    o = out.cpu().to(torch.float64)
    nan_ok = torch.isnan(ref) & torch.isnan(o)
    same = (o == ref) | nan_ok
    if bool(same.all()):
        return None
    if _single_rounding(cfg, inputs):
        i = (~same).nonzero()[0].tolist()
        return f"{int((~same).sum())} of {o.numel()} differ from the correctly rounded reference, e.g. {i}: " \
               f"{o[tuple(i)].item()} vs {ref[tuple(i)].item()}"
    m = torch.maximum(_terms(cfg, inputs), ref64.abs())
    ulps = torch.where(same, torch.zeros_like(o), (o - ref).abs() / _ulp(m, dt))
    worst = float(ulps.max())
    if not worst <= BOUND_ULPS:        # NaN (an unwritten or wrongly NaN element) fails too
        i = ulps.nan_to_num(float("inf")).argmax()
        i = (int(i) // cfg.K, int(i) % cfg.K)
        return f"{worst:.2f} ulps of M > {BOUND_ULPS} at {i}: {o[i].item()} vs {ref[i].item()}"
    return None


def _run(fn, cfg, plan, inputs, device):
    out = torch.full((cfg.N, cfg.K), float("nan"), dtype=TORCH_DTYPES[cfg.A_dtype], device=device)
    fn(*dequant_args(plan, inputs, out))
    return out


@pytest.mark.parametrize("cfg", CASES)
def test_dequant_cpu(cfg):
    """The CUDA plan's IR on the CPU: every code, against the float64 reference."""
    plan = make_plan(cfg, "cuda")
    fn = build_dequant(plan, "cpu")
    seed = random.randrange(2 ** 31)
    for gscale in (True, False) if plan.w.global_scale else (True,):
        inputs = _inputs(cfg, seed, global_scale=gscale)
        err = _mismatch(cfg, inputs, _run(fn, cfg, plan, inputs, "cpu"))
        assert err is None, f"seed={seed} global_scale={gscale}: {err}"


def test_formats_enumerated():
    """Every quantized weight format with float16 activations has a case."""
    quantized = {w for w in WEIGHT_FORMATS if FORMATS[w].kind != "float"}
    covered = {p.values[0].W_dtype for p in CASES if p.values[0].A_dtype == "float16"}
    assert covered == quantized
    assert {"int8", "uint1", "nf4", "fp4_e2m1", "float8_e5m2", "nvfp4"} <= covered


def _block_value(func, name):
    from tvm import s_tir
    sch = s_tir.Schedule(func)
    return sch.get(sch.get_sblock(name)).body.value


@pytest.mark.parametrize("cfg", [p.values[0] for p in CASES if not FORMATS[p.values[0].W_dtype].global_scale],
                         ids=[p.id for p in CASES if not FORMATS[p.values[0].W_dtype].global_scale])
def test_same_expression_as_matmul(cfg):
    """W_decoded is the fused matmul's B_decode expression, operation for operation."""
    import tvm_ffi
    plan = make_plan(cfg, "cuda")
    assert tvm_ffi.structural_equal(_block_value(emit_dequant(plan), "W_decoded"),
                                    _block_value(emit_matmul(plan), "B_decode"), map_free_vars=True)


def test_global_scale_folded():
    cfg = _config("float16", "nvfp4", "g128")
    f = emit_dequant(make_plan(cfg, "cuda"))
    assert [p.name for p in f.params] == ["W", "scale", "global_scale", "w_table", "s_table", "W_decoded"]
    assert "global_scale" in f.script()


def test_dequant_params_and_refusals():
    cfg = MatmulConfig(N=64, K=128, W_dtype="uint4", group_size=32, with_scaling=True, with_zeros=True,
                       with_bias=True)
    f = emit_dequant(make_plan(cfg, "cuda"))
    assert [p.name for p in f.params] == ["W", "scale", "zeros", "W_decoded"]
    assert f.params[-1].ty.shape[0] == 64 and str(f.params[-1].ty.dtype) == "float16"
    refused = {
        "A_dtype": MatmulConfig(N=64, K=128, A_dtype="float32", W_dtype="uint4"),
        "W_dtype": MatmulConfig(N=64, K=128, W_dtype="float16"),
        "K": MatmulConfig(N=64, K=132, W_dtype="int8"),
        "W_dtype='uint8'": MatmulConfig(N=64, K=128, A_dtype="int8", W_dtype="uint8"),
        "N": MatmulConfig(N=2 ** 17, K=2 ** 14, W_dtype="uint4"),
    }
    for field, c in refused.items():
        reason = dequant_unsupported(make_plan(c, "cuda"))
        assert reason is not None and field.split("=")[0] in reason, (field, reason)
        with pytest.raises(NotImplementedError, match=field.split("=")[0]):
            emit_dequant(make_plan(c, "cuda"))
    assert "layout" in dequant_unsupported(make_plan(MatmulConfig(N=64, K=128, layout="nn"), "cuda"))
    with pytest.raises(ValueError, match="threads"):
        dequant_source(make_plan(cfg, "cuda"), TARGETS["sm_90"], threads=100)


@pytest.mark.parametrize("w_dtype,combo", [("nf4", "g128"), ("uint4", "g128-rescale"), ("nvfp4", "g128")])
def test_dequant_cpu_plan(w_dtype, combo):
    """A CPU plan decodes in float32 (as the CPU matmul does), then casts: within the same bound."""
    cfg = _config("float16", w_dtype, combo)
    plan = make_plan(cfg, "cpu")
    assert plan.decode_dtype == "float32"
    seed = random.randrange(2 ** 31)
    inputs = _inputs(cfg, seed)
    err = _mismatch(cfg, inputs, _run(build_dequant(plan), cfg, plan, inputs, "cpu"))
    assert err is None, f"seed={seed}: {err}"


@pytest.mark.parametrize("a_dtype,w_dtype", [("int8", w) for w in ("int8", "int4", "uint4", "int2", "uint2", "int1", "uint1")]
                         + [("float8_e4m3", w) for w in ("int4", "uint4", "int2", "uint2")])
def test_dequant_int8_codes_cpu(a_dtype, w_dtype):
    """int8 / float8_e4m3 activations: W_decoded is the integer weight value as int8 or as its e4m3
    bit pattern (scales stay with the GEMM), every code, against the reference decode."""
    import dataclasses
    cfg = MatmulConfig(N=64, K=256, A_dtype=a_dtype, W_dtype=w_dtype, group_size=128, with_scaling=True,
                       with_act_scaling=True)
    plan = make_plan(cfg, "cuda")
    f = emit_dequant(plan)
    assert [p.name for p in f.params] == ["W", "W_decoded"] and str(f.params[-1].ty.dtype) == "int8"
    fn = build_dequant(plan, "cpu")
    inputs = _inputs(cfg, random.randrange(2 ** 31))
    out = torch.full((cfg.N, cfg.K), 99, dtype=torch.int8)
    fn(*dequant_args(plan, inputs, out))
    ref = dequantize(dataclasses.replace(cfg, with_scaling=False, group_size=-1), inputs["W"])
    lo, hi = FORMATS[w_dtype].code_range
    assert int(ref.min()) <= lo + 1 and int(ref.max()) >= hi - 1, "the random weight missed codes"
    got = out if a_dtype == "int8" else out.view(torch.float8_e4m3fn)
    assert torch.equal(got.to(torch.float64), ref.to(torch.float64))


def test_e4m3_bits_every_value():
    """``ir.matmul.e4m3_bits`` (the branch-free float32 route) gives torch's float8_e4m3fn bits of
    every integer it is used for, -15..15, compiled for LLVM; and its CUDA text has no select chain
    (one ``max``, no conditionals)."""
    import numpy as np
    import tvm
    from tvm import te
    from bitblas.ir.matmul import e4m3_bits
    n = 31
    X = te.placeholder((n,), "int32", name="X")
    f = te.create_prim_func([X, te.compute((n,), lambda i: e4m3_bits(X[i]), name="Y")])
    fn = tvm.compile(f, target="llvm")
    x = np.arange(-15, 16, dtype=np.int32)
    out = tvm.runtime.tensor(np.full(n, 99, np.int8), tvm.cpu())
    fn(tvm.runtime.tensor(x, tvm.cpu()), out)
    ref = torch.tensor(x, dtype=torch.float32).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert (out.numpy().view(np.uint8) == ref).all()
    cfg = MatmulConfig(N=64, K=256, A_dtype="float8_e4m3", W_dtype="int4", with_scaling=True, with_act_scaling=True)
    src = dequant_source(make_plan(cfg, "cuda"), TARGETS["sm_90"])
    body = src[src.index('extern "C" __global__ void __launch_bounds__'):]
    assert "condval" not in body and "? " not in body and body.count("max(") == 8 * PER_THREAD


def test_dequant_args_checks():
    cfg = MatmulConfig(N=64, K=128, W_dtype="uint4", group_size=32, with_scaling=True)
    plan = make_plan(cfg, "cuda")
    inputs = _inputs(cfg, 0)
    out = torch.empty(64 * 128 + 1, dtype=torch.float16)[1:].view(64, 128)
    with pytest.raises(ValueError, match="out: data pointer must be 16-byte aligned"):
        dequant_args(plan, inputs, out)
    w = torch.empty(64 * 64 + 2, dtype=torch.int8)[2:].view(64, 64)
    with pytest.raises(ValueError, match="W: data pointer must be 4-byte aligned"):
        dequant_args(plan, dict(inputs, W=w), torch.empty(64, 128, dtype=torch.float16))
    with pytest.raises(ValueError, match="scale: missing"):
        dequant_args(plan, {"W": inputs["W"]}, torch.empty(64, 128, dtype=torch.float16))


def test_dequant_targets():
    from bitblas.schedule.cuda_dequant import _resolve_target
    plan = make_plan(MatmulConfig(N=64, K=128, W_dtype="int4"), "cuda")
    assert _resolve_target(plan, "cpu")[1] == "cpu"
    assert _resolve_target(plan, {"kind": "llvm"})[1] == "cpu"
    assert _resolve_target(make_plan(plan.config, "cpu"), None)[1] == "cpu"
    assert _resolve_target(plan, "sm_90")[1] == "cuda"
    assert _resolve_target(plan, TARGETS["sm_80"])[0].arch == "sm_80"
    with pytest.raises(ValueError, match="target="):
        _resolve_target(plan, "no-such-target")
    with pytest.raises(ValueError, match="not a CUDA target"):
        dequant_source(plan, "cpu")


# -- CUDA ---------------------------------------------------------------------------------------

# The representative set: (name, W_dtype, config fields); K of the odd shape is the multiple of
# the group size (and 8) nearest 4000.
GPU_SET = {
    "u4-g128-zeros": dict(W_dtype="uint4", group_size=128, with_scaling=True, with_zeros=True),
    "nf4-g128": dict(W_dtype="nf4", group_size=128, with_scaling=True),
    "fp4-g32": dict(W_dtype="fp4_e2m1", group_size=32, with_scaling=True),
    "e4m3-chan": dict(W_dtype="float8_e4m3", with_scaling=True),
    "nvfp4": dict(W_dtype="nvfp4", group_size=16, with_scaling=True),
    "i2-g128-rescale": dict(W_dtype="int2", group_size=128, with_scaling=True, with_zeros=True, zeros_mode="rescale"),
    "u1-g32-qzeros": dict(W_dtype="uint1", group_size=32, with_scaling=True, with_zeros=True,
                          zeros_mode="quantized"),
}


def _near_k(kw, k=4000):
    step = max(8, kw.get("group_size", -1))
    return max(step, round(k / step) * step)


def _gpu_config(name, a_dtype, n, k):
    kw = GPU_SET[name]
    return MatmulConfig(N=n, K=k if k == 4096 else _near_k(kw, k), A_dtype=a_dtype, out_dtype=a_dtype, **kw)


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(GPU_SET))
def test_dequant_codegen(arch, name):
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    for a, threads in (("float16", 256), ("bfloat16", 128)):
        cfg = _gpu_config(name, a, 1000, 4000)
        src = dequant_source(make_plan(cfg, "cuda"), TARGETS[arch], threads=threads)
        assert "*(uint4*)(W_decoded_ptr + " in src, "no 16-byte store of the decoded weights"
        assert f"__launch_bounds__({threads})" in src
        assert nvcc_compile(src, arch)[:4] == b"\x7fELF"


@pytest.mark.nvcc
@pytest.mark.parametrize("a_dtype,w_dtype", [("int8", "uint2"), ("float8_e4m3", "int4")])
def test_dequant_codes_codegen(a_dtype, w_dtype):
    """int8 / float8 activations: the codes kernel (one byte per weight) compiles for sm_90."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    cfg = MatmulConfig(N=1000, K=4096, A_dtype=a_dtype, W_dtype=w_dtype, group_size=128, with_scaling=True)
    src = dequant_source(make_plan(cfg, "cuda"), TARGETS["sm_90"])
    assert "main_kernel(signed char* __restrict__ W_ptr, signed char* __restrict__ W_decoded_ptr)" in src
    assert nvcc_compile(src, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.gpu
@_skip
@pytest.mark.parametrize("nk", [(4096, 4096), (1000, 4000)], ids=["4096x4096", "1000xK4000"])
@pytest.mark.parametrize("a_dtype", list(ACTS), ids=list(ACTS.values()))
@pytest.mark.parametrize("name", list(GPU_SET))
def test_dequant_gpu(name, a_dtype, nk):
    cfg = _gpu_config(name, a_dtype, *nk)
    plan = make_plan(cfg, "cuda")
    fn = build_dequant(plan, cuda_target())
    seed = random.randrange(2 ** 31)
    inputs = _inputs(cfg, seed, device="cuda")
    out = _run(fn, cfg, plan, inputs, "cuda")
    torch.cuda.synchronize()
    err = _mismatch(cfg, inputs, out)
    assert err is None, f"{cfg} seed={seed}: {err}"


TAIL_SHAPES = [(7, 56), (2, 512), (33, 40), (1000, 1032)]     # N * K / 8 not a multiple of the block


@pytest.mark.parametrize("threads", [128, 256])
@pytest.mark.parametrize("nk", TAIL_SHAPES, ids=[f"{n}x{k}" for n, k in TAIL_SHAPES])
@pytest.mark.parametrize("w_dtype,a_dtype", [("int1", "bfloat16"), ("uint4", "float16"), ("nf4", "float16"),
                                             ("int2", "int8"), ("fp4_e2m1", "bfloat16")])
def test_dequant_tail_store_guarded(w_dtype, a_dtype, nk, threads):
    """Threads past N * K / 8 in the last block store nothing: the vector store of the decoded weights
    sits under the same tail predicate as the decode (it once did not, and the idle threads wrote 16
    bytes each past W_decoded: GPU fuzz seeds 100121 and 100141 read corrupted activations after it)."""
    n, k = nk
    work, per_block = n * k // 8, threads * PER_THREAD
    if work % per_block == 0:
        pytest.skip(f"{work} vectors of work fill blocks of {per_block}: no tail")
    kw = {} if w_dtype == "int1" else dict(with_scaling=True, group_size=8)
    cfg = MatmulConfig(M=None, N=n, K=k, A_dtype=a_dtype, W_dtype=w_dtype, out_dtype="float16", **kw)
    src = dequant_source(make_plan(cfg, "cuda"), TARGETS["sm_90"], threads=threads)
    lines = [ln.strip() for ln in src[src.index("__global__ void"):].splitlines() if ln.strip()]
    stores = [i for i, ln in enumerate(lines) if ln.startswith(("*(uint4*)(W_decoded_ptr", "*(int2*)(W_decoded_ptr"))]
    # one per vector of a thread, but for the trailing ones no thread has (dropped by the compiler)
    assert len(stores) == min(PER_THREAD, -(-work // threads)), (len(stores), work)
    last = (-(-work // per_block) - 1) * per_block      # the first vector of the last block
    for j, i in enumerate(stores):                       # the thread's j-th vector: last + j * threads + tx there
        if last + (j + 1) * threads <= work:
            continue                                     # every thread of every block has it: no guard needed
        assert lines[i - 1].startswith("if (") and "threadIdx.x" in lines[i - 1], \
            f"unguarded store ({work} vectors of work, blocks of {per_block}): {lines[i - 1]!r} / {lines[i]!r}"
    if find_nvcc() is not None and threads == 256:
        assert nvcc_compile(src, "sm_90")[:4] == b"\x7fELF"


def test_dequant_full_blocks_unguarded():
    """Where the blocks are full (N * K / 8 a multiple of the threads) the store stays unpredicated."""
    cfg = MatmulConfig(M=None, N=4096, K=4096, W_dtype="uint4", group_size=128, with_scaling=True)
    src = dequant_source(make_plan(cfg, "cuda"), TARGETS["sm_90"])
    body = src[src.index("__global__ void"):]
    assert "if (" not in body and "*(uint4*)(W_decoded_ptr + " in body


@pytest.mark.gpu
@_skip
@pytest.mark.parametrize("nk", TAIL_SHAPES, ids=[f"{n}x{k}" for n, k in TAIL_SHAPES])
def test_dequant_gpu_writes_nothing_past_the_end(nk):
    """W_decoded as the head of a NaN-filled buffer: the kernel writes exactly N * K values."""
    n, k = nk
    cfg = MatmulConfig(N=n, K=k, A_dtype="float16", W_dtype="uint4", group_size=8, with_scaling=True)
    plan = make_plan(cfg, "cuda")
    fn = build_dequant(plan, cuda_target())
    inputs = _inputs(cfg, 0, device="cuda")
    buf = torch.full((n * k + 4096,), float("nan"), dtype=torch.float16, device="cuda")
    out = buf[: n * k].view(n, k)
    fn(*dequant_args(plan, inputs, out))
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert torch.isnan(buf[n * k:]).all(), "the kernel wrote past W_decoded"
