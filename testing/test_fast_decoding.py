"""Microsoft BitBLAS's fast-decoding weight bytes (issue 22, "Byte layouts").

Where BitBLAS's ``fast_decoding`` resolves True (int / uint 1/2/4-bit weights with float16, int8,
... activations; its ``MatmulConfig`` rule), its ``Matmul.transform_weight`` runs a LOP3Permutate
after packing: the codes of each 32-bit word are reordered for the lop3 decoders. Its ``Linear``
saves that ``qweight``. Here:

* the order is written from BitBLAS's source (``lop3_permutate_impl.py``, ``tir_interleave_weight``:
  the lane loop, then float16 2-bit byte swap, int8 1-bit nibble swaps, and the float16 1-bit move,
  which writes two nibbles to one place) and compared with ours, and with slot lists written by
  hand for a few words;
* the operator's weight is in that order (``Plan.w_order``): ``transform_weight`` gives BitBLAS's
  bytes and the kernels read them, so a weight BitBLAS packed (a GPTQModel / vLLM "bitblas"
  checkpoint) goes to ``Matmul`` as it is;
* a state dict built the way BitBLAS's ``Linear`` saves one (pack the codes, interleave, no format
  record) loads into ``bitblas.Linear`` as it is and computes dequantize-then-matmul;
* ``bitblas.Linear/3`` state dicts hold the same bytes; ``/2`` ones (natural order, earlier
  bitblas) are converted on load, and so are layers pickled by an earlier bitblas.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bitblas
from bitblas import MatmulConfig
from bitblas.quantization import bitblas_fast_decoding, from_bitblas_weight, to_bitblas_weight
from bitblas.quantization.utils import bitblas_weight_order, lop3_permute, reorder_codes
from nn_helpers import rel_err
from test_bitblas_layouts import bb_general_compress

N, K = 48, 128


# -- BitBLAS's LOP3Permutate, written from its TIR -----------------------------------------------
def bb_lop3_permutate(qweight: np.ndarray, bits: int, datatype: str) -> np.ndarray:
    """BitBLAS's ``tir_interleave_weight`` on int8 storage (32-bit words, unsigned arithmetic:
    its uint32 masks make the shifts logical)."""
    a = np.ascontiguousarray(qweight).view(np.uint32).astype(np.uint64)
    stride = {"float16": 16, "bfloat16": 16, "int8": 8, "int4": 4}[datatype]
    groups, per, mask = 32 // stride, stride // bits, (1 << bits) - 1
    b = np.zeros_like(a)
    for i in range(groups):
        for j in range(per):
            off = i * per + j
            b |= ((a >> (bits * off)) & mask) << ((off % groups) * stride + (off // groups) * bits)
    m = 0xFFFFFFFF
    if datatype == "float16" and bits == 2:
        b = (b & 0xFF0000FF) | ((((b & 0x00FF0000) << 8) & m) >> 16) | ((((b & 0x0000FF00) << 16) & m) >> 8)
    elif datatype == "float16" and bits == 1:
        b = ((b & 0xF000000F) | (((b & 0x000000F0) >> 4) << 8) | (((b & 0x00000F00) >> 8) << 16)
             | (((b & 0x0000F000) >> 12) << 24) | (((b & 0x000F0000) >> 16) << 8) | (((b & 0x00F00000) >> 20) << 12)
             | (((b & 0x0F000000) >> 24) << 20))
    elif datatype == "int8" and bits == 1:
        b = ((b & 0xF0F00F0F) | (((b & 0x000000F0) >> 4) << 16) | (((b & 0x0000F000) >> 12) << 24)
             | (((b & 0x000F0000) >> 16) << 4) | (((b & 0x0F000000) >> 24) << 12))
    return (b & m).astype(np.uint32).view(np.int8).reshape(qweight.shape)


def _words(codes_per_word, bits):
    """int8 bytes of 32-bit words holding the given codes, code j at bits [j*bits, (j+1)*bits)."""
    out = []
    for codes in codes_per_word:
        w = sum(int(c) << (bits * j) for j, c in enumerate(codes))
        out.append(w)
    return np.array(out, dtype=np.uint32).view(np.int8)


def _slots(word_bytes, bits):
    """The code in each slot of each word."""
    w = word_bytes.view(np.uint32)
    return [[(int(x) >> (bits * p)) & ((1 << bits) - 1) for p in range(32 // bits)] for x in w]


# (bits, decode target) -> the code index each slot of a word holds, listed by hand from BitBLAS's
# decoders (lop3.py: "interleave {e7,e5,e3,e1,e6,e4,e2,e0}" for 4-bit float16, the 2-bit decoder's
# bytes {e6,e4,e2,e0} / {e7,e5,e3,e1}) and the lane rule for int8 (lane = code % 4)
HAND_SLOTS = {
    (4, "float16"): [0, 2, 4, 6, 1, 3, 5, 7],
    (4, "int8"): [0, 4, 1, 5, 2, 6, 3, 7],
    (2, "float16"): [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15],
    (2, "int8"): [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15],
    (4, "bfloat16"): [0, 2, 4, 6, 1, 3, 5, 7],
    (2, "bfloat16"): [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15],
}


@pytest.mark.parametrize("bits, target", list(HAND_SLOTS))
def test_lop3_order_by_hand(bits, target):
    """A few words of distinct codes (4-bit) / codes 0..3 in each position (2-bit): each slot holds
    the code the hand-written list names."""
    n = 32 // bits
    rng = np.random.default_rng(bits)
    codes = [list(range(n))] if bits == 4 else []
    codes += [list(rng.integers(0, 1 << bits, n)) for _ in range(3)]
    got = _slots(lop3_permute(_words(codes, bits), bits, target), bits)
    for word, slots in zip(codes, got):
        assert slots == [word[j] for j in HAND_SLOTS[(bits, target)]]


@pytest.mark.parametrize("bits, target", [(4, "float16"), (2, "float16"), (4, "bfloat16"), (2, "bfloat16"),
                                          (1, "bfloat16"), (4, "int8"), (2, "int8"), (1, "int8"), (2, "int4")])
def test_lop3_permute_matches_bitblas_tir(bits, target):
    """Our interleave is BitBLAS's LOP3Permutate on random bytes, and deinterleaving undoes it."""
    q = np.random.default_rng(7).integers(-128, 128, (6, 32)).astype(np.int8)
    ours = lop3_permute(q, bits, target)
    assert np.array_equal(ours, bb_lop3_permutate(q, bits, target))
    assert np.array_equal(lop3_permute(ours, bits, target, inverse=True), q)
    t = torch.from_numpy(q)
    assert torch.equal(lop3_permute(t, bits, target), torch.from_numpy(bb_lop3_permutate(q, bits, target)))


