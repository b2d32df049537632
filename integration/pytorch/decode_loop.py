"""Greedy decoding with a small Llama-style model: float16 beside bitblas W4A16 (uint4, group 128),
in eager mode and as a CUDA-graph replay of one decode step; logits agreement, tokens/s and the host
overhead of one bitblas.Linear call.

    python integration/pytorch/decode_loop.py                  # GPU if there is one, else CPU (small model)
    python integration/pytorch/decode_loop.py --json out.json  # also write the numbers

Random weights: the numbers measure speed and agreement with the float model, not text quality.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bitblas  # noqa: E402
from tiny_llama import TinyLlama, TinyLlamaConfig, cosine, greedy_decode  # noqa: E402


def graph_step(model, batch: int, device):
    """A decode step captured in a CUDA graph: step(token [B, 1], pos [1]) -> logits [B, 1, vocab]."""
    tok = torch.zeros(batch, 1, dtype=torch.long, device=device)
    pos = torch.zeros(1, dtype=torch.long, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # warm up (builds kernels, makes constant tables) off the graph
        for _ in range(2):
            model(tok, pos)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model(tok, pos)

    def step(t, p):
        tok.copy_(t)
        pos.copy_(p)
        g.replay()
        return out
    return step


def tokens_per_s(model, prompt, steps, step_fn=None, sync=lambda: None):
    greedy_decode(model, prompt, 4, step_fn)          # warm-up
    sync()
    t0 = time.perf_counter()
    out = greedy_decode(model, prompt, steps, step_fn)
    sync()
    dt = time.perf_counter() - t0
    return out, prompt.shape[0] * (steps - 1) / dt    # the prefill's token is not a decode step


def host_overhead_us(device, n=400, K=256, N=256):
    """Host time per call: ``n`` calls issued while the GPU is held busy (``torch.cuda._sleep``), so
    nothing waits for the GPU and the time is what the host spends per call (on the CPU: plain wall
    time per call). Also the wall time per call of back-to-back calls. For bitblas paths and F.linear."""
    lin = bitblas.Linear(K, N, A_dtype="float16", W_dtype="uint4", group_size=128, with_zeros=True).to(device)
    lin.load_and_transform_weight(torch.randn(N, K) * 0.05)
    x = torch.randn(1, K, dtype=torch.float16, device=device)
    x3 = x.view(1, 1, K)
    w16 = torch.randn(N, K, dtype=torch.float16, device=device)
    out = torch.empty(1, N, dtype=torch.float16, device=device)
    op = lin.bitblas_matmul
    lin(x)
    plan, fn = op._kernel(x.device.type, 1)
    raw_args = [x, lin.qweight, lin.scales, lin.zeros, out]
    custom = torch.ops.bitblas.matmul
    cases = {
        "bitblas.Linear forward, x [1, K]": lambda: lin(x),
        "bitblas.Linear forward, x [1, 1, K]": lambda: lin(x3),
        "Matmul call (output given)": lambda: op(x, lin.qweight, scale=lin.scales, zeros=lin.zeros, output=out),
        "torch.ops.bitblas.matmul (custom-op dispatch)": lambda: custom(x, lin.qweight, lin.scales, lin.zeros, None,
                                                                         None, None, lin._key),
        "kernel function only (tvm-ffi call + launch)": lambda: fn(*raw_args),
        "torch F.linear float16 (reference)": lambda: F.linear(x, w16),
    }
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = {}
    for name, f in cases.items():
        for _ in range(100):
            f()
        sync()
        host, wall = float("inf"), float("inf")
        for _ in range(5):
            if cuda:
                torch.cuda._sleep(200_000_000)        # ~0.1 s of GPU work queued ahead
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            host = min(host, (time.perf_counter() - t0) / n * 1e6)
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            sync()
            wall = min(wall, (time.perf_counter() - t0) / n * 1e6)
        res[name] = {"host_us": round(host, 2), "back_to_back_wall_us": round(wall, 2)}
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--intermediate", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="decode steps")
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph runs")
    p.add_argument("--no-overhead", action="store_true", help="skip the host-overhead measurement")
    p.add_argument("--w8", action="store_true", help="also report the logits of a uint8 (W8A16) copy")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:   # TinyLlama-1.1B's layer shapes, 4 layers
        cfg = TinyLlamaConfig(vocab_size=32000, hidden_size=a.hidden or 2048, intermediate_size=a.intermediate or 5632,
                              num_layers=a.layers or 4, num_heads=32, num_kv_heads=4, max_seq_len=256)
    else:
        cfg = TinyLlamaConfig(vocab_size=512, hidden_size=a.hidden or 256, intermediate_size=a.intermediate or 512,
                              num_layers=a.layers or 2, num_heads=4, num_kv_heads=2, max_seq_len=128)
    steps = a.steps or (128 if cuda else 16)
    torch.manual_seed(0)
    ref = TinyLlama(cfg).init_weights(0).half().to(dev)
    q = TinyLlama(cfg).half().to(dev)
    q.load_state_dict(ref.state_dict())
    t0 = time.perf_counter()
    bitblas.quantize_model(q, dict(W_dtype="uint4", group_size=128, with_zeros=True), skip=["lm_head"])
    t_quant = time.perf_counter() - t0
    for m in (ref, q):
        m.setup_cache(a.batch)
    prompt = torch.randint(0, cfg.vocab_size, (a.batch, a.prompt), device=dev,
                           generator=torch.Generator(device=dev).manual_seed(1))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = {"device": torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu",
           "torch": torch.__version__, "model": vars(cfg), "weights": "uint4 g128 zeros (method mse), lm_head float16",
           "batch": a.batch, "prompt": a.prompt, "steps": steps, "quantize_model_s": round(t_quant, 2)}
    try:
        res["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        pass
    with torch.inference_mode():
        start = torch.zeros(1, dtype=torch.long, device=dev)
        t0 = time.perf_counter()
        lq = q(prompt, start)          # builds the prefill kernels
        sync()
        res["first_prefill_s (builds kernels)"] = round(time.perf_counter() - t0, 2)
        lr = ref(prompt, start)
        res["prefill_logits"] = {"cosine": round(cosine(lr, lq), 6),
                                 "max_abs_diff": round(float((lr - lq).abs().max()), 4),
                                 "max_abs_logit": round(float(lr.abs().max()), 4)}
        t = prompt[:, -1:]
        pos = torch.tensor([a.prompt], device=dev)
        ld, lqd = ref(t, pos), q(t, pos)
        res["decode_logits"] = {"cosine": round(cosine(ld, lqd), 6),
                                "max_abs_diff": round(float((ld - lqd).abs().max()), 4)}
        if a.w8:      # the same model at 8 bits: agreement limited by quantization, not by the kernels
            q8 = TinyLlama(cfg).half().to(dev)
            q8.load_state_dict(ref.state_dict())
            bitblas.quantize_model(q8, dict(W_dtype="uint8", group_size=128, with_zeros=True), skip=["lm_head"])
            q8.setup_cache(a.batch)
            l8 = q8(prompt, start)
            res["prefill_logits_uint8_g128"] = {"cosine": round(cosine(lr, l8), 6),
                                                "max_abs_diff": round(float((lr - l8).abs().max()), 4)}
            del q8
        tps = {}
        out_ref, tps["float16 eager"] = tokens_per_s(ref, prompt, steps, sync=sync)
        out_q, tps["bitblas eager"] = tokens_per_s(q, prompt, steps, sync=sync)
        if cuda and not a.no_graph:
            _, tps["float16 CUDA graph"] = tokens_per_s(ref, prompt, steps, graph_step(ref, a.batch, dev), sync)
            out_g, tps["bitblas CUDA graph"] = tokens_per_s(q, prompt, steps, graph_step(q, a.batch, dev), sync)
            res["graph_tokens_equal_eager"] = bool(torch.equal(out_g, out_q))
        res["tokens_per_s"] = {k: round(v, 1) for k, v in tps.items()}
        res["greedy_tokens_agree_with_float16"] = round(float((out_ref == out_q).float().mean()), 3)
        if not a.no_overhead:
            res["host_us_per_call"] = host_overhead_us(dev)
    print(json.dumps(res, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
