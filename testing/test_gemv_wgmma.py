"""The wgmma GEMV (``GEMVHint(mma=True, wgmma=True)``, bitblas/schedule/gemv/wgmma.py), CPU side:

* the slab permutation of the activations against the decoder the kernel runs (the pairs are read
  from the generated ``bb_prep`` helper, not from the permutation's own table), and the permute
  kernel's helper emulated word by word;
* the default tiles on sm_90 and where the template refuses a plan or a hint, with the argument
  named; the row classes and the tuner's candidates;
* nvcc code generation for sm_90a (marked nvcc): no spills, no serialized wgmma.

The GPU checks are in test_gpu_gemv_wgmma.py.
"""
from __future__ import annotations

import random
import re

import pytest

from bitblas import MatmulConfig
from bitblas.build import _nvcc, cuda_source, cuda_target, find_nvcc
from bitblas.kernels.select import row_class as gemv_kernel_rows
from bitblas.plan import make_plan
from bitblas.kernels import default_hint
from bitblas.schedule import GEMVHint, GEMVMmaHint, GEMVWgmmaHint
from bitblas.schedule.gemv import gemv_hint_unsupported, schedule_cuda_gemv
from bitblas.schedule.gemv.emit import format_helpers
from bitblas.schedule.gemv.wgmma import _perm_groups, _perm_helper, slab_permutation, wgmma_rows
from bitblas.tune.space import candidates
from kernel_helpers import A100_SPEC, H200_SPEC, TARGETS

SM90 = cuda_target(TARGETS["sm_90"])
SM80 = cuda_target(TARGETS["sm_80"])
WG = dict(unroll=1, mma=True, wgmma=True)


def _cfg(W="uint4", N=28672, K=8192, **kw):
    base = dict(A_dtype="float16", W_dtype=W, group_size=128, with_scaling=True)
    base.update(kw)
    return MatmulConfig(N=N, K=K, **base)


def _prep_pairs(bits: int, signed: bool):
    """(lo, hi) code positions of each paired activation word, read from the bb_prep helper."""
    tag = f"t{bits}"
    src = format_helpers(tag, "float16", bits, "offset" if signed and bits < 8 else "twos" if signed else "plain", 4,
                   half_pairs=bits == 8)[f"bb_prep_{tag}"]
    pairs = {}
    for i, a, b, sel in re.findall(r"ap\[(\d+)\] = __byte_perm\(a\[(\d+)\], a\[(\d+)\], 0x([0-9a-f]+)\)", src):
        lo_half = 1 if sel.endswith("32") else 0                   # 0x7632: high halves, 0x5410: low halves
        pairs[int(i)] = (2 * int(a) + lo_half, 2 * int(b) + lo_half)
    return [pairs[i] for i in range(len(pairs))]