def test_bitblas_1bit_float16_bytes_lose_codes():
    """Why 1-bit weights with float16 activations are refused: BitBLAS's LOP3Permutate maps two
    different words to the same bytes."""
    a = _words([[0] * 32], 1)
    b = _words([[1 if j in (8, 10, 12, 14) else 0 for j in range(32)]], 1)
    c = _words([[1 if j in (1, 3, 5, 7) else 0 for j in range(32)]], 1)
    assert not np.array_equal(b, c)
    assert np.array_equal(bb_lop3_permutate(b, 1, "float16"), bb_lop3_permutate(c, 1, "float16"))
    assert not np.array_equal(bb_lop3_permutate(a, 1, "float16"), bb_lop3_permutate(b, 1, "float16"))
    with pytest.raises(NotImplementedError, match="fast_decoding=False"):
        bitblas_weight_order(MatmulConfig(M=1, N=N, K=K, A_dtype="float16", W_dtype="uint1"))


# -- when BitBLAS's fast decoding is on ------------------------------------------------------------
@pytest.mark.parametrize("A, W, given, expect", [
    ("float16", "uint4", None, True), ("float16", "int4", None, True), ("float16", "int2", None, True),
    ("float16", "uint1", None, True), ("int8", "int2", None, True), ("int8", "uint1", None, True),
    ("int4", "int2", None, True), ("float32", "uint4", None, True),
    ("bfloat16", "uint4", None, False), ("int8", "int4", None, False), ("int8", "uint4", None, False),
    ("float16", "int8", None, False), ("float16", "uint8", None, False), ("float16", "nf4", None, False),
    ("float16", "fp4_e2m1", None, False), ("float16", "float16", None, False), ("int4", "int4", None, False),
    ("float16", "uint4", False, False), ("bfloat16", "uint4", True, True),
])
def test_bitblas_fast_decoding_rule(A, W, given, expect):
    c = MatmulConfig(M=1, N=N, K=K, A_dtype=A, W_dtype=W, fast_decoding=given)
    assert bitblas_fast_decoding(c) is expect
    op = bitblas.Matmul(c)
    lossy = A == "float16" and W in ("uint1", "int1")       # BitBLAS's bytes lose codes: natural order here
    assert op.fast_decoding is (expect and not lossy) and op.config.fast_decoding is given
    order = None if lossy else bitblas_weight_order(c)
    assert op.plan().w_order == (None if order is None else tuple(order))


