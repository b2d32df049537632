"""GPTQ and AWQ checkpoints into bitblas.Linear / QuantLinear, against dequantize-then-matmul.

Packed tensors are built here from known float weights by the reference packers of nn_helpers."""
from __future__ import annotations

import pytest
import torch

import bitblas
from bitblas.nn import from_awq, from_gptq, load_awq_model, load_gptq_model
from bitblas.nn.checkpoint import gptq_v1_to_v2_qzeros, unpack_int32
from nn_helpers import FakeGPTQLayer, awq_pack, gptq_pack, ref_quantize, rel_err

TOL = 4e-3      # float16 activations and output (bitblas.reference.TOLERANCES["float16"])
N, K = 64, 256


def _weight(seed=0, n=N, k=K):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def _x(*lead, seed=1):
    return torch.randn(*lead, K, generator=torch.Generator().manual_seed(seed)).half()


GPTQ_CASES = [
    pytest.param(4, 64, False, "gptq", id="b4-g64"),
    pytest.param(4, 64, True, "gptq", id="b4-g64-actorder"),
    pytest.param(4, -1, False, "gptq", id="b4-perchannel"),
    pytest.param(4, 32, True, "gptq_v2", id="b4-g32-actorder-v2"),
    pytest.param(2, 64, False, "gptq", id="b2-g64"),
    pytest.param(8, 128, True, "gptq", id="b8-g128-actorder"),
]


@pytest.mark.parametrize("bits,gs,act_order,fmt", GPTQ_CASES)
def test_gptq_into_linear(bits, gs, act_order, fmt):
    r = ref_quantize(_weight(), bits, gs, act_order, zmin=1 if fmt == "gptq" else 0)
    qweight, qzeros = gptq_pack(r, bits, zero_offset=fmt == "gptq")
    bias = (torch.randn(N) * 0.1).half()
    src = FakeGPTQLayer(qweight, qzeros, r.s, r.g_idx if act_order else None, bias)
    lin = bitblas.Linear(K, N, bias=True, W_dtype=f"uint{bits}", group_size=gs, with_scaling=True, with_zeros=True,
                         zeros_mode="original")
    lin.repack_from_gptq(src, checkpoint_format=fmt)
    assert (lin.perm is not None) == act_order
    # the layer holds exactly the checkpoint's weight
    assert torch.equal(lin.dequantized_weight(), r.w_deq.to(torch.float32))
    for lead in ((1,), (5,), (2, 3)):
        x = _x(*lead)
        out = lin(x)
        ref = x.double() @ r.w_deq.T + bias.double()
        assert out.shape == (*lead, N) and out.dtype == torch.float16
        assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("zeros_mode", ["rescale", "quantized"])
def test_gptq_other_zero_modes(zeros_mode):
    r = ref_quantize(_weight(3), 4, 64, zmin=1)
    qweight, qzeros = gptq_pack(r, 4, zero_offset=False)
    lin = bitblas.Linear(K, N, W_dtype="uint4", group_size=64, with_zeros=True, zeros_mode=zeros_mode)
    lin.repack_from_gptq(qweight=qweight, qzeros=qzeros, scales=r.s, checkpoint_format="gptq_v2")
    x = _x(4)
    assert rel_err(lin(x), x.double() @ r.w_deq.T) <= TOL


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gptq_v1_zero_points_borrow_across_the_word(bits):
    """GPTQ v1 (GPTQModel / optimum / transformers exports) stores the v2 qzeros word minus one per
    slot as one 32-bit subtraction (GPTQModel's convert_gptq_v2_to_v1_format_module): a zero point of 0
    borrows from the next slot. Reading must add the constant back to the whole word."""
    per, gs = 32 // bits, 32
    r = ref_quantize(_weight(4), bits, gs)
    g = torch.Generator().manual_seed(bits)
    zero = torch.rand(r.z.shape, generator=g) < 0.4       # zero points of 0 in many groups and columns
    r.z[zero] = 0
    r.z[0, :per] = 0                                       # a word of all zeros: a borrow chain through it
    sk = r.s.double()[r.g_idx.long()].T
    r.q = torch.round(_weight(4).double() / sk + r.z[r.g_idx.long()].T).clamp(0, (1 << bits) - 1).long()
    r.w_deq = (r.q - r.z[r.g_idx.long()].T).double() * sk
    qweight, qzeros_v2 = gptq_pack(r, bits, zero_offset=False)
    one_per_slot = sum(1 << (bits * i) for i in range(per))
    v1 = (qzeros_v2.to(torch.int64) - one_per_slot) % (1 << 32)
    qzeros_v1 = torch.where(v1 >= 1 << 31, v1 - (1 << 32), v1).to(torch.int32)
    assert bool((unpack_int32(qzeros_v1, bits, 1) == (1 << bits) - 1).any())      # slots that borrowed
    # reading each slot plus one (the old rule) gets them wrong
    assert not torch.equal(unpack_int32(qzeros_v1, bits, 1).long() + 1, r.z)
    imp = from_gptq(qweight, qzeros_v1, r.s, bits=bits, checkpoint_format="gptq")
    assert torch.equal(imp.zeros.T.long(), r.z)
    assert torch.equal(gptq_v1_to_v2_qzeros(qzeros_v1, bits), qzeros_v2)
    lin = bitblas.Linear(K, N, W_dtype=f"uint{bits}", group_size=gs, with_zeros=True)
    lin.repack_from_gptq(qweight=qweight, qzeros=qzeros_v1, scales=r.s)
    assert torch.equal(lin.dequantized_weight(), r.w_deq.to(torch.float32))


