"""The Hopper wgmma template (bitblas/schedule/cuda_wgmma.py): float16 / bfloat16 / int8 / float8
activations with weights of the same kind (no decode), TMA + mbarrier ring + wgmma, epilogue
scales and bias. The default on sm_90 targets for such plans at every row count.

    python -m pytest testing/test_wgmma.py -m "not gpu"     # CI: routing, reasons, nvcc sm_90a codegen
    python -m pytest testing/test_wgmma.py -m gpu           # H100/H200: kernels vs reference
"""
from __future__ import annotations

import re

import pytest
import torch

from bitblas import MatmulConfig
from bitblas.build import build_plan, cuda_source, cuda_target, find_nvcc, nvcc_compile
from bitblas.plan import make_plan
from bitblas.schedule import GEMVHint, MMAHint, WGMMAHint, wgmma_unsupported
from bitblas.kernels import default_hint
from kernel_helpers import HOST_WARP, TARGETS, check_kernel, choose, fp8_mma_tolerance, past_gemv

C = MatmulConfig
E4, E5 = "float8_e4m3", "float8_e5m2"
SCALED = dict(with_scaling=True, group_size=-1, with_act_scaling=True)

FAMILIES = {
    "f16": dict(A_dtype="float16", W_dtype="float16"),
    "f16-bias-f32out": dict(A_dtype="float16", W_dtype="float16", with_bias=True, out_dtype="float32"),
    "bf16-bias": dict(A_dtype="bfloat16", W_dtype="bfloat16", with_bias=True, out_dtype="bfloat16"),
    "i8-i32": dict(A_dtype="int8", W_dtype="int8", out_dtype="int32", accum_dtype="int32"),
    "i8-scaled-f16": dict(A_dtype="int8", W_dtype="int8", out_dtype="float16", **SCALED),
    "i8-scaled-bias-bf16": dict(A_dtype="int8", W_dtype="int8", out_dtype="bfloat16", with_bias=True, **SCALED),
    "e4m3-scaled-f16": dict(A_dtype=E4, W_dtype=E4, out_dtype="float16", **SCALED),
    "e5m2xe4m3-bias-bf16": dict(A_dtype=E5, W_dtype=E4, out_dtype="bfloat16", with_bias=True, **SCALED),
    "e4m3-noscale-f32": dict(A_dtype=E4, W_dtype=E4, out_dtype="float32"),
    "i8-noscale-bias-f16": dict(A_dtype="int8", W_dtype="int8", out_dtype="float16", with_bias=True),
    # group scales: int32 / fp8 partial sums promoted to float32 once per group (128 or 256 K)
    "i8-g128-f16": dict(A_dtype="int8", W_dtype="int8", out_dtype="float16", with_scaling=True, group_size=128,
                        with_act_scaling=True),
    "i8-g256-bias-bf16": dict(A_dtype="int8", W_dtype="int8", out_dtype="bfloat16", with_scaling=True,
                              group_size=256, with_bias=True),
    "e4m3-g128-bf16": dict(A_dtype=E4, W_dtype=E4, out_dtype="bfloat16", with_scaling=True, group_size=128,
                           with_act_scaling=True),
}


def _plan(cfg, m=None):
    return make_plan(cfg, "cuda", cfg.M if isinstance(cfg.M, int) else m)


def _tol(cfg):
    """fp8: the tensor cores' reduced-precision accumulator (see fp8_mma_tolerance); else the table."""
    return fp8_mma_tolerance(cfg) if cfg.A_dtype in (E4, E5) else None


def _h200():
    return cuda_target(TARGETS["sm_90"])


