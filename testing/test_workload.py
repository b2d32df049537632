"""Workloads from models: torch capture on a small transformer, the TVM pass on Relax / TIR modules
built here, and ``python -m bitblas tune`` pre-tuning a captured workload (CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bitblas
from bitblas.workload import capture, find_matmuls, load, workload_from_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Block(nn.Module):
    """LLaMA-style: q/k/v/o projections (nn.Linear), attention with explicit matmuls, a gated MLP."""

    def __init__(self, d=64, heads=4, ffn=96):
        super().__init__()
        self.h = heads
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up, self.down = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False), nn.Linear(ffn, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.h, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        att = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.o_proj(y)
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=100, d=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d), Block(d)])
        self.enc = nn.TransformerEncoderLayer(d, 4, dim_feedforward=80, batch_first=True)   # nn.MultiheadAttention
        self.head_w = nn.Parameter(torch.randn(d, vocab) * 0.02)                              # x @ W, layout nn

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        x = self.enc(x)
        return x @ self.head_w


@pytest.fixture(scope="module")
def workload():
    torch.manual_seed(0)
    model = TinyLM().eval()
    return capture(model, torch.randint(0, 100, (1, 7)), torch.randint(0, 100, (2, 33)),
                   torch.randint(0, 100, (1, 1)))


def _site(wl, name):
    hits = [s for s in wl.sites if s["name"] == name]
    assert len(hits) == 1, (name, [s["name"] for s in wl.sites])
    return hits[0]


def test_capture_records_linears_with_m_per_call(workload):
    wl = workload
    assert wl.calls == 3
    q = _site(wl, "layers.0.q_proj")
    assert (q["op"], q["N"], q["K"], q["layout"], q["weight"], q["with_bias"]) == ("linear", 64, 64, "nt", True, False)
    assert q["M_per_call"] == [7, 66, 1] and q["M"] == [1, 7, 66] and q["dynamic"]
    assert q["A_dtype"] == "float32" and q["count"] == 3
    down = _site(wl, "layers.1.down")
    assert (down["N"], down["K"], down["with_bias"]) == (64, 96, True)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate", "up", "down"):
        for i in (0, 1):
            _site(wl, f"layers.{i}.{name}")


def test_capture_records_attention_and_weight_matmul(workload):
    wl = workload
    # explicit attention products (activations x activations): one site each, N and batch vary too
    qk, pv = _site(wl, "layers.0.matmul#0"), _site(wl, "layers.0.matmul#1")
    assert not qk["weight"] and qk["M"] == [1, 7, 33] and qk["N"] == [1, 7, 33] and qk["batch"] == [4, 8]
    assert qk["shapes"] == [[4, 7, 7, 16], [8, 33, 33, 16], [4, 1, 1, 16]]
    assert pv["K"] == [1, 7, 33] and pv["N"] == 16
    # x @ head_w (an nn.Parameter [K, N]): a weight matmul with layout nn
    head = [s for s in wl.sites if s["weight"] and s["layout"] == "nn"]
    assert len(head) == 1 and (head[0]["N"], head[0]["K"]) == (100, 64) and head[0]["M"] == [1, 7, 66]
    assert head[0]["name"] == "matmul#0"
    # nn.TransformerEncoderLayer: MultiheadAttention's fused in/out projections and its MLP linears
    assert _site(wl, "enc.self_attn.in_proj")["N"] == 192
    assert _site(wl, "enc.self_attn.out_proj")["M"] == [1, 7, 66]
    assert _site(wl, "enc.linear1")["N"] == 80


def test_capture_json_roundtrip(workload, tmp_path):
    p = tmp_path / "wl.json"
    from bitblas.workload import save
    save(workload.to_dict(), str(p))
    d = load(str(p))
    assert d["schema"] == "bitblas-workload/1" and d["source"] == "torch" and d["model"] == "TinyLM"
    assert len(d["workloads"]) == len(workload.sites)
    p2 = tmp_path / "bad.json"
    p2.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="workload"):
        load(str(p2))


def test_capture_input_forms_and_errors():
    lin = nn.Linear(8, 4)
    wl = capture(lin, torch.randn(3, 8), (torch.randn(5, 8),), {"input": torch.randn(2, 2, 8)})
    assert wl.sites[0]["M_per_call"] == [3, 5, 4]
    with pytest.raises(TypeError, match="model"):
        capture(lambda x: x, torch.randn(1))
    with pytest.raises(ValueError, match="example input"):
        capture(lin)
    out = lin(torch.randn(1, 8))                       # hooks removed afterwards
    assert out.shape == (1, 4) and not lin._forward_pre_hooks


# -- TVM --------------------------------------------------------------------------------------------------
def _relax_module():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((1, "seq_len", 64), "float16"), w: R.Tensor((128, 64), "float16"),
                 w2: R.Tensor((64, 128), "float16"), q: R.Tensor((4, "seq_len", 16), "float16"),
                 k: R.Tensor((4, 16, "seq_len"), "float16")):
            with R.dataflow():
                y = R.linear(x, w)
                z = R.matmul(y, R.permute_dims(w2))
                s = R.matmul(q, k)
                R.output(z, s)
            return (z, s)
    return Mod


def test_tvm_pass_on_relax_module():
    found = find_matmuls(_relax_module())
    by_nk = {(f["N"], f["K"]): f for f in found}
    lin = by_nk[(128, 64)]
    assert lin["M"] == "seq_len" and lin["symbols"] == ["seq_len"] and lin["batch"] == 1 and lin["B_static"]
    assert lin["A_dtype"] == "float16" and lin["calls"] >= 1
    assert by_nk[(64, 128)]["M"] == "seq_len"
    att = by_nk[("seq_len", 16)]
    assert att["batch"] == 4 and att["M"] == "seq_len" and not att["B_static"]
    wl = workload_from_module(_relax_module(), "tiny")
    weights = [w for w in wl["workloads"] if w["weight"]]
    assert {(w["N"], w["K"]) for w in weights} == {(128, 64), (64, 128)}
    assert all(w["M"] is None and w["dynamic"] and w["symbols"] == ["seq_len"] for w in weights)
    assert not [w for w in wl["workloads"] if not w["weight"] and w["N"] != "seq_len"]


def test_tvm_pass_on_tir_and_as_a_pass():
    from bitblas._tvm import tvm
    from bitblas.ir.matmul import emit_matmul
    from bitblas.plan import make_plan
    from bitblas.workload import FindMatmuls
    cfg = bitblas.MatmulConfig(M=None, N=256, K=512, A_dtype="float16", W_dtype="uint4", group_size=128,
                               with_scaling=True)
    func = emit_matmul(make_plan(cfg, "cpu", None))
    (hit,) = find_matmuls(func)
    assert (hit["block"], hit["M"], hit["N"], hit["K"], hit["layout"], hit["symbols"]) == \
        ("C", "m", 256, 512, "nt", ["m"])
    static = emit_matmul(make_plan(cfg.replace(M=24), "cpu", 24))
    p = FindMatmuls()
    mod = tvm.IRModule({"a": static})
    assert p(mod).same_as(mod) or True                  # the pass leaves the module as it is
    assert [(f["func"], f["M"], f["symbols"]) for f in p.found] == [("a", 24, [])]


# -- the CLI ------------------------------------------------------------------------------------------------
def test_cli_tune_from_captured_workload(tmp_path, workload):
    """`python -m bitblas tune` on a torch-captured workload (CPU): one operator per distinct
    (N, K, bias) x format, buckets = the M seen, a summary table; a second run loads from the cache."""
    from bitblas.workload import save
    small = {**workload.to_dict()}
    small["workloads"] = [s for s in small["workloads"] if s["name"] in ("layers.0.q_proj", "layers.1.q_proj",
                                                                          "layers.0.down")]
    wpath = tmp_path / "wl.json"
    save(small, str(wpath))
    cmd = [sys.executable, "-m", "bitblas", "tune", "--workloads", str(wpath), "--formats", "uint4:g32:zeros",
           "int8", "--topk", "2", "--kind", "cpu", "--no-parallel", "--database", str(tmp_path / "db"),
           "--json", str(tmp_path / "out.json"), "--time-budget", "30", "--max-measure-rows", "8"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "4/4 operators tuned" in r.stdout, r.stdout
    res = json.load(open(tmp_path / "out.json"))["rows"]
    q = [x for x in res if x["N"] == 64 and x["K"] == 64]
    assert {x["bucket"] for x in q} == {1, 7, 66} and {x["format"] for x in q} == {"uint4:g32:zeros", "int8"}
    assert all(sorted(x["sites"]) == ["layers.0.q_proj", "layers.1.q_proj"] for x in q)   # deduplicated
    assert all(not x["cached"] and x["tuned_ms"] > 0 for x in res)
    assert all(x["measured_rows"] == min(x["bucket"], 8) for x in res)      # --max-measure-rows
    r2 = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert all(x["cached"] for x in json.load(open(tmp_path / "out.json"))["rows"])
    assert "cache" in r2.stdout


def test_cli_format_specs():
    from bitblas.tune.cli import parse_format
    assert parse_format("uint4:g128:zeros") == {"W_dtype": "uint4", "with_scaling": True, "group_size": 128,
                                                "with_zeros": True, "zeros_mode": "original"}
    assert parse_format("float16")["with_scaling"] is False
    assert parse_format("nvfp4")["group_size"] == 16
    assert parse_format("int4:noscale")["with_scaling"] is False
    with pytest.raises(ValueError, match="bogus"):
        parse_format("bogus")
    with pytest.raises(ValueError, match="x7"):
        parse_format("int4:x7")
