"""Turning power samples into energy per interval: integration, counters, the node total.

Watts samples are integrated with the trapezoid rule between consecutive samples of the
same component; cumulative counters (RAPL, NVML total energy) are differenced. A segment
between two samples lands in the interval of its later sample, so across intervals every
joule is counted once. A segment across a failed read (`interrupt`: the source was away),
or longer than `max_gap_s`, is not integrated: that time is unknown, and an interval says
how much of it its energy covers.
Power at a tick, and so an interval's min and max, comes only from components read within
`max_gap_s` and since the interval began: a source that stopped answering is not restated. The node's energy is the BMC's whole-system reading when there is
one, else the sum of PSU inputs, else the sum of the top-level components (CPU packages,
DRAM, GPUs; core/uncore sub-zones are inside their package and left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from agents.sources.power import PowerSample
from schemas.energy import CarbonBasis, CarbonIntensity, EnergyReading, PowerSource

_SUB_ZONES = ("core", "uncore")


class CarbonProvider(Protocol):
    """Where the agent gets carbon intensity; `current()` never raises."""

    async def current(self) -> CarbonIntensity: ...


class StaticCarbon:
    """A fixed carbon intensity (`--carbon-intensity`)."""

    def __init__(
        self,
        g_per_kwh: float,
        *,
        zone: str = "static",
        basis: CarbonBasis = CarbonBasis.OPERATIONAL,
    ) -> None:
        self.g_per_kwh = g_per_kwh
        self.zone = zone
        self.basis = basis

    async def current(self) -> CarbonIntensity:
        return CarbonIntensity(
            g_per_kwh=self.g_per_kwh,
            zone=self.zone,
            provider="static",
            basis=self.basis,
            observed_at=datetime.now(UTC),
        )


@dataclass
class _Track:
    """One (source, component): its last point and what it added this interval."""

    source: PowerSource
    component: str
    last_at: float | None = None
    last_watts: float | None = None
    last_counter: float | None = None
    energy_j: float = 0.0
    covered_s: float = 0.0
    gap_s: float = 0.0  # time this interval that fell in gaps (a failed read, or max_gap_s)
    interrupted: bool = False  # a read failed since the last sample
    watts_now: float | None = None  # power over the last segment


# The fields of `energy.node.v1` an `IntervalEnergy` fills, by their names.
_SAID = ("readings", "energy_j", "avg_power_w", "min_power_w", "max_power_w", "covered_s")


@dataclass(frozen=True)
class IntervalEnergy:
    """What one interval measured."""

    readings: list[EnergyReading]
    energy_j: float | None  # whole node; None when no reading of it covered any time
    basis: str  # "system", "psu", "components" or "none"
    min_power_w: float | None
    max_power_w: float | None
    duration_s: float  # the interval's wall time
    covered_s: float  # the time the node's readings actually span

    @property
    def avg_power_w(self) -> float | None:
        if self.energy_j is None or self.covered_s <= 0:
            return None
        return self.energy_j / self.covered_s

    @property
    def uncovered_s(self) -> float:
        """The part of the interval the node's energy does not cover (unknown energy)."""
        return max(0.0, self.duration_s - self.covered_s)

    def reported(self) -> dict[str, Any]:
        """What `energy.node.v1` says of the measurement (`_SAID`, by the same names)."""
        return {name: getattr(self, name) for name in _SAID}


def node_basis(components: Iterable[str]) -> str:
    """Which readings make up the node's energy: `system`, `psu`, `components` or `none`."""
    names = set(components)
    if "system" in names:
        return "system"
    if any(n.startswith("psu") for n in names):
        return "psu"
    return "components" if names else "none"


def _in_basis(component: str, basis: str) -> bool:
    if basis == "system":
        return component == "system"
    if basis == "psu":
        return component.startswith("psu")
    return not component.startswith(_SUB_ZONES)


