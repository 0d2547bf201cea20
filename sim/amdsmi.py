"""Simulated AMD SMI: the `amdsmi` calls the GPU agent uses, over AMD GPUs held in memory.

`SimAmdSmi` follows ROCm's `amdsmi` Python package (py-interface/amdsmi_interface.py and
amdsmi_exception.py): the same function names and arguments, the same return types (dicts
with amdsmi's keys, "N/A" where amdsmi reports a field as not available), its enums with
amdsmi_wrapper's values (exposed as attributes, as `import amdsmi` exposes them), its
status codes, and its error classes: a failed call raises `AmdSmiLibraryException` with
`get_error_code()` the AMDSMI_STATUS_* value (NO_DATA when an event read times out,
NOT_SUPPORTED for a block without RAS, NOT_INIT before `amdsmi_init`). Processor handles
are `ctypes.c_void_p`s as amdsmi's are. `AmdSmiEventReader` reads the KFD SMI events of
every GPU whose notification was initialised, as amdsmi_get_gpu_event_notification does.

amdsmi is not needed to run it. Each instance is one node's library; several run side by
side. Faults are injected with `inject_fault` (see `FAULTS`) and cleared with `recover`.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from sim.gpus import SimGpus

# amdsmi_wrapper.AMDSMI_STATUS_* (amdsmi.h: amdsmi_status_t)
AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NOT_YET_IMPLEMENTED = 3
AMDSMI_STATUS_DRM_ERROR = 6
AMDSMI_STATUS_API_FAILED = 7
AMDSMI_STATUS_TIMEOUT = 8
AMDSMI_STATUS_RETRY = 9
AMDSMI_STATUS_NO_PERM = 10
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_FILE_ERROR = 14
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_BUSY = 30
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34
AMDSMI_STATUS_NO_DATA = 40
AMDSMI_STATUS_UNKNOWN_ERROR = 0xFFFFFFFF

_ERR_INFO = {
    AMDSMI_STATUS_INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AMDSMI_STATUS_NOT_YET_IMPLEMENTED: "AMDSMI_STATUS_NOT_YET_IMPLEMENTED - Feature not yet implemented",
    AMDSMI_STATUS_DRM_ERROR: "AMDSMI_STATUS_DRM_ERROR - Error when called libdrm",
    AMDSMI_STATUS_API_FAILED: "AMDSMI_STATUS_API_FAILED - API call failed",
    AMDSMI_STATUS_TIMEOUT: "AMDSMI_STATUS_TIMEOUT - Timeout in API call",
    AMDSMI_STATUS_RETRY: "AMDSMI_STATUS_RETRY - Retry operation",
    AMDSMI_STATUS_NO_PERM: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    AMDSMI_STATUS_IO: "AMDSMI_STATUS_IO - I/O Error",
    AMDSMI_STATUS_FILE_ERROR: "AMDSMI_STATUS_FILE_ERROR - Error opening file",
    AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    AMDSMI_STATUS_BUSY: "AMDSMI_STATUS_BUSY - Device busy",
    AMDSMI_STATUS_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    AMDSMI_STATUS_NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    AMDSMI_STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
    AMDSMI_STATUS_NO_DATA: "AMDSMI_STATUS_NO_DATA - No data was found for given input",
}


class AmdSmiRetCode(IntEnum):
    """amdsmi_exception.AmdSmiRetCode (amdsmi before ROCm 6.0; later only the constants)."""

    SUCCESS = AMDSMI_STATUS_SUCCESS
    STATUS_INVAL = AMDSMI_STATUS_INVAL
    STATUS_NOT_SUPPORTED = AMDSMI_STATUS_NOT_SUPPORTED
    STATUS_FILE_ERROR = AMDSMI_STATUS_FILE_ERROR
    STATUS_NO_PERM = AMDSMI_STATUS_NO_PERM
    STATUS_INIT_ERROR = AMDSMI_STATUS_INIT_ERROR
    STATUS_NOT_FOUND = AMDSMI_STATUS_NOT_FOUND
    STATUS_NO_DATA = AMDSMI_STATUS_NO_DATA
    STATUS_BUSY = AMDSMI_STATUS_BUSY
    STATUS_DRM_ERROR = AMDSMI_STATUS_DRM_ERROR
    STATUS_IO = AMDSMI_STATUS_IO
    STATUS_API_FAILED = AMDSMI_STATUS_API_FAILED
    STATUS_TIMEOUT = AMDSMI_STATUS_TIMEOUT
    STATUS_RETRY = AMDSMI_STATUS_RETRY
    STATUS_NOT_INIT = AMDSMI_STATUS_NOT_INIT
    UNKNOWN_ERROR = AMDSMI_STATUS_UNKNOWN_ERROR


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    """A call the library answered with a status other than success."""

    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _ERR_INFO.get(
            err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
        )

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_info(self) -> str:
        return self.err_info

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(AMDSMI_STATUS_RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(AMDSMI_STATUS_TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: Any, expected: Any, msg: str | None = None) -> None:
        super().__init__(msg)
        self.err_code = None
        self.err_msg = msg or (
            f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}"
        )

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2
    INIT_NON_AMD_CPUS = 4
    INIT_NON_AMD_GPUS = 8
    INIT_AMD_APUS = 3


class AmdSmiEvtNotificationType(IntEnum):
    NONE = 0
    VMFAULT = 1
    THERMAL_THROTTLE = 2
    GPU_PRE_RESET = 3
    GPU_POST_RESET = 4
    RING_HANG = 5


class AmdSmiGpuBlock(IntEnum):
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384
    VCN = 32768
    JPEG = 65536
    IH = 131072
    MPIO = 262144
    RESERVED = 9223372036854775808


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2
    MAX_HYST = 3
    MIN_HYST = 4
    CRITICAL = 5
    CRITICAL_HYST = 6
    EMERGENCY = 7
    EMERGENCY_HYST = 8
    CRIT_MIN = 9
    CRIT_MIN_HYST = 10
    OFFSET = 11
    LOWEST = 12
    HIGHEST = 13


class AmdSmiMemoryPageStatus(IntEnum):
    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


class amdsmi_processor_handle(ctypes.c_void_p):
    """A processor handle, as amdsmi_wrapper's (a void pointer)."""


