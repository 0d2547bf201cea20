"""GPU energy from NVML: each GPU's total-energy counter, its power where there is none.

`nvml` is the `pynvml` module or a `sim.nvml.SimNvml` (the same calls as
`agents.sources.nvml`). `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver
loaded, Volta and later) gives exact energy; GPUs that answer NotSupported are read with
`nvmlDeviceGetPowerUsage` (mW) instead, which the agent integrates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from agents.sources.nvml_compat import pynvml
from agents.sources.power import PowerSample, SourceError
from schemas.energy import PowerSource

log = structlog.get_logger(__name__)


@dataclass
class _Gpu:
    index: int
    handle: Any
    has_counter: bool = True

    @property
    def component(self) -> str:
        return f"gpu-{self.index}"


def _not_supported(exc: pynvml.NVMLError) -> bool:
    return bool(exc.value == pynvml.NVML_ERROR_NOT_SUPPORTED)


class NoNvml(SourceError):
    """No NVML library at all (a node without the NVIDIA driver), unlike a GPU in trouble."""


class NvmlEnergyReader:
    """Energy (or, as a fallback, power) of every GPU on the node (a `PowerReader`)."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._gpus: list[_Gpu] | None = None
        self._initialised = False
        self._problem: str | None = None
        try:
            self._discover()
        except NoNvml:
            raise  # not a GPU node: the agent leaves this source out and says so, once
        except SourceError as exc:
            self._problem = str(exc)
            log.warning("nvml energy: no GPUs yet", error=self._problem)

    def _discover(self) -> list[_Gpu]:
        """Init NVML (once) and find every GPU and whether it has an energy counter."""
        if self._gpus is not None:
            return self._gpus
        try:
            if not self._initialised:
                self.nvml.nvmlInit()
                self._initialised = True
            gpus = [
                _Gpu(i, self.nvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(int(self.nvml.nvmlDeviceGetCount()))
            ]
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND and not self._initialised:
                raise NoNvml(f"nvml: no NVIDIA driver library on this node ({exc})") from None
            raise SourceError(f"nvml: cannot list GPUs: {exc}") from None
        for gpu in gpus:
            try:
                self.nvml.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)
            except pynvml.NVMLError as exc:
                gpu.has_counter = not _not_supported(exc)  # other errors: retried on read
        self._gpus, self._problem = gpus, None
        log.info("nvml energy", reading=self.describe())
        return gpus

    def describe(self) -> str:
        if self._gpus is None:
            return f"NVML: no GPUs read ({self._problem})"
        if not self._gpus:
            return "NVML: no GPUs"
        counters = [g.component for g in self._gpus if g.has_counter]
        power = [g.component for g in self._gpus if not g.has_counter]
        parts = []
        if counters:
            parts.append(f"energy counter on {', '.join(counters)}")
        if power:
            parts.append(f"power only on {', '.join(power)}")
        return "NVML: " + "; ".join(parts)

    def _sample(self, gpu: _Gpu) -> PowerSample:
        if gpu.has_counter:
            try:
                mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)
                return PowerSample(
                    PowerSource.NVML, gpu.component, time.monotonic(), energy_j=int(mj) / 1000
                )
            except pynvml.NVMLError as exc:
                if not _not_supported(exc):
                    raise
                gpu.has_counter = False
                log.info("nvml energy: no counter, reading power", gpu=gpu.index)
        mw = self.nvml.nvmlDeviceGetPowerUsage(gpu.handle)
        return PowerSample(PowerSource.NVML, gpu.component, time.monotonic(), watts=int(mw) / 1000)

    def read(self) -> list[PowerSample]:
        """One sample per GPU; `SourceError` (one line, every failing GPU) if any fails."""
        samples: list[PowerSample] = []
        failed: list[str] = []
        for gpu in self._discover():
            try:
                samples.append(self._sample(gpu))
            except pynvml.NVMLError as exc:
                failed.append(f"{gpu.component}: {exc}")
        if failed:
            raise SourceError(f"nvml: {'; '.join(failed)}")
        return samples

    def close(self) -> None:
        """Release this reader's NVML init (NVML counts inits)."""
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("nvml energy: shutdown failed", error=str(exc))
