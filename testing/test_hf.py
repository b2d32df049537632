"""transformers integration (bitblas.hf): quantize on load, save / reload, meta skeletons, generate,
torch.compile, on small Llama, Qwen2 and Mistral models built from configs with random weights (CPU).

Skips without transformers (``pip install -e ".[hf]"``)."""
from __future__ import annotations

import functools
import json
import os

import pytest
import torch
import torch.nn as nn

transformers = pytest.importorskip("transformers")

import bitblas  # noqa: E402
from bitblas.hf import BitBLASConfig  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

ARCHS = {
    "llama": transformers.LlamaConfig,
    "qwen2": transformers.Qwen2Config,        # q/k/v with bias
    "mistral": transformers.MistralConfig,
}
QCFG = dict(W_dtype="uint4", group_size=128)   # the README's call: zero points on by default for uint4
MIN_COS = 0.98          # uint4 g128 on random weights (measured 0.987-0.989, method="rtn" 0.985;
#                         clamping negatives gave 0.008; the best uniform grid per group: ~0.988)


def _config(arch, **kw):
    base = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    return ARCHS[arch](**(base | kw))


def _ids(s=12, seed=0):
    return torch.randint(0, 256, (2, s), generator=torch.Generator().manual_seed(seed))


def cosine(a, b):
    return float(nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), 0))


class Case:
    def __init__(self, arch, tmp):
        torch.manual_seed(0)
        self.arch = arch
        self.ref = AutoModelForCausalLM.from_config(_config(arch), dtype=torch.float16).eval()
        self.float_dir = str(tmp / "float")
        self.ref.save_pretrained(self.float_dir)
        self.q = AutoModelForCausalLM.from_pretrained(self.float_dir, dtype=torch.float16,
                                                      quantization_config=BitBLASConfig(**QCFG))
        self.saved_dir = str(tmp / "bitblas")
        self.q.save_pretrained(self.saved_dir)
        with torch.no_grad():
            self.ref_logits = self.ref(_ids()).logits
            self.q_logits = self.q(_ids()).logits


@pytest.fixture(scope="module", params=list(ARCHS))
def case(request, tmp_path_factory):
    return Case(request.param, tmp_path_factory.mktemp(request.param))


def test_quantize_on_load_matches_quantize_model(case):
    q = case.q
    layers = {n: m for n, m in q.named_modules() if isinstance(m, bitblas.Linear)}
    assert len(layers) == 7 * 2 and type(q.lm_head) is nn.Linear
    assert all(m.W_dtype == "uint4" and m.with_zeros for m in layers.values())
    # the same tensors quantize_model gives on the float model
    ref = AutoModelForCausalLM.from_config(_config(case.arch), dtype=torch.float16).eval()
    ref.load_state_dict(case.ref.state_dict())
    bitblas.quantize_model(ref, QCFG, skip=["lm_head"])
    want = ref.state_dict()
    got = q.state_dict()
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_quantize_on_load_never_holds_the_float_model(tmp_path, monkeypatch):
    """Each float weight is quantized as it is read: when a layer is quantized, the layers still waiting
    hold no float weight (they are meta), and the ones done hold only packed tensors."""
    from bitblas import hf
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(_config("llama"), dtype=torch.float16).save_pretrained(tmp_path)
    seen = []
    orig = hf._Quantize.convert

    def convert(self, input_dict, model=None, full_layer_name=None, **kw):
        pending = self.hf_quantizer._pending
        seen.append((sum(not model.get_submodule(n).weight.is_meta for n in pending),
                     sum(type(m) is nn.Linear and m.weight.device.type != "meta" and n != "lm_head"
                         for n, m in model.named_modules())))
        return orig(self, input_dict, model=model, full_layer_name=full_layer_name, **kw)
    monkeypatch.setattr(hf._Quantize, "convert", convert)
    AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float16, quantization_config=BitBLASConfig(**QCFG))
    assert len(seen) == 14 and all(s == (0, 0) for s in seen), seen


def test_logits_close_to_float(case):
    cos = cosine(case.ref_logits, case.q_logits)
    print(f"\n{case.arch}: logits cosine {cos:.4f}, max |diff| "
          f"{float((case.ref_logits - case.q_logits).abs().max()):.4f}")
    assert cos >= MIN_COS