# Fault names `inject_fault` accepts, with what each does.
FAULTS: dict[str, str] = {
    "ecc-uncorrectable": "an uncorrectable UMC (HBM) ECC error; its page pending retirement",
    "ecc-correctable-burst": "corrected UMC ECC errors climb by 20,000",
    "bad-page-threshold": "retired (bad) pages reach the driver's threshold",
    "bad-page-unreservable": "a bad page the driver could not retire",
    "ring-hang": "a RING_HANG event, then the driver's GPU_PRE_RESET",
    "gpu-reset": "GPU_PRE_RESET then GPU_POST_RESET events (a reset that recovered)",
    "thermal": "hotspot above its critical threshold; a THERMAL_THROTTLE event",
    "fallen-off-bus": "every call raises AMDSMI_STATUS_NOT_FOUND",
    "hang": "every call on this GPU blocks until recovery",
}


@dataclass(frozen=True)
class AmdGpuModel:
    """What an AMD GPU model looks like to amdsmi."""

    market_name: str
    product_name: str
    device_id: int
    gfx: str
    compute_units: int
    vram_mib: int
    power_limit_w: int
    idle_power_w: int
    critical_c: int
    emergency_c: int
    ras_blocks: int
    bad_page_threshold: int


_MI300_RAS = (
    AmdSmiGpuBlock.UMC
    | AmdSmiGpuBlock.SDMA
    | AmdSmiGpuBlock.GFX
    | AmdSmiGpuBlock.MMHUB
    | AmdSmiGpuBlock.PCIE_BIF
    | AmdSmiGpuBlock.HDP
    | AmdSmiGpuBlock.XGMI_WAFL
    | AmdSmiGpuBlock.MP1
    | AmdSmiGpuBlock.VCN
    | AmdSmiGpuBlock.JPEG
)

AMD_MODELS: dict[str, AmdGpuModel] = {
    "MI300X": AmdGpuModel(
        "AMD Instinct MI300X",
        "AMD Instinct MI300X OAM",
        0x74A1,
        "gfx942",
        304,
        196592,
        750,
        140,
        100,
        105,
        int(_MI300_RAS),
        128,
    ),
}
# Where the eight OAMs of an MI300X platform sit on PCIe.
_MI300X_BDFS = (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)


