"""The GEMV template's register decoders of table formats, emulated bit for bit on the CPU.

Each test runs the decoder's integer program (shifts, ``lop3``, ``prmt``, the final multiply) in
Python, with the constants taken from the same functions the CUDA generator uses
(``bitblas.schedule.gemv_decode._e2m1_consts`` ...), and compares every code with the format's table
rounded as the TensorIR rounds it (float32 -> activation dtype, through torch). Random words check
that the codes of one word do not leak into each other.
"""
from __future__ import annotations

import math
import random
import struct

import pytest
import torch

from bitblas.formats import E2M1_TABLE, E4M3_TABLE, E5M2_TABLE, NF4_TABLE
from bitblas.schedule import gemv_decode as g

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
    k = g._e4m3_consts()
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


def test_e4m3_scale_helper():
    """bb_e4m3f: the float32 value of a float8_e4m3 scale byte (mirrors the CUDA source)."""
    src = g._e4m3_scale_helper()
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
        assert g._decoder(FORMATS[name]) == dec, name
