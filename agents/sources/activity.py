"""What the idleness agent reads about a session, and the sources that read it.

Each signal is measured, or unknown with the reason: an unknown signal is never taken
for idleness. GPUs are keyed by every ID pod-resources may name them by (GPU UUID, MIG
UUID, index); kernels come from a Jupyter server's `/api/kernels`; CPU time from the
pod's cgroup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # kept out at run time: the GPU sources run where pydantic is not installed
    from schemas.session import KernelActivity


@dataclass(frozen=True)
class DeviceUtilization:
    """One GPU or MIG instance's utilisation over the last sample."""

    device: str
    percent: float | None
    """None: not measurable here (`detail` says why)."""
    detail: str = ""
    """How it was measured, or why it could not be."""


class GpuUtilization(Protocol):
    async def utilization(self) -> Mapping[str, DeviceUtilization]:
        """Device ID (GPU UUID, MIG UUID or index) -> its utilisation now."""
        ...


@dataclass(frozen=True)
class KernelsReading:
    """A Jupyter server's kernels, or why they could not be read (then: unknown)."""

    kernels: list[KernelActivity] | None
    error: str | None = None

    @property
    def known(self) -> bool:
        return self.kernels is not None


class KernelSource(Protocol):
    async def kernels(self, pod: Mapping[str, Any]) -> KernelsReading:
        """The kernels of the Jupyter server in `pod` (the pod object from the API)."""
        ...


class CpuUsage(Protocol):
    async def usage_usec(self) -> Mapping[str, int]:
        """Pod UID -> the CPU time its cgroup has used, in microseconds (a counter)."""
        ...
