"""The GPU agent's backends: how it reads one vendor's GPUs (NVML or AMD SMI).

The agent's loop (lanes, polls, events, publishing) is one; a backend gives it the calls
that differ: start and stop the library, discover and identify GPUs, read health and
telemetry and turn them into findings, wait for the vendor's events. Every method but
`findings`, `event_findings` and `refresh` blocks and runs on the GPU's lane or the event
thread. `select` picks one by the `agents.gpu.backend` setting (`auto`: what the node has);
amdsmi and pynvml are imported only when chosen.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from agents.gpu import amd_health
from agents.gpu.amd_health import AmdLimits, EventSeen
from agents.gpu.health import Finding, Limits
from agents.gpu.health import sample_findings as nvml_findings
from agents.sources import amdsmi as amd
from agents.sources import nvml
from agents.sources.nvml import GpuIdentity, TelemetrySample
from agents.sources.nvml_compat import pynvml
from nodeward.config import ConfigError
from nodeward.watchdog import Lane

BACKENDS = ("nvml", "amdsmi", "auto")


class GpuBackend:
    """What the agent needs from a GPU library (see the module docstring)."""

    name = "?"
    errors: tuple[type[BaseException], ...] = ()
    """The library's call errors (a poll that raises one is judged, not crashed on)."""

    def init(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def open_events(self) -> Any:
        raise NotImplementedError

    def close_events(self, events: Any) -> None:
        raise NotImplementedError

    def identify(self, lane: Lane, index: int) -> GpuIdentity:
        raise NotImplementedError

    def register_events(self, lane: Lane, gpu: GpuIdentity, events: Any) -> None:
        raise NotImplementedError

    def sample_health(self, lane: Lane, gpu: GpuIdentity) -> Any:
        """A health sample with an `ecc` mapping (kind -> count) for the metrics."""
        raise NotImplementedError

    def findings(self, sample: Any) -> list[Finding]:
        raise NotImplementedError

    def sample_telemetry(self, lane: Lane, gpu: GpuIdentity) -> TelemetrySample:
        raise NotImplementedError

    def is_lost(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def wait_events(
        self,
        events: Any,
        deliver: Callable[[Any], None],
        failed: Callable[[str], None],
        stop: threading.Event,
        timeout_ms: int,
    ) -> None:
        raise NotImplementedError

    def device_key(self, handle: Any) -> int:
        raise NotImplementedError

    def processes(self, gpu: GpuIdentity) -> list[Any]:
        """Compute processes (objects with pid, usedGpuMemory, gpuInstanceId)."""
        return []

    def event_findings(self, held: Sequence[EventSeen]) -> list[Finding]:
        """Findings from the vendor events the agent holds (not NVML's XIDs)."""
        return []

    def refresh(self, event: Any) -> bool:
        """Whether `event` asks for an immediate health poll."""
        return False


class _SourceBackend(GpuBackend):
    """A backend whose per-GPU calls are one `agents.sources` module's functions of the library.

    `nvml` and `amdsmi` share these functions' names and signatures; a backend names its
    module and adds the calls that differ.
    """

    source: ModuleType

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def identify(self, lane: Lane, index: int) -> GpuIdentity:
        return self.source.identify(self.lib, lane, index)  # type: ignore[no-any-return]

    def sample_health(self, lane: Lane, gpu: GpuIdentity) -> Any:
        return self.source.sample_health(self.lib, lane, gpu)

    def sample_telemetry(self, lane: Lane, gpu: GpuIdentity) -> TelemetrySample:
        return self.source.sample_telemetry(self.lib, lane, gpu)  # type: ignore[no-any-return]

    def is_lost(self, exc: BaseException) -> bool:
        return self.source.is_lost(exc)  # type: ignore[no-any-return]

    def wait_events(
        self,
        events: Any,
        deliver: Callable[[Any], None],
        failed: Callable[[str], None],
        stop: threading.Event,
        timeout_ms: int,
    ) -> None:
        self.source.wait_events(self.lib, events, deliver, failed, stop, timeout_ms=timeout_ms)

    def device_key(self, handle: Any) -> int:
        return self.source.handle_key(handle)  # type: ignore[no-any-return]


class NvmlBackend(_SourceBackend):
    """NVIDIA GPUs through nvidia-ml-py (`pynvml`, or a `SimNvml`)."""

    name = "nvml"
    source = nvml
    errors = (pynvml.NVMLError,)

    def __init__(self, lib: Any, limits: Limits | None = None) -> None:
        super().__init__(lib)
        self.limits = limits or Limits()

    def init(self) -> None:
        self.lib.nvmlInit()

    def shutdown(self) -> None:
        self.lib.nvmlShutdown()

    def device_count(self) -> int:
        return nvml.device_count(self.lib)

    def open_events(self) -> Any:
        return self.lib.nvmlEventSetCreate()

    def close_events(self, events: Any) -> None:
        self.lib.nvmlEventSetFree(events)

    def register_events(self, lane: Lane, gpu: GpuIdentity, events: Any) -> None:
        nvml.register_events(self.lib, lane, gpu, events)

    def findings(self, sample: Any) -> list[Finding]:
        return nvml_findings(sample, self.limits)

    def processes(self, gpu: GpuIdentity) -> list[Any]:
        return list(self.lib.nvmlDeviceGetComputeRunningProcesses(gpu.handle) or [])


class AmdSmiBackend(_SourceBackend):
    """AMD GPUs through AMD SMI (the `amdsmi` module, or a `SimAmdSmi`)."""

    name = "amdsmi"
    source = amd

    def __init__(self, lib: Any, limits: AmdLimits | None = None) -> None:
        super().__init__(lib)
        self.limits = limits or AmdLimits()
        self.errors = (lib.AmdSmiException,)

    def init(self) -> None:
        self.lib.amdsmi_init(self.lib.AmdSmiInitFlags.INIT_AMD_GPUS)

    def shutdown(self) -> None:
        self.lib.amdsmi_shut_down()

    def device_count(self) -> int:
        return len(amd.processor_handles(self.lib))

    def open_events(self) -> Any:
        return []  # one AmdSmiEventReader per GPU, added as each is identified

    def close_events(self, events: Any) -> None:
        amd.close_readers(self.lib, events)

    def register_events(self, lane: Lane, gpu: GpuIdentity, events: Any) -> None:
        events.extend(amd.open_readers(self.lib, lane, [gpu]))

    def findings(self, sample: Any) -> list[Finding]:
        return amd_health.sample_findings(sample, self.limits)

    def event_findings(self, held: Sequence[EventSeen]) -> list[Finding]:
        return amd_health.event_findings(held, self.limits)

    def refresh(self, event: Any) -> bool:
        return isinstance(event, amd.AmdEvent) and amd_health.is_refresh(event)


def _import(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _has_gpus(backend: GpuBackend) -> bool:
    """Whether the library starts on this node and sees at least one GPU."""
    absent: tuple[type[BaseException], ...] = (*backend.errors, OSError)
    try:
        backend.init()
    except absent:  # no driver, no library: not this vendor
        return False
    try:
        return backend.device_count() > 0
    except absent:
        return False
    finally:
        with contextlib.suppress(*absent):
            backend.shutdown()


def select(
    choice: str, *, nvml_limits: Limits | None = None, amd_limits: AmdLimits | None = None
) -> GpuBackend:
    """The backend `choice` names (`nvml`, `amdsmi`, `auto`), on the real library.

    `auto` takes the first library that starts and sees GPUs (NVML, then AMD SMI), else
    NVML (so the agent reports what NVML says rather than nothing). A choice that cannot
    be met is a `ConfigError` (one line at the command line).
    """
    if choice not in BACKENDS:
        raise ConfigError(f"unknown GPU backend {choice!r}; known: {', '.join(BACKENDS)}")
    if choice == "nvml":
        return NvmlBackend(pynvml, nvml_limits)
    if choice == "amdsmi":
        lib = _import("amdsmi")
        if lib is None:
            raise ConfigError(
                "agents.gpu.backend is amdsmi but the amdsmi package (ROCm) is not installed"
            )
        return AmdSmiBackend(lib, amd_limits)
    nv = NvmlBackend(pynvml, nvml_limits)
    if _has_gpus(nv):
        return nv
    lib = _import("amdsmi")
    if lib is not None:
        amd_backend = AmdSmiBackend(lib, amd_limits)
        if _has_gpus(amd_backend):
            return amd_backend
    return nv