@pytest.mark.parametrize("A, W, interleaved", [
    ("float16", "uint4", True), ("int8", "int2", True), ("float32", "uint4", False),   # float32: one lane per word
    ("bfloat16", "uint4", False), ("float16", "nf4", False),
])
def test_bitblas_weight_order(A, W, interleaved):
    c = MatmulConfig(M=1, N=N, K=K, A_dtype=A, W_dtype=W)
    assert (bitblas_weight_order(c) is not None) is interleaved
    assert bitblas_weight_order(MatmulConfig(M=1, N=N, K=K, A_dtype=A, W_dtype=W, fast_decoding=False)) is None
    assert bitblas_weight_order(MatmulConfig(M=1, N=N, K=20, A_dtype=A, W_dtype=W)) is None  # 10- / 5-byte rows


# -- bitblas.Linear state dicts -------------------------------------------------------------------
CASES = {
    # name: (Linear kwargs, bits, signed); float16 activations
    "u4_g32_zeros": (dict(W_dtype="uint4", group_size=32, with_zeros=True), 4, False),
    "i4_g32": (dict(W_dtype="int4", group_size=32), 4, True),
    "u2_g64_zeros": (dict(W_dtype="uint2", group_size=64, with_zeros=True), 2, False),
}


def _bitblas_saved(name, seed):
    """What Microsoft BitBLAS's Linear saves for this layer (its state dict, no format record): codes
    through general_compress, then its LOP3Permutate; scales [N, groups] and zeros (its "original":
    (q - z) * s, [N, groups] in A_dtype). Returns (state dict, float64 dequantized weight [N, K])."""
    kw, bits, signed = CASES[name]
    g = torch.Generator().manual_seed(seed)
    gs = kw["group_size"]
    G = K // gs
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    q = torch.randint(lo, hi + 1, (N, K), generator=g)
    stored = q + (1 << (bits - 1)) if signed else q                        # offset-binary for signed weights
    packed = bb_lop3_permutate(bb_general_compress(stored.numpy().astype(np.int8), bits), bits, "float16")
    scales = (torch.rand(N, G, generator=g) * 0.05 + 0.01).half()
    sd = {"qweight": torch.from_numpy(packed.copy()), "scales": scales}
    z = torch.zeros(N, G, dtype=torch.float16)
    if kw.get("with_zeros"):
        z = torch.randint(0, hi + 1, (N, G), generator=g).half()
        sd["zeros"] = z
    else:
        sd["zeros"] = torch.zeros(N, G, dtype=torch.float16)       # BitBLAS's Linear saves it anyway
    deq = (q.double() - z.double().repeat_interleave(gs, 1)) * scales.double().repeat_interleave(gs, 1)
    return sd, deq


def _layer(name):
    return bitblas.Linear(K, N, A_dtype="float16", opt_M=1, **CASES[name][0])


def _record(lin, fmt):
    rec = json.loads(bytes(lin.state_dict()["_extra_state"].numpy()).decode())
    return torch.frombuffer(bytearray(json.dumps({**rec, "format": fmt}, sort_keys=True).encode()),
                            dtype=torch.uint8)