def test_generate(case):
    ids = _ids(6, seed=1)
    out = case.q.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, 10) and torch.equal(out[:, :6], ids)
    with torch.no_grad():            # greedy: the first new token is the argmax of the prompt's last logits
        assert torch.equal(out[:, 6], case.q(ids).logits[:, -1].argmax(-1))


def test_save_records_config_and_reload_is_exact(case):
    with open(os.path.join(case.saved_dir, "config.json")) as fh:
        qc = json.load(fh)["quantization_config"]
    assert qc["quant_method"] == "bitblas" and qc["W_dtype"] == "uint4" and qc["group_size"] == 128
    q2, info = AutoModelForCausalLM.from_pretrained(case.saved_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert q2.dtype == torch.float16
    a, b = case.q.state_dict(), q2.state_dict()
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    with torch.no_grad():
        assert torch.equal(q2(_ids()).logits, case.q_logits)


def test_meta_skeleton_loads_saved_state(case):
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(_config(case.arch), dtype=torch.float16)
    bitblas.quantize_model(m, QCFG, skip=["lm_head"])
    assert all(b.is_meta for n, b in m.named_buffers() if n.endswith("qweight"))
    m.load_state_dict(case.q.state_dict(), assign=True)
    m.eval()
    # buffers a checkpoint does not hold (rotary inv_freq) are rebuilt by the model
    m.model.rotary_emb.inv_freq = case.q.model.rotary_emb.inv_freq
    with torch.no_grad():
        assert torch.equal(m(_ids()).logits, case.q_logits)


def test_quantize_model_then_save_pretrained_round_trips(case, tmp_path):
    """quantize_model on a transformers model records the config, so save_pretrained / from_pretrained
    round-trip (the layers left float are listed in modules_to_not_convert)."""
    m = AutoModelForCausalLM.from_config(_config(case.arch), dtype=torch.float16).eval()
    m.load_state_dict(case.ref.state_dict())
    bitblas.quantize_model(m, dict(W_dtype="int4", group_size=64), skip=["lm_head", "*.mlp.down_proj"])
    qc = m.config.quantization_config
    assert isinstance(qc, BitBLASConfig) and qc.W_dtype == "int4" and qc.group_size == 64
    assert sorted(qc.modules_to_not_convert) == ["lm_head", "model.layers.0.mlp.down_proj",
                                                 "model.layers.1.mlp.down_proj"]
    m.save_pretrained(tmp_path)
    m2, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert type(m2.model.layers[1].mlp.down_proj) is nn.Linear
    assert isinstance(m2.model.layers[1].mlp.up_proj, bitblas.Linear)
    with torch.no_grad():
        assert torch.equal(m2(_ids()).logits, m(_ids()).logits)


def test_torch_compile(case):
    torch._dynamo.reset()
    compiled = torch.compile(case.q, backend="aot_eager")
    with torch.no_grad():
        out = compiled(_ids()).logits
    assert torch.equal(out, case.q_logits)


def test_backward_raises_a_clear_error(case):
    with pytest.raises(RuntimeError, match="no backward"):
        case.q(_ids()).logits.sum().backward()


def test_unsupported_layers_error_or_stay_float(tmp_path):
    """intermediate_size 1376 is not a multiple of group_size 128: an error naming the layer, or with
    skip_unsupported=True those layers stay float and the model saves and reloads."""
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(_config("llama", intermediate_size=1376, num_hidden_layers=1),
                                           dtype=torch.float16).eval()
    ref.save_pretrained(tmp_path / "f")
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.0\.mlp\.down_proj': group_size=128"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "f", dtype=torch.float16,
                                             quantization_config=BitBLASConfig(**QCFG))
    with pytest.warns(UserWarning, match=r"model\.layers\.0\.mlp\.down_proj"):
        q = AutoModelForCausalLM.from_pretrained(tmp_path / "f", dtype=torch.float16,
                                                 quantization_config=BitBLASConfig(**QCFG, skip_unsupported=True))
    down = q.model.layers[0].mlp.down_proj
    assert type(down) is nn.Linear and torch.equal(down.weight, ref.model.layers[0].mlp.down_proj.weight)
    assert isinstance(q.model.layers[0].mlp.up_proj, bitblas.Linear)
    q.save_pretrained(tmp_path / "q")
    q2, info = AutoModelForCausalLM.from_pretrained(tmp_path / "q", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(q2.model.layers[0].mlp.down_proj) is nn.Linear
    with torch.no_grad():
        assert torch.equal(q2(_ids()).logits, q(_ids()).logits)


def test_config_round_trip_and_errors(naming):
    from transformers.quantizers import AutoQuantizationConfig
    c = AutoQuantizationConfig.from_dict(BitBLASConfig(W_dtype="int4", group_size=64).to_dict())
    assert isinstance(c, BitBLASConfig) and c.W_dtype == "int4" and c.group_size == 64
    with naming(ValueError, "W_dtype"):
        BitBLASConfig(W_dtype="uint5")
    with pytest.raises(ValueError, match="groupsize"):
        BitBLASConfig(groupsize=64)
    c = AutoQuantizationConfig.from_dict(BitBLASConfig(method="rtn").to_dict())
    assert c.method == "rtn" and BitBLASConfig().method == "mse"
    with naming(ValueError, "method"):
        BitBLASConfig(method="gptq")
    with pytest.raises(ValueError, match=r"'dataset' is not a field.*quantize_model\(model, config, calibration="):
        BitBLASConfig(dataset=["some text"])


def test_method_reaches_quantize_on_load(tmp_path):
    """BitBLASConfig(method=...) quantizes each layer as quantize_weight(method=...) does."""
    from bitblas.quantization import quantize_weight
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(_config("llama"), dtype=torch.float16).eval()
    ref.save_pretrained(tmp_path)
    w = ref.model.layers[0].mlp.down_proj.weight
    for m in ("rtn", "mse"):
        q = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float16,
                                                 quantization_config=BitBLASConfig(**QCFG, method=m))
        got = q.model.layers[0].mlp.down_proj.unpacked()
        want = quantize_weight(w, "uint4", group_size=128, with_zeros=True, method=m)
        assert torch.equal(got["codes"].to(torch.int16), want.codes) and torch.equal(got["scales"], want.scale)
        assert torch.equal(got["zeros"], want.zeros)


