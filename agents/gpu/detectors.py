"""Merging what two detectors saw into incidents: one per GPU and XID, whichever came first.

NVML's XID events and the driver's kernel-log lines report the same XIDs. A sighting joins
the oldest open incident of its GPU and XID (opened less than `window` seconds before) that
its detector has not reported yet, and confirms it; otherwise it opens a new incident. So
the n-th NVML report of an XID pairs with the n-th kernel-log report of it, and a detector
reporting an XID twice makes two incidents (the XID happened twice). Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

NVML = "nvml"
KMSG = "kmsg"


@dataclass
class Incident:
    """One XID on one GPU, as seen by one or more detectors."""

    id: int
    gpu: int
    xid: int
    opened_at: float
    detectors: list[str] = field(default_factory=list)
    """In the order they reported it: the first opened the incident."""

    @property
    def confirmed(self) -> bool:
        return len(self.detectors) > 1


@dataclass(frozen=True)
class Sighting:
    incident: Incident
    new: bool
    """True: this sighting opened the incident; False: it confirmed one already open."""


@dataclass
class IncidentMerger:
    """Incidents of one node's GPUs, merged across detectors within `window` seconds."""

    window: float
    _open: list[Incident] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def observe(self, gpu: int, xid: int, detector: str, at: float) -> Sighting:
        """Record that `detector` saw `xid` on `gpu` at `at` (monotonic seconds)."""
        self._open = [i for i in self._open if at - i.opened_at <= self.window]
        for incident in self._open:
            if incident.gpu == gpu and incident.xid == xid and detector not in incident.detectors:
                incident.detectors.append(detector)
                return Sighting(incident, new=False)
        incident = Incident(next(self._ids), gpu, xid, at, [detector])
        self._open.append(incident)
        return Sighting(incident, new=True)

    def forget(self, gpu: int) -> None:
        """Drop the GPU's open incidents (the driver cleared its XID history)."""
        self._open = [i for i in self._open if i.gpu != gpu]
