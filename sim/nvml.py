"""Simulated NVML: the pynvml functions the GPU agent uses, over GPUs held in memory.

`SimNvml` has nvidia-ml-py's function names, argument order, return types (pynvml's own
ctypes structures where pynvml returns one), constants and error classes (it raises the
real `pynvml.NVMLError_*`), so the agent runs unchanged on `pynvml` or on a `SimNvml`.
Each instance is one node's driver: several run side by side in one process.
Faults are injected at runtime with `inject_xid`, `inject_fault` and `recover`; load
with `set_load` (power follows utilisation), `set_mig_load` (one MIG instance) or
`set_power`. The energy counter integrates power over the (monotonic, injectable) clock, as
the driver's counter does. As on real GPUs, utilisation rates are not reported with MIG
enabled (NotSupported); GPM (`nvmlGpm*`, Hopper and later) measures each MIG instance's
graphics activity between two samples. `set_processes` sets what
`nvmlDeviceGetComputeRunningProcesses` lists.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from sim.gpus import SimGpus

# The recovery-action values the simulated driver reports, as nvml.h defines them
# (nvmlGpuRecoveryAction_t's NONE, the GpuRecoveryAction event type, its field id), with
# pynvml's names. The simulator stands for the driver, which has them compiled in; it does not
# take them from `pynvml`, which lacks them before nvidia-ml-py 13, and it does not patch
# `pynvml`: filling in the bindings is the agents' `agents.sources.nvml_compat`, which a
# simulator may not import. tests/unit/test_nvml_compat.py holds these to its nvml.h table.
NVML_GPU_RECOVERY_ACTION_NONE = 0
nvmlEventTypeGpuRecoveryAction = 0x8000
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

# Fault names `inject_fault` accepts, with what each does.
FAULTS: dict[str, str] = {
    "ecc-dbe-burst": "uncorrectable ECC errors (volatile and aggregate) with XID 48",
    "row-remap-failure": "row remapping failed (and pending) with XID 64",
    "retired-page-limit": "retired pages at the retirement limit, one pending, with XID 63",
    "fallen-off-bus": "every call raises NVMLError_GpuIsLost, with XID 79",
    "thermal": "temperature above the slowdown threshold; HW thermal slowdown clocks",
    "nvlink-errors": "NVLink CRC and replay error counters climb",
    "pcie-replay": "the PCIe replay counter climbs",
    "hang": "every NVML call on this GPU blocks until recovery",
}

_ENOTSUP = pynvml.NVML_ERROR_NOT_SUPPORTED


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml returns the subclass, e.g. NVMLError_GpuIsLost


@dataclass(frozen=True)
class GpuModel:
    """What a GPU model looks like to NVML."""

    name: str
    memory_mib: int
    nvlinks: int
    power_limit_w: float
    slowdown_c: int
    shutdown_c: int
    row_remap: bool = True
    idle_power_w: float = 70.0
    family: str = "hopper"
    """Architecture (the seed's `family`): GPM is only there for hopper and later."""

    def power_at(self, utilization_pct: float) -> float:
        """Board power (W) at a utilisation: linear from idle to the power limit."""
        share = min(max(utilization_pct, 0.0), 100.0) / 100
        return self.idle_power_w + share * (self.power_limit_w - self.idle_power_w)


MODELS: dict[str, GpuModel] = {
    "H100": GpuModel("NVIDIA H100 80GB HBM3", 81559, 18, 700.0, 87, 92, idle_power_w=70.0),
    "A100": GpuModel(
        "NVIDIA A100-SXM4-80GB", 81920, 12, 400.0, 85, 92, idle_power_w=55.0, family="ampere"
    ),
}

# NVML's architecture of each family (`nvmlDeviceGetArchitecture`).
ARCHITECTURES: dict[str, int] = {
    "volta": pynvml.NVML_DEVICE_ARCH_VOLTA,
    "turing": pynvml.NVML_DEVICE_ARCH_TURING,
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "ada": pynvml.NVML_DEVICE_ARCH_ADA,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}
_GPM_FAMILIES = frozenset({"hopper", "blackwell"})


def model_for(product: str) -> GpuModel:
    """The model of a product label (`NVIDIA-H100-80GB-HBM3`); H100 when unknown."""
    for key, model in MODELS.items():
        if key in product.upper():
            return model
    return MODELS["H100"]


@dataclass(eq=False)
class SimHandle:
    """A device handle: a GPU, or one MIG instance of it."""

    gpu: SimGpu
    mig: SimMig | None = None


@dataclass
class SimMig:
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    uuid: str
    load_pct: float = 30.0  # graphics activity (set with SimNvml.set_mig_load)
    active_s: float = 0.0  # seconds of graphics activity, integrated up to the GPU's activity_at

    @property
    def slices(self) -> int:
        """The compute slices (of 7) the instance holds: `3g.40gb` -> 3."""
        head = self.profile.split("g.", 1)[0]
        return int(head) if head.isdigit() else 1


@dataclass(frozen=True)
class SimGpmSample:
    """What one GPM sample holds: when, of which GPU or GPU instance, the activity so far."""

    gpu_index: int
    gpu_instance_id: int | None
    at: float
    active_s: float


@dataclass
class SimGpu:
    """One simulated GPU's state (guarded by the owning SimNvml's lock)."""

    index: int
    uuid: str
    pci_bus_id: str
    model: GpuModel
    migs: list[SimMig] = field(default_factory=list)
    temperature_c: int = 45
    utilization_gpu: int = 30
    utilization_memory: int = 20
    memory_used_mib: int = 20480
    power_mw: int = 250_000  # change it with SimNvml.set_power/set_load, so energy integrates
    energy_mj: float = 0.0  # since the driver loaded; integrated up to `energy_at`
    energy_at: float | None = None  # clock time the counter is integrated to
    energy_supported: bool = True  # False: NVML answers NotSupported (pre-Volta GPUs)
    clock_reasons: int = pynvml.nvmlClocksEventReasonNone
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    retired_pages: dict[int, list[int]] = field(default_factory=dict)
    retired_pending: int = 0
    remapped: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    pcie_replay: int = 0
    recovery_action: int = NVML_GPU_RECOVERY_ACTION_NONE
    lost: bool = False
    hang: threading.Event | None = None
    processes: list[tuple[int, int, int | None]] = field(default_factory=list)
    """Compute processes: (pid, used MiB, GPU instance ID or None)."""
    active_s: float = 0.0  # seconds of graphics activity (whole GPU), up to `activity_at`
    activity_at: float | None = None
    handle: SimHandle = field(init=False)

    def __post_init__(self) -> None:
        self.handle = SimHandle(self)


@dataclass(frozen=True)
class SimEvent:
    """Like `pynvml.c_nvmlEventData_t`: the device handle, event type and data (the XID)."""

    device: SimHandle
    eventType: int  # pynvml's field names
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class SimEventSet:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[SimEvent] = queue.SimpleQueue()
        self.masks: dict[int, int] = {}  # GPU index -> registered mask
        self.freed = False


_MIG_PROFILES = {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "7g.80gb": 1}


def gpu_uuid(node: str, index: int) -> str:
    """The UUID the simulated driver gives GPU `index` of `node` (stable: the sim cluster's
    ResourceSlices publish the same)."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def pci_bus_id(index: int) -> str:
    """The PCI bus id of simulated GPU `index`."""
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


class SimNvml(SimGpus[SimGpu]):
    """One node's simulated NVML driver. Thread-safe; no process-wide state."""

    MAX_MIG_DEVICES = 7
    FAULTS = FAULTS

    def __init__(
        self, node: str, gpus: list[SimGpu], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(node, gpus, clock=clock)
        self._sets: list[SimEventSet] = []
        self._gpm: dict[int, tuple[Any, SimGpmSample | None]] = {}  # address -> buffer, sample
        now = clock()
        for gpu in gpus:
            gpu.energy_at = now  # the counter starts when the driver loads
            gpu.activity_at = now

    @classmethod
    def build(
        cls,
        node: str,
        *,
        product: str = "H100",
        count: int = 8,
        mig: dict[str, int] | None = None,
        family: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> SimNvml:
        """A node of `count` GPUs of `product`; `mig` (profile -> count on the node) spreads
        MIG instances over the GPUs, as `nvidia.com/mig-<profile>` capacity does. `family`
        (the seed's, e.g. `hopper`) overrides the product's architecture; one NVML does not
        know reads as NVML_DEVICE_ARCH_UNKNOWN."""
        model = model_for(product)
        if family is not None:
            model = dataclasses.replace(model, family=family)
        gpus: list[SimGpu] = []
        for i in range(count):
            gpus.append(SimGpu(i, gpu_uuid(node, i), pci_bus_id(i), model))
        if mig and count:
            slots = {g.index: 7 for g in gpus}
            gi = {g.index: 0 for g in gpus}
            for profile, n in sorted(mig.items()):
                size = 7 // _MIG_PROFILES.get(profile, 7) or 1
                for _ in range(n):
                    gpu = next((g for g in gpus if slots[g.index] >= size), None)
                    if gpu is None:
                        break
                    slots[gpu.index] -= size
                    gi[gpu.index] += 1
                    digest = hashlib.sha256(f"{gpu.uuid}/{gi[gpu.index]}".encode()).hexdigest()
                    gpu.migs.append(
                        SimMig(
                            gi[gpu.index],
                            0,
                            profile,
                            f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
                        )
                    )
        return cls(node, gpus, clock=clock)

    # -- fault injection ---------------------------------------------------------------

    def inject_xid(self, index: int, xid: int, *, gpu_instance_id: int | None = None) -> None:
        """Raise XID `xid` on GPU `index` (an XID critical-error event)."""
        gpu = self._gpu(index)
        with self._lock:
            self._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, xid, gpu_instance_id)

    def inject_fault(self, index: int, fault: str) -> None:
        """Apply a named fault (see `FAULTS`) to GPU `index`."""
        gpu = self._faulty(index, fault)
        with self._lock:
            if fault == "ecc-dbe-burst":
                for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                    key = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)
                    gpu.ecc[key] = gpu.ecc.get(key, 0) + 16
                self._emit(gpu, pynvml.nvmlEventTypeDoubleBitEccError, 0)
                self._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, 48)
            elif fault == "row-remap-failure":
                gpu.remapped[1] += 1
                gpu.remapped[2] = 1
                gpu.remapped[3] = 1
                self._emit(gpu, pynvml.nvmlEventTypeDramRetirementFailure, 0)
                self._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, 64)
            elif fault == "retired-page-limit":
                pages = gpu.retired_pages.setdefault(
                    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, []
                )
                pages.extend(0x1000 * (len(pages) + i) for i in range(64))
                gpu.retired_pending = 1
                self._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, 63)
            elif fault == "fallen-off-bus":
                self._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, 79)
            elif fault == "thermal":
                gpu.temperature_c = gpu.model.slowdown_c + 3
                gpu.clock_reasons |= (
                    pynvml.nvmlClocksEventReasonHwThermalSlowdown
                    | pynvml.nvmlClocksEventReasonHwSlowdown
                )
            elif fault == "nvlink-errors":
                for link in range(min(2, gpu.model.nvlinks)):
                    for counter in (
                        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                        pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
                    ):
                        gpu.nvlink_errors[(link, counter)] = (
                            gpu.nvlink_errors.get((link, counter), 0) + 500
                        )
            elif fault == "pcie-replay":
                gpu.pcie_replay += 5000
            self._lose_or_hang(gpu, fault)

    def _integrate(self, gpu: SimGpu) -> None:
        """Bring the energy counter up to now at the power held since the last update."""
        now = self.clock()
        if gpu.energy_at is not None and now > gpu.energy_at:
            gpu.energy_mj += gpu.power_mw * (now - gpu.energy_at)  # mW x s = mJ
        gpu.energy_at = now if gpu.energy_at is None else max(now, gpu.energy_at)

    def set_power(self, index: int, watts: float) -> None:
        """Set GPU `index`'s board power from now on (energy so far at the old power)."""
        if watts < 0:
            raise ValueError(f"power must not be negative, got {watts} W")
        gpu = self._gpu(index)
        with self._lock:
            self._integrate(gpu)
            gpu.power_mw = round(watts * 1000)

    def set_load(self, index: int, utilization_pct: float) -> None:
        """Set GPU `index`'s utilisation; its power follows (idle to the power limit)."""
        gpu = self._loaded(index, utilization_pct)
        with self._lock:
            self._integrate(gpu)
            self._integrate_activity(gpu)
            gpu.utilization_gpu = round(utilization_pct)
            gpu.power_mw = round(gpu.model.power_at(utilization_pct) * 1000)

    def set_mig_load(self, index: int, gpu_instance_id: int, utilization_pct: float) -> None:
        """Set one MIG instance's graphics activity (GPM reads it); the GPU's power follows
        its instances' load, weighted by their slices."""
        gpu = self._loaded(index, utilization_pct)
        mig = next((m for m in gpu.migs if m.gpu_instance_id == gpu_instance_id), None)
        if mig is None:
            have = ", ".join(str(m.gpu_instance_id) for m in gpu.migs) or "none"
            raise ValueError(
                f"GPU {index} of node {self.node} has no GPU instance {gpu_instance_id} "
                f"(it has: {have})"
            )
        with self._lock:
            self._integrate(gpu)
            self._integrate_activity(gpu)
            mig.load_pct = utilization_pct
            gpu.power_mw = round(gpu.model.power_at(self._mig_mean(gpu)) * 1000)

    def set_processes(
        self, index: int, processes: list[tuple[int, int]], *, gpu_instance_id: int | None = None
    ) -> None:
        """Set the compute processes, (pid, used MiB) each, on GPU `index` or one of its MIG
        instances (replacing those there before)."""
        gpu = self._gpu(index)
        if gpu_instance_id is not None and all(
            m.gpu_instance_id != gpu_instance_id for m in gpu.migs
        ):
            raise ValueError(
                f"GPU {index} of node {self.node} has no GPU instance {gpu_instance_id}"
            )
        with self._lock:
            kept = [p for p in gpu.processes if p[2] != gpu_instance_id]
            gpu.processes = kept + [(pid, mib, gpu_instance_id) for pid, mib in processes]

    @staticmethod
    def _mig_mean(gpu: SimGpu) -> float:
        """The GPU's activity from its MIG instances: each weighted by its share of 7 slices."""
        return sum(m.load_pct * m.slices for m in gpu.migs) / 7

    def _integrate_activity(self, gpu: SimGpu) -> None:
        """Bring the GPU's and its instances' activity counters up to now."""
        now = self.clock()
        if gpu.activity_at is not None and now > gpu.activity_at:
            dt = now - gpu.activity_at
            whole = self._mig_mean(gpu) if gpu.migs else float(gpu.utilization_gpu)
            gpu.active_s += dt * whole / 100
            for mig in gpu.migs:
                mig.active_s += dt * mig.load_pct / 100
        gpu.activity_at = now if gpu.activity_at is None else max(now, gpu.activity_at)

    def set_recovery_action(self, index: int, action: int, *, emit: bool = True) -> None:
        """Set the driver's recovery action (XID 154 and the GpuRecoveryAction event;
        `emit=False`: the state alone, as behind an XID 154 seen in the kernel log only)."""
        gpu = self._gpu(index)
        with self._lock:
            gpu.recovery_action = action
            if emit:
                self._emit(gpu, nvmlEventTypeGpuRecoveryAction, action)
                self._emit(gpu, pynvml.nvmlEventTypeXidCriticalError, 154)

    def recover(self, index: int) -> None:
        """GPU reset: clear every fault and volatile counter; recovery action back to none."""
        gpu = self._gpu(index)
        with self._lock:
            hang = self._clear_faults(gpu)
            gpu.temperature_c = 45
            gpu.clock_reasons = pynvml.nvmlClocksEventReasonNone
            for key in list(gpu.ecc):
                if key[1] == pynvml.NVML_VOLATILE_ECC:
                    gpu.ecc[key] = 0
            gpu.retired_pages.clear()
            gpu.retired_pending = 0
            gpu.remapped = [0, 0, 0, 0]
            gpu.nvlink_errors.clear()
            gpu.pcie_replay = 0
            gpu.recovery_action = NVML_GPU_RECOVERY_ACTION_NONE
            self._emit(gpu, nvmlEventTypeGpuRecoveryAction, gpu.recovery_action)
        if hang is not None:
            hang.set()

    def _emit(self, gpu: SimGpu, kind: int, data: int, gi: int | None = None) -> None:
        event = SimEvent(gpu.handle, kind, data, 0xFFFFFFFF if gi is None else gi)
        for es in self._sets:
            if not es.freed and es.masks.get(gpu.index, 0) & kind:
                es.queue.put(event)

    # -- the pynvml surface ------------------------------------------------------------

    def _enter(self, handle: SimHandle) -> SimGpu:
        """Every device call starts here: uninitialised, hung and lost GPUs behave as NVML's."""
        if self._initialised <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = handle.gpu
        if self._lost(gpu):
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def nvmlInit(self) -> None:
        with self._lock:
            self._initialised += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._initialised <= 0:
                raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
            self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        if self._initialised <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimHandle:
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._enter(self.gpus[index].handle).handle

    def nvmlDeviceGetUUID(self, handle: SimHandle) -> str:
        gpu = self._enter(handle)
        return handle.mig.uuid if handle.mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: SimHandle) -> str:
        gpu = self._enter(handle)
        if handle.mig:
            return f"{gpu.model.name} MIG {handle.mig.profile}"
        return gpu.model.name

    def nvmlDeviceGetIndex(self, handle: SimHandle) -> int:
        return self._enter(handle).index

    def nvmlDeviceGetPciInfo(self, handle: SimHandle) -> Any:
        gpu = self._enter(handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id[4:].encode()
        return info

    def nvmlDeviceGetMigMode(self, handle: SimHandle) -> list[int]:
        gpu = self._enter(handle)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.migs else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: SimHandle) -> int:
        self._enter(handle)
        return self.MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: SimHandle, index: int) -> SimHandle:
        gpu = self._enter(handle)
        if index >= len(gpu.migs):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return SimHandle(gpu, gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: SimHandle) -> int:
        self._enter(handle)
        if handle.mig is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: SimHandle) -> int:
        self._enter(handle)
        if handle.mig is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.compute_instance_id

    def nvmlDeviceGetTotalEccErrors(self, handle: SimHandle, error_type: int, counter: int) -> int:
        gpu = self._enter(handle)
        with self._lock:
            return gpu.ecc.get((error_type, counter), 0)

    def nvmlDeviceGetRetiredPages(self, handle: SimHandle, cause: int) -> list[int]:
        gpu = self._enter(handle)
        with self._lock:
            return list(gpu.retired_pages.get(cause, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: SimHandle) -> int:
        return self._enter(handle).retired_pending

    def nvmlDeviceGetRemappedRows(self, handle: SimHandle) -> tuple[int, int, int, int]:
        gpu = self._enter(handle)
        if gpu.migs or not gpu.model.row_remap:
            raise _error(_ENOTSUP)  # NVML: NOT_SUPPORTED with MIG enabled
        with self._lock:
            corr, unc, pending, failure = gpu.remapped
            return (corr, unc, pending, failure)

    def nvmlDeviceGetTemperature(self, handle: SimHandle, sensor: int) -> int:
        return self._enter(handle).temperature_c

    def nvmlDeviceGetTemperatureThreshold(self, handle: SimHandle, threshold: int) -> int:
        gpu = self._enter(handle)
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return gpu.model.slowdown_c
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return gpu.model.shutdown_c
        raise _error(_ENOTSUP)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimHandle) -> int:
        return self._enter(handle).clock_reasons

    def nvmlDeviceGetNvLinkState(self, handle: SimHandle, link: int) -> int:
        gpu = self._enter(handle)
        if link >= gpu.model.nvlinks:
            raise _error(_ENOTSUP)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: SimHandle, link: int, counter: int) -> int:
        gpu = self._enter(handle)
        if link >= gpu.model.nvlinks:
            raise _error(_ENOTSUP)
        with self._lock:
            return gpu.nvlink_errors.get((link, counter), 0)

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimHandle) -> int:
        return self._enter(handle).pcie_replay

    def nvmlDeviceGetPowerUsage(self, handle: SimHandle) -> int:
        return self._enter(handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimHandle) -> int:
        gpu = self._enter(handle)
        if not gpu.energy_supported:
            raise _error(_ENOTSUP)
        with self._lock:
            self._integrate(gpu)
            return int(gpu.energy_mj)

    def nvmlDeviceGetUtilizationRates(self, handle: SimHandle) -> Any:
        gpu = self._enter(handle)
        if handle.mig is not None or gpu.migs:
            raise _error(_ENOTSUP)  # NVML: not supported on MIG devices nor with MIG enabled
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = gpu.utilization_gpu
        util.memory = gpu.utilization_memory
        return util

    def nvmlDeviceGetArchitecture(self, handle: SimHandle) -> int:
        family = self._enter(handle).model.family
        return int(ARCHITECTURES.get(family, pynvml.NVML_DEVICE_ARCH_UNKNOWN))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimHandle) -> list[Any]:
        """The compute processes on the GPU (on a MIG handle: on that instance), as pynvml
        returns them (friendly objects with pid, usedGpuMemory, gpuInstanceId, ...)."""
        gpu = self._enter(handle)
        out = []
        with self._lock:
            for pid, used_mib, gi in gpu.processes:
                if handle.mig is not None and gi != handle.mig.gpu_instance_id:
                    continue
                info = pynvml.c_nvmlProcessInfo_t()
                info.pid = pid
                info.usedGpuMemory = used_mib * 1024 * 1024
                info.gpuInstanceId = 0xFFFFFFFF if gi is None else gi
                info.computeInstanceId = 0xFFFFFFFF if gi is None else 0
                out.append(pynvml.nvmlStructToFriendlyObject(info))
        return out

    # GPM (GPU performance monitoring): samples are pynvml's own `c_nvmlGpmSample_t`
    # pointers, to buffers this driver keeps, so `c_nvmlGpmMetricsGet_t` works unchanged.

    def nvmlGpmQueryDeviceSupport(self, handle: SimHandle) -> Any:
        gpu = self._enter(handle)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.model.family in _GPM_FAMILIES)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        if self._initialised <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        buffer = ctypes.create_string_buffer(8)
        with self._lock:
            self._gpm[ctypes.addressof(buffer)] = (buffer, None)
        return ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        with self._lock:
            if self._gpm.pop(self._gpm_address(sample), None) is None:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    @staticmethod
    def _gpm_address(sample: Any) -> int:
        return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)

    def _gpm_take(self, handle: SimHandle, gpu_instance_id: int | None, sample: Any) -> Any:
        gpu = self._enter(handle)
        if handle.mig is not None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # GPM takes the parent GPU
        if gpu.model.family not in _GPM_FAMILIES:
            raise _error(_ENOTSUP)
        address = self._gpm_address(sample)
        with self._lock:
            if address not in self._gpm:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._integrate_activity(gpu)
            if gpu_instance_id is None:
                active = gpu.active_s
            else:
                mig = next((m for m in gpu.migs if m.gpu_instance_id == gpu_instance_id), None)
                if mig is None:
                    raise _error(pynvml.NVML_ERROR_NOT_FOUND)
                active = mig.active_s
            taken = SimGpmSample(gpu.index, gpu_instance_id, self.clock(), active)
            self._gpm[address] = (self._gpm[address][0], taken)
        return sample

    def nvmlGpmSampleGet(self, handle: SimHandle, sample: Any) -> Any:
        return self._gpm_take(handle, None, sample)

    def nvmlGpmMigSampleGet(self, handle: SimHandle, gpu_instance_id: int, sample: Any) -> Any:
        return self._gpm_take(handle, int(gpu_instance_id), sample)

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        """Graphics utilisation between `sample1` and `sample2`; other metrics NotSupported."""
        if self._initialised <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if metrics_get.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._lock:
            first = self._gpm.get(self._gpm_address(metrics_get.sample1), (None, None))[1]
            second = self._gpm.get(self._gpm_address(metrics_get.sample2), (None, None))[1]
        if (
            first is None
            or second is None
            or (first.gpu_index, first.gpu_instance_id)
            != (second.gpu_index, second.gpu_instance_id)
            or second.at <= first.at
        ):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        share = (second.active_s - first.active_s) / (second.at - first.at)
        for i in range(metrics_get.numMetrics):
            metric = metrics_get.metrics[i]
            if metric.metricId == pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = min(max(share * 100, 0.0), 100.0)
            else:
                metric.nvmlReturn = _ENOTSUP
        return metrics_get

    def nvmlDeviceGetMemoryInfo(self, handle: SimHandle) -> Any:
        gpu = self._enter(handle)
        mem = pynvml.c_nvmlMemory_t()
        mem.total = gpu.model.memory_mib * 1024 * 1024
        mem.used = gpu.memory_used_mib * 1024 * 1024
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetClockInfo(self, handle: SimHandle, clock: int) -> int:
        self._enter(handle)
        return 1980 if clock == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetFieldValues(self, handle: SimHandle, field_ids: list[int]) -> list[Any]:
        gpu = self._enter(handle)
        values = []
        for fid in field_ids:
            value = pynvml.c_nvmlFieldValue_t()
            value.fieldId = fid
            if fid == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.recovery_action
            else:
                value.nvmlReturn = _ENOTSUP
            values.append(value)
        return values

    def nvmlDeviceGetSupportedEventTypes(self, handle: SimHandle) -> int:
        self._enter(handle)
        return int(
            pynvml.nvmlEventTypeXidCriticalError
            | pynvml.nvmlEventTypeDoubleBitEccError
            | pynvml.nvmlEventTypeSingleBitEccError
            | pynvml.nvmlEventTypeDramRetirementEvent
            | pynvml.nvmlEventTypeDramRetirementFailure
            | nvmlEventTypeGpuRecoveryAction
        )

    def nvmlEventSetCreate(self) -> SimEventSet:
        if self._initialised <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        es = SimEventSet()
        with self._lock:
            self._sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle: SimHandle, mask: int, es: SimEventSet) -> None:
        gpu = self._enter(handle)
        with self._lock:
            es.masks[gpu.index] = es.masks.get(gpu.index, 0) | mask

    def nvmlEventSetWait(self, es: SimEventSet, timeout_ms: int) -> SimEvent:
        if es.freed:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        try:
            return es.queue.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise _error(pynvml.NVML_ERROR_TIMEOUT) from None

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def nvmlEventSetFree(self, es: SimEventSet) -> None:
        with self._lock:
            es.freed = True
            with contextlib.suppress(ValueError):
                self._sets.remove(es)