@pytest.mark.parametrize("bits", (2, 4, 8))
@pytest.mark.parametrize("signed", (False, True))
def test_slab_permutation_matches_decoder(bits, signed):
    """Position 16 s + 2 q + e + 8 h of a permuted slab holds the activation that lane q's decoded
    word 2 s + h, code e multiplies: summing the fragment products over a slab gives the plain
    dot product."""
    pairs = _prep_pairs(bits, signed)
    V = 4 * 32 // bits
    perm = slab_permutation(bits, 4)
    assert sorted(perm) == list(range(4 * V))
    rng = random.Random(bits)
    w = [rng.randint(-7, 7) for _ in range(4 * V)]
    a = [rng.randint(-9, 9) for _ in range(4 * V)]
    p = [a[perm[t]] for t in range(4 * V)]
    tot = 0
    for s in range(V // 4):
        for q in range(4):
            for h in range(2):
                lo, hi = pairs[2 * s + h]
                tot += w[V * q + lo] * p[16 * s + 2 * q + 8 * h] + w[V * q + hi] * p[16 * s + 2 * q + 1 + 8 * h]
    assert tot == sum(x * y for x, y in zip(w, a))


def _emulate_perm(helper: str, src_halves, nchunks):
    """Run the generated bb_perm helper on a list of 16-bit values: uint4 loads, __byte_perm on
    32-bit words, uint4 stores."""
    words = [src_halves[2 * i] | (src_halves[2 * i + 1] << 16) for i in range(len(src_halves) // 2)]
    regs = {}
    for k in re.findall(r"const uint4 i(\d+) = __ldg\(s \+ (\d+)\);", helper):
        regs[int(k[0])] = words[4 * int(k[1]): 4 * int(k[1]) + 4]
    out = {}
    for c, body in re.findall(r"d\[(\d+)\] = make_uint4\((.*)\);", helper):
        vals = []
        for x, xi, y, yi, sel in re.findall(r"__byte_perm\(i(\d+)\.([xyzw]), i(\d+)\.([xyzw]), 0x([0-9a-f]+)\)", body):
            src8 = regs[int(x)]["xyzw".index(xi)] | (regs[int(y)]["xyzw".index(yi)] << 32)
            sel = int(sel, 16)
            vals.append(sum(((src8 >> (8 * ((sel >> (4 * b)) & 7))) & 0xFF) << (8 * b) for b in range(4)))
        out[int(c)] = vals
    assert sorted(out) == list(range(nchunks))
    halves = []
    for c in range(nchunks):
        for v in out[c]:
            halves += [v & 0xFFFF, v >> 16]
    return halves


@pytest.mark.parametrize("bits", (2, 4, 8))
def test_permute_helper_emulated(bits):
    """The permute kernel: thread (slab, group J) runs bb_perm on the input at J * stride chunks
    and writes J * per chunks on; over every J that is the slab permutation."""
    perm = slab_permutation(bits, 4)
    G, per, stride = _perm_groups(perm)
    assert G > 1, "every int decoder's slab splits into independent groups"
    helper = _perm_helper(perm, per)
    src = list(range(1000, 1000 + len(perm)))
    got = [None] * len(perm)
    for J in range(G):
        part = _emulate_perm(helper, src[8 * stride * J:], per)
        got[8 * per * J: 8 * per * (J + 1)] = part
    assert got == [src[perm[t]] for t in range(len(perm))]


def test_wgmma_default_tiles():
    """sm_90, 17..64 rows, N >= 8192: 4-bit codes take the wgmma GEMV (one warpgroup of 64
    channels, 128 above 40 rows, on wide layers; 4 warpgroups splitting K below 16896), 2-bit
    codes on wide layers, 8-bit codes above 48 rows; 9..16 rows: 2- and 4-bit codes on wide
    layers (one warpgroup of 64 channels), 2-bit codes from N=8192 (4 warpgroups splitting K); sm_80, narrow layers, table formats, 8 rows or fewer
    and int8 activations keep the mma.sync kernels (table formats and 8-bit codes from 9 rows
    the 32-channel tile of 8 K warps under 2 blocks per SM, wide layers too)."""
    def tile(cfg, m, target=SM90):
        h = default_hint(make_plan(cfg, "cuda", m), target)
        return (h.rows_per_warp, max(1, h.k_warps), h.stages) if isinstance(h, GEMVWgmmaHint) else None

    assert tile(_cfg(), 24) == (16, 1, 4)
    assert tile(_cfg(), 40) == (16, 1, 4)
    assert tile(_cfg(), 41) == tile(_cfg(), 48) == tile(_cfg(), 64) == (32, 1, 2)
    assert tile(_cfg(N=8192), 17) == (16, 4, 2)
    assert tile(_cfg(N=8192), 64) == (16, 4, 2)
    assert tile(_cfg(W="int2"), 24) == (32, 1, 2)
    assert tile(_cfg(W="int2", N=8192), 24) is None
    assert tile(_cfg(W="int8", group_size=-1), 48) is None
    assert tile(_cfg(W="int8", group_size=-1), 64) == (16, 1, 4)
    assert tile(_cfg(with_zeros=True, A_dtype="bfloat16", out_dtype="bfloat16"), 40) == (16, 1, 4)
    assert tile(_cfg(), 64, SM80) is None
    assert tile(_cfg(N=4096), 64) is None
    assert tile(_cfg(W="nf4"), 64) is None
    assert tile(_cfg(N=8192), 16) is None
    assert tile(_cfg(W="int2", N=8192), 9) == tile(_cfg(W="int2", N=8192), 16) == (16, 4, 2)
    assert tile(_cfg(W="int2", N=8192), 8) is None and tile(_cfg(W="int2", N=4096), 16) is None
    assert tile(_cfg(), 8) is None
    assert tile(_cfg(), 9) == tile(_cfg(), 16) == tile(_cfg(W="int2"), 12) == (16, 1, 4)
    assert tile(_cfg(with_zeros=True, A_dtype="bfloat16", out_dtype="bfloat16"), 16) == (16, 1, 4)
    assert tile(_cfg(W="int8", group_size=-1), 16) is None and tile(_cfg(W="nf4"), 16) is None
    assert tile(_cfg(), 16, SM80) is None
    for cfg in (_cfg(W="int8", group_size=-1), _cfg(W="nf4"), _cfg(W="fp4_e2m1")):
        h = default_hint(make_plan(cfg, "cuda", 12), SM90)
        assert (type(h), h.rows_per_warp, h.k_warps, h.stages, h.min_blocks) == (GEMVMmaHint, 32, 8, 1, 2)
    h = default_hint(make_plan(_cfg(A_dtype="int8", W_dtype="int4", with_act_scaling=True), "cuda", 12), SM90)
    assert isinstance(h, GEMVMmaHint)
    assert tile(_cfg(K=8192 + 64, group_size=64), 32) is None     # K not a multiple of 4 weight vectors


def test_wgmma_refusals_name_the_argument():
    plan = make_plan(_cfg(), "cuda", 32)
    cases = [
        (make_plan(_cfg(W="nf4"), "cuda", 32), GEMVHint(rows_per_warp=16, k_warps=1, stages=4, **WG), "W_dtype='nf4'"),
        (plan, GEMVHint(rows_per_warp=48, k_warps=1, stages=4, **WG), "rows_per_warp=48"),
        (plan, GEMVHint(rows_per_warp=16, k_warps=3, stages=4, **WG), "k_warps=3"),
        (plan, GEMVHint(rows_per_warp=16, k_warps=1, stages=0, **WG), "stages=0"),
        (plan, GEMVHint(rows_per_warp=16, k_warps=1, stages=4, vec_bytes=8, **WG), "vec_bytes=8"),
        (make_plan(_cfg(K=1152), "cuda", 32), GEMVHint(rows_per_warp=16, k_warps=4, stages=2, **WG), "K=1152"),
        (make_plan(_cfg(W="int2", K=1024 * 3), "cuda", 64), GEMVHint(rows_per_warp=16, k_warps=4, stages=2, **WG),
         "shared memory"),
        (make_plan(_cfg(A_dtype="int8", W_dtype="int4", with_act_scaling=True), "cuda", 32),
         GEMVHint(rows_per_warp=16, k_warps=1, stages=4, **WG), "A_dtype='int8'"),
    ]
    for p, h, word in cases:
        why = gemv_hint_unsupported(p, h)
        assert why is not None and word in why, (h, why)
    with pytest.raises(ValueError, match="sm_90"):
        schedule_cuda_gemv(None, plan, GEMVHint(rows_per_warp=16, k_warps=1, stages=4, **WG), SM80)
    # the one-hint spelling: wgmma=True without mma=True names the missing flag
    with pytest.raises(ValueError, match="mma=True"):
        GEMVHint(rows_per_warp=16, k_warps=1, stages=4, unroll=1, wgmma=True)


def test_wgmma_row_classes_and_candidates():
    """A dynamic-M operator builds the wgmma GEMV per class of 8 rows (its B operand grows in steps
    of 8), the mma.sync kernels per 8 / 16 / 32 / 48 / 64; the tuner's sm_90 space has wgmma tiles
    from 9 rows, the sm_80 one none."""
    cfg = MatmulConfig(M=None, N=28672, K=8192, A_dtype="float16", W_dtype="uint4", group_size=128, with_scaling=True)
    wg = GEMVHint(rows_per_warp=16, k_warps=1, stages=4, **WG)
    mma = GEMVHint(rows_per_warp=32, k_warps=4, unroll=2, stages=1, mma=True, min_blocks=1, chunk_loop=True)
    assert [gemv_kernel_rows(cfg, "cuda", m, wg) for m in (17, 24, 25, 33, 57, 64)] == [24, 24, 32, 40, 64, 64]
    assert [gemv_kernel_rows(cfg, "cuda", m, mma) for m in (17, 33, 57)] == [32, 48, 64]
    assert [gemv_kernel_rows(cfg, "cuda", m, wg) for m in (9, 13, 16)] == [16, 16, 16]
    for bucket in (16, 24, 64):
        wgs = [c.hint for c in candidates(cfg, "cuda", bucket, H200_SPEC) if isinstance(c.hint, GEMVWgmmaHint)]
        assert len(wgs) == 12 and all(gemv_hint_unsupported(make_plan(cfg, "cuda", bucket), h) is None for h in wgs)
    assert not [c for c in candidates(cfg, "cuda", 32, A100_SPEC) if isinstance(c.hint, GEMVWgmmaHint)]
    assert not [c for c in candidates(cfg, "cuda", 8, H200_SPEC) if isinstance(c.hint, GEMVWgmmaHint)]


@pytest.mark.nvcc
@pytest.mark.parametrize("name,m,hint", [
    ("u4", 17, (16, 1, 4)), ("u4-zeros-bias", 64, (32, 1, 2)), ("bf16-u4-qzeros", 40, (16, 4, 2)),
    ("i2", 24, (32, 1, 2)), ("i8-chan-f32", 64, (16, 2, 4)), ("u4-noscale", 9, (16, 1, 1)),
])
def test_wgmma_codegen(name, m, hint):
    """Generated sources compile with nvcc for sm_90a: the main kernel without spills and without
    ptxas serializing the wgmma (C7513), the permute kernel beside it."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    kw = {"u4": {}, "u4-zeros-bias": dict(with_zeros=True, with_bias=True),
          "bf16-u4-qzeros": dict(A_dtype="bfloat16", with_zeros=True, zeros_mode="quantized", out_dtype="bfloat16"),
          "i2": dict(W="int2"), "i8-chan-f32": dict(W="int8", group_size=-1, out_dtype="float32"),
          "u4-noscale": dict(with_scaling=False, group_size=-1)}[name]
    cfg = _cfg(N=1000, K=4096, **kw)
    R, KW, st = hint
    src = cuda_source(make_plan(cfg, "cuda", m), SM90, GEMVHint(rows_per_warp=R, k_warps=KW, stages=st, pdl=True, **WG))
    assert "wgmma.mma_async.sync.aligned.m64n" + str(wgmma_rows(m)) + "k16" in src
    assert "permute_kernel" in src and "cp.async.bulk.tensor" in src
    text = _nvcc(src, "sm_90", 300, ["--resource-usage"])[1]
    assert "C7513" not in text, text[-2000:]
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", text)]
    assert spills and max(spills) <= 8, text[-2000:]


@pytest.mark.parametrize("W,m,hint", [("uint4", 17, (16, 1, 4)), ("uint4", 40, (16, 4, 2)), ("int8", 64, (32, 1, 2))])
def test_wgmma_pdl_order(W, m, hint):
    """Programmatic dependent launch: both kernels carry TVM's PDL tag (the main kernel also the
    dynamic shared memory tag, last); the permute kernel waits for the previous kernel before it
    reads the activations and then lets the main kernel launch; the main kernel loads its first
    weights before it waits for the permute kernel, and issues no TMA of the permuted activations
    before that wait; it triggers the next kernel before its output store."""
    R, KW, st = hint
    cfg = _cfg(W=W, N=1000, K=4096, **(dict(group_size=-1) if W == "int8" else {}))
    plan = make_plan(cfg, "cuda", m)
    h = GEMVHint(rows_per_warp=R, k_warps=KW, stages=st, pdl=True, **WG)
    mod = schedule_cuda_gemv(None, plan, h, SM90)
    tags = {g.name_hint: [str(t) for t in f.attrs["tirx.kernel_launch_params"]] for g, f in mod.functions.items()}
    assert tags["main"][-2:] == ["tirx.use_programtic_dependent_launch", "tirx.use_dyn_shared_memory"]
    assert tags["permute"][-1] == "tirx.use_programtic_dependent_launch"
    src = cuda_source(plan, SM90, h)

    def body(name):                            # the kernel's definition, up to the next kernel
        start = re.search(name + r"\([^;{]*\) \{", src).end()
        end = src.find('extern "C"', start)
        return src[start:end if end > 0 else len(src)]
    perm = body("permute_kernel")
    wait, trig = perm.index("griddepcontrol_wait();"), perm.index("griddepcontrol_launch_dependents();")
    assert wait < trig < perm.index("A_ptr[")
    main = body("main_kernel")
    wait = main.index("griddepcontrol_wait();")
    assert main.index("bb_ldw4(") < wait < main.index("cp_async_bulk_tensor")
    assert main.index("griddepcontrol_launch_dependents();") < main.index("output_ptr[")
    assert "tirx.use_programtic_dependent_launch" not in str(
        schedule_cuda_gemv(None, plan, GEMVHint(rows_per_warp=R, k_warps=KW, stages=st, pdl=False, **WG),
                           SM90)["main"].attrs.get("tirx.kernel_launch_params", []))
