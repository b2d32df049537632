"""bitblas.kernels: the template registry is the one place the tuner, the builder and the selector
learn about kernels; adding a template is one file plus one registry line (no GPU needed)."""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

import pytest

import bitblas
from bitblas import MatmulConfig, kernels
from bitblas.kernels import REGISTRY, KernelChoice, Template
from bitblas.kernels.base import Candidate

KERNELS_DIR = os.path.dirname(kernels.__file__)
SUPPORT = {"__init__.py", "base.py", "select.py", "_common.py", "_gemv.py", "costmodel.py"}


def test_one_file_per_registered_family():
    """Every template family file in bitblas/kernels/ is registered, and nothing else is."""
    files = sorted(f for f in os.listdir(KERNELS_DIR) if f.endswith(".py") and f not in SUPPORT)
    modules = sorted({type(t).__module__.rsplit(".", 1)[1] + ".py" for t in REGISTRY})
    assert files == modules
    assert len({t.name for t in REGISTRY}) == len(REGISTRY)
    for t in REGISTRY:
        assert isinstance(t, Template), t.name
        assert t.kind in ("cpu", "cuda") and dataclasses.is_dataclass(t.Hint)


def test_registry_order_and_count():
    """The registry, in default order: 12 templates, the GEMV one per kernel (issue 23 item 4)."""
    assert [t.name for t in REGISTRY] == ["nvfp4-cpu", "nvfp4-gemv", "cpu-gemv", "cpu", "gemv-rows", "gemv-ksplit",
                                          "gemv-mma", "gemv-wgmma", "wgmma", "fused-wgmma", "mma", "simple"]
    assert len({t.Hint for t in REGISTRY}) == len(REGISTRY)      # template_of: one template per hint class