# -- routing and reasons (CPU) ---------------------------------------------------------------------
@pytest.mark.parametrize("fam", list(FAMILIES))
@pytest.mark.parametrize("M", [None, 1, 17, 128, 1000])
def test_default_on_sm90(fam, M):
    plan = _plan(C(M=M, N=1000, K=512, **FAMILIES[fam]))
    hint = default_hint(plan, _h200())
    if FAMILIES[fam]["A_dtype"] == "int8" and M is not None and M <= 32:
        from bitblas.schedule import GEMVHint        # int8 x int8: the GEMV up to 32 rows
        assert isinstance(hint, GEMVHint), hint
        hint = WGMMAHint.default(plan, _h200())      # wgmma still takes it when asked
    assert isinstance(hint, WGMMAHint), hint
    hint.check(plan)
    assert hint.smem_bytes() <= TARGETS["sm_90"]["max_shared_memory_per_block"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
def test_not_below_sm90(arch):
    plan = _plan(C(M=None, N=1000, K=512, **FAMILIES["f16"]))
    hint = default_hint(plan, cuda_target(TARGETS[arch]))
    assert isinstance(hint, MMAHint)
    assert "sm_90" in wgmma_unsupported(plan, int(arch[3:]))
    assert WGMMAHint.default(plan, None) is None          # unknown arch: not assumed


@pytest.mark.parametrize("M,expect", [(1, (64, 64)), (128, (64, 64)), (256, (64, 128)), (512, (128, 128)), (1024, (128, 256)),
                                      (None, (128, 256))])
def test_tiles_fill_the_sms(M, expect, monkeypatch):
    import bitblas.arch as g
    monkeypatch.setattr(g, "_LOCAL_SMS", [132])
    h = WGMMAHint.default(_plan(C(M=M, N=4096, K=4096, **FAMILIES["f16"])), _h200())
    assert (h.BM, h.BN) == expect


@pytest.mark.parametrize("M,kind", [(1, GEMVHint), (8, GEMVHint), (9, GEMVHint), (16, GEMVHint), (17, GEMVHint),
                                    (32, GEMVHint), (33, WGMMAHint), (65, WGMMAHint)])
def test_int8_rows_gemv_then_wgmma(M, kind):
    """int8 x int8 with group scales: the GEMV (dp4a rows kernel, from 5 rows the m16n8k32 one,
    faster than the 64 x 64 wgmma tile on the H200; above 16 rows its chunk loop) for 1..32 rows,
    wgmma from 33; int8 x int4 per channel: the GEMV up to 64 rows (chunks of 16 above 16)."""
    plan = _plan(C(M=M, N=8192, K=8192, A_dtype="int8", W_dtype="int8", with_scaling=True, group_size=128))
    assert isinstance(default_hint(plan, _h200()), kind)
    h4 = default_hint(_plan(C(M=M, N=8192, K=8192, A_dtype="int8", W_dtype="int4", with_scaling=True)), _h200())
    assert isinstance(h4, GEMVHint) == (M <= 64), h4
    if M <= 16:
        assert isinstance(default_hint(plan, cuda_target(TARGETS["sm_80"])), GEMVHint)


def test_small_m_keeps_other_templates():
    t = _h200()
    plan = _plan(C(M=65, N=1024, K=512, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True))
    assert isinstance(default_hint(plan, t), MMAHint)                    # decoded weights past the GEMV: mma.sync
    assert isinstance(default_hint(_plan(C(M=8, N=1024, K=512, A_dtype="float16", W_dtype="uint4")), t), GEMVHint)


@pytest.mark.parametrize("kw,why", [
    (dict(A_dtype="float16", W_dtype="uint4"), "W_dtype=uint4"),
    (dict(A_dtype="int8", W_dtype="int4", with_scaling=True, group_size=-1), "W_dtype=int4"),
    (dict(A_dtype="int8", W_dtype="int8", with_scaling=True, group_size=64), "group_size=64"),
    (dict(A_dtype="bfloat16", W_dtype=E4), "W_dtype=float8_e4m3"),
    (dict(A_dtype="float16", W_dtype="float16", layout="nn"), "layout"),
    (dict(A_dtype="float32", W_dtype="float16"), "A_dtype=float32"),
])
def test_unsupported_reasons(kw, why):
    plan = _plan(C(M=None, N=256, K=512, **kw))
    reason = wgmma_unsupported(plan, 90)
    assert reason is not None and why in reason, reason
    assert WGMMAHint.default(plan, _h200()) is None


def test_k_alignment_reason():
    assert "K=1004" in wgmma_unsupported(_plan(C(M=None, N=256, K=1004, **FAMILIES["f16"])), 90)
    assert wgmma_unsupported(_plan(C(M=None, N=256, K=1000, **FAMILIES["f16"])), 90) is None   # 2000-byte rows
    assert "K=1000" in wgmma_unsupported(_plan(C(M=None, N=256, K=1000, **FAMILIES["i8-i32"])), 90)


@pytest.mark.parametrize("bad,match", [
    (WGMMAHint(consumers=3), "consumers"), (WGMMAHint(BN=264), "BN"), (WGMMAHint(BN=24), "BN"),
    (WGMMAHint(stages=1), "stages"), (WGMMAHint(BN=256, stages=6), "shared memory"), (WGMMAHint(group_m=0), "group_m"),
    (WGMMAHint(cluster=4), "cluster"),
])
def test_hint_check(bad, match):
    with pytest.raises(ValueError, match=match):
        bad.check()


def test_int8_bn_limit():
    plan = _plan(C(M=None, N=1000, K=512, **FAMILIES["i8-i32"]))
    with pytest.raises(ValueError, match="int8 wgmma"):
        WGMMAHint(BN=256).check(plan)


CODEGEN = [("f16", None, WGMMAHint()), ("f16", 1000, WGMMAHint(persistent=False)),
           ("bf16-bias", None, WGMMAHint(BN=128, stages=6, consumers=1)),
           ("i8-i32", None, None), ("i8-scaled-bias-bf16", 777, None),
           ("e4m3-scaled-f16", None, None), ("e5m2xe4m3-bias-bf16", 1000, WGMMAHint(BN=192, stages=4)),
           ("e4m3-noscale-f32", None, None), ("i8-g128-f16", None, None), ("i8-g256-bias-bf16", 1000, None),
           ("e4m3-g128-bf16", None, WGMMAHint(BN=128, stages=5, promote=1)),
           ("e4m3-scaled-f16", None, WGMMAHint(BN=128, stages=6, promote=2)),
           ("f16", None, WGMMAHint(cluster=2)), ("i8-g128-f16", 1000, WGMMAHint(BN=128, stages=6, cluster=2)),
           ("e4m3-scaled-f16", None, WGMMAHint(BN=128, stages=6, cluster=2, persistent=False))]


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
@pytest.mark.parametrize("fam,M,hint", CODEGEN, ids=[f"{f}-{m}-{i}" for i, (f, m, _) in enumerate(CODEGEN)])
def test_codegen_nvcc_sm90a(fam, M, hint):
    plan = _plan(C(M=M, N=1000, K=1024, **FAMILIES[fam]), m=None)
    src = cuda_source(plan, _h200(), hint)
    h = hint or WGMMAHint.default(plan, _h200())
    assert f"m64n{h.BN}k" in src and "cp.async.bulk.tensor" in src and "setmaxnreg" in src
    P = h.promote_tiles(plan)
    assert ("wait_group_sync_aligned_1" in src) == (P != 1)   # one group left in flight between promotions
    assert ("tot_ptr[" in src) == bool(P)                      # float32 promotion of the partial sums
    assert ("bb_st2" in src) == (plan.config.out_dtype in ("float16", "bfloat16"))
    # CTA pairs: the weight tile's halves multicast to both CTAs, ring slots released in both, the
    # pair's barrier after the mbarrier init and before exit
    paired = ["multicast::cluster", "mapa.shared::cluster", "bb_arrive_pair((", "%cluster_ctarank"]
    assert [p in src for p in paired] == [h.cluster == 2] * len(paired)
    assert src.count("bb_cluster_sync();") == (2 if h.cluster == 2 else 0)
    # the consumers encode their two shared-memory descriptors once, outside the K loop; each wgmma
    # adds its stage's and k step's offset (16-byte units) to them
    assert src.count("ptx_wgmma_encode_matrix_descriptor((&(desc") == 2
    assert "__shfl_sync(0xffffffffu, (int)(threadIdx.x / 128) - 1, 0)" in src   # a warp-uniform warpgroup index
    # 16-bit outputs with N a multiple of 8 store 16 bytes per lane after a transpose in the quad
    # (and 4-byte pairs for a row's last partial 32 columns; N = 1000 has one)
    quad = plan.config.out_dtype in ("float16", "bfloat16")
    assert ("bb_st4q((&(output" in src) == quad and ("bb_st2((&(output" in src) == quad
    assert re.search(r"descA_ptr\[0\] \+ \(\(uint64_t\)", src) and re.search(r"descB_ptr\[0\] \+ \(\(uint64_t\)", src)
    assert len(nvcc_compile(src, arch="sm_90a")) > 0


# -- on the GPU (sm_90) ------------------------------------------------------------------------------
def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")

SHAPES = [(1024, 4096), (1000, 1000)]      # (N, K): tile multiples; neither N nor K a tile multiple


@pytest.mark.parametrize("NK", SHAPES, ids=["N1024K4096", "N1000K1000"])
@pytest.mark.parametrize("fam", list(FAMILIES))
@pytest.mark.parametrize("M", [1, 16, 17, 128, 1000, 1024])
@pytest.mark.gpu
@needs_sm90
def test_gpu_static(fam, M, NK):
    N, K = NK
    kw = FAMILIES[fam]
    if kw["A_dtype"] in ("int8", E4, E5) and K % 16:
        K = 1008
    if kw.get("group_size", -1) > 0 and K % kw["group_size"]:
        K = 1024                                   # group scales: K a multiple of the group
    cfg = C(M=M, N=N, K=K, **kw)
    plan = _plan(cfg)
    assert wgmma_unsupported(plan, 90) is None
    hint = WGMMAHint.default(plan, cuda_target())
    fn = build_plan(plan, cuda_target(), hint)
    err = check_kernel(cfg, plan, fn, M, tol=_tol(cfg))
    assert err is None, err


HINTS = [WGMMAHint(), WGMMAHint(persistent=False), WGMMAHint(BN=128, stages=6), WGMMAHint(BN=128, stages=3, consumers=1),
         WGMMAHint(BN=192, stages=4, group_m=3), WGMMAHint(BN=64, stages=2, persistent=False)]


@pytest.mark.parametrize("hint", HINTS, ids=[f"h{i}" for i in range(len(HINTS))])
@pytest.mark.parametrize("fam", ["f16", "i8-scaled-f16", "e4m3-scaled-f16"])
@pytest.mark.gpu
@needs_sm90
def test_gpu_dynamic_hints(fam, hint):
    kw = FAMILIES[fam]
    if kw["A_dtype"] == "int8" and hint.BN not in (64, 128, 192):
        pytest.skip("int8 wgmma N <= 224")
    cfg = C(M=None, N=1000, K=1008, **kw)
    plan = _plan(cfg)
    fn = build_plan(plan, cuda_target(), hint)
    for m in (1, 33, 129, 1000, 2049):
        err = check_kernel(cfg, plan, fn, m, tol=_tol(cfg))
        assert err is None, f"{hint}: {err}"


PAIRS = [("f16", WGMMAHint(cluster=2)), ("f16", WGMMAHint(BN=192, stages=4, cluster=2, persistent=False)),
         ("bf16-bias", WGMMAHint(BN=128, stages=6, consumers=1, cluster=2, group_m=3)),
         ("i8-g128-f16", WGMMAHint(BN=128, stages=6, cluster=2)),
         ("e4m3-g128-bf16", WGMMAHint(BN=128, stages=6, cluster=2, persistent=False))]


@pytest.mark.parametrize("fam,hint", PAIRS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(PAIRS)])
@pytest.mark.gpu
@needs_sm90
def test_gpu_cta_pairs(fam, hint):
    """CTA pairs sharing each weight tile by multicast: row counts that leave the second CTA of the
    last pair without rows (33, 129, 2049: odd row-tile counts), K off the tile, N off the tile."""
    cfg = C(M=None, N=1000, K=1024 if "-g" in fam else 1008, **FAMILIES[fam])
    plan = _plan(cfg)
    fn = build_plan(plan, cuda_target(), hint)
    for m in (1, 33, 129, 1000, 2049, 4096):
        err = check_kernel(cfg, plan, fn, m, tol=_tol(cfg))
        assert err is None, f"{hint} m={m}: {err}"


