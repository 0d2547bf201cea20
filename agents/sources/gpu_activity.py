"""Utilisation of each GPU and MIG instance on the node, for the idleness agent.

`nvml` is the `pynvml` module or a `sim.nvml.SimNvml`. A whole GPU is read with
`nvmlDeviceGetUtilizationRates` (the share of the driver's last sample period in which a
kernel ran). NVML does not report utilisation rates for MIG instances (nor for a GPU with
MIG enabled): there GPM, on Hopper and later, measures each GPU instance's graphics activity
between two samples kept from one call to the next. Where neither works the percentage is
None, with the reason, so it is never taken for idleness. Every result is keyed by every ID
pod-resources may name the device by: GPU UUID and index, MIG UUID.

NVML calls block: they run on one `Lane` thread with a deadline. Nothing raises out of
`utilization()`: a lost GPU, a hung driver or a failed call becomes None with the reason.
This module imports neither pydantic nor structlog (it runs in `bench/gpu_real.py` on bare
GPU hosts).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.sources.activity import DeviceUtilization
from agents.sources.nvml_compat import pynvml
from nodeward.watchdog import CallTimeout, Lane, LaneBusy

RATES = "NVML utilisation rate"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _lost(exc: BaseException) -> bool:
    return isinstance(exc, pynvml.NVMLError) and exc.value == pynvml.NVML_ERROR_GPU_IS_LOST


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass
class _Gpm:
    """Two GPM sample buffers of one GPU or GPU instance: the last sample and the next."""

    samples: list[Any]
    taken_at: float | None = None


@dataclass
class _Unit:
    """What one reading is about: a whole GPU, or one MIG instance of it."""

    ids: tuple[str, ...]
    device: str
    label: str
    gpu_instance_id: int | None = None
    gpm: _Gpm | None = None


@dataclass
class _Gpu:
    index: int
    uuid: str
    name: str
    handle: Any
    mig: bool
    gpm_supported: bool
    units: list[_Unit] = field(default_factory=list)
    problem: str | None = None
    """Set when the GPU could not be read at discovery (lost, ...): every ID reads None."""

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(i for u in self.units for i in u.ids) or (self.uuid, str(self.index))


class NvmlUtilization:
    """Every GPU's and MIG instance's utilisation now (a `GpuUtilization`)."""

    def __init__(
        self,
        nvml: Any,
        *,
        timeout: float = 5.0,
        rediscover_after: float = 300.0,
        min_gpm_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        lane: Lane | None = None,
    ) -> None:
        self.nvml = nvml
        self.timeout = timeout
        self.rediscover_after = rediscover_after
        self.min_gpm_interval = min_gpm_interval
        self.clock = clock
        self._lane = lane or Lane("nvml-utilization")
        self._own_lane = lane is None
        self._initialised = False
        self._gpus: list[_Gpu] | None = None
        self._found_at = 0.0
        self._ids: tuple[str, ...] = ()
        """Every device ID of the last discovery (read from the loop when NVML hangs)."""
        self._last: dict[str, DeviceUtilization] = {}
        """Device -> its last GPM reading (repeated when asked again too soon)."""

    async def utilization(self) -> Mapping[str, DeviceUtilization]:
        try:
            return await self._lane.call(self.sample, self.timeout)
        except (CallTimeout, LaneBusy) as exc:
            return self._unknown(f"NVML did not answer: {exc}")
        except Exception as exc:  # noqa: BLE001 - never raise: every device is unknown, with why
            return self._unknown(f"NVML: {_one_line(exc)}")

    def _unknown(self, why: str) -> dict[str, DeviceUtilization]:
        return {i: DeviceUtilization(i, None, why) for i in self._ids}

    # -- on the lane thread --------------------------------------------------------------

    def sample(self) -> dict[str, DeviceUtilization]:
        """One reading of every device (blocking; `utilization()` runs it on the lane)."""
        gpus = self._discover()
        out: dict[str, DeviceUtilization] = {}
        for gpu in gpus:
            if gpu.problem is not None:
                for unit in gpu.units:
                    for i in unit.ids:
                        out[i] = DeviceUtilization(unit.device, None, gpu.problem)
                continue
            readings: list[tuple[_Unit, DeviceUtilization]] = []
            try:
                for unit in gpu.units:
                    readings.append((unit, self._read(gpu, unit)))
            except pynvml.NVMLError as exc:
                if not _lost(exc):
                    raise
                readings = [
                    (u, DeviceUtilization(u.device, None, f"GPU {gpu.index} lost ({exc})"))
                    for u in gpu.units
                ]
                self._found_at = -self.rediscover_after  # find it again once it is back
            for unit, reading in readings:
                for i in unit.ids:
                    out[i] = reading
        return out

    def _read(self, gpu: _Gpu, unit: _Unit) -> DeviceUtilization:
        """One unit's reading; NVML errors other than a lost GPU become None with the call."""
        try:
            if unit.gpm is not None:
                return self._read_gpm(gpu, unit, unit.gpm)
            if unit.gpu_instance_id is not None:
                return DeviceUtilization(
                    unit.device,
                    None,
                    f"MIG {unit.label} on {gpu.name}: utilisation not measurable without GPM "
                    "(Hopper or later)",
                )
            rates = self.nvml.nvmlDeviceGetUtilizationRates(gpu.handle)
            return DeviceUtilization(unit.device, float(rates.gpu), RATES)
        except pynvml.NVMLError as exc:
            if _lost(exc):
                raise
            if exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED and gpu.mig:
                why = f"{gpu.name} in MIG mode: whole-GPU utilisation not reported without GPM"
                return DeviceUtilization(unit.device, None, why)
            return DeviceUtilization(unit.device, None, f"{unit.label}: {exc}")

    def _take(self, gpu: _Gpu, unit: _Unit, sample: Any) -> None:
        if unit.gpu_instance_id is None:
            self.nvml.nvmlGpmSampleGet(gpu.handle, sample)
        else:
            self.nvml.nvmlGpmMigSampleGet(gpu.handle, unit.gpu_instance_id, sample)

    def _read_gpm(self, gpu: _Gpu, unit: _Unit, gpm: _Gpm) -> DeviceUtilization:
        """Graphics activity between the last GPM sample and one taken now."""
        now = self.clock()
        key = unit.device
        if gpm.taken_at is not None and now - gpm.taken_at < self.min_gpm_interval:
            last = self._last.get(key)
            if last is not None:
                return last
            return DeviceUtilization(unit.device, None, "GPM: sampled too recently; next time")
        self._take(gpu, unit, gpm.samples[1])
        if gpm.taken_at is None:
            gpm.samples.reverse()
            gpm.taken_at = now
            return DeviceUtilization(unit.device, None, "GPM: first sample taken; value next time")
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = gpm.samples[0]
        request.sample2 = gpm.samples[1]
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        self.nvml.nvmlGpmMetricsGet(request)
        span = now - gpm.taken_at
        gpm.samples.reverse()  # the sample just taken is the next one's start
        gpm.taken_at = now
        metric = request.metrics[0]
        if metric.nvmlReturn != pynvml.NVML_SUCCESS:
            reading = DeviceUtilization(
                unit.device,
                None,
                f"GPM graphics utilisation: {pynvml.NVMLError(metric.nvmlReturn)}",
            )
        else:
            percent = min(max(float(metric.value), 0.0), 100.0)
            reading = DeviceUtilization(
                unit.device, percent, f"GPM graphics activity over {span:.1f}s"
            )
        self._last[key] = reading
        return reading

    def _discover(self) -> list[_Gpu]:
        """The node's GPUs and MIG instances (again after `rediscover_after` seconds)."""
        now = self.clock()
        if self._gpus is not None and now - self._found_at < self.rediscover_after:
            return self._gpus
        if not self._initialised:
            self.nvml.nvmlInit()
            self._initialised = True
        old = self._gpus or []
        before = {g.index: g for g in old}
        gpus = [self._find(i, before.get(i)) for i in range(int(self.nvml.nvmlDeviceGetCount()))]
        self._free_gpm(old)  # the samples of devices that are gone (the others moved over)
        self._gpus, self._found_at = gpus, now
        self._ids = tuple(i for g in gpus for i in g.ids)
        devices = {u.device for g in gpus for u in g.units}
        self._last = {k: v for k, v in self._last.items() if k in devices}
        return gpus

    def _find(self, index: int, before: _Gpu | None) -> _Gpu:
        """GPU `index` and its MIG instances; one that cannot be read keeps the IDs it had."""
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            if before is not None:
                gpu = _Gpu(index, before.uuid, before.name, None, before.mig, False)
                gpu.units = [
                    _Unit(u.ids, u.device, u.label, u.gpu_instance_id) for u in before.units
                ]
            else:
                gpu = _Gpu(index, str(index), f"GPU {index}", None, False, False)
                gpu.units = [_Unit((str(index),), str(index), f"GPU {index}")]
            gpu.problem = f"GPU {index}: {exc}"
            return gpu
        name = _text(self._maybe("nvmlDeviceGetName", handle) or "GPU")
        gpu = _Gpu(index, uuid, name, handle, mig=False, gpm_supported=False)
        try:
            mode = self._maybe("nvmlDeviceGetMigMode", handle)
            gpu.mig = bool(mode) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            support = self._maybe("nvmlGpmQueryDeviceSupport", handle)
            gpu.gpm_supported = bool(support is not None and support.isSupportedDevice)
            whole = _Unit((uuid, str(index)), uuid, f"GPU {index}")
            gpu.units.append(whole)
            if gpu.mig:
                gpu.units.extend(self._find_migs(gpu))
            if gpu.gpm_supported and gpu.mig:  # whole GPUs are read with utilisation rates
                kept = {u.device: u for u in before.units} if before and before.uuid == uuid else {}
                for unit in gpu.units:
                    prev = kept.get(unit.device)
                    if prev is not None and prev.gpm is not None:
                        unit.gpm, prev.gpm = prev.gpm, None  # same device: its samples go on
                        continue
                    unit.gpm = _Gpm([nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()])
                    try:
                        self._take(gpu, unit, unit.gpm.samples[0])
                        unit.gpm.taken_at = self.clock()
                    except pynvml.NVMLError as exc:
                        if _lost(exc):
                            raise
        except pynvml.NVMLError as exc:
            gpu.problem = f"GPU {index}: {exc}"
        return gpu

    def _find_migs(self, gpu: _Gpu) -> list[_Unit]:
        units: list[_Unit] = []
        count = int(self._maybe("nvmlDeviceGetMaxMigDeviceCount", gpu.handle) or 0)
        for m in range(count):
            try:
                mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, m)
            except pynvml.NVMLError as exc:
                if _lost(exc):
                    raise
                continue  # NOT_FOUND: no instance in this slot
            uuid = _text(self.nvml.nvmlDeviceGetUUID(mig))
            name = _text(self._maybe("nvmlDeviceGetName", mig) or "")
            profile = name.rsplit(" ", 1)[-1] if "MIG" in name else f"instance {m}"
            gi = int(self.nvml.nvmlDeviceGetGpuInstanceId(mig))
            units.append(_Unit((uuid,), uuid, profile, gpu_instance_id=gi))
        return units

    def _maybe(self, name: str, *args: Any) -> Any:
        """`nvml.<name>(*args)`, None if NVML (or this pynvml) does not support it."""
        fn = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if exc.value in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise

    def _free_gpm(self, gpus: list[_Gpu]) -> None:
        for gpu in gpus:
            for unit in gpu.units:
                if unit.gpm is None:
                    continue
                for sample in unit.gpm.samples:
                    with contextlib.suppress(pynvml.NVMLError):  # a lost GPU's: nothing to free
                        self.nvml.nvmlGpmSampleFree(sample)
                unit.gpm = None

    def describe(self) -> dict[str, str]:
        """Device ID -> how it is measured (after the first reading): for logs and checks."""
        out: dict[str, str] = {}
        for gpu in self._gpus or ():
            for unit in gpu.units:
                if gpu.problem:
                    how = gpu.problem
                elif unit.gpm is not None:
                    how = "GPM"
                elif unit.gpu_instance_id is None:
                    how = "utilisation rates"
                else:
                    how = "not measurable"
                for i in unit.ids:
                    out[i] = f"{gpu.name} {unit.label}: {how}"
        return out

    def close(self) -> None:
        """Free GPM samples, release NVML and end the lane's thread (blocking)."""
        self._free_gpm(self._gpus or [])
        self._gpus = None
        if self._initialised:
            self._initialised = False
            with contextlib.suppress(pynvml.NVMLError):  # already shut down: nothing held
                self.nvml.nvmlShutdown()
        if self._own_lane:
            self._lane.close()