def amd_model_for(product: str) -> AmdGpuModel:
    """The model of a product label (`AMD_Instinct_MI300X_OAM`); MI300X when unknown."""
    for key, model in AMD_MODELS.items():
        if key in product.upper():
            return model
    return AMD_MODELS["MI300X"]


@dataclass
class SimAmdGpu:
    """One simulated AMD GPU's state (guarded by the owning SimAmdSmi's lock)."""

    index: int
    uuid: str
    bdf: str
    serial: str
    model: AmdGpuModel
    handle: amdsmi_processor_handle
    hotspot_c: int = 45
    gfx_activity: int = 0
    vram_used_mib: int = 2048
    ecc: dict[int, list[int]] = field(default_factory=dict)
    """RAS block -> [correctable, uncorrectable, deferred] since the driver loaded."""
    bad_pages: list[tuple[int, int]] = field(default_factory=list)
    """(page address, AmdSmiMemoryPageStatus)."""
    lost: bool = False
    hang: threading.Event | None = None
    energy_at: float = 0.0
    energy_uj: float = 0.0


@dataclass(frozen=True)
class _Notice:
    gpu: SimAmdGpu
    event: AmdSmiEvtNotificationType
    message: str


class SimAmdSmi(SimGpus[SimAmdGpu]):
    """One node's simulated AMD SMI library. Thread-safe; no process-wide state."""

    FAULTS = FAULTS

    def __init__(
        self, node: str, gpus: list[SimAmdGpu], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(node, gpus, clock=clock)
        self._masks: dict[int, int] = {}  # GPU index -> notification mask
        self._notices: deque[_Notice] = deque()
        self._arrived = threading.Condition(self._lock)
        for gpu in gpus:
            gpu.energy_at = clock()

    @classmethod
    def build(cls, node: str, *, product: str = "MI300X", count: int = 8) -> SimAmdSmi:
        """A node of `count` GPUs of `product` (an `amd.com/gpu.product-name` label)."""
        model = amd_model_for(product)
        gpus = []
        base = int(hashlib.sha256(node.encode()).hexdigest()[:4], 16) << 16
        for i in range(count):
            digest = hashlib.sha256(f"{node}/amd/{i}".encode()).hexdigest()
            uuid = (
                f"{digest[:2]}ff{model.device_id:04x}-{digest[4:8]}-{digest[8:12]}-"
                f"{digest[12:16]}-{digest[16:28]}"
            )
            bus = _MI300X_BDFS[i % len(_MI300X_BDFS)] + 0x100 * (i // len(_MI300X_BDFS))
            gpus.append(
                SimAmdGpu(
                    i,
                    uuid,
                    f"0000:{bus:02x}:00.0",
                    digest[28:44].upper(),
                    model,
                    amdsmi_processor_handle(base + 0x1000 + i * 0x10),
                )
            )
        return cls(node, gpus)

    # -- fault injection ---------------------------------------------------------------

    def _count(self, gpu: SimAmdGpu, block: AmdSmiGpuBlock, kind: int, n: int) -> None:
        counts = gpu.ecc.setdefault(int(block), [0, 0, 0])
        counts[kind] += n

    def inject_fault(self, index: int, fault: str) -> None:
        """Apply a named fault (see `FAULTS`) to GPU `index`."""
        gpu = self._faulty(index, fault)
        evt = AmdSmiEvtNotificationType
        with self._lock:
            if fault == "ecc-uncorrectable":
                self._count(gpu, AmdSmiGpuBlock.UMC, 1, 1)
                page = 0x7F3A2000 + 0x1000 * len(gpu.bad_pages)
                gpu.bad_pages.append((page, AmdSmiMemoryPageStatus.PENDING))
            elif fault == "ecc-correctable-burst":
                self._count(gpu, AmdSmiGpuBlock.UMC, 0, 20_000)
            elif fault == "bad-page-threshold":
                start = len(gpu.bad_pages)
                gpu.bad_pages.extend(
                    (0x10000000 + 0x1000 * (start + i), AmdSmiMemoryPageStatus.RESERVED)
                    for i in range(max(gpu.model.bad_page_threshold - start, 1))
                )
            elif fault == "bad-page-unreservable":
                page = 0x20000000 + 0x1000 * len(gpu.bad_pages)
                gpu.bad_pages.append((page, AmdSmiMemoryPageStatus.UNRESERVABLE))
            elif fault == "ring-hang":
                self._notify(gpu, evt.RING_HANG, "gfx_0.0.0")
                self._notify(gpu, evt.GPU_PRE_RESET, "1")
            elif fault == "gpu-reset":
                self._notify(gpu, evt.GPU_PRE_RESET, "1")
                self._notify(gpu, evt.GPU_POST_RESET, "1")
            elif fault == "thermal":
                gpu.hotspot_c = gpu.model.critical_c + 3
                self._notify(gpu, evt.THERMAL_THROTTLE, "2:1")
            self._lose_or_hang(gpu, fault)

    def inject_xid(self, index: int, xid: int, **_: Any) -> None:
        """AMD GPUs report no XIDs: refused, naming the faults there are."""
        self._gpu(index)
        raise ValueError(
            f"node {self.node} has AMD GPUs: no XIDs; inject a fault ({', '.join(sorted(FAULTS))})"
        )

    def set_recovery_action(self, index: int, action: int) -> None:
        """NVML's recovery action has no AMD counterpart: refused."""
        self._gpu(index)
        raise ValueError(f"node {self.node} has AMD GPUs: no NVML recovery action")

    def set_load(self, index: int, utilization_pct: float) -> None:
        """Set GPU `index`'s graphics activity; its power follows (idle to the limit)."""
        gpu = self._loaded(index, utilization_pct)
        with self._lock:
            self._integrate(gpu)
            gpu.gfx_activity = round(utilization_pct)

    def recover(self, index: int) -> None:
        """GPU reset: counters since load cleared, pending pages retired, faults gone."""
        gpu = self._gpu(index)
        with self._lock:
            hang = self._clear_faults(gpu)
            gpu.hotspot_c = 45
            gpu.ecc.clear()
            gpu.bad_pages = [
                (p, AmdSmiMemoryPageStatus.RESERVED if s == AmdSmiMemoryPageStatus.PENDING else s)
                for p, s in gpu.bad_pages
            ]
            self._notify(gpu, AmdSmiEvtNotificationType.GPU_PRE_RESET, "1")
            self._notify(gpu, AmdSmiEvtNotificationType.GPU_POST_RESET, "1")
        if hang is not None:
            hang.set()

    def _notify(self, gpu: SimAmdGpu, event: AmdSmiEvtNotificationType, message: str) -> None:
        if self._masks.get(gpu.index, 0) & (1 << (int(event) - 1)):
            self._notices.append(_Notice(gpu, event, message))
            self._arrived.notify_all()

    def _power_w(self, gpu: SimAmdGpu) -> float:
        m = gpu.model
        return m.idle_power_w + gpu.gfx_activity / 100 * (m.power_limit_w - m.idle_power_w)

    def _integrate(self, gpu: SimAmdGpu) -> None:
        now = self.clock()
        if now > gpu.energy_at:
            gpu.energy_uj += self._power_w(gpu) * (now - gpu.energy_at) * 1e6
        gpu.energy_at = max(now, gpu.energy_at)

    # -- the amdsmi surface ------------------------------------------------------------

    def _check_init(self) -> None:
        if self._initialised <= 0:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)

    def _enter(self, handle: Any) -> SimAmdGpu:
        """Every device call starts here: bad handles, no init, hung and lost GPUs."""
        if not isinstance(handle, amdsmi_processor_handle):
            raise AmdSmiParameterException(handle, amdsmi_processor_handle)
        self._check_init()
        gpu = next((g for g in self.gpus if g.handle.value == handle.value), None)
        if gpu is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
        if self._lost(gpu):
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_FOUND)
        return gpu

    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        with self._lock:
            self._initialised += 1

    def amdsmi_shut_down(self) -> None:
        with self._lock:
            self._check_init()
            self._initialised -= 1

    def amdsmi_get_processor_handles(self) -> list[amdsmi_processor_handle]:
        self._check_init()
        return [amdsmi_processor_handle(g.handle.value) for g in self.gpus]

    def amdsmi_get_gpu_device_uuid(self, handle: Any) -> str:
        return self._enter(handle).uuid

    def amdsmi_get_gpu_device_bdf(self, handle: Any) -> str:
        return self._enter(handle).bdf

    def amdsmi_get_gpu_asic_info(self, handle: Any) -> dict[str, Any]:
        gpu = self._enter(handle)
        m = gpu.model
        return {
            "market_name": m.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": hex(m.device_id),
            "rev_id": "0x00",
            "asic_serial": f"0x{gpu.serial}",
            "oam_id": gpu.index,
            "num_compute_units": m.compute_units,
            "target_graphics_version": m.gfx,
        }

    def amdsmi_get_gpu_board_info(self, handle: Any) -> dict[str, Any]:
        gpu = self._enter(handle)
        return {
            "model_number": "102-G30211-00",
            "product_serial": f"PCB{gpu.serial[:9]}",
            "fru_id": "N/A",
            "product_name": gpu.model.product_name,
            "manufacturer_name": "AMD",
        }

    def amdsmi_get_gpu_ecc_enabled(self, handle: Any) -> int:
        return self._enter(handle).model.ras_blocks

    def amdsmi_get_gpu_ecc_count(self, handle: Any, block: AmdSmiGpuBlock) -> dict[str, int]:
        if not isinstance(block, AmdSmiGpuBlock):
            raise AmdSmiParameterException(block, AmdSmiGpuBlock)
        gpu = self._enter(handle)
        if not gpu.model.ras_blocks & int(block):
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        c, u, d = gpu.ecc.get(int(block), [0, 0, 0])
        return {"correctable_count": c, "uncorrectable_count": u, "deferred_count": d}

    def amdsmi_get_gpu_total_ecc_count(self, handle: Any) -> dict[str, int]:
        gpu = self._enter(handle)
        totals = [sum(v[k] for v in gpu.ecc.values()) for k in range(3)]
        return {
            "correctable_count": totals[0],
            "uncorrectable_count": totals[1],
            "deferred_count": totals[2],
        }

    def amdsmi_get_gpu_bad_page_info(self, handle: Any) -> list[dict[str, int]]:
        gpu = self._enter(handle)
        return [
            {"value": i, "page_address": addr, "page_size": 4096, "status": int(status)}
            for i, (addr, status) in enumerate(gpu.bad_pages)
        ]

    def amdsmi_get_temp_metric(
        self, handle: Any, sensor_type: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric
    ) -> int:
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        gpu = self._enter(handle)
        if sensor_type == AmdSmiTemperatureType.EDGE:  # MI300 has no edge sensor
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        values = {
            AmdSmiTemperatureMetric.CURRENT: gpu.hotspot_c
            if sensor_type == AmdSmiTemperatureType.HOTSPOT
            else gpu.hotspot_c - 8,
            AmdSmiTemperatureMetric.CRITICAL: gpu.model.critical_c,
            AmdSmiTemperatureMetric.EMERGENCY: gpu.model.emergency_c,
        }
        if metric not in values:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return values[metric]

    def amdsmi_get_power_info(self, handle: Any) -> dict[str, Any]:
        gpu = self._enter(handle)
        return {
            "current_socket_power": round(self._power_w(gpu)),
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": gpu.model.power_limit_w * 1_000_000,
        }

    def amdsmi_get_gpu_activity(self, handle: Any) -> dict[str, Any]:
        gpu = self._enter(handle)
        return {
            "gfx_activity": gpu.gfx_activity,
            "umc_activity": gpu.gfx_activity // 2,
            "mm_activity": "N/A",
        }

    def amdsmi_get_gpu_vram_usage(self, handle: Any) -> dict[str, int]:
        gpu = self._enter(handle)
        return {"vram_total": gpu.model.vram_mib, "vram_used": gpu.vram_used_mib}

    def amdsmi_get_energy_count(self, handle: Any) -> dict[str, Any]:
        gpu = self._enter(handle)
        with self._lock:
            self._integrate(gpu)
            resolution = 15.259
            ticks = int(gpu.energy_uj / resolution)
        return {
            "power": ticks,
            "energy_accumulator": ticks,
            "counter_resolution": resolution,
            "timestamp": int(self.clock() * 1e9),
        }

    def amdsmi_get_gpu_metrics_info(self, handle: Any) -> dict[str, Any]:
        gpu = self._enter(handle)
        with self._lock:
            self._integrate(gpu)
        return {
            "temperature_edge": "N/A",
            "temperature_hotspot": gpu.hotspot_c,
            "temperature_mem": gpu.hotspot_c - 8,
            "average_gfx_activity": gpu.gfx_activity,
            "average_umc_activity": gpu.gfx_activity // 2,
            "average_mm_activity": "N/A",
            "average_socket_power": "N/A",
            "current_socket_power": round(self._power_w(gpu)),
            "energy_accumulator": int(gpu.energy_uj / 15.259),
            "current_gfxclk": "N/A",
            "current_uclk": 1300,
            "throttle_status": "N/A",
            "pcie_replay_count_acc": 0,
        }

    def amdsmi_get_gpu_process_list(self, handle: Any) -> list[dict[str, Any]]:
        self._enter(handle)
        return []

    # -- events ------------------------------------------------------------------------

    def AmdSmiEventReader(
        self, processor_handle: Any, event_types: Iterable[AmdSmiEvtNotificationType]
    ) -> SimEventReader:
        """amdsmi.AmdSmiEventReader(handle, types) on this library."""
        return SimEventReader(self, processor_handle, list(event_types))

    def _init_events(self, handle: Any, mask: int) -> None:
        gpu = self._enter(handle)  # amdsmi_init_gpu_event_notification + set mask
        with self._lock:
            self._masks[gpu.index] = mask

    def _stop_events(self, handle: Any) -> None:
        gpu = self._enter(handle)
        with self._lock:
            if gpu.index not in self._masks:
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
            del self._masks[gpu.index]

    def _read_events(self, timeout_ms: int, num_elem: int) -> list[dict[str, Any]]:
        self._check_init()
        with self._lock:
            if not self._notices:
                self._arrived.wait(timeout_ms / 1000)
            if not self._notices:
                raise AmdSmiLibraryException(AMDSMI_STATUS_NO_DATA)
            out = []
            for _ in range(min(num_elem, len(self._notices))):
                n = self._notices.popleft()
                out.append(
                    {
                        "processor_handle": n.gpu.handle.value,
                        "event": n.event.name,
                        "message": n.message,
                    }
                )
            return out