@pytest.mark.gpu
@needs_sm90
def test_gpu_fp8_promotion_reduces_error():
    """fp8 partial sums promoted to float32 every K tile (128) instead of summing all of K in the
    tensor cores' 13-bit accumulator: same inputs, float32 output, the error must drop several-fold."""
    import random
    from bitblas.reference import random_inputs, reference_matmul, relative_error
    from bitblas.tune.tuner import kernel_args
    cfg = C(M=None, N=1000, K=4096, **FAMILIES["e4m3-noscale-f32"])
    plan = _plan(cfg)
    seed = random.randrange(2 ** 31)
    inputs = random_inputs(cfg, 300, device="cuda", seed=seed)
    ref = reference_matmul(cfg, **inputs)
    errs = {}
    for P in (0, 1):
        fn = build_plan(plan, cuda_target(), WGMMAHint(BN=128, stages=6, promote=P))
        out = torch.full((300, cfg.N), float("nan"), dtype=torch.float32, device="cuda")
        fn(*kernel_args(plan, inputs, out))
        torch.cuda.synchronize()
        errs[P] = relative_error(out.cpu(), ref)
    assert errs[1] * 4 < errs[0], f"seed={seed}: {errs}"
    assert errs[1] <= 4 * 2.0 ** -13, f"seed={seed}: {errs}"       # 4 instructions per promoted tile


