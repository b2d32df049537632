"""Build: plan -> TensorIR -> schedule -> tvm.compile; CUDA source -> cubin with nvcc.

``tvm.compile`` returns a source-only module for CUDA on machines without libcuda (CI), so CUDA
codegen is checked there by compiling the generated source with nvcc (:func:`nvcc_compile`).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
from typing import Optional, Union

from . import env
from ._tvm import tvm
from .arch import GENERIC_ARCH
from .plan import Plan
from .kernels import default_hint
from .schedule.target import host_cpu_target

logger = logging.getLogger(__name__)

__all__ = ["target_arch", "cpu_target", "auto_detect_nvidia_target", "DEFAULT_ARCH", "set_cpu_threads",
           "physical_cores", "cpu_llc_bytes", "cuda_target", "build_plan",
           "kernel_callable", "compile_plan", "lower_plan", "cuda_source",
           "nvcc_compile", "nvcc_resources", "find_nvcc", "PASS_CONFIG"]

PASS_CONFIG = {"tirx.use_async_copy": True}


@functools.lru_cache(maxsize=None)
def cpu_target():
    """LLVM target for this machine's CPU (its own instruction set extensions, all cores)."""
    _default_cpu_threads()
    return host_cpu_target()


def physical_cores() -> int:
    """Cores (not SMT threads) this process may run on: distinct (package, core) ids of the CPUs in
    its affinity mask (Linux sysfs), else the CPU count."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            return len(cpus) or 1
    return len(cores) or 1


@functools.lru_cache(maxsize=None)
def cpu_llc_bytes() -> int:
    """Size of this CPU's largest cache (Linux sysfs; 32 MB where it does not say)."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for idx in names:
        try:
            with open(os.path.join(base, idx, "size")) as f:
                txt = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
            best = max(best, int(txt.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or (32 << 20)


def _default_cpu_threads() -> None:
    """TVM's thread pool takes TVM_NUM_THREADS / OMP_NUM_THREADS, else half the hardware threads on
    x86 (it assumes 2-way SMT): on a machine without SMT that is half the cores. Unless the user set
    either variable, set TVM_NUM_THREADS to the physical cores before the pool starts (the first CPU
    kernel), as torch does for its own threads."""
    env.set_default_cpu_threads(physical_cores())


def set_cpu_threads(n: int) -> None:
    """Run CPU kernels on ``n`` threads of TVM's pool (default: the physical cores, or
    TVM_NUM_THREADS / OMP_NUM_THREADS; at most that many). Per calling thread, like
    ``torch.set_num_threads``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid; accepted: an int >= 1")
    cpu_target()                                    # the default pool size, before the pool starts
    tvm.get_global_func("runtime.config_threadpool")(1, n)


DEFAULT_ARCH = GENERIC_ARCH            # the generic target without a visible GPU (bitblas.arch)


def auto_detect_nvidia_target(gpu_id: int = 0):
    """A CUDA tvm Target for GPU ``gpu_id``, its limits read from the device.

    Without a visible GPU it returns a generic sm_80 target (code generation still works) and logs
    that it did so; it never raises for a missing GPU. Honours BITBLAS_TARGET / TVM_TARGET.
    """
    if env.target():
        return cuda_target(env.target())
    info = {"kind": "cuda", "arch": DEFAULT_ARCH, "max_shared_memory_per_block": 49152,
            "max_threads_per_block": 1024, "thread_warp_size": 32, "registers_per_block": 65536}
    try:
        import torch
        if torch.cuda.is_available() and gpu_id < torch.cuda.device_count():
            from .arch import Arch
            arch = Arch.from_device(gpu_id)          # bitblas.hardware.query_device's DeviceSpec
            info["arch"] = f"sm_{arch.sm}"
            info["max_shared_memory_per_block"] = arch.smem_per_block or 49152
            info["registers_per_block"] = arch.regs_per_sm or 65536
            if arch.l2_bytes:
                info["l2_cache_size_bytes"] = arch.l2_bytes
            return tvm.target.Target(info)
    except Exception as e:  # a broken driver must not stop code generation
        logger.warning("could not query GPU %d (%s); using a generic %s target", gpu_id, e, DEFAULT_ARCH)
        return tvm.target.Target(info)
    logger.info("no CUDA GPU visible; using a generic %s target", DEFAULT_ARCH)
    return tvm.target.Target(info)


def cuda_target(target: Union[None, str, dict, "tvm.target.Target"] = None):
    """A CUDA Target from None (the local GPU, else sm_80), an arch ("sm_90"), a tag, a dict or a Target."""
    if target is None:
        return auto_detect_nvidia_target()
    if isinstance(target, tvm.target.Target):
        t = target
    elif isinstance(target, str) and target.startswith("sm_"):
        t = tvm.target.Target(_arch_target(target))
    elif isinstance(target, str) and target.split()[0] in ("cuda", "nvidia/cuda") and len(target.split()) > 1:
        t = tvm.target.Target(_cli_target(target))
    elif isinstance(target, (str, dict)):
        if target == "cuda":
                return auto_detect_nvidia_target()
        try:
            t = tvm.target.Target(target)
        except Exception as e:  # TVM raises several types here
            raise ValueError(f"target={target!r} is not a valid target: {e}") from None
        if isinstance(target, str) and "/" in target and t.kind.name == "cuda":
            t = _tag_target(t)                # "nvidia/nvidia-h100": the device's shared memory
    else:
        raise TypeError(f"target: expected None, a str, a dict or a tvm Target, got {type(target).__name__}")
    if t.kind.name != "cuda":
        raise ValueError(f"target={target!r} is a {t.kind.name} target; a CUDA target is needed "
                         "(CPU tensors always use the CPU backend)")
    return t


def target_arch(target=None):
    """The :class:`bitblas.arch.Arch` of any target spelling: None (BITBLAS_TARGET / TVM_TARGET, else
    the local GPU, else a generic sm_80), "cuda", a tag ("nvidia/nvidia-h100"), "cuda -arch=sm_90a",
    "sm_90a", a dict, a tvm Target; "llvm" / "cpu" / "c" (or an LLVM Target): the host CPU."""
    from .arch import Arch, arch_of, cpu_arch
    if isinstance(target, Arch):
        return target
    if isinstance(target, str) and target in ("llvm", "cpu", "c"):
        return cpu_arch()
    if isinstance(target, tvm.target.Target) and target.kind.name == "llvm":
        return cpu_arch()
    return arch_of(cuda_target(target))


def _tag_target(t):
    """A TVM tag's Target ("nvidia/nvidia-h100") with the shared memory a block of that device may
    opt in to (the local GPU's when it is that arch, else the compute-capability family's, from
    :class:`bitblas.arch.Arch`): TVM's tags give every GPU the 48 KB default, which would keep
    the big-tile templates (wgmma, deep mma rings) off the device the tag names."""
    from .arch import Arch
    a = Arch.from_target(t)
    optin = a.spec.smem_per_block if a.spec.source == "device" else a.optin_smem_per_block
    cur = a.smem_per_block
    if not optin or (cur is not None and cur >= optin):
        return t
    spec = {k: v for k, v in dict(t.export()).items() if k not in ("tag", "keys")}
    spec["max_shared_memory_per_block"] = int(optin)
    return tvm.target.Target(spec)


def _arch_target(arch: str) -> dict:
    """A CUDA target dict for ``arch`` ("sm_90a"): the local GPU's limits when it is that arch,
    else generic ones (48 KB shared memory per block)."""
    info = {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": 49152, "max_threads_per_block": 1024,
            "thread_warp_size": 32}
    from .arch import Arch, local_cc
    try:
        if Arch.parse(arch).sm == local_cc():
            local = dict(auto_detect_nvidia_target().export())
            info.update({k: v for k, v in local.items() if k not in ("tag", "keys", "kind", "arch")})
    except Exception:  # noqa: BLE001 - a broken driver: generic limits
        pass
    return info


def _cli_target(text: str) -> dict:
    """TVM's older CLI target form, which TVM 0.27 refuses ("cuda -arch=sm_80
    -max_shared_memory_per_block=49152 -keys=cuda,gpu"), as a target dict."""
    kind, *opts = text.split()
    attrs = {}
    for opt in opts:
        if not opt.startswith("-") or "=" not in opt:
            raise ValueError(f"target={text!r}: cannot read {opt!r}; expected -key=value options")
        k, v = opt.lstrip("-").split("=", 1)
        if k in ("keys", "libs", "mattr"):
            attrs[k] = v.split(",")
        elif v.lstrip("-").isdigit():
            attrs[k] = int(v)
        elif v in ("true", "false"):
            attrs[k] = v == "true"
        else:
            attrs[k] = v
    info = _arch_target(attrs["arch"]) if "arch" in attrs else {"kind": "cuda"}
    info.update(attrs)
    info["kind"] = "cuda" if kind == "nvidia/cuda" else kind
    return info


def lower_plan(plan: Plan, hint=None, target=None):
    """The scheduled IRModule of a plan (``hint`` None: the default for its target kind and
    ``target``); the template builds it (:func:`bitblas.kernels.lower`: the TensorIR is emitted
    only for templates that schedule it)."""
    from .kernels import lower
    hint = hint or default_hint(plan, target)
    return lower(plan, hint, target)


def compile_module(mod, tgt):
    """tvm.compile; modules of hand-written TIRx kernels (GEMV, wgmma) say so by attributes: the
    tirx pipeline, and the arch the wgmma kernels need (sm_90a)."""
    from .schedule.target import TIRX_PIPELINE_ATTR, WGMMA_ARCH_ATTR
    attrs = mod.attrs
    if attrs is not None and WGMMA_ARCH_ATTR in attrs:      # arch-specific kernels (wgmma, setmaxnreg)
        spec = dict(tgt.export())
        spec["arch"] = str(attrs[WGMMA_ARCH_ATTR])
        tgt = tvm.target.Target({k: v for k, v in spec.items() if k not in ("tag", "keys")})
    if attrs is not None and TIRX_PIPELINE_ATTR in attrs:
        return tvm.compile(mod, target=tgt, tir_pipeline=str(attrs[TIRX_PIPELINE_ATTR]))
    return tvm.compile(mod, target=tgt)


def build_plan(plan: Plan, target=None, hint=None):
    """Compile a plan; returns its runtime callable (:func:`kernel_callable`, on torch tensors)."""
    return kernel_callable(compile_plan(plan, target, hint))


def kernel_callable(mod):
    """The callable of a compiled kernel module (a tvm Executable or a loaded library): its
    ``main``; for a module that also has a ``permute`` kernel (the wgmma GEMV) both in turn."""
    main = mod["main"]
    rt = getattr(mod, "mod", mod)
    if rt.implements_function("permute"):          # the host wrappers: no import queried (no GPU needed)
        from .schedule.gemv import WgmmaGemvFn
        return WgmmaGemvFn(mod["permute"], main)
    return main


def compile_plan(plan: Plan, target=None, hint=None, fallback: Optional[bool] = None):
    """Compile a plan; returns the tvm Executable (``ex["main"]``, ``ex.export_library(path)``).
    ``fallback`` (default: ``hint`` is None, i.e. the default kernel): when the kernel fails to
    build, build the registry's last-resort template instead (:func:`bitblas.kernels.fallback_hint`)."""
    tgt = cpu_target() if plan.target_kind == "cpu" else cuda_target(target)
    if fallback is None:
        fallback = hint is None
    hint = hint or default_hint(plan, tgt)
    try:
        mod = lower_plan(plan, hint, tgt)
        with tvm.transform.PassContext(config=PASS_CONFIG):
            ex = compile_module(mod, tgt)
    except Exception as e:  # noqa: BLE001 - a default kernel that fails to build falls back
        from .kernels import fallback_hint
        fb = fallback_hint(plan, hint) if fallback else None
        if fb is None:
            raise
        logger.warning("%s kernel failed to build (%s); using %s", type(hint).__name__, e, type(fb).__name__)
        mod = lower_plan(plan, fb, tgt)
        with tvm.transform.PassContext(config=PASS_CONFIG):
            ex = compile_module(mod, tgt)
    return ex


def cuda_source(plan: Plan, target=None, hint=None) -> str:
    """CUDA C source of the plan's kernel (works without a GPU)."""
    if plan.target_kind != "cuda":
        raise ValueError("cuda_source needs a plan made for target_kind='cuda'")
    tgt = cuda_target(target)
    mod = lower_plan(plan, hint, tgt)
    with tvm.transform.PassContext(config=PASS_CONFIG):
        ex = compile_module(mod, tgt)
    return ex.mod.imports[0].inspect_source()


def find_nvcc() -> Optional[str]:
    """Path of the nvcc that compiles generated kernels, or None."""
    for home in filter(None, [env.CUDA_HOME, "/usr/local/cuda-13.0", "/usr/local/cuda"]):
        p = os.path.join(home, "bin", "nvcc")
        if os.path.isfile(p):
            return p
    return shutil.which("nvcc")


def nvcc_compile(source: str, arch: str = "sm_90", timeout: float = 300.0) -> bytes:
    """Compile generated CUDA source to a cubin with nvcc; RuntimeError with nvcc's message on failure.
    Hopper kernels (wgmma, setmaxnreg: the sm_90a feature set) are compiled for sm_90a when
    ``arch`` is sm_90."""
    return _nvcc(source, arch, timeout)[0]


def nvcc_resources(source: str, arch: str = "sm_90", timeout: float = 300.0) -> dict:
    """ptxas's resource report of the kernel in ``source``: ``registers`` per thread and
    ``spill_stores`` (bytes), as compiled by :func:`nvcc_compile`."""
    text = _nvcc(source, arch, timeout, ["--resource-usage"])[1]
    regs, spill = re.search(r"Used (\d+) registers", text), re.search(r"(\d+) bytes spill stores", text)
    if regs is None or spill is None:
        raise RuntimeError(f"no resource report in nvcc's output:\n{text[-2000:]}")
    return {"registers": int(regs.group(1)), "spill_stores": int(spill.group(1))}


def _nvcc(source: str, arch: str, timeout: float, extra=()):
    """(cubin bytes, nvcc's stdout + stderr)."""
    from .arch import Arch
    a = Arch.parse(arch) if arch.startswith("sm_") else None
    if a is not None and a.wgmma and not a.suffix and ("wgmma." in source or "setmaxnreg." in source):
        arch = a.wgmma_arch
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found: set CUDA_HOME to a CUDA toolkit")
    with tempfile.TemporaryDirectory(prefix="bitblas_nvcc_") as d:
        src, out = os.path.join(d, "k.cu"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "--cubin", "-O3", f"-arch={arch}", "-lineinfo", *extra, "-o", out, src]
        code, stdout, stderr = run_process_group(cmd, timeout)
        if code != 0:
            raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{stderr[-4000:]}")
        with open(out, "rb") as f:
            return f.read(), stdout + stderr


def run_process_group(cmd, timeout: float):
    """(return code, stdout, stderr) of ``cmd`` run in a process group of its own. On timeout the
    whole group is killed (nvcc's children, cicc and ptxas, keep compiling when only nvcc is) and
    TimeoutError is raised."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except BaseException as e:               # the timeout, or KeyboardInterrupt: no compiler left behind
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise TimeoutError(f"{os.path.basename(cmd[0])} did not finish in {timeout:g} s "
                               f"(its process group was killed): {' '.join(map(str, cmd))}") from None
        raise
    return p.returncode, stdout, stderr
