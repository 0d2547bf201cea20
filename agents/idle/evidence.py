"""Judging one session from its signals: active, idle (since when, and why), or unknown.

Each interval every signal (GPU, CPU, Jupyter kernels) gives a `Reading`. A session is
active if any signal is; idle only if every signal was measured and is idle; otherwise
unknown. An unreadable signal (a Jupyter API that does not answer, a cgroup not found,
the first CPU interval) is unknown and never taken for idleness. A session's idle
time starts when its last signal went quiet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from agents.sources.activity import DeviceUtilization, KernelsReading
from schemas.session import ActivityState, IdleEvidence, SessionActivity, SessionIdle

BUSY_KERNEL_STATES = frozenset({"busy"})
STARTING_GRACE = timedelta(minutes=2)
"""A kernel `starting` this long after its last activity is not starting: Jupyter reports a
kernel nobody ever connected to as `starting` forever."""


@dataclass(frozen=True)
class Reading:
    """One signal's verdict for this interval."""

    signal: str  # gpu, cpu or kernel
    state: ActivityState
    detail: str
    idle_since: datetime | None = None
    """What the source itself knows (a kernel's `last_activity`); None: the agent's own record."""
    value: float | None = None
    """The measurement (GPU peak %, CPU cores), when there is one."""
    covers_from: datetime | None = None
    """The start of what the reading measured (a CPU rate's interval); None: now."""


@dataclass
class Track:
    """One signal of one session across intervals: since when it has been quiet."""

    observed_from: datetime
    active_until: datetime | None = None

    def idle_since(self, reported: datetime | None) -> datetime:
        own = self.active_until or self.observed_from
        return max(own, reported) if reported is not None else own


@dataclass(frozen=True)
class Verdict:
    state: ActivityState
    idle_since: datetime | None
    last_activity: datetime | None
    evidence: list[IdleEvidence]
    unknown: list[str]

    def activity(
        self, readings: Sequence[Reading], gpu_uuids: Iterable[str], now: datetime, **which: Any
    ) -> SessionActivity:
        """The `session.activity.v1` of this verdict on `readings`, sampled `now`, for the
        session `which` names (namespace, pod, node, kind, uid) holding `gpu_uuids`."""
        values = {r.signal: r.value for r in readings}
        return SessionActivity(
            **which,
            state=self.state,
            idle_since=self.idle_since,
            unknown=self.unknown,
            gpu_utilization_pct=values.get("gpu"),
            gpu_uuids=list(gpu_uuids),
            cpu_cores=values.get("cpu"),
            last_activity=self.last_activity,
            sampled_at=now,
        )

    def idle(
        self, now: datetime, idle_after: timedelta, gpus_held: int, **which: Any
    ) -> SessionIdle | None:
        """The `session.idle.v1` this verdict makes `now` of the session `which` names: one
        idle on every signal for at least `idle_after`; None for any other."""
        if self.state != ActivityState.IDLE or self.idle_since is None:
            return None
        idle_for = max((now - self.idle_since).total_seconds(), 0.0)
        if idle_for < idle_after.total_seconds():
            return None
        return SessionIdle(
            **which,
            idle_since=self.idle_since,
            idle_for_s=round(idle_for, 1),
            evidence=self.evidence,
            gpus_held=gpus_held,
        )


@dataclass
class SessionTracker:
    """What the agent remembers of one session (its pod UID) between intervals."""

    uid: str
    tracks: dict[str, Track] = field(default_factory=dict)

    def judge(self, readings: Sequence[Reading], now: datetime) -> Verdict:
        evidence: list[IdleEvidence] = []
        unknown: list[str] = []
        active = False
        latest: datetime | None = None
        idle_since: datetime | None = None
        for r in readings:
            track = self.tracks.setdefault(r.signal, Track(observed_from=r.covers_from or now))
            if r.state == ActivityState.ACTIVE:
                track.active_until = now
                active = True
            elif r.state == ActivityState.UNKNOWN:
                unknown.append(f"{r.signal}: {r.detail}")
            else:
                since = track.idle_since(r.idle_since)
                evidence.append(IdleEvidence(signal=r.signal, idle_since=since, detail=r.detail))
                idle_since = since if idle_since is None else max(idle_since, since)
            if track.active_until is not None:
                latest = track.active_until if latest is None else max(latest, track.active_until)
        if active:
            return Verdict(ActivityState.ACTIVE, None, now, [], unknown)
        if unknown or not readings:
            why = unknown or ["no signal could be read"]
            return Verdict(ActivityState.UNKNOWN, None, latest, evidence, why)
        return Verdict(ActivityState.IDLE, idle_since, latest or idle_since, evidence, [])


def gpu_reading(
    held: Iterable[DeviceUtilization],
    floor_pct: float,
    unmeasurable: Literal["ignore", "unknown"],
) -> Reading | None:
    """The GPUs a session holds; None when it holds none (or only unmeasurable ones, ignored)."""
    devices = list(held)
    if not devices:
        return None
    measured = [d for d in devices if d.percent is not None]
    blind = [d for d in devices if d.percent is None]
    busy = [d for d in measured if (d.percent or 0.0) > floor_pct]
    if busy:
        top = max(busy, key=lambda d: d.percent or 0.0)
        return Reading(
            "gpu", ActivityState.ACTIVE, f"{top.percent:.0f}% on {top.device}", value=top.percent
        )
    if blind and unmeasurable == "unknown":
        return Reading("gpu", ActivityState.UNKNOWN, "; ".join(d.detail for d in blind))
    if not measured:
        return None
    peak = max((d.percent or 0.0) for d in measured)
    detail = f"{peak:.0f}% peak on {len(measured)} GPU(s), floor {floor_pct:g}%"
    if blind:
        detail += f"; not measurable: {'; '.join(d.detail for d in blind)}"
    return Reading("gpu", ActivityState.IDLE, detail, value=peak)


def cpu_reading(
    cores: float | None,
    floor_cores: float,
    why_unknown: str = "",
    *,
    since: datetime | None = None,
) -> Reading:
    """`cores` used over the interval that began at `since`."""
    if cores is None:
        return Reading("cpu", ActivityState.UNKNOWN, why_unknown or "CPU time not readable")
    if cores > floor_cores:
        return Reading(
            "cpu", ActivityState.ACTIVE, f"{cores:.2f} cores", value=cores, covers_from=since
        )
    detail = f"{cores:.2f} cores, floor {floor_cores:g}"
    return Reading("cpu", ActivityState.IDLE, detail, value=cores, covers_from=since)


def kernel_reading(reading: KernelsReading, now: datetime | None = None) -> Reading:
    """Busy kernels are activity, and so is one starting since less than `STARTING_GRACE`."""
    if reading.kernels is None:
        return Reading(
            "kernel", ActivityState.UNKNOWN, f"Jupyter API: {reading.error or 'no answer'}"
        )
    busy = [
        k
        for k in reading.kernels
        if k.execution_state in BUSY_KERNEL_STATES
        or (
            k.execution_state == "starting"
            and (now is None or k.last_activity is None or now - k.last_activity < STARTING_GRACE)
        )
    ]
    if busy:
        return Reading("kernel", ActivityState.ACTIVE, f"{len(busy)} kernel(s) busy")
    stamps = [k.last_activity for k in reading.kernels if k.last_activity is not None]
    connections = sum(k.connections for k in reading.kernels)
    detail = f"{len(reading.kernels)} kernel(s) idle, {connections} connection(s)"
    return Reading("kernel", ActivityState.IDLE, detail, max(stamps) if stamps else None)
