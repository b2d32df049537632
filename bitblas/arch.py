"""The GPU a kernel is built for: one frozen :class:`Arch`, made once per target.

Every hardware question a template, the tuner or the builder asks ("does this target have wgmma?",
"how much shared memory may a block opt in to?", "how many SMs?") is answered here; nobody else
compares ``sm`` numbers. Facts come from three places, in this order:

* the live device (:func:`bitblas.hardware.query_device`, the one device reader) when the target's
  compute capability is the local GPU's;
* the TVM Target's attributes (``arch``, ``max_shared_memory_per_block``, ...);
* ISA facts of the compute-capability family (feature flags below, and the opt-in shared memory
  per block of a TVM target tag, which TVM's tags give as the 48 KB default).

Made from a tvm Target, a target string (``"nvidia/nvidia-h100"``, ``"cuda -arch=sm_90a"``,
``"sm_90a"``, ``"cuda"``, ``"llvm"``), a dict, None (``BITBLAS_TARGET`` / ``TVM_TARGET``, else the
local GPU, else a generic sm_80) or an int compute capability (``Arch.from_sm(90)``, for reason
functions and tests). :func:`arch_of` caches one Arch per tvm Target; ``bitblas.build.target_arch``
takes every spelling (it resolves the Target first). A leaf: imports only ``hardware`` and ``_tvm``.
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Arch", "arch_of", "as_arch", "cpu_arch", "UNKNOWN", "GENERIC_ARCH", "GENERIC_SM_COUNT", "FP8_MIN_SM"]

logger = logging.getLogger(__name__)

GENERIC_ARCH = "sm_80"                 # CUDA arch assumed without a GPU or a target that names one
GENERIC_SM_COUNT = 132                 # SM count assumed without a GPU to ask (an H100 / H200)
FP8_MIN_SM = 89                        # mma.sync / cvt with e4m3 / e5m2 operands: sm_89 (Ada) and later
# Shared memory a block may opt in to, per compute capability (CUDA programming guide, table of
# technical specifications): what a TVM target tag means by its device; tags carry 48 KB.
_OPTIN_SMEM = {70: 98304, 72: 98304, 75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376,
               90: 232448, 100: 232448, 103: 232448, 120: 101376}
_LOCAL_SMS: list = []                  # the local GPU's SM count, read once (tests pin it)


def _local_sm_count() -> int:
    """Multiprocessors of the local GPU (:data:`GENERIC_SM_COUNT` when none is visible)."""
    if not _LOCAL_SMS:
        n = GENERIC_SM_COUNT
        try:
            import torch
            if torch.cuda.is_available():
                n = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        except Exception:  # noqa: BLE001 - a broken driver must not stop code generation
            pass
        _LOCAL_SMS.append(int(n))
    return _LOCAL_SMS[0]


def local_cc() -> Optional[int]:
    """The compute capability of torch's current GPU (90), None without one."""
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            return p.major * 10 + p.minor
    except Exception:  # noqa: BLE001 - a broken driver: no local device
        pass
    return None


def _parse_arch(arch: str):
    """("sm_90a") -> (90, "a"); anything else -> (None, "")."""
    if not arch.startswith("sm_"):
        return None, ""
    digits = "".join(ch for ch in arch[3:] if ch.isdigit())
    return (int(digits) if digits else None), arch[3 + len(digits):]


