"""Reading AMD GPUs through AMD SMI (ROCm's `amdsmi` Python package).

Every function here blocks and takes `smi`, the `amdsmi` module itself or a `SimAmdSmi`;
amdsmi's enums and exceptions are read from `smi` (`smi.AmdSmiGpuBlock`,
`smi.AmdSmiLibraryException`), so nothing here imports amdsmi and the same code reads
real and simulated GPUs. Like the NVML source they run on a `nodeward.watchdog.Lane` and
mark each call. AMDSMI_STATUS_NOT_SUPPORTED becomes `None`; a GPU gone from the bus
(AMDSMI_STATUS_NOT_FOUND / DRIVER_NOT_LOADED) propagates (see `is_lost`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.sources.nvml import GpuIdentity, LibraryReader, TelemetrySample
from nodeward.watchdog import Lane

# amdsmi_wrapper.AMDSMI_STATUS_* (the same in every amdsmi release)
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_FOUND = 31
STATUS_DRIVER_NOT_LOADED = 34
STATUS_NO_DATA = 40
_LOST = frozenset({STATUS_NOT_FOUND, STATUS_DRIVER_NOT_LOADED})
# The RAS blocks read one by one (amdsmi_get_gpu_ecc_count), where ECC is enabled.
RAS_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL", "MP1")
# The KFD SMI events the agent subscribes to.
EVENTS = ("THERMAL_THROTTLE", "GPU_PRE_RESET", "GPU_POST_RESET", "RING_HANG")


def error_code(exc: BaseException) -> int | None:
    """The AMDSMI_STATUS_* of an AmdSmiLibraryException (any amdsmi version), else None."""
    getter = getattr(exc, "get_error_code", None)
    code = getter() if callable(getter) else getattr(exc, "err_code", None)
    return int(code) if isinstance(code, int) else None


def is_lost(exc: BaseException) -> bool:
    return error_code(exc) in _LOST


def handle_key(handle: Any) -> int:
    """A key equal for every copy of one processor handle (c_void_p, or the raw int)."""
    if isinstance(handle, int):
        return handle
    value = getattr(handle, "value", None)
    return int(value) if isinstance(value, int) else id(handle)


def _number(value: Any) -> int | None:
    """amdsmi's "N/A" (and anything not a number) as None."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class _Reader(LibraryReader):
    """amdsmi calls: NOT_SUPPORTED and other errors become None."""

    def failure(self) -> type[Exception]:
        error: type[Exception] = self.lib.AmdSmiLibraryException
        return error

    def lost(self, exc: Exception) -> bool:
        return is_lost(exc)

    def unsupported(self, exc: Exception) -> bool:
        return error_code(exc) == STATUS_NOT_SUPPORTED

    def said(self, exc: Exception) -> str:
        return str(exc).replace("\n\t", " ")


def amd_product(name: str) -> str:
    """An AMD board's product name (sysfs `product_name`, amdsmi's board info) as AMD's node
    labeller spells it in `amd.com/gpu.product-name`: blanks underscores, no parentheses."""
    return name.strip().replace(" ", "_").replace("(", "").replace(")", "")


def processor_handles(smi: Any) -> list[Any]:
    return list(smi.amdsmi_get_processor_handles())


def identify(smi: Any, lane: Lane, index: int) -> GpuIdentity:
    """GPU `index`'s identity: UUID, market name and BDF."""
    read = _Reader(smi, lane)
    lane.mark("amdsmi_get_processor_handles")
    handle = processor_handles(smi)[index]
    lane.mark("amdsmi_get_gpu_device_uuid")
    uuid = str(smi.amdsmi_get_gpu_device_uuid(handle))
    asic = read("amdsmi_get_gpu_asic_info", handle) or {}
    board = read("amdsmi_get_gpu_board_info", handle) or {}
    market, product = (
        str(v) if v and v != "N/A" else ""
        for v in (asic.get("market_name"), board.get("product_name"))
    )
    name = market or product or "AMD GPU"
    return GpuIdentity(
        index=index,
        uuid=uuid,
        name=name,
        # The labeller reads the board's product name (sysfs), else libdrm's marketing name.
        product=amd_product(product or market),
        pci_bus_id=read("amdsmi_get_gpu_device_bdf", handle),
        handle=handle,
    )


