"""The one place bitblas imports TVM: version pins checked first, TVMScript imports made fast."""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys

__all__ = ["REQUIRED_TVM", "REQUIRED_TVM_FFI", "check_versions", "tvm", "tensor_intrin_cuda"]

REQUIRED_TVM = "0.27.0.post1"
REQUIRED_TVM_FFI = "0.1.14.post1"


def installed(dist: str, module: str):
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(dist)
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    try:
        return getattr(importlib.import_module(module), "__version__", None)
    except ImportError:
        return None


def check_versions() -> None:
    """ImportError naming the pins unless apache-tvm and apache-tvm-ffi are exactly the pinned ones.

    Other tvm-ffi versions break TVM's ABI: 0.1.15.x segfaults on any IR JSON serialisation
    (tensorize, pickling expressions), so bitblas refuses to run on them.
    """
    ffi = installed("apache-tvm-ffi", "tvm_ffi")
    tvm_v = installed("apache-tvm", "tvm")
    if ffi != REQUIRED_TVM_FFI or (tvm_v is not None and tvm_v != REQUIRED_TVM):
        raise ImportError(
            f"bitblas needs apache-tvm=={REQUIRED_TVM} with apache-tvm-ffi=={REQUIRED_TVM_FFI} exactly; found "
            f"apache-tvm {tvm_v or 'missing'}, apache-tvm-ffi {ffi or 'missing'}. Fix with: pip install "
            f"'apache-tvm=={REQUIRED_TVM}' 'apache-tvm-ffi=={REQUIRED_TVM_FFI}' (tvm-ffi 0.1.15 segfaults)")


def __getattr__(name):  # lazy: `from bitblas._tvm import tvm` imports TVM on first use only
    if name == "tvm":
        tvm = importlib.import_module("tvm")
        _patch(tvm)
        return tvm
    raise AttributeError(name)


def _patch(tvm) -> None:
    """0.27.0.post1: the wgmma register fence (``T.cuda.wgmma.noop_barrier``) reads
    ``TensorLoad.dtype``, which the class lacks; its type carries it."""
    if not hasattr(tvm.ir.TensorLoad, "dtype"):
        tvm.ir.TensorLoad.dtype = property(lambda self: self.ty.dtype)


@contextlib.contextmanager
def _cheap_inspect_stack():
    """TVMScript's decorator calls inspect.stack(), which reads source files for every frame
    (~20 s to import tvm.s_tir.tensor_intrin); frames without context give identical output."""
    orig = inspect.stack

    def cheap(context=1):
        out, f = [], sys._getframe(1)
        while f is not None:
            out.append(inspect.FrameInfo(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None))
            f = f.f_back
        return out

    inspect.stack = cheap
    try:
        yield
    finally:
        inspect.stack = orig


def tensor_intrin_cuda():
    """tvm.s_tir.tensor_intrin.cuda, imported in ~2 s instead of ~20 s."""
    if "tvm.s_tir.tensor_intrin.cuda" not in sys.modules:
        with _cheap_inspect_stack():
            importlib.import_module("tvm.s_tir.tensor_intrin.cuda")
    return sys.modules["tvm.s_tir.tensor_intrin.cuda"]