def test_int8_bias_stays_float():
    """int8 x int8 without scales, float output and a float bias: the bias is added in float32 to
    the converted int32 sum (it was cast to int32 first, dropping its fraction); an int32 output
    adds its int32 bias exactly. The epilogue is bitblas.schedule.epilogue.scaled_sum, as in the
    GEMV template's int8 kernels."""
    plan = _plan(C(M=None, N=256, K=512, **FAMILIES["i8-noscale-bias-f16"]))
    src = cuda_source(plan, _h200(), default_hint(plan, _h200()))
    assert "(float)bias_ptr[" in src and "(int)bias_ptr[" not in src
    p32 = _plan(C(M=None, N=256, K=512, A_dtype="int8", W_dtype="int8", out_dtype="int32", with_bias=True))
    src32 = cuda_source(p32, _h200(), default_hint(p32, _h200()))
    assert "bias_ptr[" in src32 and "(float)bias_ptr[" not in src32


@pytest.mark.gpu
@needs_sm90
def test_gpu_int8_bias_fraction():
    """Zero activations: the output is the bias itself, fractions included."""
    from bitblas.reference import random_inputs
    from bitblas.tune.tuner import kernel_args
    cfg = C(M=None, N=1000, K=1024, **FAMILIES["i8-noscale-bias-f16"])
    plan = _plan(cfg)
    fn = build_plan(plan, cuda_target(), default_hint(plan, cuda_target()))
    inputs = random_inputs(cfg, 300, device="cuda", seed=5)
    inputs["A"].zero_()
    inputs["bias"].copy_(torch.rand_like(inputs["bias"], dtype=torch.float32).half() * 8 - 4)
    out = torch.full((300, cfg.N), float("nan"), dtype=torch.float16, device="cuda")
    fn(*kernel_args(plan, inputs, out))
    torch.cuda.synchronize()
    assert torch.equal(out, inputs["bias"].expand(300, -1)), (out[0, :4], inputs["bias"][:4])