@pytest.mark.parametrize("name", list(CASES))
def test_bitblas_saved_state_dict_loads(name):
    """A state dict as Microsoft BitBLAS's Linear saves it computes dequantize-then-matmul; the
    caller's tensors are not changed; our own state dict (bitblas.Linear/3) holds the same bytes."""
    sd, deq = _bitblas_saved(name, seed=1)
    keep = sd["qweight"].clone()
    lin = _layer(name)
    lin.check_state_dict(sd)
    lin.load_state_dict(sd)
    assert torch.equal(sd["qweight"], keep)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(2)).half()
    out = torch.full((3, N), float("nan"), dtype=torch.float16)
    lin(x, output=out)
    assert rel_err(out, x.double() @ deq.T) <= 4e-3
    mine = lin.state_dict()
    assert torch.equal(mine["qweight"], lin.qweight) and torch.equal(mine["qweight"], keep)
    assert torch.equal(to_bitblas_weight(lin.config, mine["qweight"]), keep)
    assert b'"format": "bitblas.Linear/3"' in bytes(mine["_extra_state"].numpy())


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_and_v2(name):
    """save -> load gives the same buffers and outputs; the saved qweight is the buffer's bytes (so a
    loader that bypasses the module's load hook reads it right); a bitblas.Linear/2 state dict (an
    earlier bitblas: qweight in natural code order) loads to the same layer, converted."""
    sd, deq = _bitblas_saved(name, seed=3)
    lin = _layer(name)
    lin.load_state_dict(sd)
    saved = lin.state_dict()
    again = _layer(name)
    again.load_state_dict(saved)
    assert torch.equal(again.qweight, lin.qweight)
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(4)).half()
    assert torch.equal(again(x), lin(x))
    assert torch.equal(saved["qweight"], lin.qweight)

    bits = CASES[name][1]
    natural = reorder_codes(lin.qweight, bits, lin._plan.w_order, inverse=True)
    assert not torch.equal(natural, lin.qweight)
    v2 = dict(saved, qweight=natural, _extra_state=_record(lin, "bitblas.Linear/2"))
    old = _layer(name)
    old.check_state_dict(v2)
    old.load_state_dict(v2)
    assert torch.equal(v2["qweight"], natural)                 # the caller's tensor is not changed
    assert torch.equal(old.qweight, lin.qweight)
    assert rel_err(old(x), x.double() @ deq.T) <= 4e-3
    assert b'"format": "bitblas.Linear/3"' in bytes(old.state_dict()["_extra_state"].numpy())
    assert torch.equal(old.state_dict()["qweight"], saved["qweight"])


def test_layer_pickled_by_an_earlier_bitblas():
    """A layer pickled by a bitblas whose layers held qweight in natural code order (no
    ``_code_order`` attribute) is converted when unpickled, and computes the same."""
    import pickle
    sd, deq = _bitblas_saved("u4_g32_zeros", seed=9)
    lin = _layer("u4_g32_zeros")
    lin.load_state_dict(sd)
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(10)).half()
    want = lin(x)
    old = pickle.loads(pickle.dumps(lin))
    assert torch.equal(old.qweight, lin.qweight) and torch.equal(old(x), want)      # a current pickle: as it is
    del lin.__dict__["_code_order"]
    lin._buffers["qweight"] = reorder_codes(lin.qweight, 4, lin._plan.w_order, inverse=True)
    old = pickle.loads(pickle.dumps(lin))
    assert torch.equal(old.qweight, sd["qweight"]) and torch.equal(old(x), want)


def test_int8_activations_int2_weights():
    """int8 activations with 2-bit weights: BitBLAS interleaves for int8 decoding (lane = code % 4)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randint(-2, 2, (N, K), generator=g)
    packed = bb_lop3_permutate(bb_general_compress((q + 2).numpy().astype(np.int8), 2), 2, "int8")
    lin = bitblas.Linear(K, N, A_dtype="int8", W_dtype="int2", group_size=-1, opt_M=1)
    scales = (torch.rand(lin.scales.shape, generator=g) + 0.5).to(lin.scales.dtype)
    lin.load_state_dict({"qweight": torch.from_numpy(packed.copy()), "scales": scales})
    assert torch.equal(lin.unpacked()["codes"].long(), q)
    assert torch.equal(lin.state_dict()["qweight"], torch.from_numpy(packed))


def test_one_bit_float16_checkpoint_refused():
    """1-bit weights with float16 activations: BitBLAS's bytes lose codes, so a checkpoint without
    our format record is refused; ours keep the kernels' order and round trip."""
    lin = bitblas.Linear(K, N, A_dtype="float16", W_dtype="uint1", group_size=-1, opt_M=1)
    codes = torch.randint(0, 2, (N, K), generator=torch.Generator().manual_seed(6))
    lin.load_and_transform_weight(codes.to(torch.int8), scales=torch.ones(N, 1, dtype=torch.float16))
    sd = lin.state_dict()
    fresh = bitblas.Linear(K, N, A_dtype="float16", W_dtype="uint1", group_size=-1, opt_M=1)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.unpacked()["codes"].long(), codes)
    foreign = {k: v for k, v in sd.items() if k != "_extra_state"}
    with pytest.raises(NotImplementedError, match="fast_decoding=False"):
        fresh.load_state_dict(foreign, strict=False)


