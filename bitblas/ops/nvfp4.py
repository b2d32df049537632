"""NVFP4 x NVFP4: the operator behind ``Matmul`` for A_dtype="nvfp4", and ``nvfp4_gemv``.

Every kernel (bitblas/schedule/nvfp4.py) takes its tensors batched and strided, [L, rows, K/2]
with K contiguous: the views a caller has are passed as they are, never copied or repacked.
Which kernel serves a call:

* CPU tensors: the CPU kernel (symbolic rows and batch), one call;
* CUDA, up to ``NVFP4_GEMV_MAX_ROWS`` rows: the GEMV kernel of exactly that many rows, one
  launch for the whole batch;
* CUDA from ``GEMM_MIN_ROWS`` rows where the dense wgmma GEMM serves float16 (sm_90): per batch
  index, both operands decoded to float16 with their block scales (exact: at most 6 significant
  bits, |v| <= 2688), then the dense wgmma GEMM (bitblas/schedule/cuda_wgmma.py) with float32
  accumulation, the global scales on its float32 output when given;
* CUDA otherwise: the GEMV in chunks of ``NVFP4_GEMV_MAX_ROWS`` rows (views of the rows).

``nvfp4_gemv(a, b, sfa, sfb, c)`` takes the five tensors of the batched-GEMV workload in their
permuted layouts (a [M, K/2, L] with strides (K/2, 1, M*K/2), b padded to 128 rows, ...) and
runs the GEMV with W = a, A = row 0 of b: c[:, 0, l] = decode(a[:, :, l]) @ decode(b[0, :, l]).
"""
from __future__ import annotations

import threading
from typing import Dict, Optional

import torch

from ..config import MatmulConfig
from ..plan import make_plan
from ..quantization.quantize import TORCH_DTYPES
from ..schedule.nvfp4 import NVFP4_GEMV_MAX_ROWS, gemv_smem_bytes

__all__ = ["NVFP4Matmul", "GEMM_MIN_ROWS", "CODE_DTYPES", "SCALE_DTYPES"]

GEMM_MIN_ROWS = 17          # from here decode-then-GEMM on sm_90 (the brief's M > 16; not yet measured)
CODE_DTYPES = (torch.uint8, torch.int8) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ())
SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8, torch.int8)
INT32_MAX = 2 ** 31 - 1


def dtype_names(dtypes) -> str:
    return ", ".join(str(d) for d in dtypes)


def max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0)