def test_dynamic_m_picks_tiles_per_row_count(monkeypatch):
    """A symbolic-M operator on sm_90 serves each row count with the tile class that fills the SMs
    (one symbolic kernel per class), not with the 128 x 256 tiles of large M."""
    import bitblas
    import bitblas.arch as g
    monkeypatch.setattr(g, "_LOCAL_SMS", [132])
    op = bitblas.Matmul(C(N=4096, K=4096, **FAMILIES["f16"]), target=TARGETS["sm_90"])
    got = {r: choose(op, "cuda", r) for r in (1, 100, 256, 600, 4096)}
    assert all(m is None for m, _ in got.values())
    assert [(h.BM, h.BN) for _, h in got.values()] == [(64, 64), (64, 64), (64, 128), (128, 128), (128, 256)]
    quant = bitblas.Matmul(C(N=4096, K=4096, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True),
                           target=TARGETS["sm_90"])
    assert past_gemv(choose(quant, "cuda", 300)[1])      # decoded weights: test_dequant_gemm


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fam", ["f16", "i8-scaled-f16"])
def test_gpu_misaligned_views(fam):
    """A, W and output views that start off a 16-byte boundary (TMA bases, 32-bit pair stores): the
    operator realigns them and the result is right."""
    import bitblas
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    cfg = C(N=1000, K=1024, **FAMILIES[fam])
    op = bitblas.Matmul(cfg)
    rows = 300
    inputs = random_inputs(cfg, rows, device="cuda", seed=3)

    from kernel_helpers import shifted_view as shifted
    A, W = shifted(inputs["A"]), shifted(inputs["W"])
    out = shifted(torch.full((rows, cfg.N), float("nan"), dtype=torch.float16, device="cuda"))
    assert A.data_ptr() % 16 and W.data_ptr() % 16 and out.data_ptr() % 16
    op(**{**inputs, "A": A, "W": W}, output=out)
    torch.cuda.synchronize()
    assert relative_error(out.cpu(), reference_matmul(cfg, **inputs)) <= tolerance(cfg)


