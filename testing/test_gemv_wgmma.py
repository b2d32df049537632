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
from c_interp import run_permute
from kernel_helpers import A100_SPEC, H200_SPEC, TARGETS

SM90 = cuda_target(TARGETS["sm_90"])
SM80 = cuda_target(TARGETS["sm_80"])
WG = dict(unroll=1, mma=True, wgmma=True)


def _cfg(W="uint4", N=28672, K=8192, **kw):
    base = dict(A_dtype="float16", W_dtype=W, group_size=128, with_scaling=True)
    base.update(kw)
    return MatmulConfig(N=N, K=K, **base)


# -- which codes each decoded word holds: the generated bb_dec traced bit by bit ----------------------
class _Bits:
    """A 32-bit register of the traced decoder: per bit, the set of input weight bits (bit ``b`` of
    word ``j``: ``32 j + b``) its value depends on. Python ints are constants (no dependence)."""

    def __init__(self, sets):
        self.s = tuple(frozenset(x) for x in sets)

    @staticmethod
    def of(x):
        return x if isinstance(x, _Bits) else _Bits([()] * 32)

    def whole(self):
        return frozenset().union(*self.s)

    def __lshift__(self, k):
        return _Bits([()] * k + list(self.s[:32 - k]))

    def __rshift__(self, k):
        return _Bits(list(self.s[k:]) + [()] * k)

    def __and__(self, o):
        if isinstance(o, int):
            return _Bits([x if o >> i & 1 else () for i, x in enumerate(self.s)])
        return _Bits([a | b for a, b in zip(self.s, o.s)])

    __rand__ = __and__

    def __xor__(self, o):
        return self & 0xFFFFFFFF if isinstance(o, int) else self & o

    def _arith(self, o=0):                     # carries / floats: every bit on everything
        u = self.whole() | _Bits.of(o).whole()
        return _Bits([u] * 32)

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith


def _halves(*xs):
    """A float16x2 / bfloat16x2 (or float) operation: each 16-bit half of the result depends on
    every bit of that half of each operand."""
    lo = frozenset().union(*(frozenset().union(*_Bits.of(x).s[:16]) for x in xs))
    hi = frozenset().union(*(frozenset().union(*_Bits.of(x).s[16:]) for x in xs))
    return _Bits([lo] * 16 + [hi] * 16)


def _bit(x, i):
    return x.s[i] if isinstance(x, _Bits) else (x >> i) & 1


def _lop3(a, b, c, lut):
    """Per bit, the operands whose value can change lop3's output bit (constants fixed)."""
    out = []
    for i in range(32):
        ops = [_bit(x, i) for x in (a, b, c)]
        var = [k for k, o in enumerate(ops) if isinstance(o, frozenset)]
        dep = frozenset()
        for k in var:
            others = [v for v in var if v != k]
            for bits in range(1 << len(others)):
                env = {v: (bits >> n) & 1 for n, v in enumerate(others)}
                x0, x1 = ([t if j == k else env.get(j, o) for j, o in enumerate(ops)] for t in (0, 1))
                if lut >> (4 * x0[0] + 2 * x0[1] + x0[2]) & 1 != lut >> (4 * x1[0] + 2 * x1[1] + x1[2]) & 1:
                    dep |= ops[k]                 # toggling operand k changes the bit
                    break
        out.append(dep)
    return _Bits(out)