class NVFP4Matmul:
    """Runs ``Matmul(config)`` for ``config.A_dtype == "nvfp4"`` (see the module docstring).

    Kernels are built lazily and shared by every batch size: their plans are those of
    ``config.replace(M=None, batch=None)`` with the activation rows of the kernel."""

    def __init__(self, config: MatmulConfig, target_fn=None):
        self.config = config
        self._target_fn = target_fn           # () -> the CUDA Target (resolved lazily, like Matmul's)
        self._kcfg = config.replace(M=None, batch=None)
        self._fns: Dict[tuple, object] = {}
        self._consts: Dict[torch.device, torch.Tensor] = {}
        self._lock = threading.Lock()

    # -- kernels ---------------------------------------------------------------------------
    def _target(self):
        return self._target_fn()

    def cpu_kernel(self):
        fn = self._fns.get(("cpu",))
        if fn is None:
            from ..cache.kernels import get_kernel
            fn = self._fns[("cpu",)] = get_kernel(make_plan(self._kcfg, "cpu", None))[0]
        return fn

    def gemv_plan(self, m: int):
        return make_plan(self._kcfg, "cuda", m)

    def gemv_kernel(self, m: int, hint=None):
        key = ("gemv", m, hint)
        fn = self._fns.get(key)
        if fn is None:
            from ..cache.kernels import get_kernel
            fn = self._fns[key] = get_kernel(self.gemv_plan(m), hint, target=self._target())[0]
        return fn

    def gemv_rows(self) -> int:
        """Activation rows of one GEMV launch: up to NVFP4_GEMV_MAX_ROWS, as many as the staged rows'
        shared memory allows."""
        from ..arch import arch_of
        from ..schedule.nvfp4 import gemv_smem_cap
        cap = gemv_smem_cap(arch_of(self._target()))
        m = NVFP4_GEMV_MAX_ROWS
        while m > 1 and gemv_smem_bytes(self.config.K, m) > cap:
            m -= 1
        return m

    def _gemm_hint(self, rows: int):
        """The dense wgmma GEMM's tiles for ``rows`` (None: this target has no wgmma GEMM)."""
        from ..kernels import default_hint
        from ..schedule import WGMMAHint
        key = ("gemm-hint", rows)
        if key not in self._fns:
            dense = self._dense_config("float16")
            hint = default_hint(make_plan(dense, "cuda", rows), self._target())
            self._fns[key] = hint if isinstance(hint, WGMMAHint) else None
        return self._fns[key]

    def _dense_config(self, out_dtype: str) -> MatmulConfig:
        c = self.config
        return MatmulConfig(M=None, N=c.N, K=c.K, A_dtype="float16", W_dtype="float16", out_dtype=out_dtype)

    def _gemm_kernel(self, rows: int, out_dtype: str):
        from ..cache.kernels import get_kernel
        hint = self._gemm_hint(rows)
        key = ("gemm", out_dtype, hint)
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = get_kernel(make_plan(self._dense_config(out_dtype), "cuda", None), hint,
                                             target=self._target())[0]
        return fn

    def _decode_kernel(self):
        fn = self._fns.get(("decode",))
        if fn is None:
            fn = self._fns[("decode",)] = build_decode(self.config.K, self._target())
        return fn

    def uses_gemm(self, rows: int) -> bool:
        """Whether a CUDA call with ``rows`` rows takes decode-then-GEMM."""
        return rows >= GEMM_MIN_ROWS and self._gemm_hint(rows) is not None

    def _one(self, device) -> torch.Tensor:
        t = self._consts.get(device)
        if t is None:
            t = self._consts[device] = torch.ones(1, dtype=torch.float32, device=device)
        return t

    # -- calling -----------------------------------------------------------------------------
    def run(self, A, W, given: dict):
        """``Matmul.forward`` for nvfp4 activations: checks the user tensors (batched: [L, rows, .];
        else [..., .] with the leading dimensions as rows), views them as the kernels' [L, rows, .]
        and runs them; returns the output."""
        c = self.config
        for name in ("zeros", "bias"):
            if given.get(name) is not None:
                raise ValueError(f"{name} given, but A_dtype='nvfp4' configs take none")
        if given.get("scale") is None or given.get("a_scale") is None:
            missing = "scale" if given.get("scale") is None else "a_scale"
            raise ValueError(f"{missing} is required by this config (the float8_e4m3 block scales, one per 16 K "
                             "elements)")
        if not isinstance(A, torch.Tensor):
            raise TypeError(f"A: expected a torch.Tensor, got {type(A).__name__}")
        device = A.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"A is on {device}; accepted devices: cpu, cuda")
        K2, KS = c.K // 2, c.K // 16
        A3 = _view3("A", A, _CODES, K2, c.batch)
        L, rows = A3.shape[0], A3.shape[1]
        W3 = _view3("W", W, _CODES, K2, c.batch, device=device, rows=c.N, L=L)
        S3 = _view3("scale", given["scale"], _SCALES, KS, c.batch, device=device, rows=c.N, L=L)
        B3 = _view3("a_scale", given["a_scale"], _SCALES, KS, c.batch, device=device, rows=rows, L=L)
        gw = _global("global_scale", given.get("global_scale"), device)
        ga = _global("a_global_scale", given.get("a_global_scale"), device)
        out = given.get("output")
        lead = (L,) if c.batch is not None else tuple(A.shape[:-1])
        want = TORCH_DTYPES[c.out_dtype]
        if out is None:
            out = torch.empty(*lead, rows, c.N, dtype=want, device=device) if c.batch is not None else \
                torch.empty(*lead, c.N, dtype=want, device=device)
        O3 = _out3(out, want, device, (*lead, rows, c.N) if c.batch is not None else (*lead, c.N), L, rows, c.N)
        if rows == 0 or L == 0 or c.N == 0:
            return out
        if device.type == "cuda":
            check_cuda_layout((("A", A3, 16), ("W", W3, 16), ("scale", S3, 2), ("a_scale", B3, 2)))
        self.launch(A3, W3, S3, B3, gw, ga, O3)
        return out

    def launch(self, A3, W3, S3, B3, gw, ga, O3, hint=None):
        """Run the kernels on checked [L, rows, .] views (``gw`` / ``ga``: float32 [1] or None)."""
        device = A3.device
        one = self._one(device)
        g1, g2 = (gw if gw is not None else one), (ga if ga is not None else one)
        rows = A3.shape[1]
        if device.type == "cpu":
            self.cpu_kernel()(A3, W3, S3, B3, g1, g2, O3)
            return
        if self.uses_gemm(rows) and hint is None:
            self._launch_gemm(A3, W3, S3, B3, gw, ga, O3)
            return
        step = self.gemv_rows()
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            self.gemv_kernel(r1 - r0, hint)(A3[:, r0:r1], W3, S3, B3[:, r0:r1], g1, g2, O3[:, r0:r1])

    def _launch_gemm(self, A3, W3, S3, B3, gw, ga, O3):
        """Per batch index: decode both operands to float16 (exact), then the dense wgmma GEMM."""
        c = self.config
        L, rows = A3.shape[0], A3.shape[1]
        scaled = gw is not None or ga is not None
        gemm_dtype = "float32" if scaled else c.out_dtype
        gemm = self._gemm_kernel(rows, gemm_dtype)
        dec = self._decode_kernel()
        dev = A3.device
        wa = torch.empty(rows, c.K, dtype=torch.float16, device=dev)
        ww = torch.empty(c.N, c.K, dtype=torch.float16, device=dev)
        direct = (not scaled and O3[0].is_contiguous() and O3.data_ptr() % 16 == 0
                  and O3.stride(0) * O3.element_size() % 16 == 0)
        tmp = None if direct else torch.empty(rows, c.N, dtype=TORCH_DTYPES[gemm_dtype], device=dev)
        for lb in range(L):
            dec(A3[lb], B3[lb], wa)
            dec(W3[lb], S3[lb], ww)
            if direct:
                gemm(wa, ww, O3[lb])
                continue
            gemm(wa, ww, tmp)
            v = tmp
            for g in (gw, ga):
                if g is not None:
                    v = v * g
            O3[lb].copy_(v)

    def source(self, m: int, kind: str = "cuda") -> str:
        from ..build import cuda_source, lower_plan
        if kind == "cpu":
            return lower_plan(make_plan(self._kcfg, "cpu", None)).script()
        if self.uses_gemm(m):
            dec = decode_source(self.config.K, self._target())
            dense = make_plan(self._dense_config(self.config.out_dtype), "cuda", None)
            return dec + "\n// ---- dense GEMM on the decoded operands ----\n" + cuda_source(dense, self._target(),
                                                                                               self._gemm_hint(m))
        return cuda_source(self.gemv_plan(min(m, self.gemv_rows())), self._target())