def test_awq_into_linear():
    r = ref_quantize(_weight(5), 4, 64)
    qweight, qzeros = awq_pack(r)
    lin = bitblas.Linear(K, N, W_dtype="uint4", group_size=64, with_zeros=True)
    lin.repack_from_awq(qweight=qweight, qzeros=qzeros, scales=r.s)
    assert torch.equal(lin.dequantized_weight(), r.w_deq.to(torch.float32))
    x = _x(3)
    assert rel_err(lin(x), x.double() @ r.w_deq.T) <= TOL
    # the interleave matters: reading AWQ words in plain order gives another weight
    imp = from_awq(qweight, qzeros, r.s, bits=4)
    assert torch.equal(imp.codes.long(), r.q)


def test_quant_linear_loads_gptq_state_dict():
    r = ref_quantize(_weight(6), 4, 64, act_order=True, zmin=1)
    qweight, qzeros = gptq_pack(r, 4)
    bias = (torch.randn(N) * 0.1).half()
    sd = FakeGPTQLayer(qweight, qzeros, r.s, r.g_idx, bias).state_dict()
    ql = bitblas.QuantLinear(infeatures=K, outfeatures=N, bits=4, bias=True, group_size=64)
    ql.load_state_dict(sd)
    x = _x(2, 2).float()                               # float32 in, float32 out
    out = ql(x)
    assert out.dtype == torch.float32
    assert rel_err(out, x.double() @ r.w_deq.T + bias.double()) <= TOL
    # its own state dict (bitblas layout, with perm) loads into a fresh layer
    ql2 = bitblas.QuantLinear(K, N, 4, True, 64)
    ql2.load_state_dict(ql.state_dict())
    assert torch.equal(ql2(x), out)


def test_quant_linear_pack_autogptq_api():
    w = _weight(7)
    lin = torch.nn.Linear(K, N, bias=True)
    lin.weight.data.copy_(w)
    r = ref_quantize(w, 4, 32, act_order=True)
    ql = bitblas.QuantLinear(K, N, bits=4, bias=True, group_size=32)
    # AutoGPTQ hands scales and zeros as [N, groups]
    ql.pack(lin, r.s.T.float(), r.z.T.float(), g_idx=r.g_idx)
    x = _x(3)
    ref = x.double() @ r.w_deq.T + lin.bias.double()
    assert rel_err(ql(x), ref) <= TOL