class SimEventReader:
    """amdsmi.AmdSmiEventReader: notification on one GPU; `read` returns every GPU's events."""

    def __init__(
        self, smi: SimAmdSmi, handle: Any, event_types: list[AmdSmiEvtNotificationType]
    ) -> None:
        if not isinstance(handle, amdsmi_processor_handle):
            raise AmdSmiParameterException(handle, amdsmi_processor_handle)
        for t in event_types:
            if not isinstance(t, AmdSmiEvtNotificationType):
                raise AmdSmiParameterException(t, AmdSmiEvtNotificationType)
        self.smi = smi
        self.processor_handle = handle
        mask = 0
        for t in event_types:
            if t != AmdSmiEvtNotificationType.NONE:
                mask |= 1 << (int(t) - 1)
        smi._init_events(handle, mask)

    def read(self, timestamp: int, num_elem: int = 10) -> list[dict[str, Any]]:
        """Up to `num_elem` events, waiting `timestamp` ms; AMDSMI_STATUS_NO_DATA if none."""
        return self.smi._read_events(timestamp, num_elem)

    def stop(self) -> None:
        self.smi._stop_events(self.processor_handle)

    def __enter__(self) -> SimEventReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# amdsmi's enums and errors as attributes of the library, as `import amdsmi` exposes them.
for _exported in (
    AmdSmiException,
    AmdSmiLibraryException,
    AmdSmiRetryException,
    AmdSmiTimeoutException,
    AmdSmiParameterException,
    AmdSmiInitFlags,
    AmdSmiEvtNotificationType,
    AmdSmiGpuBlock,
    AmdSmiTemperatureType,
    AmdSmiTemperatureMetric,
    AmdSmiMemoryPageStatus,
):
    setattr(SimAmdSmi, _exported.__name__, _exported)