@dataclass(frozen=True)
class Arch:
    """A compilation target's hardware facts. ``sm`` None: a CPU target, or a CUDA target whose
    compute capability is not known (feature flags then assume sm_80-class hardware: mma.sync and
    cp.async yes, Hopper features no)."""
    kind: str                              # "cuda" | "cpu"
    arch: str = ""                         # "sm_90a"; "" unknown / CPU
    sm: Optional[int] = None               # 90
    suffix: str = ""                       # "a" (arch-specific features: wgmma, setmaxnreg), "f" or ""
    smem_per_block: Optional[int] = None   # bytes a block may use (opt-in); None: the target set no limit
    target: object = field(default=None, compare=False, hash=False, repr=False)
    cores: Optional[int] = field(default=None, compare=False)   # CPU: threads the cost model assumes

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_sm(cls, sm: Optional[int], smem_per_block: Optional[int] = None) -> "Arch":
        """The Arch of compute capability ``sm`` (None: unknown), no Target."""
        if sm is None:
            return UNKNOWN
        return cls(kind="cuda", arch=f"sm_{sm}", sm=sm, smem_per_block=smem_per_block)

    @classmethod
    def parse(cls, arch: str) -> "Arch":
        """The Arch an arch string names ("sm_90a"), no Target; ValueError if it is not "sm_<digits>"."""
        sm, suffix = _parse_arch(arch) if isinstance(arch, str) else (None, "")
        if sm is None:
            raise ValueError(f"arch={arch!r} is invalid; accepted: 'sm_<compute capability>', e.g. 'sm_90a'")
        return cls(kind="cuda", arch=arch, sm=sm, suffix=suffix)

    @classmethod
    def from_target(cls, target) -> "Arch":
        """The Arch of a tvm Target (CUDA or LLVM). Prefer :func:`arch_of` (cached)."""
        if target.kind.name != "cuda":
            return cls(kind="cpu", target=target)
        attrs = target.attrs
        arch = str(attrs["arch"]) if "arch" in attrs else ""
        sm, suffix = _parse_arch(arch)
        smem = int(attrs["max_shared_memory_per_block"]) if "max_shared_memory_per_block" in attrs else None
        return cls(kind="cuda", arch=arch, sm=sm, suffix=suffix, smem_per_block=smem, target=target)

    @classmethod
    def from_spec(cls, spec, target=None) -> "Arch":
        """The Arch of a :class:`bitblas.hardware.DeviceSpec` (the tuner's device), its facts from
        the spec."""
        sm, suffix = _parse_arch(spec.arch)
        if target is not None and target.kind.name == "cuda" and "arch" in target.attrs:
            tsm, tsuffix = _parse_arch(str(target.attrs["arch"]))
            if tsm == sm:
                suffix = tsuffix
        a = cls(kind="cuda", arch=f"sm_{sm}{suffix}", sm=sm, suffix=suffix, smem_per_block=spec.smem_per_block,
                target=target)
        a.__dict__["spec"] = spec
        return a

    @classmethod
    def from_device(cls, index: Optional[int] = None) -> "Arch":
        """The Arch of the local GPU ``index`` (torch's current device by default)."""
        from .hardware import query_device
        spec = query_device(index)
        sm, suffix = _parse_arch(spec.arch)
        if cls.from_sm(sm).wgmma:          # the wgmma kernels compile for the arch-specific target
            suffix = "a"
        a = cls(kind="cuda", arch=f"sm_{sm}{suffix}", sm=sm, suffix=suffix, smem_per_block=spec.smem_per_block)
        a.__dict__["spec"] = spec
        return a

    # -- device facts (DeviceSpec: read from the GPU when it is this arch, else from the Target) ----
    @functools.cached_property
    def spec(self):
        """The :class:`bitblas.hardware.DeviceSpec` of this arch: the local GPU's when its compute
        capability is ``sm``, else generic values from the Target (``source="target"``)."""
        from .hardware import DeviceSpec, query_device
        if self.kind == "cuda" and self.sm is not None and self.sm == local_cc():
            return query_device()
        from ._tvm import tvm
        tgt = self.target if self.target is not None else tvm.target.Target(
            {"kind": "cuda", "arch": self.arch or GENERIC_ARCH})
        return DeviceSpec.from_target(tgt)

    @property
    def sm_count(self) -> int:
        """Multiprocessors: the DeviceSpec's when one was given (``from_spec`` / ``from_device``),
        else the local GPU's, else :data:`GENERIC_SM_COUNT`."""
        given = self.__dict__.get("spec")
        return given.sm_count if given is not None else _local_sm_count()

    @property
    def smem_per_sm(self) -> int:
        return self.spec.smem_per_sm

    @property
    def regs_per_sm(self) -> int:
        return self.spec.regs_per_sm

    @property
    def max_threads_per_sm(self) -> int:
        return self.spec.max_threads_per_sm

    @property
    def max_blocks_per_sm(self) -> int:
        return self.spec.max_blocks_per_sm

    @property
    def l2_bytes(self) -> int:
        return self.spec.l2_bytes

    @property
    def dram_bandwidth(self) -> float:
        return self.spec.dram_bandwidth

    @property
    def optin_smem_per_block(self) -> Optional[int]:
        """The compute-capability family's opt-in shared memory per block (None: not known)."""
        return _OPTIN_SMEM.get(self.sm) if self.sm is not None else None

    # -- feature flags (ISA facts of the compute-capability family) --------------------------------
    @property
    def known(self) -> bool:
        return self.sm is not None

    @property
    def mma(self) -> bool:
        """mma.sync m16n8k16 (fp16/bf16) and m16n8k32 (int8), ldmatrix (sm_80+; unknown: assumed)."""
        return self.kind == "cuda" and (self.sm is None or self.sm >= 80)

    cp_async = mma                          # cp.async: sm_80+
    int8_mma = mma

    @property
    def fp8_mma(self) -> bool:
        """mma.sync with e4m3 / e5m2 operands (sm_89+); not assumed for an unknown arch."""
        return self.sm is not None and self.sm >= FP8_MIN_SM

    @property
    def fp8_cvt(self) -> bool:
        """cvt.rn.f16x2.e4m3x2 (sm_89+; an unknown arch is assumed to have it)."""
        return self.kind == "cuda" and (self.sm is None or self.sm >= FP8_MIN_SM)

    @property
    def dp4a(self) -> bool:
        """dp4a (sm_61+; unknown: assumed)."""
        return self.kind == "cuda" and (self.sm is None or self.sm >= 61)

    @property
    def wgmma(self) -> bool:
        """Warpgroup mma (sm_90, compiled for sm_90a); not on sm_100+ (tcgen05 instead)."""
        return self.sm == 90

    @property
    def tma(self) -> bool:
        """Tensor memory accelerator bulk copies and the 227 KB shared memory of Hopper (sm_90+)."""
        return self.sm is not None and self.sm >= 90

    @property
    def pdl(self) -> bool:
        """Programmatic dependent launch, griddepcontrol (sm_90+)."""
        return self.sm is not None and self.sm >= 90

    @property
    def wgmma_arch(self) -> str:
        """The arch string wgmma / setmaxnreg kernels compile for ("sm_90a")."""
        return f"sm_{self.sm}a"

    def name(self) -> str:
        """"sm_90a", "cpu" or "unknown" (for messages)."""
        return self.arch or ("cpu" if self.kind == "cpu" else "unknown")


