"""bitblas.arch: one Arch per target, from every spelling a user gives (no GPU needed)."""
from __future__ import annotations

import pytest

from bitblas.arch import Arch, arch_of, as_arch, UNKNOWN
from bitblas.build import target_arch


@pytest.mark.parametrize("spelling,sm,suffix", [
    ("nvidia/nvidia-h100", 90, "a"), ("nvidia/nvidia-a100", 80, ""), ("cuda -arch=sm_90a", 90, "a"),
    ("sm_89", 89, ""), ({"kind": "cuda", "arch": "sm_90a"}, 90, "a")])
def test_every_spelling_gives_an_arch(spelling, sm, suffix):
    a = target_arch(spelling)
    assert (a.kind, a.sm, a.suffix, a.arch) == ("cuda", sm, suffix, f"sm_{sm}{suffix}")
    assert target_arch(spelling) is a                 # made once per target
    assert a.wgmma == a.tma == a.pdl == (sm == 90)
    assert a.fp8_mma == (sm >= 89) and a.mma and a.cp_async and a.dp4a


def test_tags_get_the_devices_opt_in_shared_memory():
    """TVM's tags say 48 KB for every GPU; the Arch of a tag holds what a block of that device may
    opt in to, so the H100 tag gets the same kernels as an sm_90a target."""
    assert target_arch("nvidia/nvidia-h100").smem_per_block == 232448
    assert target_arch("nvidia/nvidia-a100").smem_per_block == 166912
    assert target_arch("cuda -arch=sm_90a").smem_per_block == 49152       # explicit limits are kept


def test_cpu_and_unknown():
    cpu = target_arch("llvm")
    assert cpu.kind == "cpu" and cpu.sm is None and not (cpu.mma or cpu.wgmma or cpu.pdl or cpu.fp8_cvt)
    assert arch_of(None) is UNKNOWN and as_arch(None) is UNKNOWN
    # an unknown CUDA arch is taken as sm_80-class: mma.sync yes, Hopper / float8 mma no
    assert UNKNOWN.mma and not (UNKNOWN.wgmma or UNKNOWN.pdl or UNKNOWN.fp8_mma) and UNKNOWN.fp8_cvt


def test_int_and_target_coercion():
    from bitblas.build import cuda_target
    assert as_arch(90).wgmma and not as_arch(80).wgmma and as_arch(89).fp8_mma
    t = cuda_target("sm_80")
    assert as_arch(t) is arch_of(t) and as_arch(t).sm == 80
    with pytest.raises(ValueError, match="arch='compute_90'"):
        Arch.parse("compute_90")


def test_tvm_target_environment_variable(monkeypatch):
    monkeypatch.delenv("BITBLAS_TARGET", raising=False)
    monkeypatch.setenv("TVM_TARGET", "nvidia/nvidia-h100")
    a = target_arch(None)
    assert a.sm == 90 and a.wgmma and a.smem_per_block == 232448


def test_device_facts_without_a_gpu(monkeypatch):
    """SM count: the Target's, else the local GPU's (pinned here), else 132; the rest from the
    DeviceSpec (generic, source="target", without a GPU of that arch)."""
    import bitblas.arch as arch_mod
    monkeypatch.setattr(arch_mod, "_LOCAL_SMS", [100])
    a = Arch.parse("sm_80")
    assert a.sm_count == 100
    assert a.spec.arch == "sm_80" and a.regs_per_sm > 0 and a.l2_bytes > 0


def test_h100_tag_gets_the_wgmma_kernels():
    """Issue 23: target="nvidia/nvidia-h100" runs what {"kind": "cuda", "arch": "sm_90a"} runs."""
    from bitblas import MatmulConfig
    from bitblas.build import cuda_target
    from bitblas.plan import make_plan
    from bitblas.schedule import WGMMAHint
    from bitblas.kernels import default_hint
    cfg = MatmulConfig(M=None, N=4096, K=4096, A_dtype="float16", W_dtype="float16", out_dtype="float16")
    plan = make_plan(cfg, "cuda", None)
    tag = default_hint(plan, cuda_target("nvidia/nvidia-h100"))
    assert isinstance(tag, WGMMAHint) and tag == default_hint(plan, cuda_target({"kind": "cuda", "arch": "sm_90a"}))


def _sm90() -> bool:
    import torch
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("rows", [1, 300])
def test_gpu_h100_tag_runs_the_wgmma_kernel(rows):
    """target="nvidia/nvidia-h100" on an H100 / H200: fp16 x fp16 runs the wgmma kernel (the tag
    used to get the mma.sync one: 48 KB of shared memory) and matches the reference."""
    import torch
    import bitblas
    from bitblas.reference import random_inputs, reference_matmul, relative_error, tolerance
    cfg = bitblas.MatmulConfig(M=None, N=1024, K=1024, A_dtype="float16", W_dtype="float16", out_dtype="float16")
    op = bitblas.Matmul(cfg, target="nvidia/nvidia-h100")
    assert op.choice("cuda", rows).template == "wgmma"
    inp = random_inputs(cfg, rows, device="cuda", seed=rows)
    out = torch.full((rows, 1024), float("nan"), dtype=torch.float16, device="cuda")
    op(**inp, output=out)
    torch.cuda.synchronize()
    assert relative_error(out.cpu(), reference_matmul(cfg, **inp)) <= tolerance(cfg)


def _sm_comparisons(path: str):
    """(line, text) of each comparison of an ``sm`` / ``cc`` name (``sm``, ``arch.sm``, ``self.cc``,
    ``min_sm``) with an integer literal in the code of ``path`` (strings and comments left out)."""
    import re
    import tokenize
    lines = {}
    with open(path) as f:
        for t in tokenize.generate_tokens(f.readline):
            if t.type in (tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
                continue
            lines[t.start[0]] = lines.get(t.start[0], "") + " " + t.string
    pat = re.compile(r"\b(sm|cc|\w+_sm|\w+_cc)\s+(>=|<=|==|!=|<|>|not in|in)\s+\(?\s*\d")
    return [(n, text.strip()) for n, text in sorted(lines.items()) if pat.search(text)]


def test_sm_numbers_are_compared_only_in_arch():
    """Feature checks read Arch flags (arch.mma, arch.wgmma, arch.pdl, ...), never ``sm >= N``:
    arch.py compares compute capabilities, and hardware.py (the DeviceSpec's per-family
    throughput, which arch.py imports) is the one other module allowed to."""
    import os
    import bitblas
    root = os.path.dirname(bitblas.__file__)
    found = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if f.endswith(".py") and rel not in ("arch.py", "hardware.py"):
                hits = _sm_comparisons(os.path.join(dirpath, f))
                if hits:
                    found[rel] = hits
    assert found == {}
    assert _sm_comparisons(os.path.join(root, "arch.py"))          # the check itself finds them
