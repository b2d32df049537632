"""What the tuner knows about a GPU, read from the device itself (never from a table of GPU names).

:func:`query_device` asks the CUDA driver (``cuDeviceGetAttribute`` through ctypes) for the SM
count, shared memory and registers per SM and per block, L2 size, clocks and the memory bus; the
DRAM bandwidth is ``2 x memory clock x bus width`` (DDR), and when the driver does not report the
memory clock it is measured with a device-to-device copy. Without a GPU, :meth:`DeviceSpec.from_target`
describes a CUDA Target from its attributes, filling what a Target does not say with generic values
and saying so (``source="target"``); the tuner only measures on a real device.

Per-SM instruction throughputs (tensor-core FMAs and integer/half ALU lanes per clock) are
properties of the compute-capability family (an ISA fact, like "sm_80 has mma.m16n8k16"), used by
the cost model only to compare candidates with each other.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import asdict, dataclass
from typing import Optional

__all__ = ["DeviceSpec", "query_device", "current_device_index"]

logger = logging.getLogger(__name__)

# CUdevice_attribute values (cuda.h; stable since CUDA 3-11).
_ATTR = {
    "clock_khz": 13, "sm_count": 16, "mem_clock_khz": 36, "bus_width_bits": 37, "l2_bytes": 38,
    "max_threads_per_sm": 39, "cc_major": 75, "cc_minor": 76, "smem_per_sm": 81, "regs_per_sm": 82,
    "smem_per_block_optin": 97, "max_blocks_per_sm": 106,
}


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    arch: str                    # "sm_90"
    sm_count: int
    smem_per_sm: int             # bytes
    smem_per_block: int          # bytes a block may opt in to
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    dram_bandwidth: float        # bytes / s
    clock_hz: float              # SM clock
    source: str = "device"       # "device" (read from the GPU) | "target" (a Target without a GPU)

    @property
    def cc(self) -> int:
        return int(self.arch[3:].rstrip("af"))

    @property
    def tc_flops_per_sm_clk(self) -> float:
        """Dense fp16/bf16 mma.sync FLOPs per SM per clock (fp32 accumulate) of the family."""
        cc = self.cc
        if cc >= 80 and cc not in (86, 87, 89):
            return 2048.0
        return 1024.0 if cc >= 75 else 512.0

    @property
    def alu_ops_per_sm_clk(self) -> float:
        """32-bit integer / logic lanes per SM per clock (decode work: shifts, lop3, prmt)."""
        return 64.0 if self.cc >= 70 else 128.0

    @property
    def l2_bandwidth(self) -> float:
        """L2 -> SM bytes / s: 64 B per SM per clock (the L1 fill width), a model constant."""
        return 64.0 * self.sm_count * self.clock_hz

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceSpec":
        return cls(**d)

    @classmethod
    def from_target(cls, target) -> "DeviceSpec":
        """A spec for a CUDA Target when no GPU can be asked: the Target's arch, shared memory and
        registers; SM count, L2, clocks and bandwidth are generic (logged)."""
        attrs = target.attrs
        arch = str(attrs["arch"]) if "arch" in attrs else "sm_80"

        def get(name, default):
            return int(attrs[name]) if name in attrs else default

        smem_block = get("max_shared_memory_per_block", 49152)
        logger.info("no device to query for %s: SM count, L2 size and bandwidth are generic", arch)
        return cls(name=f"generic {arch}", arch=arch, sm_count=get("multi_processor_count", 108),
                   smem_per_sm=max(smem_block, 167936 if smem_block > 49152 else smem_block),
                   smem_per_block=smem_block, regs_per_sm=get("registers_per_block", 65536),
                   max_threads_per_sm=2048, max_blocks_per_sm=32,
                   l2_bytes=get("l2_cache_size_bytes", 40 * 2 ** 20), dram_bandwidth=2.0e12,
                   clock_hz=1.5e9, source="target")


def current_device_index() -> int:
    """The CUDA device torch currently uses (honours CUDA_VISIBLE_DEVICES and torch.cuda.set_device)."""
    import torch
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


@functools.lru_cache(maxsize=None)
def _libcuda():
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.cuInit(0) == 0:
            return lib
    return None


def _driver_attrs(index: int) -> Optional[dict]:
    """Driver attributes of the device torch calls ``cuda:index`` (mapped through its PCI bus id)."""
    lib = _libcuda()
    if lib is None:
        return None
    dev = ctypes.c_int()
    import torch
    bus = None
    try:
        props = torch.cuda.get_device_properties(index)
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - older torch: no PCI ids; fall back to the ordinal
        bus = None
    if bus is None or lib.cuDeviceGetByPCIBusId(ctypes.byref(dev), bus.encode()) != 0:
        if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
            return None
    out = {}
    v = ctypes.c_int()
    for key, code in _ATTR.items():
        out[key] = v.value if lib.cuDeviceGetAttribute(ctypes.byref(v), code, dev) == 0 else 0
    name = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(name, 256, dev)
    out["name"] = name.value.decode(errors="replace")
    return out


def _measure_bandwidth(index: int) -> float:
    """DRAM bytes / s from a device-to-device copy of 4x the L2 (read + write counted)."""
    import torch
    dev = torch.device("cuda", index)
    n = 512 * 2 ** 20
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        dst.copy_(src)
    e.record()
    e.synchronize()
    return 2 * n * 10 / (s.elapsed_time(e) * 1e-3)


@functools.lru_cache(maxsize=None)
def query_device(index: Optional[int] = None) -> DeviceSpec:
    """The spec of CUDA device ``index`` (default: torch's current device), read from the device.

    RuntimeError when no such GPU is visible.
    """
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("query_device: no CUDA GPU is visible")
    if index is None:
        index = current_device_index()
    p = torch.cuda.get_device_properties(index)
    d = _driver_attrs(index) or {}
    arch = f"sm_{p.major}{p.minor}"
    bw = 2.0 * d.get("mem_clock_khz", 0) * 1e3 * d.get("bus_width_bits", 0) / 8
    if bw <= 0:
        bw = _measure_bandwidth(index)
        logger.info("driver reports no memory clock; measured DRAM bandwidth %.0f GB/s", bw / 1e9)
    spec = DeviceSpec(
        name=d.get("name") or p.name, arch=arch,
        sm_count=d.get("sm_count") or p.multi_processor_count,
        smem_per_sm=d.get("smem_per_sm") or int(getattr(p, "shared_memory_per_multiprocessor", 0) or 0),
        smem_per_block=d.get("smem_per_block_optin") or int(getattr(p, "shared_memory_per_block_optin", 49152)),
        regs_per_sm=d.get("regs_per_sm") or int(getattr(p, "regs_per_multiprocessor", 65536)),
        max_threads_per_sm=d.get("max_threads_per_sm") or int(getattr(p, "max_threads_per_multi_processor", 2048)),
        max_blocks_per_sm=d.get("max_blocks_per_sm") or 32,
        l2_bytes=d.get("l2_bytes") or int(getattr(p, "L2_cache_size", 0) or 0),
        dram_bandwidth=bw,
        clock_hz=(d.get("clock_khz") or int(getattr(p, "clock_rate", 0) or 0) or 1_500_000) * 1e3,
    )
    logger.info("device %d: %s", index, spec)
    return spec