def test_compressed_tensors_checkpoint_into_transformers_model(tmp_path):
    """A transformers model's Linear layers packed by compressed-tensors itself, loaded with
    load_compressed_tensors_model: the logits of the model with compressed-tensors' dequantized weights."""
    pytest.importorskip("compressed_tensors")
    from test_real_packers import ct_compress
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(_config("qwen2"), dtype=torch.float16).eval()
    sd, deq = {}, ref.state_dict()
    for name, m in ref.named_modules():
        if type(m) is nn.Linear and name != "lm_head":
            comp, w = ct_compress(m.weight.float(), 4, False, 32)
            sd.update({f"{name}.{k}": v for k, v in comp.items()})
            deq[f"{name}.weight"] = w.half()
    sd.update({k: v for k, v in ref.state_dict().items() if not any(k == n + ".weight" for n in
               (n for n, m in ref.named_modules() if type(m) is nn.Linear and n != "lm_head"))})
    ref.load_state_dict(deq)
    model = AutoModelForCausalLM.from_config(_config("qwen2"), dtype=torch.float16).eval()
    bitblas.nn.load_compressed_tensors_model(model, sd)
    assert isinstance(model.model.layers[0].self_attn.q_proj, bitblas.Linear)
    with torch.no_grad():
        a, b = ref(_ids()).logits, model(_ids()).logits
    assert cosine(a, b) >= 0.9999, cosine(a, b)
    model.save_pretrained(tmp_path)                                # the config is recorded: a round trip
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(_ids()).logits, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", list(ARCHS))
def test_gpu_quantize_on_load_save_reload_compile(arch, tmp_path):
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(_config(arch, hidden_size=256, intermediate_size=512),
                                           dtype=torch.float16).eval()
    ref.save_pretrained(tmp_path / "f")
    ref = ref.cuda()
    q = AutoModelForCausalLM.from_pretrained(tmp_path / "f", dtype=torch.float16, device_map="cuda",
                                             quantization_config=BitBLASConfig(**QCFG))
    assert q.model.layers[0].self_attn.q_proj.qweight.is_cuda
    ids = _ids().cuda()
    with torch.no_grad():
        a, b = ref(ids).logits, q(ids).logits
    assert cosine(a, b) >= MIN_COS - 0.01, cosine(a, b)
    out = q.generate(ids[:, :6], max_new_tokens=4, do_sample=False)
    assert out.shape == (2, 10)
    q.save_pretrained(tmp_path / "q")
    q2, info = AutoModelForCausalLM.from_pretrained(tmp_path / "q", device_map="cuda", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert torch.equal(q2(ids).logits, b)
        torch._dynamo.reset()
        c = torch.compile(q2)(ids).logits
    assert cosine(c, b) >= 0.9999


def test_gptq_act_order_checkpoint_saves_and_reloads(tmp_path):
    """load_gptq_model (act-order: each layer keeps an input permutation) on a transformers model, then
    save_pretrained / from_pretrained: the permutation and packed tensors come back exactly."""
    from nn_helpers import gptq_pack, ref_quantize
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(_config("llama"), dtype=torch.float16).eval()
    sd = {k: v for k, v in ref.state_dict().items()}
    for name, m in ref.named_modules():
        if type(m) is nn.Linear and name != "lm_head":
            r = ref_quantize(m.weight.float(), 4, 32, act_order=True, zmin=1, seed=len(sd))
            qweight, qzeros = gptq_pack(r, 4)
            del sd[f"{name}.weight"]
            sd.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": r.s,
                       f"{name}.g_idx": r.g_idx})
    model = AutoModelForCausalLM.from_config(_config("llama"), dtype=torch.float16).eval()
    bitblas.nn.load_gptq_model(model, sd, bits=4, group_size=32)
    assert model.model.layers[0].self_attn.q_proj.perm is not None
    model.save_pretrained(tmp_path)
    again, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert torch.equal(again.model.layers[0].self_attn.q_proj.perm, model.model.layers[0].self_attn.q_proj.perm)
    with torch.no_grad():
        assert torch.equal(again(_ids()).logits, model(_ids()).logits)