# -- weights BitBLAS packed, handed to the operator --------------------------------------------
@pytest.mark.parametrize("A, W", [("float16", "uint4"), ("float16", "int4"), ("float16", "uint2"), ("int8", "int2"),
                                  ("int8", "uint1")])
def test_operator_takes_bitblas_weight_as_is(A, W):
    """GPTQModel / vLLM "bitblas" checkpoints hold BitBLAS's transform_weight output (packed, then
    its LOP3Permutate, here written from its TIR); the operator takes those bytes as they are and
    computes dequantize-then-matmul; its own transform_weight gives the same bytes; the natural
    order is not what it reads."""
    from bitblas.formats import FORMATS
    f = FORMATS[W]
    bits, signed = f.bits, f.kind == "int"
    int_acts = A == "int8"
    gs = -1 if int_acts else 32
    c = MatmulConfig(M=[1, 16], N=N, K=K, A_dtype=A, W_dtype=W, with_scaling=True, group_size=gs,
                     out_dtype="float16")
    op = bitblas.Matmul(c)
    assert op.fast_decoding
    g = torch.Generator().manual_seed(8)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    q = torch.randint(lo, hi + 1, (N, K), generator=g)
    stored = (q + (1 << (bits - 1)) if signed else q).numpy().astype(np.int8)
    bb_qweight = torch.from_numpy(bb_lop3_permutate(bb_general_compress(stored, bits), bits, A))
    assert torch.equal(op.transform_weight(q.to(torch.int8)), bb_qweight)
    assert from_bitblas_weight(op.config, bb_qweight) is bb_qweight
    G = 1 if gs == -1 else K // gs
    s = (torch.rand(N, G, generator=g) * 0.05 + 0.01)
    s = s.float() if int_acts else s.half()
    deq = q.double() * s.double().repeat_interleave(K // G, 1)
    if int_acts:
        x = torch.randint(-127, 128, (5, K), generator=g).to(torch.int8)
        out = op(x, bb_qweight, s)
    else:
        x = torch.randn(5, K, generator=g).half()
        out = op(x, bb_qweight, s)
    assert rel_err(out, x.double() @ deq.T) <= 4e-3
    natural = torch.from_numpy(bb_general_compress(stored, bits))
    assert rel_err(op(x, natural, s), x.double() @ deq.T) > 0.1


def test_state_dict_across_fast_decoding_settings():
    """A bitblas.Linear/3 state dict records its code order: a layer built with another
    fast_decoding setting loads it converted (the same codes, the same outputs), both ways."""
    sd, deq = _bitblas_saved("u4_g32_zeros", seed=11)
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(12)).half()
    fast = _layer("u4_g32_zeros")
    fast.load_state_dict(sd)
    kw = dict(CASES["u4_g32_zeros"][0], fast_decoding=False)
    plain = bitblas.Linear(K, N, A_dtype="float16", opt_M=1, **kw)
    assert plain._plan.w_order is None and fast._plan.w_order is not None
    plain.load_state_dict(fast.state_dict())
    assert not torch.equal(plain.qweight, fast.qweight)
    assert torch.equal(plain.unpacked()["codes"], fast.unpacked()["codes"])
    assert torch.equal(plain(x), fast(x)) and rel_err(plain(x), x.double() @ deq.T) <= 4e-3
    again = _layer("u4_g32_zeros")
    again.load_state_dict(plain.state_dict())
    assert torch.equal(again.qweight, fast.qweight)


def test_orders_permute_the_bits_of_the_code_index():
    """Every BitBLAS order is a permutation of the bits of the code index (the kernels' TIR and
    TVMScript forms rely on it), so is its inverse; another permutation is refused."""
    from bitblas.code_order import _TARGET_BITS, interleave_positions, order_bits, slot_codes
    for bits in (1, 2, 4):
        for target in _TARGET_BITS:
            pos = interleave_positions(bits, target)
            inv = slot_codes(pos)
            assert [inv[p] for p in pos] == list(range(len(pos)))
            for o in (pos, inv):
                img = order_bits(o)
                assert all(o[j] == sum(1 << t for i, t in enumerate(img) if j >> i & 1) for j in range(len(o)))
    with pytest.raises(ValueError, match="not a permutation of the bits"):
        order_bits((0, 2, 3, 1))