# ------------------------------------------------------------------------------------------------
# argument checks: clear errors in Python before any kernel sees a pointer
# ------------------------------------------------------------------------------------------------
# what each packed operand holds: (accepted dtypes, the dtype error's words, what one element of the last
# dimension is)
_CODES = (CODE_DTYPES, f"e2m1 codes two per byte ({dtype_names(CODE_DTYPES)})", "two e2m1 codes per byte")
_SCALES = (SCALE_DTYPES, "float8_e4m3fn block scales (or their bits as uint8 / int8)", "one scale per 16 K elements")


def _view3(name, t, kind, cols, batch, device=None, rows=None, L=None) -> torch.Tensor:
    """Codes (``_CODES``) or block scales (``_SCALES``) as an int8 [L, rows, cols] view (no copy),
    checked: type, dtype, device, shape (``rows``, batch ``L`` where given), contiguous along K."""
    dtypes, expected, what = kind
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected {expected}, got {t.dtype}")
    t = t.view(torch.int8)
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but A is on {device}; put all tensors on one device")
    if batch is not None:
        if t.dim() != 3:
            raise ValueError(f"{name}: expected [batch={batch}, rows, {cols}] ({what}), got shape {list(t.shape)}")
        v = t
        if v.shape[0] != batch:
            raise ValueError(f"{name}: batch dimension {v.shape[0]} != config.batch={batch}")
    else:
        if t.dim() < 1:
            raise ValueError(f"{name}: expected [..., {cols}] ({what}), got a scalar")
        try:
            v = (t.unsqueeze(0) if t.dim() == 2 else t.view(1, -1, t.shape[-1])) if t.dim() != 1 else t.view(1, 1, -1)
        except RuntimeError:
            raise ValueError(f"{name}: the leading dimensions of shape {list(t.shape)} (strides {list(t.stride())}) "
                             "cannot be viewed as one row dimension; pass a 2-D tensor") from None
    if v.shape[-1] != cols:
        raise ValueError(f"{name}: expected {cols} in the last dimension ({what}), got shape {list(t.shape)}")
    if rows is not None and v.shape[1] != rows:
        raise ValueError(f"{name}: expected {rows} rows, got shape {list(t.shape)}")
    if L is not None and v.shape[0] != L:
        raise ValueError(f"{name}: batch dimension {v.shape[0]} != A's {L}")
    if cols > 1 and v.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along K (stride 1 in its last dimension), got strides "
                         f"{list(t.stride())}")
    if max_offset(v) > INT32_MAX:
        raise NotImplementedError(f"{name}: offsets beyond 2**31 elements are not supported")
    return v