UNKNOWN = Arch(kind="cuda")
_CPU = Arch(kind="cpu")


def _key(target) -> str:
    return json.dumps({k: str(v) for k, v in dict(target.export()).items()}, sort_keys=True)


_CACHE: dict = {}


def arch_of(target) -> Arch:
    """The Arch of ``target`` (a tvm Target, an Arch, or None: an unknown CUDA arch), one per
    distinct Target. Any other spelling: ``bitblas.build.target_arch``."""
    if target is None:
        return UNKNOWN
    if isinstance(target, Arch):
        return target
    key = _key(target)
    a = _CACHE.get(key)
    if a is None:
        a = _CACHE[key] = Arch.from_target(target)
    return a


def cpu_arch(cores: Optional[int] = None) -> Arch:
    """The Arch of the host CPU (the CPU templates read the host's LLVM target themselves;
    ``cores``: threads the cost model assumes)."""
    return _CPU if cores is None else Arch(kind="cpu", cores=cores)


def as_arch(x) -> Arch:
    """An Arch from an Arch, a tvm Target, an int compute capability (90) or None (unknown)."""
    if x is None or isinstance(x, Arch):
        return UNKNOWN if x is None else x
    if isinstance(x, bool) or not isinstance(x, int):
        return arch_of(x)
    return Arch.from_sm(x)
