"""Reference packers' layers as the tests load them (written here).

auto-gptq 0.7.1's package ``__init__`` imports transformers 4.x names (``no_init_weights``), so under
transformers 5 ``import auto_gptq`` fails; its ``qlinear_cuda_old`` module needs none of that, so it
is loaded from its file by itself. Its CUDA extension is optional there: without it (CPU, or a torch
it was not built for) the layer runs its torch forward.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

_CACHE = {}


def autogptq_quantlinear(required: bool = True):
    """auto_gptq's ``qlinear_cuda_old.QuantLinear`` (Microsoft BitBLAS's ``CudaOldQuantLinear``): the
    package's own import where it works, else the module file. Without auto-gptq: skips the test
    (``required``) or returns None."""
    if "cuda_old" not in _CACHE:
        try:
            from auto_gptq.nn_modules.qlinear.qlinear_cuda_old import QuantLinear
        except ImportError:
            spec = importlib.util.find_spec("auto_gptq")
            if spec is None or spec.origin is None:
                if not required:
                    return None
                pytest.skip("needs auto-gptq (its QuantLinear is the reference; pip install -e '.[packers]')")
            path = os.path.join(os.path.dirname(spec.origin), "nn_modules", "qlinear", "qlinear_cuda_old.py")
            s = importlib.util.spec_from_file_location("_autogptq_qlinear_cuda_old", path)
            mod = importlib.util.module_from_spec(s)
            s.loader.exec_module(mod)
            QuantLinear = mod.QuantLinear
        _CACHE["cuda_old"] = QuantLinear
    return _CACHE["cuda_old"]