def _global(name, g, device) -> Optional[torch.Tensor]:
    if g is None:
        return None
    if not isinstance(g, torch.Tensor) or g.dtype != torch.float32 or g.numel() != 1:
        raise ValueError(f"{name}: expected a float32 tensor of one element, got "
                         f"{getattr(g, 'dtype', type(g).__name__)} {list(getattr(g, 'shape', []))}")
    if g.device != device:
        raise ValueError(f"{name} is on {g.device} but A is on {device}; put all tensors on one device")
    return g.reshape(1)


def _out3(out, want, device, shape, L, rows, N) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"output: expected a torch.Tensor, got {type(out).__name__}")
    if out.dtype != want:
        raise TypeError(f"output: expected dtype {want}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"output is on {out.device} but A is on {device}; put all tensors on one device")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"output: expected shape {list(shape)}, got {list(out.shape)}")
    try:
        o = out if out.dim() == 3 and out.shape[0] == L else out.view(L, rows, N)
    except RuntimeError:
        raise ValueError(f"output: shape {list(out.shape)} with strides {list(out.stride())} cannot be viewed as "
                         f"[{L}, {rows}, {N}]") from None
    if max_offset(o) > INT32_MAX:
        raise NotImplementedError("output: offsets beyond 2**31 elements are not supported")
    return o


def check_cuda_layout(views) -> None:
    """The CUDA kernels read codes in 16-byte vectors and scale pairs as 2-byte words: (name, [L,
    rows, .] view, alignment in bytes) each."""
    for name, v, align in views:
        bad = [s for s, n in zip(v.stride()[:2], v.shape[:2]) if n > 1 and s % align]
        if v.data_ptr() % align or bad:
            raise ValueError(f"{name}: the CUDA kernels need its data pointer and its row / batch strides to be "
                             f"multiples of {align} bytes (got pointer offset {v.data_ptr() % align}, strides "
                             f"{list(v.stride())})")


# ------------------------------------------------------------------------------------------------
# the decode kernel (decode-then-GEMM)
# ------------------------------------------------------------------------------------------------
_DEC: Dict[tuple, object] = {}
_DEC_LOCK = threading.Lock()


def _compile_decode(K: int, target):
    from ..build import PASS_CONFIG, compile_module
    from .._tvm import tvm
    from ..schedule.nvfp4 import decode_module
    with tvm.transform.PassContext(config=PASS_CONFIG):
        return compile_module(decode_module(K, target), target)


def build_decode(K: int, target):
    """The decode kernel for ``K`` on ``target`` (memory-cached): ``fn(codes, scales, out)``."""
    key = (K, str(target))
    with _DEC_LOCK:
        fn = _DEC.get(key)
    if fn is None:
        fn = _compile_decode(K, target)["main"]
        with _DEC_LOCK:
            fn = _DEC.setdefault(key, fn)
    return fn


def decode_source(K: int, target) -> str:
    return _compile_decode(K, target).mod.imports[0].inspect_source()