def _prmt(a, b, sel, sign_mode=True):
    """prmt.b32 (``sign_mode``: selector bit 3 replicates the byte's sign; ``__byte_perm`` has none);
    a traced selector makes each output byte depend on its selector nibble and on all of a and b."""
    if isinstance(sel, _Bits):
        src = _Bits.of(a).whole() | _Bits.of(b).whole()
        return _Bits([src.union(*sel.s[4 * (i // 8): 4 * (i // 8) + 4]) for i in range(32)])
    src = list(_Bits.of(a).s) + list(_Bits.of(b).s)
    out = []
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        byte = src[8 * (n & 7): 8 * (n & 7) + 8]
        out += [byte[7]] * 8 if sign_mode and n & 8 else byte
    return _Bits(out)


def _asm(text, ins):
    op, args = re.fullmatch(r"(\w+)\.b32 %0, (.*)", text).groups()
    vals = [ins[int(a[1:]) - 1] if a.startswith("%") else int(a, 0) for a in args.split(", ")]
    return _lop3(*vals) if op == "lop3" else _prmt(*vals)


def _trace_dec(src: str, nw: int):
    """Run a generated ``bb_dec`` (C source) on traced weight words: {decoded word: its _Bits}."""
    body = "\n".join(src.strip().splitlines()[1:-1])

    def asm(m):
        ins = ", ".join(re.findall(r'"r"\(([^)]*)\)', m[3]))
        return f"{m[2]} = _asm({m[1]!r}, [{ins}])"
    body = re.sub(r'asm\("([^";]*);"\s*:\s*"=r"\((\w+)\)\s*:\s*((?:"r"\([^)]*\)(?:,\s*)?)+)\)', asm, body)
    body = re.sub(r"\*reinterpret_cast<[^>]*>\(&(\w+)\)", r"\1", body)
    body = re.sub(r"\((?:unsigned|float)\)off", "off", body)
    body = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)u\b", r"\1", body)
    body = re.sub(r"\b(\d+\.\d*(?:e[-+]?\d+)?)f\b", r"\1", body)
    env = {"w": [_Bits([{32 * j + b} for b in range(32)]) for j in range(nw)], "d": {}, "off": 0, "_asm": _asm,
           "__byte_perm": lambda a, b, s: _prmt(a, b, s, sign_mode=False),
           "__uint_as_float": lambda x: _Bits.of(x)._arith(),
           **{f: (lambda *xs: _halves(*xs)) for f in (
               "__hmul2", "__hsub2", "__hfma2", "__half22float2", "__float22bfloat162_rn",
               "__float2half2_rn", "__float2bfloat162_rn")},
           "__floats2bfloat162_rn": lambda lo, hi: _Bits(list(_halves(lo).s[:16]) + list(_halves(hi).s[16:]))}
    types = r"(?:const\s+)?(?:unsigned|float|int|__half2|__nv_bfloat162|float2)\s+"
    for stmt in body.replace("{", ";").replace("}", ";").split(";"):
        stmt = stmt.strip()
        if not stmt:
            continue
        decl = re.match(types, stmt)
        if not decl:
            exec(stmt, env)
            continue
        depth, parts, cur = 0, [], ""
        for ch in stmt[decl.end():]:
            depth += (ch == "(") - (ch == ")")
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        for part in parts + [cur]:
            m = re.fullmatch(r"\s*(\w+)\[(\d+)\]\s*", part)
            if m:                              # an array declaration
                env[m[1]] = [0] * int(m[2])
            elif "=" in part:
                exec(part.strip(), env)
    return env["d"]


def _traced_pairs(src: str, bits: int, nw: int):
    """(lo, hi) code positions of each decoded word of a generated bb_dec, from its trace: each half
    must depend on every bit of exactly one code."""
    pairs = []
    d = _trace_dec(src, nw)
    assert sorted(d) == list(range(len(d)))
    for i in range(len(d)):
        pair = []
        for half in (d[i].s[:16], d[i].s[16:]):
            dep = frozenset().union(*half)
            codes = {b // bits for b in dep}
            assert len(codes) == 1, (i, sorted(dep))
            code = codes.pop()
            assert dep == set(range(code * bits, code * bits + bits)), (i, sorted(dep))
            pair.append(code)
        pairs.append(tuple(pair))
    return pairs


def _prep_pairs(src: str):
    """(lo, hi) code positions of each paired activation word, read from a bb_prep helper (the mma
    GEMV's pairing: ``__byte_perm`` of two words, or the words as they are for adjacent pairs)."""
    pairs = {}
    for i, a, b, sel in re.findall(r"ap\[(\d+)\] = __byte_perm\(a\[(\d+)\], a\[(\d+)\], 0x([0-9a-f]+)\)", src):
        lo_half = 1 if sel.endswith("32") else 0                   # 0x7632: high halves, 0x5410: low halves
        pairs[int(i)] = (2 * int(a) + lo_half, 2 * int(b) + lo_half)
    for i, a in re.findall(r"ap\[(\d+)\] = a\[(\d+)\];", src):
        pairs[int(i)] = (2 * int(a), 2 * int(a) + 1)
    return [pairs[i] for i in range(len(pairs))]


# every decoder of the wgmma kernels: (weight format, activation dtype)
_DECODERS = [(W, act) for W in ("int2", "uint2", "int4", "uint4", "int8", "uint8", "fp4_e2m1", "nf4", "float8_e4m3",
                                "float8_e5m2", "nvfp4") for act in ("float16", "bfloat16")]


@pytest.mark.parametrize("W,act", _DECODERS, ids=[f"{a[:2]}-{w}" for w, a in _DECODERS])
def test_slab_permutation_matches_decoder(W, act):
    """The K order of each decoder the wgmma kernels run, traced from its generated ``bb_dec`` (which
    input bits each half of each decoded word depends on), is ``decode.pair_codes``, the mma GEMV's
    ``bb_prep`` pairs the activations the same way, and the slab permutation for that decoder puts at
    position 16 s + 2 q + e + 8 h of a permuted slab the activation that lane q's decoded word
    2 s + h, code e multiplies: summing the fragment products over a slab gives the plain dot
    product."""
    from bitblas.formats import FORMATS
    from bitblas.schedule.gemv.decode import decoder, pair_codes
    fmt = FORMATS[W]
    bits, dec = fmt.bits, decoder(fmt)
    helpers = format_helpers("t", act, bits, fmt.storage, 4, dec, fmt.table, half_pairs=bits == 8)
    pairs = _traced_pairs(helpers["bb_dec_t"], bits, 4)
    assert pairs == pair_codes(dec, bits, 4)
    assert _prep_pairs(helpers["bb_prep_t"]) == pairs
    V = 4 * 32 // bits
    perm = slab_permutation(bits, 4, dec)
    assert sorted(perm) == list(range(4 * V))
    for s in range(V // 4):
        for q in range(4):
            for h in range(2):
                for e in range(2):
                    assert perm[16 * s + 2 * q + e + 8 * h] == V * q + pairs[2 * s + h][e]
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


@pytest.mark.parametrize("W", ["fp4_e2m1", "nvfp4"])
def test_e2m1_table_decoder_pairs(W):
    """The e2m1 table decoder (float16, the rows kernel's: decode._e2m1_lut_consts) pairs the codes
    as the bit placement does (pair_codes("e2m1")), traced from its generated source."""
    from bitblas.formats import FORMATS
    from bitblas.schedule.gemv.decode import pair_codes
    fmt = FORMATS[W]
    src = format_helpers("t", "float16", 4, fmt.storage, 4, "e2m1", fmt.table, e2m1_table=True)["bb_dec_t"]
    assert "prmt.b32" in src and "__hmul2" not in src
    assert _traced_pairs(src, 4, 4) == pair_codes("e2m1", 4, 4)
    with pytest.raises(ValueError, match="e2m1_table"):        # no table for bfloat16 halves
        format_helpers("t", "bfloat16", 4, fmt.storage, 4, "e2m1", fmt.table, e2m1_table=True)


@pytest.mark.parametrize("act", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,hint", [(1, GEMVHint(rows_per_warp=2, warps=8, unroll=1, stages=3, act_smem=True)),
                                    (16, GEMVMmaHint(rows_per_warp=32, k_warps=4, unroll=2, stages=2))],
                         ids=["rows", "mma"])
def test_e2m1_table_decoder_where(act, m, hint):
    """Only the rows kernel with float16 activations decodes e2m1 by table (measured faster there,
    slower in the tensor-core GEMV); bfloat16 and the mma kernel keep the bit placement's multiply."""
    from bitblas.schedule.gemv.decode import _e2m1_lut_consts
    cfg = MatmulConfig(M=m, N=1024, K=1024, A_dtype=act, W_dtype="nvfp4", group_size=16, with_scaling=True,
                       out_dtype=act)
    src = cuda_source(make_plan(cfg, "cuda", m), SM90, hint)
    dec = src[src.index("void bb_dec_"):]
    dec = dec[:dec.index("\n}\n")]
    table = act == "float16" and m == 1
    assert (f"0x{_e2m1_lut_consts()['tab'][0]:08x}" in dec) == table, dec[:400]
    assert ("__hmul2" in dec) != table


@pytest.mark.parametrize("act", ["float16", "bfloat16"])
def test_nvfp4_block_scales_follow_the_pairs(act):
    """nvfp4 in the wgmma kernels: a 16-byte vector holds 32 e2m1 codes, two float8 blocks of 16.
    The kernel loads both scale bytes of vector ``c`` (scale columns 2c, 2c + 1, one 16-bit load)
    and ``bb_sclb`` multiplies each decoded word (codes traced from the generated ``bb_dec``) by the
    half2 of its two codes' block scales (low byte: block 0); a wrong block fails the check."""
    from bitblas.schedule.fused_wgmma import FusedWgmmaHint, main_script
    from bitblas.schedule.gemv.decode import pair_codes
    from bitblas.schedule.gemv.emit import block_scale_helpers
    cfg = MatmulConfig(N=1000, K=1536, A_dtype=act, W_dtype="nvfp4", group_size=16, with_scaling=True)
    pairs = _traced_pairs(format_helpers("t", act, 4, "plain", 4, "e2m1", None)["bb_dec_t"], 4, 4)
    assert pairs == pair_codes("e2m1", 4, 4)
    which = {"s00": (0, 0), "s11": (1, 1), "s01": (0, 1), "s10": (1, 0)}

    def blocks_of(src):
        got = dict(re.findall(r"__hmul2\(\*reinterpret_cast<[\w:]+\*>\(&d\[(\d+)\]\), (s\d\d)\)", src))
        return [which[got[str(i)]] for i in range(len(pairs))]
    helper = block_scale_helpers("t", act, pairs, 32, 16)["bb_sclb_t"]
    assert blocks_of(helper) == [(lo // 16, hi // 16) for lo, hi in pairs]
    assert {b for b in blocks_of(helper)} == {(0, 0), (1, 1)}      # e2m1 pairs stay inside a word
    # a pairing across blocks takes the half2 of both scales (low half: the low code's block)
    cross = [(i, i + 16) for i in range(16)]
    assert blocks_of(block_scale_helpers("t", act, cross, 32, 16)["bb_sclb_t"]) == [(0, 1)] * 16
    assert "cvt.rn.f16x2.e4m3x2" in helper and ("__float22bfloat162_rn" in helper) == (act == "bfloat16")
    # exact: every e2m1 value times every finite e4m3 scale is representable in the activation dtype
    import torch
    from bitblas.formats import E2M1_TABLE, E4M3_TABLE
    w = torch.tensor(E2M1_TABLE, dtype=torch.float64)[:, None]
    sc = torch.tensor([v for v in E4M3_TABLE if v == v], dtype=torch.float64)[None, :]
    dt = torch.float16 if act == "float16" else torch.bfloat16
    assert torch.equal((w.to(dt) * sc.to(dt)).double(), w * sc)
    wrong = helper.replace("&d[0]), s00)", "&d[0]), s11)")
    assert blocks_of(wrong) != blocks_of(helper)
    for text in (schedule_cuda_gemv.__globals__["kernel_script"](
            make_plan(cfg, "cuda", 33), GEMVWgmmaHint(rows_per_warp=16, k_warps=1, stages=4)),
            main_script(make_plan(cfg, "cuda", None), FusedWgmmaHint())):
        loads = re.findall(r"sr\[[^\]]*\] = T\.cuda\.func_call\('bb_ldsb_\w+', "
                           r"scale\.ptr_to\(\[[^,]*, (.*?) \* 2\]\)", text)
        assert loads and all(x.endswith("+ q)") for x in loads), loads
        assert "bb_sclb_" in text and "bb_scl_" not in text and "bb_e4m3f" not in text


def test_decoder_trace_sees_a_wrong_order():
    """The trace is what the test relies on: a decoder whose pairs are swapped (its d[] indices
    exchanged) traces to a different order, and one whose half mixes two codes is refused."""
    from bitblas.schedule.gemv.decode import pair_codes
    src = format_helpers("t", "float16", 4, "plain", 4, "lut4", __import__("bitblas").formats.NF4_TABLE)["bb_dec_t"]
    swapped = src.replace("d[0] =", "d[@] =").replace("d[1] =", "d[0] =").replace("d[@] =", "d[1] =")
    assert _traced_pairs(swapped, 4, 4) != pair_codes("lut4", 4, 4)
    mixed = src.replace("__byte_perm(lo, hi, 0x5140)", "__byte_perm(lo, hi, 0x5150)", 1)
    with pytest.raises(AssertionError):
        _traced_pairs(mixed, 4, 4)


def _emulate_perm(helper: str, src_halves, nchunks):
    """Run the generated bb_perm helper (c_interp) on a list of 16-bit values; returns the halves
    of the ``nchunks`` chunks it writes."""
    words = [src_halves[2 * i] | (src_halves[2 * i + 1] << 16) for i in range(len(src_halves) // 2)]
    return [h for w in run_permute(helper, words, nchunks) for h in (w & 0xFFFF, w >> 16)]


@pytest.mark.parametrize("bits,dec", [(2, "int"), (4, "int"), (8, "int"), (4, "lut4")])
def test_permute_helper_emulated(bits, dec):
    """The permute kernel: thread (slab, group J) runs bb_perm on the input at J * stride chunks
    and writes J * per chunks on; over every J that is the slab permutation (e2m1 and float8
    decoders pair codes as the int ones; the 4-bit table decoder pairs adjacent codes)."""
    perm = slab_permutation(bits, 4, dec)
    G, per, stride = _perm_groups(perm)
    assert G > 1, "every decoder's slab splits into independent groups"
    helper = _perm_helper(perm, per)
    src = list(range(1000, 1000 + len(perm)))
    got = [None] * len(perm)
    for J in range(G):
        part = _emulate_perm(helper, src[8 * stride * J:], per)
        got[8 * per * J: 8 * per * (J + 1)] = part
    assert got == [src[perm[t]] for t in range(len(perm))]


@pytest.mark.parametrize("W", ["uint4", "nf4", "fp4_e2m1", "float8_e5m2", "nvfp4"])
def test_permute_kernel_follows_the_decoder(W):
    """The permute kernel of a plan (the wgmma GEMV's and the fused GEMM's) reorders the activations
    for the decoder of the plan's format: nf4's adjacent pairs, the others' (p, p + n/2), in the
    weight's code order (int / uint codes: BitBLAS's fast-decoding interleave, ``Plan.w_order``)."""
    from bitblas.formats import FORMATS
    from bitblas.schedule.fused_wgmma import FusedWgmmaHint, _gemv_stand_in
    from bitblas.schedule.gemv.decode import decoder
    from bitblas.schedule.gemv.wgmma import permute_script
    fmt = FORMATS[W]
    cfg = _cfg(W=W, N=1000, K=1536, **({"group_size": 16} if W == "nvfp4" else {}))
    order = make_plan(cfg, "cuda", None).w_order
    assert (order is not None) == (fmt.kind in ("int", "uint") and fmt.bits < 8)
    perm = slab_permutation(fmt.bits, 4, decoder(fmt), order)
    helper = repr(_perm_helper(perm, _perm_groups(perm)[1]))
    # another decoder's (or order's) permutation is not in the kernel: 4-bit codes in BitBLAS's order
    # pair adjacent codes as nf4's decoder does, so their other is the natural order's
    others = [slab_permutation(fmt.bits, 4, d) for d in (("int", "lut4") if fmt.bits == 4 else ("int",))]
    other = next((o for o in others if o != perm), None)
    for plan, hint in ((make_plan(cfg, "cuda", 33), GEMVWgmmaHint(rows_per_warp=16, k_warps=1, stages=4)),
                       (make_plan(cfg, "cuda", None), _gemv_stand_in(FusedWgmmaHint()))):
        text = permute_script(plan, hint)
        assert helper in text
        if other is not None:
            assert other != perm and repr(_perm_helper(other, _perm_groups(other)[1])) not in text


def test_wgmma_default_tiles():
    """sm_90, 17..64 rows, N >= 8192: 4-bit codes take the wgmma GEMV (one warpgroup of 64
    channels, 128 above 40 rows, on wide layers; 4 warpgroups splitting K below 16896), 2-bit
    codes on wide layers, 8-bit codes above 48 rows; 9..16 rows: 2- and 4-bit codes on wide
    layers (one warpgroup of 64 channels), 2-bit codes from N=8192 (4 warpgroups splitting K); the
    table formats as the int codes of their width (nf4, fp4_e2m1, nvfp4: 4-bit; float8: 8-bit); sm_80,
    narrow layers, 8 rows or fewer and int8 activations keep the mma.sync kernels (8-bit codes
    from 9 rows the 32-channel tile of 8 K warps under 2 blocks per SM, wide layers too)."""
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
    # the table formats where their width's int codes go: nf4 / fp4_e2m1 as 4-bit, float8 as 8-bit codes
    for W in ("nf4", "fp4_e2m1"):
        assert tile(_cfg(W=W), 64) == tile(_cfg(), 64) and tile(_cfg(W=W), 24) == tile(_cfg(), 24)
        assert tile(_cfg(W=W, N=8192), 33) == tile(_cfg(N=8192), 33) == (16, 4, 2)
        assert tile(_cfg(W=W), 16) == tile(_cfg(), 16) == (16, 1, 4)
        assert tile(_cfg(W=W, N=8192), 16) is None and tile(_cfg(W=W, N=4096), 64) is None
    nv = dict(W="nvfp4", group_size=16)       # nvfp4 (float8 block scales of 16 codes) as 4-bit codes too
    assert tile(_cfg(**nv), 64) == tile(_cfg(), 64) and tile(_cfg(**nv), 24) == tile(_cfg(), 24)
    assert tile(_cfg(**nv, N=8192), 33) == (16, 4, 2) and tile(_cfg(**nv), 16) == (16, 1, 4)
    assert tile(_cfg(**nv, N=8192), 16) is None and tile(_cfg(**nv, N=4096), 64) is None
    for W in ("float8_e4m3", "float8_e5m2"):
        assert tile(_cfg(W=W, group_size=-1), 64) == tile(_cfg(W="int8", group_size=-1), 64) == (16, 1, 4)
        assert tile(_cfg(W=W), 48) is None and tile(_cfg(W=W), 16) is None
    assert tile(_cfg(N=8192), 16) is None
    assert tile(_cfg(W="int2", N=8192), 9) == tile(_cfg(W="int2", N=8192), 16) == (16, 4, 2)
    assert tile(_cfg(W="int2", N=8192), 8) is None and tile(_cfg(W="int2", N=4096), 16) is None
    assert tile(_cfg(), 8) is None
    assert tile(_cfg(), 9) == tile(_cfg(), 16) == tile(_cfg(W="int2"), 12) == (16, 1, 4)
    assert tile(_cfg(with_zeros=True, A_dtype="bfloat16", out_dtype="bfloat16"), 16) == (16, 1, 4)
    assert tile(_cfg(W="int8", group_size=-1), 16) is None
    assert tile(_cfg(), 16, SM80) is None
    for cfg in (_cfg(W="int8", group_size=-1), _cfg(W="float8_e4m3"), _cfg(W="nf4", N=8192),
                _cfg(W="fp4_e2m1", N=8192)):
        h = default_hint(make_plan(cfg, "cuda", 12), SM90)
        assert (type(h), h.rows_per_warp, h.k_warps, h.stages, h.min_blocks) == (GEMVMmaHint, 32, 8, 1, 2)
    h = default_hint(make_plan(_cfg(A_dtype="int8", W_dtype="int4", with_act_scaling=True), "cuda", 12), SM90)
    assert isinstance(h, GEMVMmaHint)
    assert tile(_cfg(K=8192 + 64, group_size=64), 32) is None     # K not a multiple of 4 weight vectors


def test_wgmma_refusals_name_the_argument():
    plan = make_plan(_cfg(), "cuda", 32)
    cases = [
        (make_plan(_cfg(W="int1"), "cuda", 32), GEMVHint(rows_per_warp=16, k_warps=1, stages=4, **WG), "W_dtype='int1'"),
        # two groups per 16-byte vector: only nvfp4's float8 block scales (applied per decoded pair)
        (make_plan(_cfg(W="int4", group_size=16), "cuda", 32), GEMVHint(rows_per_warp=16, k_warps=1, stages=4, **WG),
         "vec_bytes=0"),
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
    ("nf4", 33, (16, 1, 4)), ("bf16-fp4-chan-bias", 17, (32, 1, 2)), ("e4m3", 64, (16, 4, 2)),
    ("bf16-e5m2-noscale-f32", 48, (16, 1, 4)), ("nvfp4", 33, (16, 1, 4)), ("bf16-nvfp4-bias", 64, (32, 1, 2)),
])
def test_wgmma_codegen(name, m, hint):
    """Generated sources compile with nvcc for sm_90a: the main kernel without spills and without
    ptxas serializing the wgmma (C7513), the permute kernel beside it; the table formats with the
    mma GEMV's decoder of the format."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    kw = {"u4": {}, "u4-zeros-bias": dict(with_zeros=True, with_bias=True),
          "bf16-u4-qzeros": dict(A_dtype="bfloat16", with_zeros=True, zeros_mode="quantized", out_dtype="bfloat16"),
          "i2": dict(W="int2"), "i8-chan-f32": dict(W="int8", group_size=-1, out_dtype="float32"),
          "u4-noscale": dict(with_scaling=False, group_size=-1), "nf4": dict(W="nf4"),
          "bf16-fp4-chan-bias": dict(W="fp4_e2m1", group_size=-1, with_bias=True, A_dtype="bfloat16",
                                     out_dtype="bfloat16"),
          "e4m3": dict(W="float8_e4m3"),
          "bf16-e5m2-noscale-f32": dict(W="float8_e5m2", with_scaling=False, group_size=-1, A_dtype="bfloat16",
                                        out_dtype="float32"),
          "nvfp4": dict(W="nvfp4", group_size=16),
          "bf16-nvfp4-bias": dict(W="nvfp4", group_size=16, A_dtype="bfloat16", with_bias=True,
                                  out_dtype="bfloat16")}[name]
    cfg = _cfg(N=1000, K=4096, **kw)
    R, KW, st = hint
    src = cuda_source(make_plan(cfg, "cuda", m), SM90, GEMVHint(rows_per_warp=R, k_warps=KW, stages=st, pdl=True, **WG))
    assert "wgmma.mma_async.sync.aligned.m64n" + str(wgmma_rows(m)) + "k16" in src
    assert "permute_kernel" in src and "cp.async.bulk.tensor" in src
    mark = {"nf4": "prmt.b32 %0, %1, %2, %3;", "bf16-fp4-chan-bias": "0x01c001c0", "e4m3": "f8k",
            "bf16-e5m2-noscale-f32": "__byte_perm(q, 0u, 0x2404)", "nvfp4": "bb_sclb_f16_e2m1_v16(",
            "bf16-nvfp4-bias": "bb_sclb_bf16_e2m1_v16("}.get(name)      # the table decoder's
    assert mark is None or mark in src
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
