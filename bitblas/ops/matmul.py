"""The Matmul operator: checks torch inputs, picks (and lazily builds) the kernel, calls it.

CPU tensors run on the CPU (LLVM) backend, CUDA tensors on CUDA kernels for ``target``. Kernels
are built on first use for each (backend, row-count specialisation): a config with an int M gets a
kernel specialised to that M, and any other row count (or a dynamic M) a kernel symbolic in M.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Dict, Optional, Tuple

import torch

from ..config import MatmulConfig
from ..plan import M_VAR, Plan, make_plan
from ..quantization.quantize import TORCH_DTYPES, pack_weight
from ..kernels import KernelChoice
from ..kernels.select import DEQUANT_GEMM, kernel_rows, select
from .checks import base_align, check_tensor, why_not
from .compat import BitBLASOperatorAPI, kernel_config, runs_as_given

__all__ = ["Matmul", "MatmulConfig", "bias_for"]

logger = logging.getLogger(__name__)

# Positional extras after (A, W) fill these slots in this order (Microsoft BitBLAS's convention:
# op(A, W, output) with no scales; op(A, W, scale, zeros, bias, output) with them).
_POSITIONAL = ("scale", "zeros", "bias", "a_scale", "output")


class Matmul(BitBLASOperatorAPI):
    """``Matmul(config, target=None)``; ``op(A, W, scale=None, zeros=None, bias=None, output=None)``.

    A: [..., K] (int4 activations: [..., K / 2] packed); W: what :meth:`transform_weight` returns.
    Extra keywords: ``a_scale`` (per-token activation scale, with_act_scaling) and
    ``global_scale`` (nvfp4, float32 [1], default 1). Returns [..., N] in ``config.out_dtype``.
    """

    def __init__(self, config: MatmulConfig, target=None, enable_tuning: bool = False,
                 from_database: bool = False, backend: str = "tir", name: str = "matmul"):
        if not isinstance(config, MatmulConfig):
            raise TypeError(f"config: expected a bitblas.MatmulConfig, got {type(config).__name__}")
        if backend not in ("tir", "tl"):
            raise ValueError(f"backend={backend!r} is invalid; accepted: 'tir', 'tl' (the same kernels)")
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        self.config = config
        self.name = name
        # the config the kernels are built for (BitBLAS-only spellings mapped; see ops.compat)
        self._kc = kernel_config(config)
        self._as_given = runs_as_given(config, self._kc)   # else every call goes through _run_compat
        self._cpu_only = isinstance(target, str) and target in ("llvm", "cpu", "c")
        self._target_arg = None if self._cpu_only else target
        self._cuda_target = None
        if self._target_arg is not None:
            self._resolve_cuda_target()            # reject a bad target now, not at the first call
        self._arch = None                         # bitblas.arch.Arch of the CUDA target, made once
        self._kernels: Dict[Tuple[str, KernelChoice], Tuple[Plan, object]] = {}   # (kind, choice) -> kernel
        self._consts: Dict[Tuple[str, torch.device], torch.Tensor] = {}
        self._base: Dict[str, Plan] = {}          # kind -> plan with symbolic M (argument names, A's width)
        self._argchecks: Dict[int, tuple] = {}    # id(plan) -> (plan, precomputed per-argument checks)
        self._taken: Dict[str, tuple] = {}        # kind -> (A's width, names of the arguments the plan takes)
        self._tuned: Dict[str, Dict[int, tuple]] = {}   # kind -> {bucket: (plan rows, hint)} once tuned
        self._by_rows: Dict[Tuple[str, int], Tuple[Plan, object]] = {}   # (kind, rows) -> kernel: dispatch
        # device -> {rows: (fn, 16-byte-aligned A needed, output template)}: the bound hot path's
        # dispatch, one int-keyed dict lookup per call; cleared in place when dispatch changes
        self._fast: Dict[torch.device, Dict[int, tuple]] = {}
        self._out_base: Dict[torch.device, torch.Tensor] = {}
        # (device, A's shape) -> the unbound call's plan, pre-checked (see :meth:`_call_entry`)
        self._calls: Dict[tuple, Optional[tuple]] = {}
        self._buckets = None                      # BucketTable of the tuned buckets
        self.tuning_results: Dict[str, dict] = {}  # kind -> {bucket: TuneResult}
        self._nv = None                           # NVFP4 x NVFP4 (A_dtype="nvfp4"): its own operator, ops/nvfp4.py
        if config.A_dtype == "nvfp4":
            from .nvfp4 import NVFP4Matmul
            self._nv = NVFP4Matmul(self._kc, self._resolve_cuda_target)
        if enable_tuning:
            self.hardware_aware_finetune()

    # -- targets and kernels -------------------------------------------------------------
    def _resolve_cuda_target(self):
        if self._cuda_target is None:
            from ..build import cuda_target
            self._cuda_target = cuda_target(self._target_arg)
        return self._cuda_target

    @property
    def target(self):
        """The CUDA target CUDA tensors are compiled for (None for a CPU-only operator)."""
        return None if self._cpu_only else self._resolve_cuda_target()

    @property
    def arch(self):
        """The :class:`bitblas.arch.Arch` CUDA tensors are compiled for (made once from the target)."""
        if self._arch is None:
            from ..arch import arch_of
            self._arch = arch_of(self._resolve_cuda_target())
        return self._arch

    def _static_m(self, rows: Optional[int]) -> Optional[int]:
        M = self._kc.M
        return M if isinstance(M, int) and rows == M else None

    def choice(self, kind: str, rows: int) -> KernelChoice:
        """The kernel that serves ``rows`` rows on ``kind`` ("cuda" / "cpu"): the tuned kernel of
        rows' bucket where it serves them, else the untuned one (:func:`bitblas.kernels.select.select`)."""
        tuned = self._tuned.get(kind)
        return select(self._kc, kind, rows, self.arch if kind == "cuda" else None,
                      (self._buckets, tuned) if tuned else None)

    def plan(self, kind: str = "cpu", rows: Optional[int] = None) -> Plan:
        """The plan of the untuned kernel that serves ``rows`` rows (None: the symbolic one)."""
        return make_plan(self._kc, kind, kernel_rows(self._kc, kind, rows, self.arch if kind == "cuda" else None))

    def _kernel(self, kind: str, rows: int):
        """(plan, kernel) that serves ``rows`` rows, built on first use; then one dict lookup."""
        entry = self._by_rows.get((kind, rows))
        if entry is not None:
            return entry
        c = self.choice(kind, rows)
        entry = self._kernels.get((kind, c))
        if entry is None:
            entry = self._kernels[(kind, c)] = self._build(kind, rows, c)
        if len(self._by_rows) < 65536:
            self._by_rows[(kind, rows)] = entry
        return entry

    def _build(self, kind: str, rows: int, c: KernelChoice) -> Tuple[Plan, object]:
        plan = make_plan(self._kc, kind, c.rows)
        t0 = time.perf_counter()
        if c.template == DEQUANT_GEMM:
            from ..dequant_gemm import DequantGemm
            fn = DequantGemm(plan, self._resolve_cuda_target(), hint=c.hint)
            logger.info("cuda kernel (m=%s, %s) ready in %.2f s", c.rows or M_VAR, fn, time.perf_counter() - t0)
            return plan, fn
        from ..cache.kernels import get_kernel
        target = self._resolve_cuda_target() if kind == "cuda" else None
        try:
            fn, used = get_kernel(plan, c.hint, target=target, default=not c.tuned)
        except Exception as e:  # noqa: BLE001 - a tuned hint that does not build for these rows
            if not c.tuned:
                raise
            logger.warning("tuned %s does not build for %d rows (%s); using the default kernel", c.hint, rows, e)
            plan = self.plan(kind, rows)
            fn, used = get_kernel(plan, None, target=target)
        logger.info("%s kernel (m=%s, %s) ready in %.2f s", kind, plan.m or M_VAR, used, time.perf_counter() - t0)
        return plan, fn

    def _fast_rows(self, device: torch.device) -> Dict[int, tuple]:
        """The per-row-count dispatch table of ``device`` (see :meth:`_fast_entry`)."""
        d = self._fast.get(device)
        if d is None:
            d = self._fast[device] = {}
        return d

    def _fast_entry(self, device: torch.device, rows: int) -> tuple:
        """(kernel, whether A must be 16-byte aligned, output template) for ``rows`` (>= 1) rows on
        ``device``, remembered in :meth:`_fast_rows`. The template is a [rows, N] view of one element
        (stride 0): ``torch.empty_like(template)`` allocates a fresh contiguous output without parsing a
        size, dtype and device per call."""
        kind = device.type
        plan, fn = self._kernel(kind, rows)
        align = kind == "cuda"      # GEMV: 16-byte vector loads; wgmma: TMA needs 16-byte aligned bases
        entry = (fn, align, self._out_template(device, (rows,)))
        d = self._fast_rows(device)
        if len(d) < 4096:
            d[rows] = entry
        return entry

    def _out_template(self, device: torch.device, lead: tuple) -> Optional[torch.Tensor]:
        """A [*lead, N] view of one output element (stride 0): ``torch.empty_like`` of it allocates a
        fresh contiguous output without parsing a size, dtype and device per call (None if torch's
        empty_like stops giving a contiguous tensor for it)."""
        base = self._out_base.get(device)
        if base is None:
            base = self._out_base[device] = torch.empty((1,), dtype=TORCH_DTYPES[self._kc.out_dtype], device=device)
        tmpl = base.expand(*lead, self._kc.N)
        probe = torch.empty_like(tmpl)
        if not probe.is_contiguous() or probe.stride()[-1] != 1:   # pragma: no cover - torch changed empty_like
            return None
        return tmpl

    def _call_entry(self, A: torch.Tensor) -> Optional[tuple]:
        """The unbound call's hot path for A's device and shape, computed once: the kernel and, per
        kernel argument, where it comes from and the exact tensor it must be (dtype, shape, device,
        contiguous), so that a call passing exactly that only compares (:func:`_fast_call`). Anything
        else (another dtype or shape the checks accept, a misaligned CUDA view, a wrong tensor) takes
        the general path of :meth:`_run_kernel`, which converts or raises naming the argument. None:
        this call always takes the general path (BitBLAS spellings run with unit scales or an int8
        cast, NVFP4 activations, no rows)."""
        device = A.device
        key = (device, A.shape)
        entry = None
        kind = device.type
        c = self._kc
        if (self._nv is None and self._as_given and kind in ("cpu", "cuda")
                and not (kind == "cuda" and self._cpu_only) and A.dim() >= 1):
            plan0 = self._base_plan(kind)
            lead = tuple(A.shape[:-1])
            rows = math.prod(lead)
            if A.shape[-1] == plan0.args[0].shape[1] and rows > 0:
                plan, fn = self._kernel(kind, rows)
                dev_index = A.get_device()
                accepted = [False] * len(_CALL_SLOTS)
                specs = []
                out = None
                for spec, want, bits_view, has_m, _tail, _shape in self._checks_for(plan):
                    if spec.role == "table":
                        specs.append((-1, None, None, None, False, self._const(spec.name, plan, device), 0))
                        continue
                    if spec.role == "output":
                        out = (want, (*lead, c.N), (rows, c.N) if len(lead) != 1 else None,
                               self._out_template(device, lead))
                        continue
                    idx = _CALL_SLOTS.index(spec.name)
                    accepted[idx] = True
                    shape = (*lead, *spec.shape[1:]) if has_m else tuple(spec.shape)
                    view = (rows, *spec.shape[1:]) if has_m and len(lead) != 1 else None
                    const = self._const(spec.name, plan, device) if spec.optional else None
                    align = base_align(spec.name, want) if kind == "cuda" else 1     # 1: nothing to check
                    specs.append((idx, want, torch.Size(shape), view, bits_view, const, align if align > 1 else 0))
                if out is not None:
                    taken = {"scale": c.with_scaling, "zeros": c.with_zeros, "bias": c.with_bias,
                             "a_scale": c.with_act_scaling, "output": True}
                    # BitBLAS's positional tensors, as indices into _fast_call's vals (output last)
                    slots = tuple(_CALL_SLOTS.index(s) if s != "output" else len(_CALL_SLOTS)
                                  for s in _POSITIONAL if taken[s])
                    rejected = tuple(i for i, a in enumerate(accepted) if not a)
                    # every tensor goes to the kernel as given (no row view, no int8 bits view) and the
                    # kernel checks its arguments before it launches: then the call leaves those checks
                    # to it (see _direct_calls); a mutable cell, emptied when the kernel refuses a call
                    direct = None
                    if (_checks_args(fn) and out[2] is None and out[3] is not None
                            and all(s[3] is None and not s[4] for s in specs)):
                        direct = [None]
                        direct[0] = _direct_calls(fn, tuple((s[0], s[5], s[6]) for s in specs), rejected, slots,
                                                  out[3], kind == "cuda", direct)
                    entry = (fn, rejected, tuple(specs), out, dev_index, kind == "cuda", slots, device, direct)
        if len(self._calls) >= 4096:
            self._calls.clear()
        self._calls[key] = entry
        return entry

    def _reset_dispatch(self, kind: Optional[str] = None) -> None:
        """Forget which kernel serves each row count (of ``kind``; None: all); kernels stay built."""
        self._calls.clear()
        self._by_rows = {k: v for k, v in self._by_rows.items() if kind is not None and k[0] != kind}
        for dev, d in self._fast.items():
            if kind is None or dev.type == kind:
                d.clear()                  # in place: bound operators hold these dicts

    def _const(self, name: str, plan: Plan, device) -> torch.Tensor:
        key = (name, device)
        t = self._consts.get(key)
        if t is None:
            if name in ("w_table", "s_table", "a_table"):
                vals = plan.table_values(name)
            elif name == "global_scale":
                vals = (1.0,)
            else:  # pragma: no cover - the plan names no other constants
                raise KeyError(name)
            t = self._consts[key] = torch.tensor(vals, dtype=torch.float32, device=device)
        return t

    # -- calling -------------------------------------------------------------------------
    def forward(self, A, W, *args, scale=None, zeros=None, bias=None, output=None, a_scale=None,
                global_scale=None, a_global_scale=None):
        if isinstance(A, torch.Tensor):
            entry = self._calls.get((A.device, A.shape), False)
            if entry is False:
                entry = self._call_entry(A)
            if entry is not None:
                direct = entry[8]
                direct = direct[0] if direct is not None else None
                if args:        # BitBLAS's positional form op(A, W, [scale, zeros, bias,] output)
                    pos = entry[6]
                    if len(args) <= len(pos):
                        if (direct is not None and scale is None and zeros is None and bias is None
                                and output is None and a_scale is None and global_scale is None
                                and a_global_scale is None):
                            out = direct[1](A, W, *args)
                            if out is not None:
                                return out
                        vals = [A, W, scale, zeros, bias, a_scale, global_scale, a_global_scale, output]
                        for i, t in zip(pos, args):
                            if vals[i] is not None:
                                break       # given twice: the general path says so
                            vals[i] = t
                        else:
                            out = _fast_call(entry, vals)
                            if out is not None:
                                return out
                else:
                    if direct is not None:
                        out = direct[0](A, W, scale, zeros, bias, a_scale, global_scale, a_global_scale, output)
                        if out is not None:
                            return out
                    out = _fast_call(entry, [A, W, scale, zeros, bias, a_scale, global_scale, a_global_scale, output])
                    if out is not None:
                        return out
        given = {"scale": scale, "zeros": zeros, "bias": bias, "output": output, "a_scale": a_scale,
                 "global_scale": global_scale, "a_global_scale": a_global_scale}
        c = self.config
        if args:
            taken = {"scale": c.with_scaling, "zeros": c.with_zeros, "bias": c.with_bias,
                     "a_scale": c.with_act_scaling, "output": True}
            slots = [s for s in _POSITIONAL if taken[s]]
            if len(args) > len(slots):
                raise TypeError(f"Matmul takes A, W and at most {len(slots)} more positional tensors "
                                f"({', '.join(slots)}) for this config; got {len(args)}")
            for slot, t in zip(slots, args):
                if given[slot] is not None:
                    raise TypeError(f"{slot} given both positionally and by keyword")
                given[slot] = t
        return self._run(A, W, given)

    # op(...) is forward itself (no argument repacking on the hot path); a subclass that overrides
    # forward re-binds __call__ (__init_subclass__)
    __call__ = forward

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "forward" in cls.__dict__ and "__call__" not in cls.__dict__:
            cls.__call__ = cls.__dict__["forward"]

    def apply(self, A, W, scale=None, zeros=None, bias=None, a_scale=None, global_scale=None, output=None):
        """``forward`` with the tensors in the torch op's order (``torch.ops.bitblas.matmul``; no
        BitBLAS positional extras): the hot path where every tensor is exactly what the kernel takes,
        else the general path (converts or raises naming the argument)."""
        if isinstance(A, torch.Tensor):
            entry = self._calls.get((A.device, A.shape), False)
            if entry is False:
                entry = self._call_entry(A)
            if entry is not None:
                direct = entry[8]
                if direct is not None and direct[0] is not None:
                    out = direct[0][0](A, W, scale, zeros, bias, a_scale, global_scale, None, output)
                    if out is not None:
                        return out
                out = _fast_call(entry, [A, W, scale, zeros, bias, a_scale, global_scale, None, output])
                if out is not None:
                    return out
        return self._run(A, W, {"scale": scale, "zeros": zeros, "bias": bias, "output": output, "a_scale": a_scale,
                                "global_scale": global_scale, "a_global_scale": None})

    def _run(self, A, W, given):
        if self._nv is not None:                 # NVFP4 activations: ops/nvfp4.py (forward, torch op)
            if isinstance(A, torch.Tensor) and A.device.type == "cuda" and self._cpu_only:
                raise ValueError("A is on CUDA but this Matmul was made with target='llvm' (CPU only)")
            return self._nv.run(A, W, given)
        if not self._as_given:
            return self._run_compat(A, W, given)
        return self._run_kernel(A, W, given)

    def _run_compat(self, A, W, given):
        """A config the kernels run in another spelling (see ops.compat.kernel_config): zero points
        without scales get unit scales; out_dtype="int8" runs the int32 kernel and casts."""
        c, kc = self.config, self._kc
        if given["scale"] is not None and not c.with_scaling:
            raise ValueError(f"scale given, but the config takes none ({why_not('scale')})")
        device = A.device if isinstance(A, torch.Tensor) else None
        if kc.with_scaling and not c.with_scaling and device is not None:
            given["scale"] = self._unit_scale(device)
        out = given["output"]
        if c.out_dtype != kc.out_dtype:
            if out is not None and not (isinstance(out, torch.Tensor) and out.dtype == torch.int8):
                raise TypeError(f"output: expected dtype torch.int8 (out_dtype='int8'), got "
                                f"{getattr(out, 'dtype', type(out).__name__)}")
            if given["bias"] is not None:
                b = given["bias"]
                if not isinstance(b, torch.Tensor) or b.dtype not in (torch.int8, torch.int32):
                    raise TypeError(f"bias: expected an int8 or int32 tensor (out_dtype='int8'), got "
                                    f"{getattr(b, 'dtype', type(b).__name__)}")
                given["bias"] = b.to(torch.int32)
            given["output"] = None
            res = self._run_kernel(A, W, given)
            if out is None:
                return res.to(torch.int8)
            if out.shape != res.shape:
                raise ValueError(f"output: expected shape {list(res.shape)}, got {list(out.shape)}")
            out.copy_(res)          # int32 -> int8: wraps around, as BitBLAS's C cast
            return out
        return self._run_kernel(A, W, given)

    def _unit_scale(self, device) -> torch.Tensor:
        key = ("unit_scale", device)
        t = self._consts.get(key)
        if t is None:
            spec = self._base_plan("cpu").arg("scale")
            t = self._consts[key] = torch.ones(spec.shape, dtype=TORCH_DTYPES[spec.user_dtype], device=device)
        return t

    def _base_plan(self, kind: str) -> Plan:
        plan = self._base.get(kind)
        if plan is None:
            plan = self._base[kind] = make_plan(self._kc, kind, None)
        return plan

    def _checks_for(self, plan: Plan) -> tuple:
        """Per-argument check data of ``plan``, computed once: (spec, torch dtype, view as int8 bits,
        first dim is the row count (symbolic, or static in a kernel made for these rows), the
        shape after the first dim, the spec's shape as a tuple). The hot path then only compares."""
        entry = self._argchecks.get(id(plan))
        if entry is None or entry[0] is not plan:
            checks = tuple((s, TORCH_DTYPES[s.user_dtype], s.dtype == "int8" and s.user_dtype != "int8",
                            s.per_row, tuple(s.shape[1:]), tuple(s.shape)) for s in plan.args)
            entry = self._argchecks[id(plan)] = (plan, checks)
        return entry[1]

    def _takes(self, kind: str, plan0: Plan) -> tuple:
        """(A's last dimension, the names of the optional tensors the config takes) for ``kind``."""
        t = self._taken.get(kind)
        if t is None:
            t = self._taken[kind] = (plan0.args[0].shape[1], frozenset(a.name for a in plan0.args))
        return t

    def _run_kernel(self, A, W, given):
        c = self._kc
        if not isinstance(A, torch.Tensor):
            raise TypeError(f"A: expected a torch.Tensor, got {type(A).__name__}")
        device = A.device
        dev_type = device.type
        if dev_type == "cuda":
            if self._cpu_only:
                raise ValueError("A is on CUDA but this Matmul was made with target='llvm' (CPU only)")
            kind = "cuda"
        elif dev_type == "cpu":
            kind = "cpu"
        else:
            raise ValueError(f"A is on {device}; accepted devices: cpu, cuda")
        plan0 = self._base.get(kind) or self._base_plan(kind)
        a_cols, taken = self._taken.get(kind) or self._takes(kind, plan0)
        if A.dim() < 1 or A.shape[-1] != a_cols:
            raise ValueError(f"A: expected shape [..., {a_cols}] (K={c.K}"
                             f"{', two int4 codes per byte' if plan0.a.packed else ''}), got {list(A.shape)}")
        lead = A.shape[:-1]
        rows = lead.numel()
        for name, v in given.items():
            if v is not None and name not in taken:
                raise ValueError(f"{name} given, but the config takes none "
                                 f"({why_not(name)})")
        if rows > 0:
            entry = self._by_rows.get((kind, rows))
            plan, fn = entry if entry is not None else self._kernel(kind, rows)
        else:
            plan, fn = plan0, None
        out = given["output"]
        flat = len(lead) == 1
        call = []
        realign = []                          # (index in call, bytes > 1) of the user tensors (base_align)
        dev_index = A.get_device()
        for spec, want, bits_view, has_m, tail, shape in self._checks_for(plan):
            name = spec.name
            role = spec.role
            if role == "table":
                call.append(self._const(name, plan, device))
                continue
            if role == "output":
                if out is None:
                    out = torch.empty(*lead, c.N, dtype=want, device=device)
                elif not (isinstance(out, torch.Tensor) and out.dtype == want and out.device == device
                          and out.is_contiguous() and out.shape == (*lead, c.N)):
                    check_tensor("output", out, spec, rows, device, lead=lead)
                call.append(out if flat else out.view(rows, c.N))
                continue
            t = A if name == "A" else W if name == "W" else given.get(name)
            if t is None:
                if spec.optional:
                    call.append(self._const(name, plan, device))
                    continue
                raise ValueError(f"{name} is required by this config ({spec.doc}); pass {name}=...")
            # fast path: exactly the expected dtype, shape, device and layout; anything else takes the
            # general check, which accepts the other legal forms or raises naming the argument
            if (isinstance(t, torch.Tensor) and t.dtype is want and t.get_device() == dev_index
                    and (t.is_cuda if dev_index >= 0 else t.is_cpu) and t.is_contiguous()
                    and t.shape == ((*lead, *tail) if has_m else shape)):
                if has_m and not flat:
                    t = t.view(rows, *tail)
                if bits_view:
                    t = t.view(torch.int8)
            else:
                t = check_tensor(name, t, spec, rows, device,
                                  lead=lead if spec.per_row else None)
            if (align := base_align(name, want)) > 1:
                realign.append((len(call), align))
            call.append(t)
        if rows == 0:
            return out
        if kind == "cuda":
            # GEMV kernels read A and W in 16-byte vectors, TMA (wgmma) needs 16-byte aligned bases,
            # 1-byte scales are read in pairs: realign odd views (rare) by a copy
            for i, a in realign:
                if call[i].data_ptr() % a:
                    call[i] = call[i].clone()
            if call[-1].data_ptr() % 16:
                # an output view off a 16-byte boundary (wgmma stores column pairs as 32-bit words):
                # compute into a fresh buffer and copy
                tmp = torch.empty_like(call[-1])
                fn(*call[:-1], tmp)
                call[-1].copy_(tmp)
                return out
        fn(*call)
        return out

    def bind(self, W, scale=None, zeros=None, bias=None, global_scale=None):
        """This operator with its weight-side tensors checked once (see :mod:`bitblas.ops.bound`):
        the result is called as ``bound(A, a_scale=None, output=None)`` (the nn modules' hot path)."""
        self._not_for_nvfp4("bind")
        from .bound import BoundMatmul
        if not self._as_given:
            from .bound import UnboundCall
            return UnboundCall(self, W, scale, zeros, bias, global_scale)
        return BoundMatmul(self, W, scale, zeros, bias, global_scale)

    # -- weights ---------------------------------------------------------------------------
    def transform_weight(self, weight, scale=None, zeros=None, bias=None):
        """Unpacked codes [N, K] (int8; see README) -> packed W, and scale/zeros in kernel form.

        Returns W alone when only the weight is given, else a list [W, scale?, zeros?, bias?] (the
        bias in the output dtype; out_dtype="int32" takes integer values only, see :func:`bias_for`).
        A float tensor of whole numbers is taken as integer codes for integer / table formats
        (as BitBLAS, which casts with ``.char()``); other float values raise.
        """
        if self.config.batch is not None:
            raise NotImplementedError("transform_weight: batched configs take W as [batch, N, K/2] codes "
                                      "(bitblas.quantization.quantize_activation(w, 'nvfp4') gives them)")
        packed = pack_weight(self.config, weight, scale, zeros, _weight_arg="weight")
        if scale is None and zeros is None and bias is None:
            return packed["W"]
        out = [packed["W"]] + [packed[k] for k in ("scale", "zeros") if k in packed]
        if bias is not None:
            out.append(bias_for(self.config, bias))
        return out

    # -- inspection and timing ----------------------------------------------------------------
    def get_source(self, target=None, kenrel_only: bool = False, kind: Optional[str] = None,
                   m: Optional[int] = None) -> str:
        """CUDA C source of the kernel a call with ``m`` rows runs on the CUDA target (default: the
        config's static M; a dynamic M without ``m``: the symbolic-M kernel), as the operator
        chooses it: the tensor-core GEMV built for the top of m's row class, the tuned hint of m's
        bucket, or the decode kernel followed by the dense GEMM (decode-then-GEMM path).
        ``target`` (BitBLAS's argument): another CUDA target to generate for. ``kind="cpu"`` (or
        ``get_source("cpu")``): the scheduled TIR of the CPU kernel. ``kenrel_only`` (BitBLAS's
        spelling) is accepted; the source is always the kernels alone."""
        from ..build import cuda_source, cuda_target, lower_plan
        from ..kernels.select import choice_sources
        if isinstance(target, str) and target in ("cpu", "cuda") and kind is None:
            kind, target = target, None
        if target is not None and kind != "cpu":
            t = cuda_target(target)
            if self._cpu_only or str(t) != str(self._resolve_cuda_target()):
                return Matmul(self.config, target=t).get_source(kind="cuda", m=m)
        kind = kind or ("cpu" if self._cpu_only else "cuda")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"kind={kind!r}: expected 'cpu' or 'cuda'")
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"m={m!r}: expected a positive int (rows of the call)")
        rows = m if m is not None else (self._kc.M if isinstance(self._kc.M, int) else None)
        if self._nv is not None:
            return self._nv.source(rows or 1, kind)
        if kind == "cpu":
            return lower_plan(make_plan(self._kc, kind, self._static_m(rows))).script()
        target = self._resolve_cuda_target()
        if rows is None:
            return cuda_source(make_plan(self._kc, kind, None), target)
        # decode-then-GEMM: the dequantize kernel, then the dense GEMM on the decoded weights
        return "\n// ---- dense GEMM on the decoded weights ----\n".join(
            choice_sources(self._kc, self.choice(kind, rows), target))

    def profile_latency(self, m: Optional[int] = None, warmup: int = 5, repeats: int = 30,
                        device=None, flush_l2: bool = False, kernel_only: bool = False) -> float:
        """Median latency in ms of one call of the operator at ``m`` rows (default: the config's M,
        its largest bucket, or 1), on fresh random inputs (GPU if available, else CPU).

        ``warmup`` calls (building the kernel), then ``repeats`` samples, each a batch of
        back-to-back calls timed with CUDA events (bitblas.tune.measure). A call goes through the
        operator as a caller's does (``apply``: its checks, the dispatch to the kernel of ``m``
        rows, the launch), so where the kernel is shorter than the host's path to launch it (one
        row of a small layer) this is the host's time per call, which is what the caller gets.
        ``kernel_only``: launch the compiled kernel function itself instead (no operator dispatch:
        the tuner's measurement). ``flush_l2``: cycle through enough weight copies that the
        weights come from DRAM (GPU L2, CPU last-level cache); by default the calls repeat on the
        same tensors, as Microsoft BitBLAS's ``profile_latency`` (tvm's time_evaluator) and a
        caller's loop over one layer do, so a layer that fits the L2 is timed warm.
        """
        self._not_for_nvfp4("profile_latency")
        from ..hardware import query_device
        from ..reference import random_inputs
        from ..tune.measure import time_kernel
        from ..tune.tuner import cycled_copies, weight_copies
        c = self._kc
        if m is None:
            m = c.M if isinstance(c.M, int) else (max(c.M) if c.M else 1)
        if device is None:
            device = "cuda" if (torch.cuda.is_available() and not self._cpu_only) else "cpu"
        cuda = torch.device(device).type == "cuda"
        kind = "cuda" if cuda else "cpu"
        inputs = random_inputs(c, m, device=device)     # the kernels' config (a BitBLAS spelling: below)
        spec = query_device(torch.device(device).index) if cuda and flush_l2 else None
        if kernel_only:
            out = torch.empty(m, c.N, dtype=TORCH_DTYPES[c.out_dtype], device=device)
            plan, fn = self._kernel(kind, m)
            return time_kernel(fn, weight_copies(plan, inputs, out, spec, cuda, flush_l2), cuda,
                               samples=max(1, repeats))
        if not self.config.with_scaling:
            inputs.pop("scale", None)                   # zero points without scales: unit scales inside
        out = torch.empty(m, c.N, dtype=TORCH_DTYPES[self.config.out_dtype], device=device)
        for _ in range(max(1, warmup)):
            self(**inputs, output=out)
        # apply's positional order: A, W, scale, zeros, bias, a_scale, global_scale, output
        base = [inputs.get(k) for k in ("A", "W", "scale", "zeros", "bias", "a_scale", "global_scale")] + [out]
        sets = cycled_copies(base, {i for i in (1, 2, 3) if base[i] is not None}, spec, cuda, flush_l2)
        return time_kernel(self.apply, sets, cuda, samples=max(1, repeats))

    def hardware_aware_finetune(self, topk: int = 20, parallel_build: bool = True, kind: Optional[str] = None,
                                force: bool = False, progress: Optional[bool] = None, **bounds) -> dict:
        """Tune every M bucket (bitblas.tune): Roller-style candidates from the device, the ``topk``
        best by the cost model compiled in parallel (``parallel_build``), checked against the
        reference, measured; the fastest serves its bucket from now on. Results and kernels go to
        the database (bitblas.cache): a later call, here or in another process, loads them
        without compiling. ``kind``: "cuda" (default with a GPU) or "cpu". ``force``: re-tune.
        ``bounds``: ``time_budget_s`` (per bucket; CPU default 60 s, None: unbounded) and
        ``max_measure_rows`` (CPU default 64), see :func:`bitblas.tune.tune`.
        Returns {bucket: TuneResult}.
        """
        self._not_for_nvfp4("hardware_aware_finetune")
        unknown = sorted(set(bounds) - {"time_budget_s", "max_measure_rows"})
        if unknown:
            raise TypeError(f"hardware_aware_finetune() got unexpected keyword arguments {unknown}; accepted: "
                            "time_budget_s, max_measure_rows")
        from ..dispatch import BucketTable, buckets_of
        from ..tune import tune
        if kind is None:
            kind = "cuda" if (torch.cuda.is_available() and not self._cpu_only) else "cpu"
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"kind={kind!r} is invalid; accepted: 'cpu', 'cuda' or None")
        if kind == "cuda" and self._cpu_only:
            raise ValueError("kind='cuda' but this Matmul was made with target='llvm' (CPU only)")
        buckets = buckets_of(self._kc)
        results = tune(self._kc, kind, buckets, target=self._resolve_cuda_target() if kind == "cuda" else None,
                       topk=topk, parallel=parallel_build, force=force, progress=progress, **bounds)
        self._buckets = BucketTable(buckets)
        # a skipped bucket (past the GEMV, where decode + wgmma GEMM measured fastest or no fused
        # tile takes the config: bitblas.tune.tuner.tune_bucket) has no entry: its rows keep the
        # untuned choice
        self._tuned[kind] = {b: (r.plan_m, r.hint) for b, r in results.items() if r.skipped is None}
        self._reset_dispatch(kind)
        self.tuning_results[kind] = results
        for b in self._tuned[kind]:       # load each tuned bucket's kernel now (memory cache: no compile)
            self._kernel(kind, b)
        return results

    def _not_for_nvfp4(self, what: str) -> None:
        if self._nv is not None:
            raise NotImplementedError(f"{what} is not supported for A_dtype='nvfp4' configs yet (their kernels: "
                                      "bitblas/schedule/nvfp4.py; timing: python -m benchmark.nvfp4)")

    def __repr__(self):
        return f"Matmul({self.config})"


