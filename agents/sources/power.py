"""What every power or energy source of the energy agent returns, and how it fails.

A source is read by blocking code (python-ipmi, sysfs, NVML) that the agent runs in a
worker thread with a timeout, one `read()` per sampling tick. Each reading is either an
instantaneous power (IPMI DCMI/SDR, NVML power) that the agent integrates over time, or
a cumulative energy counter (RAPL, NVML total energy) that the agent differences; a
source says which by filling `watts` or `energy_j`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schemas.energy import PowerSource


@dataclass(frozen=True)
class PowerSample:
    """One component's reading at one moment (`at`: `time.monotonic()` when read)."""

    source: PowerSource
    component: str  # "system", "psu-1", "package-0", "dram-0", "gpu-3", ...
    at: float
    watts: float | None = None  # instantaneous power
    energy_j: float | None = None  # a cumulative counter, wrap-around already undone

    def __post_init__(self) -> None:
        if (self.watts is None) == (self.energy_j is None):
            raise ValueError("a PowerSample holds either watts or energy_j")


class SourceError(Exception):
    """A source that cannot be read now. `str()` is one line naming the source and why
    (and, for permissions, what is needed); the agent reports it as degraded and goes on."""


class PowerReader(Protocol):
    """A source of power or energy readings for one node.

    A source whose reads are bounded by deadlines of its own (IPMI: each ipmitool run) also
    has `max_read_s`, the longest one read can take; the agent then waits that long for it
    before calling it hung, so the source's own error (not "hung") is what gets reported.
    """

    name: str  # "ipmi", "rapl", "nvml", "sim": shown in logs and `degraded`

    def describe(self) -> str:
        """What was found at start, one line (e.g. "DCMI power reading", "SDR 'PSU1 Input'")."""
        ...

    def read(self) -> list[PowerSample]:
        """Blocking: one reading of every component; raises `SourceError`."""
        ...

    def close(self) -> None: ...
