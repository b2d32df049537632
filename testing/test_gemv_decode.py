"""The GEMV template's register decoders of table formats, emulated bit for bit on the CPU.

Each test runs the decoder's integer program (shifts, ``lop3``, ``prmt``, the final multiply) in
Python, with the constants taken from the same functions the CUDA generator uses
(``bitblas.schedule.gemv.decode._e2m1_consts`` ...), and compares every code with the format's table
rounded as the TensorIR rounds it (float32 -> activation dtype, through torch). Random words check
that the codes of one word do not leak into each other. The int8-activation helpers
(``bitblas.schedule.gemv.int8``) are run from their generated CUDA source by a small interpreter.
"""
from __future__ import annotations

import math
import random
import struct

import pytest
import torch

from bitblas.formats import E2M1_TABLE, E4M3_TABLE, E5M2_TABLE, NF4_TABLE
from bitblas.schedule.gemv import decode as g
from c_interp import run_c

ACTS = ("float16", "bfloat16")
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _shift(x: int, s: int) -> int:
    return (x << s) & 0xFFFFFFFF if s >= 0 else x >> -s


def _half(bits: int, act: str) -> float:
    """Value of a 16-bit float16 / bfloat16 pattern."""
    if act == "float16":
        return struct.unpack("<e", struct.pack("<H", bits))[0]
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _expect(v: float, act: str) -> float:
    """A table entry as the TensorIR decodes it: float32, cast to the activation dtype."""
    return float(torch.tensor(v, dtype=torch.float32).to(TORCH[act]).float())


def _words(nbits: int, n_random: int = 200):
    """Words whose fields all hold the same code (every code), then random words."""
    per = 32 // nbits
    out = [sum(c << (nbits * i) for i in range(per)) for c in range(1 << nbits)]
    rng = random.Random(0)
    out += [rng.getrandbits(32) for _ in range(n_random)]
    return out