@dataclass
class AmdHealthSample:
    """One poll of an AMD GPU's RAS counters and thermals; None where not supported."""

    ecc_total: dict[str, int] | None = None
    """correctable / uncorrectable / deferred since the driver loaded (all blocks)."""
    ecc_blocks: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per RAS block (UMC, GFX, ...) with any count above zero."""
    bad_pages: dict[str, int] | None = None
    """Bad (retired) pages by status: reserved, pending, unreservable."""
    temperature_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ecc(self) -> dict[str, int]:
        """The counters as metrics (`kind` -> count)."""
        return dict(self.ecc_total or {})


_COUNTS = {
    "correctable_count": "correctable",
    "uncorrectable_count": "uncorrectable",
    "deferred_count": "deferred",
}
_PAGE_STATUS = {0: "reserved", 1: "pending", 2: "unreservable"}


def _counts(raw: dict[str, Any]) -> dict[str, int]:
    return {ours: _number(raw.get(key)) or 0 for key, ours in _COUNTS.items()}


def _page_status(value: Any) -> str:
    """A bad page's status: amdsmi gives the enum's value, some releases its name."""
    if isinstance(value, int):
        return _PAGE_STATUS.get(value, "unknown")
    name = getattr(value, "name", str(value))
    return name.rsplit("_", 1)[-1].lower() if name else "unknown"


def sample_health(smi: Any, lane: Lane, gpu: GpuIdentity) -> AmdHealthSample:
    """Read every RAS counter and the thermals of one GPU."""
    read = _Reader(smi, lane)
    h = gpu.handle
    s = AmdHealthSample()
    total = read("amdsmi_get_gpu_total_ecc_count", h)
    if total is not None:
        s.ecc_total = _counts(total)
    enabled = read("amdsmi_get_gpu_ecc_enabled", h)
    for name in RAS_BLOCKS:
        block = getattr(smi.AmdSmiGpuBlock, name)
        if enabled is not None and not int(enabled) & int(block):
            continue
        counts = read("amdsmi_get_gpu_ecc_count", h, block)
        if counts is not None and any(_counts(counts).values()):
            s.ecc_blocks[name] = _counts(counts)
    pages = read("amdsmi_get_gpu_bad_page_info", h)
    if isinstance(pages, str):  # amdsmi before ROCm 6.2: "No bad pages found."
        pages = []
    if isinstance(pages, list):
        tally = {"reserved": 0, "pending": 0, "unreservable": 0}
        for page in pages:
            status = _page_status(page.get("status") if isinstance(page, dict) else None)
            tally[status] = tally.get(status, 0) + 1
        s.bad_pages = tally
    sensor, metric = smi.AmdSmiTemperatureType, smi.AmdSmiTemperatureMetric
    s.temperature_c = _number(read("amdsmi_get_temp_metric", h, sensor.HOTSPOT, metric.CURRENT))
    s.slowdown_c = _number(read("amdsmi_get_temp_metric", h, sensor.HOTSPOT, metric.CRITICAL))
    s.shutdown_c = _number(read("amdsmi_get_temp_metric", h, sensor.HOTSPOT, metric.EMERGENCY))
    s.errors = read.errors
    return s


def sample_telemetry(smi: Any, lane: Lane, gpu: GpuIdentity) -> TelemetrySample:
    """Activity, VRAM, hotspot temperature, power and energy of one GPU."""
    read = _Reader(smi, lane)
    h = gpu.handle
    activity = read("amdsmi_get_gpu_activity", h) or {}
    vram = read("amdsmi_get_gpu_vram_usage", h) or {}
    power = read("amdsmi_get_power_info", h) or {}
    energy = read("amdsmi_get_energy_count", h) or {}
    sensor, metric = smi.AmdSmiTemperatureType, smi.AmdSmiTemperatureMetric
    temp = _number(read("amdsmi_get_temp_metric", h, sensor.HOTSPOT, metric.CURRENT))
    watts = _number(power.get("current_socket_power"))
    if watts is None:
        watts = _number(power.get("average_socket_power"))
    ticks, resolution = _number(energy.get("energy_accumulator")), energy.get("counter_resolution")
    energy_mj = None  # the accumulator counts `counter_resolution` µJ a tick
    if ticks is not None and isinstance(resolution, int | float):
        energy_mj = int(ticks * resolution / 1000)
    mib = 1024 * 1024
    return TelemetrySample(
        utilization_gpu_pct=float(_number(activity.get("gfx_activity")) or 0),
        utilization_memory_pct=float(_number(activity.get("umc_activity")) or 0),
        memory_used_bytes=(_number(vram.get("vram_used")) or 0) * mib,
        memory_total_bytes=(_number(vram.get("vram_total")) or 0) * mib,
        temperature_c=float(temp) if temp is not None else None,
        power_w=float(watts) if watts is not None else None,
        energy_mj=energy_mj,
        sm_clock_mhz=None,
        memory_clock_mhz=None,
    )


@dataclass(frozen=True)
class AmdEvent:
    """One KFD SMI event: the GPU (see `handle_key`), amdsmi's event name and message."""

    device_key: int
    event: str
    message: str


def open_readers(smi: Any, lane: Lane, gpus: list[GpuIdentity]) -> list[Any]:
    """An AmdSmiEventReader per GPU for `EVENTS` (a GPU that cannot notify is skipped)."""
    types = [getattr(smi.AmdSmiEvtNotificationType, name) for name in EVENTS]
    readers = []
    for gpu in gpus:
        lane.mark("AmdSmiEventReader")
        try:
            readers.append(smi.AmdSmiEventReader(gpu.handle, types))
        except smi.AmdSmiLibraryException:
            continue
    return readers


def wait_events(
    smi: Any,
    readers: list[Any],
    deliver: Callable[[AmdEvent], None],
    failed: Callable[[str], None],
    stop: threading.Event,
    *,
    timeout_ms: int = 500,
) -> None:
    """The event thread: read until `stop`; one reader returns every GPU's events."""
    while not stop.is_set():
        if not readers:
            stop.wait(timeout_ms / 1000)
            continue
        try:
            found = readers[0].read(timeout_ms)
        except smi.AmdSmiLibraryException as exc:
            if error_code(exc) == STATUS_NO_DATA:
                continue
            failed(str(exc).replace("\n\t", " "))
            stop.wait(1.0)
            continue
        for item in found:
            deliver(
                AmdEvent(
                    device_key=handle_key(item.get("processor_handle")),
                    event=str(item.get("event", "")),
                    message=str(item.get("message", "")),
                )
            )


def close_readers(smi: Any, readers: list[Any]) -> None:
    for reader in readers:
        try:
            reader.stop()
        except smi.AmdSmiException:
            continue