def bias_for(config: MatmulConfig, bias) -> torch.Tensor:
    """``bias`` as the operator takes it: a contiguous tensor in ``config.out_dtype``. An int32
    output adds the bias to the exact integer sum, so a float bias must hold integers in the
    int32 range (ValueError otherwise: converting would truncate it silently)."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias: expected a torch.Tensor, got {type(bias).__name__}")
    want = TORCH_DTYPES[config.out_dtype]
    if want == torch.int32 and (bias.dtype.is_floating_point or bias.dtype.is_complex):
        b = bias.detach()
        if b.is_complex() or not bool(torch.isfinite(b).all()) or not bool((b == b.round()).all()):
            raise ValueError("bias: out_dtype='int32' adds the bias to the exact integer sum and takes integer "
                             f"values only; got a {bias.dtype} bias with non-integer values (round it yourself, "
                             "or use a float out_dtype)")
        if b.numel() and (float(b.min()) < -2 ** 31 or float(b.max()) > 2 ** 31 - 1):
            raise ValueError(f"bias: values must fit int32 for out_dtype='int32', got [{float(b.min())}, "
                             f"{float(b.max())}]")
    return bias.to(want).contiguous()


def _checks_args(fn) -> bool:
    """Whether ``fn`` checks every tensor argument before it launches or writes anything: a compiled
    tvm-ffi function (its packed-function prologue), or a wrapper of such kernels that says so
    (``checks_args``: each of its kernels checks its own arguments, and nothing but its own
    temporaries is written before the last one's checks pass)."""
    import tvm_ffi
    return isinstance(fn, tvm_ffi.Function) or getattr(fn, "checks_args", False) is True


# the unbound call's tensors by position in _fast_call's ``vals`` (A and W first, then the keywords)
_CALL_SLOTS = ("A", "W", "scale", "zeros", "bias", "a_scale", "global_scale", "a_global_scale")
_NAMES = _CALL_SLOTS + ("output",)       # _fast_call's vals, by name


def _direct_calls(fn, picks: tuple, rejected: tuple, slots: tuple, tmpl: torch.Tensor, cuda: bool,
                  cell: list) -> tuple:
    """The unbound call's shortest path for an entry whose tensors all go to the kernel as given:
    (keyword form ``(A, W, scale, zeros, bias, a_scale, global_scale, a_global_scale, output)``,
    BitBLAS's positional form ``(A, W, *slots)``), Python functions generated for this entry's
    arguments (as dataclasses generates its methods), so that a call runs no loop over argument
    descriptions. Each returns the output, or None to take the checked path (:func:`_fast_call`)
    and then the general one.

    The kernel's own argument checks (tvm's packed-function prologue: type, ndim, dtype, device type
    and id, shape, compact strides, byte offset, non-NULL data) run before anything is launched;
    only the base alignments (:func:`~.checks.base_align`: A, W, 1-byte scales; the output's 16
    bytes) are checked here. A call the kernel refuses empties ``cell`` (the entry's), so this call and the entry's
    later ones take the checks of :func:`_fast_call` (a mismatch there: the general path, which
    converts or raises naming the argument): no exception per call for a caller that passes, say,
    float16 scales."""
    ns = {"_fn": fn, "_tmpl": tmpl, "_empty_like": torch.empty_like, "_cell": cell}
    body = []
    for i in rejected:                         # tensors this config takes none of
        body.append(f"if {_NAMES[i]} is not None: return None")
    args, aligned = [], []
    for j, (idx, const, align) in enumerate(picks):
        if const is not None:
            ns[f"_c{j}"] = const
        if idx < 0:
            args.append(f"_c{j}")
            continue
        name = _NAMES[idx]
        if const is None:
            body.append(f"if {name} is None: return None")   # required: the general path says which
        else:
            body.append(f"if {name} is None: {name} = _c{j}")
        args.append(name)
        if align:
            aligned.append(f"{name}.data_ptr() % {align}")
    body += ["try:",
             "    if output is None: output = _empty_like(_tmpl)"]
    if cuda:
        body.append(f"    if {' or '.join(aligned + ['output.data_ptr() % 16'])}: return None")
    body += [f"    _fn({', '.join(args + ['output'])})",
             "    return output",
             "except Exception:",
             "    _cell[0] = None",
             "    return None"]
    pos = [_NAMES[i] for i in slots]
    unset = [n for n in _NAMES if n not in ("A", "W") and n not in pos]
    src = (f"def _kw(A, W, {', '.join(_NAMES[2:])}):\n"
           + "".join(f"    {line}\n" for line in body)
           + f"def _pos(A, W, {', '.join(f'{n}=None' for n in pos)}):\n"
           + "".join(f"    {n} = None\n" for n in unset)
           + "".join(f"    {line}\n" for line in body))
    exec(compile(src, f"<bitblas direct call {'/'.join(pos)}>", "exec"), ns)   # noqa: S102 - generated above
    return ns["_kw"], ns["_pos"]


def _fast_call(entry: tuple, vals: list) -> Optional[torch.Tensor]:
    """Run ``entry`` (Matmul._call_entry) if every tensor is exactly what the kernel takes; None to
    take the general path, which then accepts the other legal forms or raises naming the argument.
    ``vals``: the tensors of _CALL_SLOTS, then the output (None: allocate it)."""
    fn, rejected, specs, (out_want, out_shape, out_view, tmpl), dev_index, cuda = entry[:6]
    for i in rejected:                 # tensors this config takes none of
        if vals[i] is not None:
            return None
    call = []
    for idx, want, shape, view, bits_view, const, align in specs:
        if idx < 0:
            call.append(const)
            continue
        t = vals[idx]
        if t is None:
            if const is None:
                return None
            call.append(const)
            continue
        if idx == 0:                   # A: its device and shape are the key the entry was found under
            if not (t.dtype is want and t.is_contiguous()):
                return None
        elif not (isinstance(t, torch.Tensor) and t.dtype is want and t.shape == shape and t.is_contiguous()
                  and ((t.is_cuda and t.get_device() == dev_index) if cuda else t.is_cpu)):
            return None
        if view is not None:
            t = t.view(view)
        if bits_view:
            t = t.view(torch.int8)
        if align and t.data_ptr() % align:
            return None
        call.append(t)
    output = vals[8]
    if output is None:
        output = torch.empty_like(tmpl) if tmpl is not None else torch.empty(out_shape, dtype=out_want,
                                                                             device=entry[7])
    elif not (isinstance(output, torch.Tensor) and output.dtype is out_want and output.shape == out_shape
              and output.is_contiguous()
              and ((output.is_cuda and output.get_device() == dev_index) if cuda else output.is_cpu)):
        return None
    o = output if out_view is None else output.view(out_view)
    if cuda and o.data_ptr() % 16:
        return None
    call.append(o)
    fn(*call)
    return output