# -- checkpoints that need converting on load, whichever way transformers fills the layers ----------------
# A /1 save (signed codes two's complement) and a record-less one (Microsoft BitBLAS's Linear: qweight
# lop3-interleaved) only read right through bitblas.Linear's load hook. Loaders: "installed" (the
# installed transformers, through the quantizer's converter); "5.17-api" (transformers 5.17's HfQuantizer
# base class: no get_load_operations / serialized_names, get_weight_conversions() returns []); "assigning"
# (a loader that uses none of the quantizer's converters: every tensor assigned to the layer as it is).
_OLD_QCFG = dict(W_dtype="int4", group_size=64)      # signed: /1 bytes differ; lop3-interleaved: /2 bytes differ
_DEVICE_MAPS = {"none": None, "cpu": "cpu", "auto": "auto", "dict": {"": "cpu"}}


def _twos_complement_packed(codes: torch.Tensor) -> torch.Tensor:
    """int4 codes [N, K] as bitblas.Linear/1 stored them: two 4-bit two's complement fields a byte, the
    first in the low nibble."""
    u = (codes.long() & 15).reshape(codes.shape[0], -1, 2)
    return (u[..., 0] | (u[..., 1] << 4)).to(torch.uint8).view(torch.int8)


def _with_format(record: torch.Tensor, fmt: str) -> torch.Tensor:
    rec = json.loads(bytes(record.numpy()).decode())
    return torch.frombuffer(bytearray(json.dumps({**rec, "format": fmt}, sort_keys=True).encode()), dtype=torch.uint8)


class OldCheckpoints:
    """A tiny int4 Llama quantized on load and saved (bitblas.Linear/3), and its tensors rewritten into
    the /2 form (natural code order), the /1 form (also two's complement codes) and Microsoft BitBLAS's
    record-less form (the same bytes as /3), each a from_pretrained folder."""

    def __init__(self, tmp):
        import shutil
        from safetensors.torch import load_file, save_file
        from bitblas.quantization.utils import reorder_codes
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(_config("llama", num_hidden_layers=1), dtype=torch.float16) \
            .save_pretrained(tmp / "f")
        self.q = AutoModelForCausalLM.from_pretrained(tmp / "f", dtype=torch.float16,
                                                      quantization_config=BitBLASConfig(**_OLD_QCFG)).eval()
        self.dirs = {"v3": tmp / "v3"}
        self.q.save_pretrained(tmp / "v3")
        sd = load_file(str(tmp / "v3" / "model.safetensors"))
        self.layers = {n: m for n, m in self.q.named_modules() if isinstance(m, bitblas.Linear)}
        v2, v1, bb = dict(sd), dict(sd), dict(sd)
        for n, m in self.layers.items():
            assert b'"format": "bitblas.Linear/3"' in bytes(sd[f"{n}._extra_state"].numpy())
            v2[f"{n}.qweight"] = reorder_codes(sd[f"{n}.qweight"], 4, m._plan.w_order, inverse=True)
            v2[f"{n}._extra_state"] = _with_format(sd[f"{n}._extra_state"], "bitblas.Linear/2")
            v1[f"{n}.qweight"] = _twos_complement_packed(m.unpacked()["codes"])
            v1[f"{n}._extra_state"] = _with_format(sd[f"{n}._extra_state"], "bitblas.Linear/1")
            del bb[f"{n}._extra_state"]
            for form in (v2, v1):       # read as they are, the rewritten bytes give another model
                assert not torch.equal(form[f"{n}.qweight"], sd[f"{n}.qweight"])
        for name, tensors in (("v2", v2), ("v1", v1), ("bitblas", bb)):
            shutil.copytree(tmp / "v3", tmp / name)
            save_file(tensors, str(tmp / name / "model.safetensors"), metadata={"format": "pt"})
            self.dirs[name] = tmp / name

    @functools.cached_property
    def logits(self):           # CPU kernels: built on first use only
        with torch.no_grad():
            return self.q(_ids()).logits


