"""Reading NVML: device discovery, health and telemetry samples, the XID event wait.

Every function here blocks and takes `nvml`, the `pynvml` module itself or a `SimNvml`,
so the same code reads real and simulated GPUs. They run on a `nodeward.watchdog.Lane`
(one per GPU) and call `lane.mark(name)` before each NVML call, so a call that hangs is
reported by name. `NVMLError_GpuIsLost` propagates; `NotSupported` becomes `None`.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.sources.nvml_compat import pynvml
from nodeward.watchdog import Lane

# Events the agent waits for (masked by what each device supports).
EVENT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeDramRetirementEvent
    | pynvml.nvmlEventTypeDramRetirementFailure
    | pynvml.nvmlEventTypeGpuRecoveryAction
)
_NO_INSTANCE = 0xFFFFFFFF
_NVLINK_COUNTERS = {
    "replay": pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    "crc_flit": pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    "crc_data": pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
}
_MAX_NVLINKS = 18


def is_lost(exc: BaseException) -> bool:
    return isinstance(exc, pynvml.NVMLError) and exc.value == pynvml.NVML_ERROR_GPU_IS_LOST


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def handle_key(handle: Any) -> int:
    """A key equal for every copy of one device handle (ctypes pointer or sim object)."""
    try:
        return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
    except (ctypes.ArgumentError, TypeError):
        return id(handle)


class LibraryReader:
    """Makes named calls of a GPU library `lib` on one lane: the library's errors become
    None, noted in `errors` unless the call is not supported; a lost GPU's are raised."""

    def __init__(self, lib: Any, lane: Lane) -> None:
        self.lib = lib
        self.lane = lane
        self.errors: dict[str, str] = {}

    def __call__(self, name: str, *args: Any) -> Any:
        self.lane.mark(name)
        try:
            return getattr(self.lib, name)(*args)
        except self.failure() as exc:
            if self.lost(exc):
                raise
            if not self.unsupported(exc):
                self.errors[name] = self.said(exc)
            return None

    def failure(self) -> type[Exception]:
        """The library's error type."""
        raise NotImplementedError

    def lost(self, exc: Exception) -> bool:
        raise NotImplementedError

    def unsupported(self, exc: Exception) -> bool:
        raise NotImplementedError

    def said(self, exc: Exception) -> str:
        return str(exc)


class _Reader(LibraryReader):
    """NVML calls: NotSupported and other errors become None."""

    def failure(self) -> type[Exception]:
        error: type[Exception] = pynvml.NVMLError
        return error

    def lost(self, exc: Exception) -> bool:
        return is_lost(exc)

    def unsupported(self, exc: Exception) -> bool:
        return bool(getattr(exc, "value", None) == pynvml.NVML_ERROR_NOT_SUPPORTED)


@dataclass(frozen=True)
class MigIdentity:
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    profile: str | None


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str | None
    handle: Any
    migs: tuple[MigIdentity, ...] = ()
    nvlinks: tuple[int, ...] = ()
    product: str = ""
    """The model as the node's product label spells it (`nvidia_product`, or `amdsmi`'s
    `amd_product`): what a join with the capacity service's series, which read it, needs."""


