"""What a user sees: visible logging, warnings for lossy quantization, safe quantize_model defaults,
a clear error for backward, meta skeletons and unsupported layers in quantize_model (CPU)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn

import bitblas
from bitblas.nn import QuantizationConfig
from bitblas.quantization import LossyQuantizationWarning, quantize_weight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, **env):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.pop("BITBLAS_LOG_LEVEL", None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_set_log_level_prints_and_import_touches_no_global_handler():
    r = _python("import logging; root = list(logging.getLogger().handlers)\n"
                "import bitblas\n"
                "assert logging.getLogger().handlers == root\n"
                "assert all(isinstance(h, logging.NullHandler) for h in logging.getLogger('bitblas').handlers)\n"
                "logging.getLogger('bitblas.cache').info('before-level')\n"
                "bitblas.set_log_level('INFO'); bitblas.set_log_level('INFO')\n"
                "assert len(logging.getLogger('bitblas').handlers) == 2\n"
                "logging.getLogger('bitblas.cache').info('after-level')\n"
                "logging.getLogger('bitblas.cache').debug('not-shown')\n")
    assert r.returncode == 0, r.stderr
    assert "after-level" in r.stderr and "before-level" not in r.stderr and "not-shown" not in r.stderr
    assert r.stderr.count("after-level") == 1


def test_env_log_level_prints():
    r = _python("import logging, bitblas; logging.getLogger('bitblas.tune').debug('env-debug')",
                BITBLAS_LOG_LEVEL="debug")
    assert r.returncode == 0, r.stderr
    assert "env-debug" in r.stderr
    r = _python("import bitblas", BITBLAS_LOG_LEVEL="LOUD")
    assert r.returncode != 0 and "BITBLAS_LOG_LEVEL='LOUD'" in r.stderr


def test_handler_defers_to_an_application_root_handler(capfd):
    """With a root handler (as here under pytest), records reach it once; the stderr handler is silent."""
    logger = logging.getLogger("bitblas")
    before = logger.level
    assert logging.getLogger().handlers
    try:
        bitblas.set_log_level("INFO")
        logging.getLogger("bitblas.x").info("only-through-root")
        assert "only-through-root" not in capfd.readouterr().err
    finally:
        logger.setLevel(before)
        for h in [h for h in logger.handlers if type(h).__name__ == "_StderrHandler"]:
            logger.removeHandler(h)


def _w(seed=0, n=16, k=64):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def test_lossy_clamps_warn():
    w = _w()
    with pytest.warns(LossyQuantizationWarning, match="clamped to 0"):
        quantize_weight(w, "uint4", group_size=32, with_zeros=False)
    with pytest.warns(LossyQuantizationWarning, match="without scales"):
        quantize_weight(w * 100, "int8", with_scaling=False)
    with pytest.warns(LossyQuantizationWarning, match="without scales"):
        quantize_weight(w * 1000, "float8_e4m3", with_scaling=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_weight(w, "uint4", group_size=32, with_zeros=True)
        quantize_weight(w, "int4", group_size=32)
        quantize_weight(w.clamp(-100, 100).round(), "int8", with_scaling=False)
    # a Linear built BitBLAS-style without zero points warns when a float weight is loaded
    lin = bitblas.Linear(64, 16, W_dtype="uint4", group_size=32)
    with pytest.warns(LossyQuantizationWarning, match="negative weights"):
        lin.load_and_transform_weight(w)


def test_quantize_model_defaults_keep_negative_weights():
    assert QuantizationConfig().zeros_default() is True                       # uint4
    assert QuantizationConfig(W_dtype="int4").zeros_default() is False
    assert QuantizationConfig(W_dtype="uint8", with_zeros=False).zeros_default() is False
    assert QuantizationConfig(W_dtype="nf4").zeros_default() is False
    m = nn.Sequential(nn.Linear(64, 16, bias=False)).half()
    w = m[0].weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bitblas.quantize_model(m, dict(W_dtype="uint4", group_size=32), skip=[])
    assert m[0].with_zeros
    cos = nn.functional.cosine_similarity(m[0].dequantized_weight().flatten(), w.float().flatten(), 0)
    assert cos > 0.99


def test_backward_through_a_layer_raises_a_clear_error():
    lin = bitblas.Linear(64, 16, W_dtype="int4", group_size=32, A_dtype="float32")
    lin.load_and_transform_weight(_w())
    x = torch.randn(3, 64)
    y0 = lin(x)
    assert y0.grad_fn is None and not y0.requires_grad
    xg = x.clone().requires_grad_()
    y = lin(xg)
    assert torch.equal(y.detach(), y0)
    with pytest.raises(RuntimeError, match=r"W_dtype='int4'\): bitblas layers are inference-only and have no "
                                           r"backward"):
        (y * 2).sum().backward()
    with torch.no_grad():
        assert lin(xg).grad_fn is None
    ql = bitblas.QuantLinear(64, 16, bits=4, group_size=32)       # a subclass with its own forward (casts)
    y = ql(xg)
    assert y.dtype == torch.float32 and torch.equal(y.detach(), ql(x))
    with pytest.raises(RuntimeError, match="QuantLinear.*no backward"):
        y.sum().backward()


def test_quantize_model_meta_skeleton_and_unsupported_layers(naming):
    def model():
        return nn.Sequential(nn.Linear(128, 1376), nn.ReLU(), nn.Linear(1376, 64)).half()
    ref = model()
    with torch.device("meta"):
        meta = model()
    with naming(ValueError, "'2'"):
        bitblas.quantize_model(meta, dict(W_dtype="uint4", group_size=64), skip=[])
    assert type(meta[0]) is nn.Linear                       # nothing changed
    with pytest.warns(UserWarning, match=r"1 layer\(s\) .* stay float: 2 \(group_size=64 must divide "
                                         r"in_features=1376\)"):
        bitblas.quantize_model(meta, dict(W_dtype="uint4", group_size=64), skip=[], skip_unsupported=True)
    assert meta.bitblas_skipped_layers == {"2": "group_size=64 must divide in_features=1376"}
    assert isinstance(meta[0], bitblas.Linear) and meta[0].qweight.is_meta and type(meta[2]) is nn.Linear
    q = model()
    q.load_state_dict(ref.state_dict())
    with pytest.warns(UserWarning, match="stay float"):
        bitblas.quantize_model(q, dict(W_dtype="uint4", group_size=64), skip=[], skip_unsupported=True)
    meta.load_state_dict(q.state_dict(), assign=True)
    x = torch.randn(2, 128).half()
    assert torch.equal(meta(x), q(x))