@dataclass
class Accumulator:
    """Integrates samples tick by tick; `close()` ends an interval and starts the next."""

    max_gap_s: float = float("inf")
    """Segments longer than this are not integrated: the time is reported as uncovered."""
    tracks: dict[tuple[PowerSource, str], _Track] = field(default_factory=dict)
    _tick_powers: list[float] = field(default_factory=list)
    _began: float = float("-inf")  # when this interval began (sample time)
    _latest: float = float("-inf")  # the latest sample time seen
    dropped: int = 0  # samples refused (time going backwards, negative or non-finite)

    def tick(self, samples: Sequence[PowerSample], now: float | None = None) -> float | None:
        """Add one tick's samples; returns the node's power at this tick (None if unknown).

        `now` (the sample clock, `time.monotonic()`; by default the latest sample's time): a
        component whose last reading is older than `max_gap_s`, or from before this interval
        began, is not part of the power now.
        """
        for sample in samples:
            self._add(sample)
        now = self._latest if now is None else now
        recent = [
            t
            for t in self.tracks.values()
            if t.watts_now is not None
            and t.last_at is not None
            and t.last_at > self._began
            and now - t.last_at <= self.max_gap_s
        ]
        if not recent:
            return None
        fresh = {t.component: t for t in recent}
        basis = node_basis(fresh)
        power = sum(t.watts_now or 0.0 for c, t in fresh.items() if _in_basis(c, basis))
        self._tick_powers.append(power)
        return power

    def interrupt(self, keys: Iterable[tuple[PowerSource, str]]) -> None:
        """A read of these components failed: their next sample starts a new segment (the
        time since their last one is a gap, not integrated)."""
        for key in keys:
            track = self.tracks.get(key)
            if track is not None:
                track.interrupted = True

    def _add(self, s: PowerSample) -> None:
        value = s.watts if s.watts is not None else s.energy_j
        if value is None or not (value >= 0.0) or value == float("inf"):
            self.dropped += 1
            return
        key = (s.source, s.component)
        self._latest = max(self._latest, s.at)
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = _Track(s.source, s.component)
        if track.last_at is not None and s.at <= track.last_at:
            self.dropped += 1
            return
        dt = 0.0 if track.last_at is None else s.at - track.last_at
        if dt > self.max_gap_s or track.interrupted:
            # The source was away: nothing is known of the time in between.
            track.gap_s += dt
            track.last_watts = track.last_counter = track.watts_now = None
            track.interrupted = False
        if s.watts is not None:
            if track.last_watts is not None and dt > 0:
                track.energy_j += (track.last_watts + s.watts) / 2 * dt
                track.covered_s += dt
            track.last_watts = s.watts
            track.last_counter = None
            track.watts_now = s.watts
        else:
            assert s.energy_j is not None
            if track.last_counter is not None and dt > 0:
                delta = s.energy_j - track.last_counter
                if delta >= 0:  # a counter that went back was reset: start again from here
                    track.energy_j += delta
                    track.covered_s += dt
                    track.watts_now = delta / dt
            track.last_counter = s.energy_j
            track.last_watts = None
        track.last_at = s.at

    def close(self, duration_s: float, now: float | None = None) -> IntervalEnergy:
        """The interval's readings and node energy; per-interval sums restart at zero.

        `now`: when the next interval begins (sample clock; default the latest sample's time).
        The node's energy is None when no reading of its basis covered any of the interval.
        """
        readings = []
        for track in self.tracks.values():
            if track.covered_s <= 0:
                continue
            readings.append(
                EnergyReading(
                    source=track.source,
                    component=track.component,
                    energy_j=track.energy_j,
                    avg_power_w=track.energy_j / track.covered_s,
                )
            )
        basis = node_basis(r.component for r in readings)
        in_basis = [r.energy_j for r in readings if _in_basis(r.component, basis)]
        energy = sum(in_basis) if in_basis else None
        covered = max(
            (
                t.covered_s
                for t in self.tracks.values()
                if t.covered_s > 0 and _in_basis(t.component, basis)
            ),
            default=0.0,
        )
        powers = self._tick_powers
        result = IntervalEnergy(
            readings=sorted(readings, key=lambda r: (r.source.value, r.component)),
            energy_j=energy,
            basis=basis,
            min_power_w=min(powers) if powers else None,
            max_power_w=max(powers) if powers else None,
            duration_s=duration_s,
            covered_s=covered,
        )
        for track in self.tracks.values():
            track.energy_j = track.covered_s = track.gap_s = 0.0
        self._tick_powers = []
        self._began = self._latest if now is None else now
        return result