def test_choice_is_a_frozen_key():
    a = KernelChoice("gemv", None, 8)
    assert a == KernelChoice("gemv", None, 8, tuned=True) and hash(a) == hash(KernelChoice("gemv", None, 8, tuned=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rows = 4


def test_only_tensorir_templates_emit_the_tensorir(monkeypatch):
    """Item 5: build.lower_plan emits emit_matmul's TensorIR only for templates that schedule it."""
    import bitblas.ir.matmul as ir
    from bitblas.build import cuda_target, lower_plan
    from bitblas.plan import make_plan
    calls = []
    orig = ir.emit_matmul
    monkeypatch.setattr(ir, "emit_matmul", lambda *a, **k: calls.append(1) or orig(*a, **k))
    w4 = MatmulConfig(M=None, N=256, K=256, A_dtype="float16", W_dtype="uint4", with_scaling=True, group_size=128)
    f16 = MatmulConfig(M=None, N=256, K=256, A_dtype="float16", W_dtype="float16")
    h100 = cuda_target("nvidia/nvidia-h100")
    lower_plan(make_plan(w4, "cuda", 1), None, h100)            # GEMV: written directly
    lower_plan(make_plan(f16, "cuda", None), None, h100)        # wgmma: written directly
    assert calls == []
    lower_plan(make_plan(w4, "cuda", None), None, cuda_target("sm_80"))    # mma.sync: schedules the TensorIR
    assert calls == [1]


@dataclasses.dataclass(frozen=True)
class ToyHint:
    threads: int = 96


class Toy:
    """A new template: takes fp16 x fp16 CUDA plans; builds the simple kernel with its own threads."""
    name = "toy"
    kind = "cuda"
    Hint = ToyHint
    needs_tir = True
    tune_order = 0
    tune_fallback = False

    def reason(self, plan, arch) -> Optional[str]:
        return None if plan.config.W_dtype == "float16" and not plan.nvfp4_acts else "fp16 weights only"

    def default(self, plan, arch, rows=None):
        return ToyHint() if self.reason(plan, arch) is None else None

    def space(self, plan, rows, arch):
        return [Candidate(None, ToyHint(t)) for t in (64, 96)] if self.reason(plan, arch) is None else []

    def cost(self, plan, hint, rows, arch) -> float:
        return 1e-6 * hint.threads

    def build(self, plan, hint, arch, func=None):
        from bitblas.schedule.cuda_simple import SimpleCUDAHint, schedule_cuda_simple
        return schedule_cuda_simple(func, plan, SimpleCUDAHint(threads=hint.threads))


def test_a_new_template_is_one_registry_line(monkeypatch):
    """Put a template first in the registry (the one line): the default hint, the selector, the
    tuner's candidate list and cost, and the builder all use it, with no other edit."""
    from bitblas.build import cuda_source
    from bitblas.plan import make_plan
    from bitblas.kernels import default_hint
    from bitblas.tune.space import estimate
    from bitblas.tune.space import candidates
    monkeypatch.setattr(kernels, "REGISTRY", (Toy(),) + REGISTRY)
    cfg = MatmulConfig(M=None, N=256, K=256, A_dtype="float16", W_dtype="float16")
    plan = make_plan(cfg, "cuda", None)
    assert default_hint(plan, None) == ToyHint()
    op = bitblas.Matmul(cfg, target="sm_80")
    assert op.choice("cuda", 300) == KernelChoice("toy", ToyHint(), None)
    cands = candidates(cfg, "cuda", 128)
    assert [c.hint for c in cands[:2]] == [ToyHint(64), ToyHint(96)]
    assert estimate(plan, ToyHint(64), 128) == pytest.approx(64e-6)
    assert "threadIdx" in cuda_source(plan, "sm_80", ToyHint(64))
    w4 = MatmulConfig(M=None, N=256, K=256, A_dtype="float16", W_dtype="uint4", with_scaling=True, group_size=128)
    assert not isinstance(default_hint(make_plan(w4, "cuda", None), None), ToyHint)   # its reason says no


def test_cuda_reason_steps():
    """The templates whose ``reason`` is _common.cuda_reason (mma, fused-wgmma): nvfp4 activations
    first, then the arch feature with the target's name, then the template's own check; an unknown
    arch (None) skips the feature step."""
    from bitblas.arch import arch_of
    from bitblas.build import cuda_target
    from bitblas.ops.compat import kernel_config
    from bitblas.plan import make_plan
    by_name = {t.name: t for t in REGISTRY}
    mma, fused = by_name["mma"], by_name["fused-wgmma"]

    def plan(kind="cuda", **fields):
        cfg = dict(M=None, N=256, K=256, A_dtype="float16", W_dtype="uint4", with_scaling=True, group_size=128)
        return make_plan(kernel_config(MatmulConfig(**{**cfg, **fields})), kind, None)

    sm75, sm80, sm90 = (arch_of(cuda_target(a)) for a in ("sm_75", "sm_80", "sm_90a"))
    w4, f32 = plan(), plan(A_dtype="float32", out_dtype="float32")
    nv = plan(A_dtype="nvfp4", W_dtype="nvfp4", group_size=16, with_act_scaling=True, out_dtype="bfloat16")
    for t in (mma, fused):
        assert t.reason(plan("cpu"), sm90) == "not a CUDA plan"
        assert t.reason(nv, sm75) == "nvfp4 activations (the nvfp4 templates take them)"
    assert mma.reason(f32, sm75) == "mma.sync needs sm_80+ (target: sm_75)"
    assert mma.reason(f32, sm80) == mma.reason(f32, None) == \
        "A_dtype=float32 (tensor-core template: float16 / bfloat16 activations)"
    assert mma.reason(w4, sm80) is None and mma.reason(w4, None) is None
    assert fused.reason(w4, sm80) == "wgmma needs sm_90 (target: sm_80)"
    assert fused.reason(f32, sm90) == fused.reason(f32, None) == \
        "A_dtype='float32': the fused wgmma GEMM takes float16 / bfloat16 / int8 / float8_e4m3 activations"
    assert fused.reason(w4, sm90) is None