@pytest.fixture(scope="module")
def old_checkpoints(tmp_path_factory):
    return OldCheckpoints(tmp_path_factory.mktemp("old"))


def _load_counting_deserialize(path, loader, monkeypatch, **kw):
    """from_pretrained with ``loader`` (see above); returns the model, its loading info and how many layers
    the quantizer's deserialize converter loaded."""
    from transformers.quantizers.base import HfQuantizer
    from bitblas import hf
    if loader == "5.17-api":
        monkeypatch.delattr(HfQuantizer, "get_load_operations", raising=False)
        monkeypatch.setattr(HfQuantizer, "get_weight_conversions", lambda self: [])
        monkeypatch.setattr(HfQuantizer, "update_weight_conversions",
                            lambda self, conversions, *args: conversions + self.get_weight_conversions())
    elif loader == "assigning":
        monkeypatch.setattr(hf.BitBLASHfQuantizer, "get_weight_conversions", lambda self: [], raising=False)
        monkeypatch.setattr(hf.BitBLASHfQuantizer, "get_load_operations", lambda self: {}, raising=False)
    calls = []
    orig = hf._Deserialize.convert

    def convert(self, input_dict, full_layer_name=None, **k):
        calls.append(full_layer_name)
        return orig(self, input_dict, full_layer_name=full_layer_name, **k)
    monkeypatch.setattr(hf._Deserialize, "convert", convert)
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kw)
    monkeypatch.undo()
    return model, info, len(calls)


@pytest.mark.parametrize("device_map", list(_DEVICE_MAPS))
@pytest.mark.parametrize("loader", ["installed", "5.17-api", "assigning"])
@pytest.mark.parametrize("form", ["v3", "v2", "v1", "bitblas"])
def test_old_checkpoints_convert_on_every_loading_path(old_checkpoints, form, loader, device_map, monkeypatch):
    """Each form reloads to the saved model's logits exactly, whatever fills the layers: through the
    quantizer's converter (all layers) or assigned by transformers and converted after loading; a /3
    save is not converted."""
    kw = {} if _DEVICE_MAPS[device_map] is None else {"device_map": _DEVICE_MAPS[device_map]}
    model, info, deserialized = _load_counting_deserialize(old_checkpoints.dirs[form], loader, monkeypatch, **kw)
    assert deserialized == (0 if loader == "assigning" else len(old_checkpoints.layers))
    if loader != "assigning":       # a record-less state is complete (the assigning loader's report is its own)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    for n, m in old_checkpoints.layers.items():
        assert torch.equal(model.get_submodule(n).qweight, m.qweight), n
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, old_checkpoints.logits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("loader", ["installed", "assigning"])
@pytest.mark.parametrize("form", ["v3", "v2", "v1", "bitblas"])
def test_gpu_old_checkpoints_convert_with_cuda_device_map(old_checkpoints, form, loader, monkeypatch):
    import copy
    ref = copy.deepcopy(old_checkpoints.q).cuda()
    model, info, deserialized = _load_counting_deserialize(old_checkpoints.dirs[form], loader, monkeypatch,
                                                           device_map="cuda")
    assert deserialized == (0 if loader == "assigning" else len(old_checkpoints.layers))
    if loader != "assigning":
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = _ids().cuda()
    for n, m in old_checkpoints.layers.items():
        got = model.get_submodule(n).qweight
        assert got.is_cuda and torch.equal(got.cpu(), m.qweight), n
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