def _fields(word: int, nbits: int):
    return [(word >> (nbits * i)) & ((1 << nbits) - 1) for i in range(32 // nbits)]


@pytest.mark.parametrize("act", ACTS)
def test_e2m1_decode(act):
    k = g._e2m1_consts(act)
    for w in _words(4):
        codes = _fields(w, 4)
        for p, (ss, ms) in enumerate(k["shifts"]):
            mg = g._emu_lop3(_shift(w, ms), k["mag_mask"], 0, k["lut_mag"])
            x = g._emu_lop3(_shift(w, ss), k["sign_mask"], mg, k["lut_sign"])
            for half, code in ((x & 0xFFFF, codes[p]), (x >> 16, codes[p + 4])):
                got = _half(half, act) * k["mul"]          # the hmul2 by an exact power of two
                assert got == E2M1_TABLE[code], (act, hex(w), p, code, got)
                # the multiply is exact in the activation dtype (normal result, power-of-two factor)
                assert _expect(got, act) == got


def test_e2m1_table_decode_float16():
    """float16 activations: the e2m1 decoder's table program (two lookups per word, one ``prmt`` and
    one ``lop3`` per pair, no multiply) gives every code's exact value; ``__byte_perm`` of the
    lookups ignores selector bit 3, which the masked selectors never set."""
    k = g._e2m1_lut_consts()
    for w in _words(4):
        codes = _fields(w, 4)
        qm = w & k["mag_mask"]
        assert qm & 0x88888888 == 0
        l0 = g._emu_prmt(*k["tab"], qm)
        l1 = g._emu_prmt(*k["tab"], qm >> 16)
        for p, (sel, ss) in enumerate(zip(k["spread"], k["sign_shift"])):
            x = g._emu_lop3(_shift(w, ss), k["sign_mask"], g._emu_prmt(l0, l1, sel), k["lut_sign"])
            for half, code in ((x & 0xFFFF, codes[p]), (x >> 16, codes[p + 4])):
                # the exact half, -0.0 for code 8 included
                assert half == g._act_bits(E2M1_TABLE[code], "float16"), (hex(w), p, code, hex(half))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("table", [NF4_TABLE, E2M1_TABLE], ids=["nf4", "e2m1-as-lut"])
def test_lut4_decode(act, table):
    k = g._lut4_consts(table, act)
    for w in _words(4):
        codes = _fields(w, 4)
        s0 = w & k["sel_mask"]
        s1 = s0 >> 16
        q4 = (w << 4) & 0xFFFFFFFF
        m0 = g._emu_prmt(w, q4, k["msel"][0])
        m1 = g._emu_prmt(w, q4, k["msel"][1])
        for h, (s, m) in enumerate(((s0, m0), (s1, m1))):
            lo = g._emu_lop3(g._emu_prmt(*k["tl0"], s), g._emu_prmt(*k["tl1"], s), m, k["lut_sel"])
            hi = g._emu_lop3(g._emu_prmt(*k["th0"], s), g._emu_prmt(*k["th1"], s), m, k["lut_sel"])
            for t, sel in enumerate(k["ilv"]):
                pair = g._emu_prmt(lo, hi, sel)
                for half, idx in ((pair & 0xFFFF, 4 * h + 2 * t), (pair >> 16, 4 * h + 2 * t + 1)):
                    code = codes[idx]
                    assert _half(half, act) == _expect(table[code], act), (act, hex(w), idx, code)


def test_act_bits_matches_torch():
    for act in ACTS:
        for v in NF4_TABLE + E2M1_TABLE + (1 / 3, -1e-6, 65504.0, 1e-8):
            want = torch.tensor(v, dtype=torch.float32).to(TORCH[act]).view(torch.int16).item() & 0xFFFF
            assert g._act_bits(v, act) == want, (act, v)


def _bytes_words():
    """Words holding every byte code at every byte position, then random words."""
    out = [sum(((c + 37 * i) & 0xFF) << (8 * i) for i in range(4)) for c in range(256)]
    rng = random.Random(1)
    return out + [rng.getrandbits(32) for _ in range(200)]


def test_e4m3_decode():
    k = g.e4m3_consts()
    seen = set()
    for w in _bytes_words():
        codes = _fields(w, 8)
        qm = w & k["mag_mask"]
        for sel, sh, (b0, b1) in k["pairs"]:
            t = g._emu_prmt(qm, 0, sel) >> 1
            x = g._emu_lop3(_shift(w, sh), k["sign_mask"], t, k["lut_sign"])
            for half, idx in ((x & 0xFFFF, b0), (x >> 16, b1)):
                code = codes[idx]
                if code & 0x7F == 0x7F:       # e4m3fn NaN: documented, never written by the quantizers
                    continue
                seen.add(code)
                assert _half(half, "float16") * k["factor"] == E4M3_TABLE[code], (hex(w), idx, code)
    assert len(seen) == 254


def test_e5m2_decode():
    for w in _bytes_words():
        codes = _fields(w, 8)
        for t, sel in enumerate(g.E5M2_PRMT):
            x = g._emu_prmt(w, 0, sel)
            for half, idx in ((x & 0xFFFF, 2 * t), (x >> 16, 2 * t + 1)):
                got, want = _half(half, "float16"), E5M2_TABLE[codes[idx]]
                assert got == want or (math.isnan(got) and math.isnan(want)), (hex(w), idx)


def test_f8_pair_layout():
    """The tensor-core GEMV's float8 pairs (``f8_pair_dec``): pair p of a word holds bytes p and
    p + 2 (the int decoders' pairing, which bb_prep mirrors); e5m2 through the same selectors."""
    k = g.e4m3_consts()
    assert [pair for _, _, pair in k["pairs"]] == [(0, 2), (1, 3)]
    src = g.f8_pair_dec("t", "float16", 1, "e5m2")
    for w in _bytes_words():
        codes = _fields(w, 8)
        for p, (sel, _, (b0, b1)) in enumerate(k["pairs"]):
            assert f"0x{sel:x}" in src
            x = g._emu_prmt(w, 0, sel)
            for half, idx in ((x & 0xFFFF, b0), (x >> 16, b1)):
                got, want = _half(half, "float16"), E5M2_TABLE[codes[idx]]
                assert got == want or (math.isnan(got) and math.isnan(want)), (hex(w), idx)
    assert "256.f" in g.f8_pair_dec("t", "bfloat16", 1, "e4m3")


def test_e4m3_scale_helper():
    """bb_e4m3f: the float32 value of a float8_e4m3 scale byte (mirrors the CUDA source)."""
    src = g.e4m3_scale_helper()
    assert "960u" in src and "0.001953125f" in src and "0x7Fu" in src
    for b in range(-128, 128):                      # the kernel passes the int8 byte, sign-extended
        mg = b & 0x7F
        if mg == 0x7F:
            continue
        v = struct.unpack("<f", struct.pack("<I", ((mg + 960) << 20) & 0xFFFFFFFF))[0] if mg >= 8 else mg * 0.001953125
        v = -v if b & 0x80 else v
        assert v == E4M3_TABLE[b & 0xFF], b


def test_decoder_choice():
    from bitblas.formats import FORMATS
    want = {"int4": "int", "uint8": "int", "fp4_e2m1": "e2m1", "nvfp4": "e2m1", "nf4": "lut4",
            "float8_e4m3": "e4m3", "float8_e5m2": "e5m2", "float16": None}
    for name, dec in want.items():
        assert g.decoder(FORMATS[name]) == dec, name


# -- int8 activations (bitblas/schedule/gemv/int8.py): the generated CUDA helpers, interpreted ------
# (testing/c_interp.py runs their text, the very source nvcc compiles, on Python ints)
I8_WEIGHTS = ("int8", "uint8", "int4", "uint4", "int2", "uint2", "int1", "uint1")


@pytest.mark.parametrize("wd", I8_WEIGHTS)
@pytest.mark.parametrize("nw", (1, 2, 4))
@pytest.mark.parametrize("order_of", (None, "int8", "float16"))
def test_int8_act_decode_dot(wd, nw, order_of):
    """bb_prep / bb_dec / bb_dot of int8 activations: for weight vectors covering every byte value
    at every byte position (then random ones) and random int8 activations (one-hot ones too, which
    pick single codes), the dp4a dot product equals sum(a_k * q_k) with q_k decoded by the format's
    rule (bitblas.quantization.unpack_codes, int16), exactly. ``order_of``: the weight words hold
    their codes in BitBLAS's fast-decoding order for that decode target (``Plan.w_order``; int8 is
    the one int8 activations use, float16 another permutation the gather must follow too)."""
    from bitblas.code_order import interleave_positions
    from bitblas.formats import FORMATS
    from bitblas.quantization.utils import unpack_codes
    from bitblas.schedule.gemv.int8 import i8_helpers
    fmt = FORMATS[wd]
    if order_of and fmt.bits == 8:
        pytest.skip("8-bit codes have no order inside a word")
    order = interleave_positions(fmt.bits, order_of) if order_of else None
    V = nw * 32 // fmt.bits                                  # values per vector
    na = V // 4
    src = i8_helpers("t", fmt.bits, fmt.storage, nw, order)
    rng = random.Random(nw * 31 + fmt.bits)
    nb = 4 * nw
    vecs = [bytes((i * nb + j) & 0xFF for j in range(nb)) for i in range(-(-256 // nb))]       # every byte value
    vecs += [bytes(rng.getrandbits(8) for _ in range(nb)) for _ in range(60)]
    acts = [[rng.choice((-128, 127, rng.randint(-128, 127))) for _ in range(V)] for _ in range(3)]
    acts += [[-128 if k == j else 0 for k in range(V)] for j in range(V)]             # one-hot: each code alone
    for wb in vecs:
        q = unpack_codes(torch.tensor(list(wb), dtype=torch.uint8).view(torch.int8), fmt, order=order).tolist()
        d = run_c(src["bb_dec_t"], {"w": [int.from_bytes(wb[4 * j:4 * j + 4], "little") for j in range(nw)],
                                    "d": {}})["d"]
        for a in acts:
            ab = bytes(x & 0xFF for x in a)
            prep = run_c(src["bb_prep_t"], {"a": [int.from_bytes(ab[4 * j:4 * j + 4], "little") for j in range(na)],
                                            "ap": {}})
            got = run_c(src["bb_dot_t"], {"d": d, "ap": prep["ap"], "c": prep["return"]})["return"]
            assert got == sum(x * y for x, y in zip(a, q)), (wd, nw, wb.hex(), a)


def test_int8_act_decode_consts():
    """The lop3 truth table is (a & b) ^ c; signed sub-byte codes are stored offset by 2**(bits-1)
    (offset-binary, undone by the dp4a chain's start) and need no XOR; two's complement ones would
    be XOR-ed to it; unsigned ones and 8-bit words are taken as they are."""
    from bitblas.schedule.gemv.int8 import i8_consts
    k = i8_consts(4, "twos")
    assert g._emu_lop3(0xF7, 0x0F0F0F0F, 0x08080808, k["lut"]) == 0x0808080F
    assert (k["off"], k["xor"], k["wtype"]) == (8, 0x08080808, "u32")
    assert (i8_consts(4, "offset")["off"], i8_consts(4, "offset")["xor"]) == (8, 0)
    assert i8_consts(4, "plain")["off"] == 0 and i8_consts(1, "offset")["shifts"] == tuple(range(8))
    assert i8_consts(8, "twos")["wtype"] == "s32" and i8_consts(8, "plain")["wtype"] == "u32"


# -- float activations x int / uint codes: the magic-number decoder (gemv.emit._int_helpers) -------
def _round_act(v: float, act: str) -> float:
    return float(torch.tensor(v, dtype=torch.float64).to(TORCH[act]).double())


def _pair_bits(lo: float, hi: float, act: str) -> int:
    return g._act_bits(lo, act) | (g._act_bits(hi, act) << 16)


def _pair(bits: int, act: str):
    return (_half(bits & 0xFFFF, act), _half(bits >> 16, act))


def _run_float_dec(src: str, words, off: int, act: str):
    """Interpret a generated ``bb_dec`` of the int path (every line form it emits): the decoded
    registers ``d[i]`` as (low, high) value pairs (half2 / bfloat162 outputs) or floats (float32
    outputs). Arithmetic is exact in float64, rounded to the register's dtype as the GPU rounds."""
    import re
    t2 = r"(?:__half2|__nv_bfloat162)"
    env = {"off": off}
    d = {}
    for line in src.strip().splitlines()[1:-1]:
        line = line.strip()
        if line in ("{", "}"):
            continue
        m = re.fullmatch(r"const unsigned z0u = \(0x([0-9a-f]+)u \+ \(unsigned\)off\) \* 0x10001u;", line)
        if m:
            env["z0u"] = ((int(m[1], 16) + off) & 0xFFFF) * 0x10001
            continue
        m = re.fullmatch(rf"const {t2} z0 = \*reinterpret_cast<const {t2}\*>\(&z0u\);", line)
        if m:
            env["z0"] = _pair(env["z0u"], act)
            continue
        m = re.fullmatch(rf"const {t2} (m\d+) = __float2(?:half2|bfloat162)_rn\(([-\d.e]+)f\);", line)
        if m:
            env[m[1]] = (_round_act(float(m[2]), act),) * 2
            continue
        m = re.fullmatch(rf"const {t2} (c\d+) = __float2(?:half2|bfloat162)_rn\(-\(([-\d.e]+)f \+ \(float\)off\)\);", line)
        if m:
            env[m[1]] = (_round_act(-(float(m[2]) + off), act),) * 2
            continue
        m = re.fullmatch(r"const unsigned (w\d+) = w\[(\d+)\](?: >> (\d+))?;", line)
        if m:
            env[m[1]] = words[int(m[2])] >> int(m[3] or 0)
            continue
        m = re.fullmatch(r'\{ unsigned x; asm\("lop3\.b32 %0, %1, 0x([0-9a-f]+), 0x([0-9a-f]+), 0x([0-9a-f]+);" '
                         r': "=r"\(x\) : "r"\((w\d+)\)\);', line)
        if m:
            env["x"] = g._emu_lop3(env[m[4]], int(m[1], 16), int(m[2], 16), int(m[3], 16))
            continue
        m = re.fullmatch(rf"{t2} v = __hsub2\(\*reinterpret_cast<{t2}\*>\(&x\), z0\);", line)
        if m:
            x = _pair(env["x"], act)
            env["v"] = tuple(_round_act(a - b, act) for a, b in zip(x, env["z0"]))
            continue
        m = re.fullmatch(rf"{t2} v = __hfma2\(\*reinterpret_cast<{t2}\*>\(&x\), (m\d+), (c\d+)\);", line)
        if m:
            x = _pair(env["x"], act)
            env["v"] = tuple(_round_act(a * b + c, act) for a, b, c in zip(x, env[m[1]], env[m[2]]))
            continue
        m = re.fullmatch(r"d\[(\d+)\] = \*reinterpret_cast<unsigned\*>\(&v\); \}", line)
        if m:
            d[int(m[1])] = env["v"]
            continue
        m = re.fullmatch(r"const float c = 8388608\.f \+ \(float\)off;", line)
        if m:
            env["c"] = 8388608.0 + off
            continue
        m = re.fullmatch(r"\{ unsigned x = (?:\(w\[(\d+)\] \^ 0x([0-9a-f]+)u\)|w\[(\d+)\]);(?: float f\[4\];)?", line)
        if m:
            env["x"] = words[int(m[1])] ^ int(m[2], 16) if m[1] else words[int(m[3])]
            continue
        m = re.fullmatch(r"(d|f)\[(\d+)\] = __uint_as_float\(__byte_perm\(x, 0x4B000000u, 0x([0-9a-f]+)\)\) - c;", line)
        if m:
            bits = g._emu_prmt(env["x"], 0x4B000000, int(m[3], 16))
            val = struct.unpack("<f", struct.pack("<I", bits))[0] - env["c"]
            (d if m[1] == "d" else env.setdefault("f", {}))[int(m[2])] = val
            continue
        m = re.fullmatch(r"\{ __nv_bfloat162 v = __floats2bfloat162_rn\(f\[(\d)\], f\[(\d)\]\); "
                         r"d\[(\d+)\] = \*reinterpret_cast<unsigned\*>\(&v\); \}", line)
        if m:
            d[int(m[3])] = (_round_act(env["f"][int(m[1])], act), _round_act(env["f"][int(m[2])], act))
            continue
        raise AssertionError(f"line form the interpreter does not know: {line!r}")
    return d


_INT_WEIGHTS = ("int1", "int2", "int4", "int8", "uint1", "uint2", "uint4", "uint8")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("wd", _INT_WEIGHTS)
@pytest.mark.parametrize("nw, half_pairs", [(1, False), (2, False), (1, True)], ids=["nw1", "nw2", "nw1-pairs"])
def test_int_decode_float_acts(act, wd, nw, half_pairs):
    """The float-activation GEMV's int decoder (every kernel family that takes float activations:
    rows, staged row, k-split, tensor-core GEMV and its chunk loop, wgmma GEMV), run from its
    generated source: for words covering every field value at every position and random words,
    and offsets ``off`` over the range the kernels pass, decoded value = q + x_shift - off exactly,
    with q the code as bitblas.quantization.unpack_codes decodes the stored bytes (offset-binary
    for int1/2/4, two's complement for int8) and x_shift = 2**(bits-1) for signed formats; the
    pairs hold codes (j*n + p, j*n + p + n/2) of word j, as bb_prep pairs the activations."""
    from bitblas.formats import FORMATS
    from bitblas.quantization.utils import unpack_codes
    from bitblas.schedule.gemv.emit import format_helpers
    fmt = FORMATS[wd]
    b = fmt.bits
    if half_pairs and b != 8:
        pytest.skip("half pairs: the 8-bit tensor-core operand")
    src = format_helpers("t", act, b, fmt.storage, nw, half_pairs=half_pairs)["bb_dec_t"]
    x_shift = (1 << (b - 1)) if fmt.kind == "int" else 0
    n, f32 = 32 // b, b == 8 and not half_pairs
    P = n // 2
    rng = random.Random(b * 13 + nw)
    words = _words(b, 40)
    offs = sorted({0, x_shift, (1 << b) - 1, (1 << b) - 1 + x_shift, rng.randint(0, (1 << b) - 1 + x_shift)})
    for i in range(0, len(words), nw):
        ws = (words[i:i + nw] * nw)[:nw]
        raw = b"".join(w.to_bytes(4, "little") for w in ws)
        q = unpack_codes(torch.tensor(list(raw), dtype=torch.uint8).view(torch.int8), fmt).tolist()
        for off in offs:
            d = _run_float_dec(src, ws, off, act)
            for j in range(nw):
                if f32:
                    got = [d[4 * j + t] for t in range(4)]
                    want = [q[4 * j + t] + x_shift - off for t in range(4)]
                else:
                    got = [v for p in range(P) for v in d[j * P + p]]
                    # rounded to the pair's dtype: exact but for bfloat16 8-bit values beyond 256
                    want = [_round_act(q[j * n + k] + x_shift - off, act) for p in range(P) for k in (p, p + P)]
                assert got == [float(v) for v in want], (wd, act, nw, hex(ws[j]), off)


# -- quantized zero points: where every GEMV kernel family reads them -------------------------------
_FAMILIES = {   # name: (rows of the plan, hint)
    "rows": (1, dict()),
    "rows-r8": (4, dict(rows_per_warp=8)),
    "staged-row": (1, dict(rows_per_warp=2, warps=8, act_smem=True)),
    "k-split": (2, dict(k_warps=4, rows_per_warp=2)),
    "tensor-core": (16, dict(rows_per_warp=16, k_warps=4, unroll=2, stages=2, mma=True)),
    "chunk-loop": (64, dict(rows_per_warp=32, k_warps=4, unroll=1, stages=2, mma=True, min_blocks=1, chunk_loop=True)),
    "wgmma": (32, dict(rows_per_warp=16, k_warps=1, stages=4, unroll=1, mma=True, wgmma=True)),
}


class _TShim:
    """The TVMScript operators the zero-point reads use, on Python ints (GPU int semantics)."""

    @staticmethod
    def Cast(dtype, x):
        x = int(x)
        return ((x + 128) & 255) - 128 if dtype == "int8" else x

    @staticmethod
    def shift_right(a, b):
        return a >> b

    min = staticmethod(min)


@pytest.mark.parametrize("family", list(_FAMILIES))
@pytest.mark.parametrize("wd", ["uint4", "uint2", "uint8", "uint1"])
def test_quantized_zero_reads(family, wd):
    """zeros_mode="quantized": each generated kernel's zero-point read (``zr[...] = ...``), evaluated
    for random values of the loop variables on real packed zeros [groups, N * bits / 8], gives the
    code of the channel and group it names; the byte index and the shift name the same channel."""
    import ast
    import re
    from bitblas import MatmulConfig
    from bitblas.plan import make_plan
    from bitblas.quantization import pack_weight
    from bitblas.schedule.gemv import GEMVHint, kernel_script
    m, hint = _FAMILIES[family]
    if wd == "uint1" and family == "wgmma":
        pytest.skip("the wgmma GEMV takes 2-, 4- and 8-bit codes")
    N, K, gs = 1000, 8192, 128
    cfg = MatmulConfig(M=1, N=N, K=K, W_dtype=wd, group_size=gs, with_scaling=True, with_zeros=True,
                       zeros_mode="quantized")
    bits = int(wd[4:])
    codes = torch.randint(0, 1 << bits, (N, K // gs), dtype=torch.int32)
    packed = pack_weight(cfg, torch.zeros(N, K, dtype=torch.int32), torch.ones(N, K // gs), codes)["zeros"]
    zeros = packed.numpy()
    script = kernel_script(make_plan(cfg, "cuda", m), GEMVHint(**hint))
    reads = [ln.split(" = ", 1)[1] for ln in script.splitlines() if re.match(r"\s*zr\[[^]]*\] = ", ln)]
    assert reads, "no zero-point read in the kernel"
    rng = random.Random(bits)
    checked = 0
    for expr in reads:
        tree = ast.parse(expr, mode="eval")
        sub = next(n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and getattr(n.value, "id", "") == "zeros")
        g_node, n_node = sub.slice.elts
        if bits < 8:          # zeros[g, chan // per] and a shift (chan % per) * bits of the same chan
            assert isinstance(n_node, ast.BinOp) and isinstance(n_node.op, ast.FloorDiv)
            chan = n_node.left
            mods = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)]
            assert mods and all(ast.dump(x.left) == ast.dump(chan) for x in mods), expr
        else:
            chan = n_node
        # roles from the kernel's own index math: the group is a K position // group_size, the
        # channel is clamped to N - 1
        assert f"// {gs}" in ast.unparse(g_node) and f", {N - 1})" in ast.unparse(chan), expr
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - {"T", "zeros"}
        for _ in range(300):
            env = {v: rng.randint(0, 40) if v in ("n0", "bx") else rng.choice((0, 0, 1, 2, 3)) for v in names}
            if "n0" in env:
                env["n0"] *= 16
            env.update(T=_TShim, zeros=zeros)
            g = eval(compile(ast.Expression(g_node), "g", "eval"), env)
            n = eval(compile(ast.Expression(chan), "n", "eval"), env)
            if not (0 <= g < K // gs and 0 <= n < N):
                continue
            got = int(eval(compile(tree, "zr", "eval"), env)) & 255      # scale_lines: ov = int32(zr) & 255
            assert got == int(codes[n, g]), (family, wd, expr, env, n, g)
            checked += 1
    assert checked > 30, (family, wd)     # reads of steps past K (guarded in the kernel) have no valid group


@pytest.mark.parametrize("wd", ("int4", "uint4", "int2", "uint2", "int1", "uint1"))
@pytest.mark.parametrize("nw", (1, 2, 4))
@pytest.mark.parametrize("order_of", (None, "float16", "int8"))
def test_float_prep_pairs_follow_code_order(wd, nw, order_of):
    """bb_prep of the float-activation GEMV under a code order (``Plan.w_order``, BitBLAS's
    fast-decoding interleave), run from its source: activation word i (a half pair) holds the
    activations of the codes that decoded word i holds in its low and high half, i.e. of the
    fields in slots p and p + n/2 of the weight word, which unpack_codes(order=...) names; and
    decode.pair_codes says the same (the wgmma kernels' slab permutation is built from it)."""
    import re
    from bitblas.code_order import interleave_positions
    from bitblas.formats import FORMATS
    from bitblas.quantization.utils import pack_codes, unpack_codes, unpack_fields
    from bitblas.schedule.gemv.decode import pair_codes
    from bitblas.schedule.gemv.emit import format_helpers
    fmt = FORMATS[wd]
    b = fmt.bits
    n, P = 32 // b, 16 // b
    order = interleave_positions(b, order_of) if order_of else None
    src = format_helpers("t", "float16", b, fmt.storage, nw, order=order)["bb_prep_t"]
    # activation value of K position k: its index (16-bit), two per word
    env = {j: (2 * j) | (2 * j + 1) << 16 for j in range(nw * n // 2)}
    got = {}
    for line in src.splitlines():
        m = re.fullmatch(r"\s*ap\[(\d+)\] = __byte_perm\(a\[(\d+)\], a\[(\d+)\], 0x([0-9a-f]+)\);", line)
        if m:
            x = g._emu_prmt(env[int(m[2])], env[int(m[3])], int(m[4], 16))
            got[int(m[1])] = (x & 0xFFFF, x >> 16)
    assert len(got) == nw * P
    # which code sits in slot s of the words: pack each code alone (a one-hot row) and find its field
    code_of_slot = [None] * (nw * n)
    for k in range(nw * n):
        one = torch.zeros(1, nw * n, dtype=torch.int32)
        one[0, k] = 1
        fields = unpack_fields(pack_codes(one, f"uint{b}", "plain", order), b)[0].tolist()
        code_of_slot[fields.index(1)] = k
    want = {j * P + p: (code_of_slot[j * n + p], code_of_slot[j * n + p + P]) for j in range(nw) for p in range(P)}
    assert got == want, (wd, nw, order_of)
    assert [tuple(x) for x in pair_codes("int", b, nw, order)] == [want[i] for i in range(nw * P)]
    # and unpack_codes reads the codes back in natural order
    codes = torch.randint(0, 1 << b, (1, nw * n))
    assert torch.equal(unpack_codes(pack_codes(codes, f"uint{b}", "plain", order), f"uint{b}", "plain", order)
                       .to(torch.int64), codes)