# -- the epilogue's quad-transposed store, on the host (CPU) -------------------------------------------
_LANES_HARNESS = HOST_WARP + r"""
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
// a stand-in pack that keeps which value went where: the integer parts of a and b, low half first
static unsigned bb_pack2(float a, float b) { return (unsigned)(int)a | ((unsigned)(int)b << 16); }
#define __device__
#define __forceinline__ inline
HELPER
int main() {
  static unsigned out[8][32];            // 8 rows (lane / 4) x 32 columns as 16 words of 2 columns
  for (auto& r : out) for (auto& w : r) w = 0xDEADBEEFu;
  std::thread lanes[32];
  for (unsigned l = 0; l < 32; ++l)
    lanes[l] = std::thread([l] {
      threadIdx.x = l;
      unsigned row = l / 4, q = l % 4;
      float v[8];                        // word q of blocks 0..3: columns 8j + 2q, 8j + 2q + 1
      for (int j = 0; j < 4; ++j) { v[2 * j] = row * 32 + 8 * j + 2 * q; v[2 * j + 1] = v[2 * j] + 1; }
      bb_st4q(&out[row][(8 * q) / 2], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], row != 5);
    });
  for (auto& t : lanes) t.join();
  for (auto& r : out) for (int c = 0; c < 16; ++c) printf("%u%c", r[c], c == 15 ? '\n' : ' ');
}
"""


def test_quad_store_transposes_on_the_host(tmp_path):
    """bb_st4q's source, compiled for the host with a warp of 32 threads emulating __shfl_xor_sync:
    each lane ends with the 16 bytes of its quad's block (lane q: columns 8q..8q+7 of its row, in
    order) and a lane whose ``ok`` is 0 stores nothing."""
    import shutil
    import subprocess
    from bitblas.schedule.cuda_wgmma import _ST4Q
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs a host C++ compiler (g++)")
    (tmp_path / "quad.cpp").write_text(_LANES_HARNESS.replace("HELPER", _ST4Q))
    subprocess.run([gxx, "-std=c++20", "-O1", "-pthread", "-o", str(tmp_path / "quad"), str(tmp_path / "quad.cpp")],
                   check=True, capture_output=True)
    rows = subprocess.run([str(tmp_path / "quad")], check=True, capture_output=True, text=True).stdout.split("\n")
    for row in range(8):
        words = [int(w) for w in rows[row].split()]
        if row == 5:
            assert words == [0xDEADBEEF] * 16          # ok = 0: nothing stored
            continue
        want = [(row * 32 + 2 * c) | ((row * 32 + 2 * c + 1) << 16) for c in range(16)]
        assert words == want, (row, words, want)