def test_mismatched_checkpoints_raise(naming):
    r = ref_quantize(_weight(8), 2, 64)
    qweight2, qzeros2 = gptq_pack(r, 2)
    lin = bitblas.Linear(K, N, W_dtype="uint4", group_size=64, with_zeros=True)
    before = {k: v.clone() for k, v in lin.state_dict().items()}
    with pytest.raises(ValueError, match="bits=2"):        # a 2-bit checkpoint into a 4-bit layer
        lin.repack_from_gptq(qweight=qweight2, qzeros=qzeros2, scales=r.s)
    r4 = ref_quantize(_weight(8), 4, 32)
    qweight4, qzeros4 = gptq_pack(r4, 4)
    with naming(ValueError, "group_size"):
        lin.repack_from_gptq(qweight=qweight4, qzeros=qzeros4, scales=r4.s)
    with naming(ValueError, "qzeros"):
        lin.repack_from_gptq(qweight=qweight4, qzeros=qzeros4[:, :-1], scales=r4.s[::2])
    with naming(TypeError, "qweight"):
        lin.repack_from_gptq(qweight=qweight4.float(), qzeros=qzeros4, scales=r4.s)
    with pytest.raises(NotImplementedError, match="bits=3"):
        from_gptq(qweight4, qzeros4, r4.s, bits=3)
    with naming(ValueError, "W_dtype"):
        bitblas.Linear(K, N, W_dtype="int4", group_size=64, with_zeros=True).repack_from_gptq(
            qweight=qweight4, qzeros=qzeros4, scales=r4.s)
    after = lin.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unequal_act_order_groups_unsupported():
    r = ref_quantize(_weight(9), 4, 64)
    qweight, qzeros = gptq_pack(r, 4)
    g = r.g_idx.clone()
    g[0] = 1                                           # group 1 now holds 65 rows
    with pytest.raises(NotImplementedError, match="unequal"):
        from_gptq(qweight, qzeros, r.s, g, bits=4)


class _Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, K)
        self.a = torch.nn.Linear(K, N, bias=False)
        self.b = torch.nn.Linear(N, K, bias=True)
        self.head = torch.nn.Linear(K, 10, bias=False)

    def forward(self, t):
        return self.head(self.b(self.a(self.emb(t))))


def _two_checkpoint(fmt="gptq"):
    ra = ref_quantize(_weight(10, N, K), 4, 64, act_order=fmt == "gptq", zmin=1)
    rb = ref_quantize(_weight(11, K, N), 4, 64, zmin=1)
    sd = {"emb.weight": torch.randn(10, K).half(), "head.weight": torch.randn(10, K).half() * 0.05,
          "b.bias": (torch.randn(K) * 0.1).half()}
    for name, r in (("a", ra), ("b", rb)):
        qw, qz = gptq_pack(r, 4) if fmt == "gptq" else awq_pack(r)
        sd.update({f"{name}.qweight": qw, f"{name}.qzeros": qz, f"{name}.scales": r.s})
        if fmt == "gptq":
            sd[f"{name}.g_idx"] = r.g_idx
    return sd, ra, rb


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_load_checkpoint_model(fmt):
    sd, ra, rb = _two_checkpoint(fmt)
    model = _Two().half()
    (load_gptq_model if fmt == "gptq" else load_awq_model)(model, sd, bits=4, group_size=64)
    assert isinstance(model.a, bitblas.Linear) and isinstance(model.b, bitblas.Linear)
    assert type(model.head) is torch.nn.Linear
    t = torch.tensor([[1, 2, 3]])
    h = sd["emb.weight"][t].double()
    h = h @ ra.w_deq.T
    h = h.half().double() @ rb.w_deq.T + sd["b.bias"].double()
    ref = h.half().double() @ sd["head.weight"].double().T
    assert rel_err(model(t), ref) <= 2e-2


def test_load_checkpoint_model_is_atomic():
    sd, _, _ = _two_checkpoint()
    sd["b.scales"] = sd["b.scales"][:, :8]             # a broken second layer
    model = _Two().half()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="layer 'b'"):
        load_gptq_model(model, sd, bits=4, group_size=64)
    assert type(model.a) is torch.nn.Linear and type(model.b) is torch.nn.Linear
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    sd, _, _ = _two_checkpoint()
    sd["emb.weight"] = sd["emb.weight"][:, :8]         # a bad float tensor: checked before the swap too
    with pytest.raises(ValueError, match="emb.weight"):
        load_gptq_model(model, sd, bits=4, group_size=64)
    assert type(model.a) is torch.nn.Linear
