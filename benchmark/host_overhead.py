"""Host (CPU-side) time of one bitblas call, layer by layer, at a shape where the kernel is negligible.

    python -m benchmark.host_overhead --device cuda          # on the GPU host
    python -m benchmark.host_overhead --device cuda --n 4096 --k 4096   # W4A16 g128 (zeros) 1x4096x4096
    python -m benchmark.host_overhead --device cpu --json out.json

Each row is the median over ``--repeats`` batches of ``--iters`` back-to-back calls of the host
time per call in µs (``time.perf_counter_ns`` around the batch). On CUDA nothing synchronises
inside a batch and every batch starts on an idle GPU after a ``torch.cuda.synchronize()``; a batch
(default 200 calls on CUDA) queues fewer launches than the launch queue holds, so the host never
waits for the GPU and the time is the host's, even where a kernel takes longer than its launch.
``wall`` is the batch's time up to the end of that synchronize.

Columns: ``kernel`` calls the real kernel; ``ffi-nop`` swaps every kernel for tvm-ffi's
``testing.nop`` (the same tvm-ffi argument conversion, no TVM host code, no launch); ``py-nop``
swaps it for a Python ``lambda *a: None`` (pure Python overhead). Rows:

    F.linear            torch's float16 F.linear on an [N, K] weight (the bar to meet)
    nn.Linear()         torch's float16 nn.Linear module call
    Linear()            the module call: nn.Module.__call__ + Linear.forward (the hot path)
    Linear.forward      the same without nn.Module.__call__
    torch.ops (op)      the custom op through the torch dispatcher (the torch.compile path, eager)
    torch_op.matmul     what modules call off the hot path in eager mode (Matmul.apply: exact tensors
                        are compared, anything else takes the general path and its full checks)
    Matmul(...)         the operator with every tensor passed and checked per call
    bound(x)            the operator bound to the weights (Matmul.bind), activations checked per call
    raw kernel          the compiled tvm-ffi function on preallocated 2-D arguments
    torch.empty(out)    allocating the output alone, for scale
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bitblas  # noqa: E402
from bitblas import torch_op  # noqa: E402
from bitblas.quantization.quantize import TORCH_DTYPES  # noqa: E402


def _time(fn, iters: int, repeats: int, cuda: bool):
    """(median host µs per call, median wall µs per call incl. one sync per batch)."""
    for _ in range(max(50, iters // 10)):
        fn()
    if cuda:
        torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter_ns()
        if cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter_ns()
        host.append((t1 - t0) / iters / 1e3)
        wall.append((t2 - t0) / iters / 1e3)
    return statistics.median(host), statistics.median(wall)


def _forget_kernels(op):
    """Make ``op`` resolve its kernels again (after get_kernel is patched)."""
    op._kernels.clear()
    if hasattr(op, "_reset_dispatch"):
        op._reset_dispatch()
    else:                                       # before the per-row dispatch tables existed
        op._by_rows.clear()


def _layer(args, device):
    lin = bitblas.Linear(args.k, args.n, bias=False, A_dtype=args.a_dtype, W_dtype=args.w_dtype,
                         group_size=args.group_size, with_zeros=args.zeros, device=device)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(args.n, args.k, generator=g)
    lin.load_and_transform_weight(w)            # quantized (default method); the layer follows w to the CPU
    return lin.to(device)


def _cases(lin, args, device):
    op = lin.bitblas_matmul
    shape = (1,) * (args.dims - 2) + (args.rows, args.k)
    x = torch.randn(shape, dtype=lin._a_dtype, device=device)
    b = lin._buffers
    names = lin._arg_names                       # W, scale, zeros, bias, global_scale buffer names
    t = [b[k] if k else None for k in names]
    key = lin._key
    kw = {k: v for k, v in zip(("scale", "zeros", "bias", "global_scale"), t[1:]) if v is not None}
    bound = op.bind(t[0], **kw)
    lin(x)                                        # builds the kernel, binds the layer
    kind = "cuda" if device.type == "cuda" else "cpu"
    rows = x.numel() // x.shape[-1]
    out = torch.empty(rows, args.n, dtype=TORCH_DTYPES[op.config.out_dtype], device=device)
    x2 = x.reshape(rows, x.shape[-1])

    def raw_args():
        plan, fn = op._kernel(kind, rows)
        call = []
        for spec in plan.args:
            if spec.name == "A":
                call.append(x2)
            elif spec.role == "output":
                call.append(out)
            elif spec.role == "table" or (spec.optional and dict(zip(("W", "scale", "zeros", "bias",
                                                                       "global_scale"), t)).get(spec.name) is None):
                call.append(op._const(spec.name, plan, device))
            else:
                v = dict(zip(("W", "scale", "zeros", "bias", "global_scale"), t))[spec.name]
                call.append(v.view(torch.int8) if spec.dtype == "int8" and v.dtype != torch.int8 else v)
        return fn, tuple(call)

    fwd = lin.forward
    custom = torch.ops.bitblas.matmul
    W, sc, zr, bi, gs = t

    def raw():
        fn, call = raw_args()
        return lambda: fn(*call)

    empty_dtype = TORCH_DTYPES[op.config.out_dtype]
    w16 = torch.randn(args.n, args.k, device=device).to(torch.float16)
    x16 = x.to(torch.float16) if x.dtype.is_floating_point else torch.randn(x.shape, device=device).half()
    lin16 = torch.nn.Linear(args.k, args.n, bias=False, device=device, dtype=torch.float16)
    F = torch.nn.functional
    return [
        ("F.linear", lambda: (lambda: F.linear(x16, w16))),
        ("nn.Linear()", lambda: (lambda: lin16(x16))),
        ("Linear()", lambda: (lambda: lin(x))),
        ("Linear.forward", lambda: (lambda: fwd(x))),
        ("torch.ops (op)", lambda: (lambda: custom(x, W, sc, zr, bi, None, gs, key))),
        ("torch_op.matmul", lambda: (lambda: torch_op.matmul(x, W, sc, zr, bi, None, gs, key=key))),
        ("Matmul(...)", lambda: (lambda: op(x, W, **kw))),
        ("bound(x)", lambda: (lambda: bound(x))),
        ("raw kernel", raw),
        ("torch.empty(out)", lambda: (lambda: torch.empty((rows, args.n), dtype=empty_dtype, device=device))),
    ]


_TORCH_ONLY = ("torch.empty(out)", "F.linear", "nn.Linear()")   # no bitblas kernel to swap


class _PyNop:
    """A kernel that does nothing, in pure Python. It says it checks its arguments (as a compiled
    kernel's prologue does), so the operator's call path is the one the real kernel gets."""
    checks_args = True

    def __call__(self, *args):
        return None


def _with_kernel(op, fake):
    """Context: every kernel ``op`` resolves is ``fake`` (None: the real ones)."""
    from bitblas.cache import kernels

    class _Ctx:
        def __enter__(self):
            if fake is not None:
                self.orig = kernels.get_kernel
                kernels.get_kernel = lambda plan, hint=None, **k: (fake, self.orig(plan, hint, **k)[1])
                _forget_kernels(op)

        def __exit__(self, *exc):
            if fake is not None:
                kernels.get_kernel = self.orig
                _forget_kernels(op)
    return _Ctx()


def _commit():
    if os.environ.get("BITBLAS_COMMIT"):      # a copy of the tree without its git history (the GPU host)
        return os.environ["BITBLAS_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--rows", type=int, default=1, help="rows of the activation (decode: 1)")
    p.add_argument("--dims", type=int, default=2, choices=(2, 3), help="activation rank ([rows, K] or [1, rows, K])")
    p.add_argument("--a-dtype", default="float16")
    p.add_argument("--w-dtype", default="uint4")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--no-zeros", dest="zeros", action="store_false")
    p.add_argument("--iters", type=int, default=None, help="calls per batch (default: 200 cuda, 1000 cpu)")
    p.add_argument("--repeats", type=int, default=None, help="batches (default: 60 cuda, 15 cpu)")
    p.add_argument("--modes", default="kernel,ffi-nop,py-nop")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    iters = args.iters or (200 if cuda else 1000)
    repeats = args.repeats = args.repeats or (60 if cuda else 15)
    lin = _layer(args, device)
    op = lin.bitblas_matmul
    cases = _cases(lin, args, device)
    modes = [m for m in args.modes.split(",") if m]
    fakes = {"kernel": None, "py-nop": _PyNop()}
    import tvm_ffi
    nop = tvm_ffi.get_global_func("testing.nop", allow_missing=True)
    if nop is not None:
        fakes["ffi-nop"] = nop
    modes = [m for m in modes if m in fakes]
    res = {}
    # warm up clocks (GPU idles at a few hundred MHz; the first timed row would pay the ramp-up)
    first = cases[0][1]()
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        for _ in range(100):
            first()
    if cuda:
        torch.cuda.synchronize()
    for mode in modes:
        with _with_kernel(op, fakes[mode]):
            for name, make in cases:
                if mode != "kernel" and name in _TORCH_ONLY:
                    continue
                res[(name, mode)] = _time(make(), iters, repeats, cuda)
    dev = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(f"bitblas host overhead: {args.device} ({dev}), {args.a_dtype} x {args.w_dtype} g{args.group_size}"
          f"{' zeros' if args.zeros else ''}, N=K={args.n}x{args.k}, x {[1] * (args.dims - 2) + [args.rows, args.k]}, "
          f"commit {_commit()}; median host µs/call over {args.repeats} x {iters} calls")
    head = f"{'':18}" + "".join(f"{m:>10}" for m in modes) + ("   wall(kernel)" if cuda and "kernel" in modes else "")
    print(head)
    for name, _ in cases:
        cells = "".join(f"{res[(name, m)][0]:10.2f}" if (name, m) in res else f"{'':>10}" for m in modes)
        if cuda and (name, "kernel") in res:
            cells += f"{res[(name, 'kernel')][1]:15.2f}"
        print(f"{name:18}{cells}")
    if args.json:
        rows = [{"case": n, "mode": m, "host_us": h, "wall_us": w} for (n, m), (h, w) in res.items()]
        with open(args.json, "w") as f:
            json.dump({"commit": _commit(), "device": dev, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