def nvidia_product(name: str) -> str:
    """An NVML device name as GPU feature discovery spells it in `nvidia.com/gpu.product`
    (its `sanitise`: characters outside `A-Za-z0-9-_. ` dropped, runs of blanks one dash);
    without the `-SHARED` or `-MIG-<profile>` it appends for time-slicing or MIG."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def device_count(nvml: Any) -> int:
    return int(nvml.nvmlDeviceGetCount())


def identify(nvml: Any, lane: Lane, index: int) -> GpuIdentity:
    """One GPU's identity, MIG instances and active NVLinks."""
    read = _Reader(nvml, lane)
    lane.mark("nvmlDeviceGetHandleByIndex")
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    lane.mark("nvmlDeviceGetUUID")
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    name = _text(read("nvmlDeviceGetName", handle) or "unknown")
    pci = read("nvmlDeviceGetPciInfo", handle)
    migs: list[MigIdentity] = []
    mode = read("nvmlDeviceGetMigMode", handle)
    if mode and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
        for i in range(int(read("nvmlDeviceGetMaxMigDeviceCount", handle) or 0)):
            mig = read("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if mig is None:
                continue
            mig_name = _text(read("nvmlDeviceGetName", mig) or "")
            migs.append(
                MigIdentity(
                    gpu_instance_id=int(read("nvmlDeviceGetGpuInstanceId", mig) or 0),
                    compute_instance_id=int(read("nvmlDeviceGetComputeInstanceId", mig) or 0),
                    uuid=_text(read("nvmlDeviceGetUUID", mig) or f"{uuid}/mig{i}"),
                    profile=mig_name.rsplit(" ", 1)[-1] if "MIG" in mig_name else None,
                )
            )
    links = tuple(
        link
        for link in range(_MAX_NVLINKS)
        if read("nvmlDeviceGetNvLinkState", handle, link) == pynvml.NVML_FEATURE_ENABLED
    )
    return GpuIdentity(
        index=index,
        uuid=uuid,
        name=name,
        product=nvidia_product(name),
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        handle=handle,
        migs=tuple(migs),
        nvlinks=links,
    )


def register_events(nvml: Any, lane: Lane, gpu: GpuIdentity, event_set: Any) -> int:
    """Register the events this GPU supports in `event_set`; returns the mask registered."""
    read = _Reader(nvml, lane)
    supported = read("nvmlDeviceGetSupportedEventTypes", gpu.handle)
    mask = int(EVENT_MASK) & int(supported if supported is not None else EVENT_MASK)
    if mask:
        read("nvmlDeviceRegisterEvents", gpu.handle, mask, event_set)
    return mask


@dataclass
class HealthSample:
    """One poll of a GPU's health counters; `None` where the GPU does not support a read."""

    ecc: dict[str, int] = field(default_factory=dict)
    retired_pages: dict[str, int] | None = None
    retired_pending: bool | None = None
    remapped_rows: dict[str, int] | None = None
    temperature_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None
    clock_reasons: int | None = None
    nvlink_errors: dict[str, int] = field(default_factory=dict)
    pcie_replay: int | None = None
    recovery_action: int | None = None
    errors: dict[str, str] = field(default_factory=dict)


def sample_health(nvml: Any, lane: Lane, gpu: GpuIdentity) -> HealthSample:
    """Read every health counter of one GPU (raises NVMLError_GpuIsLost if it is gone)."""
    read = _Reader(nvml, lane)
    h = gpu.handle
    s = HealthSample()
    for kind, etype in (
        ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    ):
        for counter, ctype in (
            ("volatile", pynvml.NVML_VOLATILE_ECC),
            ("aggregate", pynvml.NVML_AGGREGATE_ECC),
        ):
            value = read("nvmlDeviceGetTotalEccErrors", h, etype, ctype)
            if value is not None:
                s.ecc[f"{kind}_{counter}"] = int(value)
    sbe = read(
        "nvmlDeviceGetRetiredPages",
        h,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    dbe = read(
        "nvmlDeviceGetRetiredPages", h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    if sbe is not None or dbe is not None:
        s.retired_pages = {"sbe": len(sbe or ()), "dbe": len(dbe or ())}
    pending = read("nvmlDeviceGetRetiredPagesPendingStatus", h)
    s.retired_pending = None if pending is None else bool(pending)
    rows = read("nvmlDeviceGetRemappedRows", h)
    if rows is not None:
        corr, unc, is_pending, failure = rows
        s.remapped_rows = {
            "correctable": int(corr),
            "uncorrectable": int(unc),
            "pending": int(is_pending),
            "failure": int(failure),
        }
    s.temperature_c = read("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
    s.slowdown_c = read(
        "nvmlDeviceGetTemperatureThreshold", h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    )
    s.shutdown_c = read(
        "nvmlDeviceGetTemperatureThreshold", h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    )
    s.clock_reasons = read("nvmlDeviceGetCurrentClocksEventReasons", h)
    for link in gpu.nvlinks:
        for name, counter in _NVLINK_COUNTERS.items():
            value = read("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
            if value:
                s.nvlink_errors[name] = s.nvlink_errors.get(name, 0) + int(value)
    s.pcie_replay = read("nvmlDeviceGetPcieReplayCounter", h)
    fields = read("nvmlDeviceGetFieldValues", h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if fields and fields[0].nvmlReturn == pynvml.NVML_SUCCESS:
        s.recovery_action = int(fields[0].value.uiVal)
    s.errors = read.errors
    return s


@dataclass(frozen=True)
class TelemetrySample:
    utilization_gpu_pct: float
    utilization_memory_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float | None
    power_w: float | None
    energy_mj: int | None
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None


def sample_telemetry(nvml: Any, lane: Lane, gpu: GpuIdentity) -> TelemetrySample:
    """Utilisation, memory, temperature, power, energy and clocks of one GPU."""
    read = _Reader(nvml, lane)
    h = gpu.handle
    util = read("nvmlDeviceGetUtilizationRates", h)
    mem = read("nvmlDeviceGetMemoryInfo", h)
    power = read("nvmlDeviceGetPowerUsage", h)
    return TelemetrySample(
        utilization_gpu_pct=float(util.gpu) if util is not None else 0.0,
        utilization_memory_pct=float(util.memory) if util is not None else 0.0,
        memory_used_bytes=int(mem.used) if mem is not None else 0,
        memory_total_bytes=int(mem.total) if mem is not None else 0,
        temperature_c=read("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU),
        power_w=power / 1000 if power is not None else None,
        energy_mj=read("nvmlDeviceGetTotalEnergyConsumption", h),
        sm_clock_mhz=read("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM),
        memory_clock_mhz=read("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM),
    )


@dataclass(frozen=True)
class NvmlEvent:
    """An NVML event, its device resolved to a key (see `handle_key`)."""

    device_key: int
    event_type: int
    data: int
    gpu_instance_id: int | None
    compute_instance_id: int | None


def wait_events(
    nvml: Any,
    event_set: Any,
    deliver: Callable[[NvmlEvent], None],
    failed: Callable[[str], None],
    stop: threading.Event,
    *,
    timeout_ms: int = 500,
) -> None:
    """The event thread: wait on `event_set` until `stop`; hand each event to `deliver`."""
    while not stop.is_set():
        try:
            data = nvml.nvmlEventSetWait(event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                continue
            failed(str(exc))
            stop.wait(1.0)
            continue
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        deliver(
            NvmlEvent(
                device_key=handle_key(data.device),
                event_type=int(data.eventType),
                data=int(data.eventData),
                gpu_instance_id=None if gi == _NO_INSTANCE else gi,
                compute_instance_id=None if ci == _NO_INSTANCE else ci,
            )
        )
