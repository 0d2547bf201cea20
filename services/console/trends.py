"""Trends over the last hour, day or week: stored events folded into fixed time buckets.

Pure, so it is tested without a bus: `history.py` reads the streams and hands each event to
one of these accumulators, and the pages draw their points. A range is cut into `POINTS`
buckets aligned on multiples of its bucket width (one minute for the last hour, 24 minutes
for the day, 2 h 48 min for the week); the newest is the bucket so far. Memory is bounded
by the buckets of the window and, for sessions, one entry per session seen in it: buckets
that leave the window are dropped (`prune`).

Events are placed by their own time (an energy interval by its start and end, a session
sample by `sampled_at`, a capacity change or an audit record by its CloudEvents `time`),
not by when the server stored them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

POINTS = 60
"""Buckets (points) per range."""


@dataclass(frozen=True)
class Range:
    """A time range a trend is drawn over: its name in `?range=`, its words, its length."""

    name: str
    label: str
    seconds: int
    points: int = POINTS

    @property
    def width(self) -> float:
        """Seconds per bucket."""
        return self.seconds / self.points

    def index(self, t: float) -> int:
        """The bucket holding time `t` (seconds since the epoch)."""
        return math.floor(t / self.width)

    def window(self, now: float) -> tuple[int, int]:
        """The first and last bucket drawn at `now` (the last holds `now`)."""
        last = self.index(now)
        return last - self.points + 1, last

    def start(self, index: int) -> float:
        return index * self.width

    def at(self, index: int) -> datetime:
        return datetime.fromtimestamp(self.start(index), UTC)


RANGES: tuple[Range, ...] = (
    Range("1h", "last hour", 3600),
    Range("1d", "last day", 86400),
    Range("1w", "last week", 7 * 86400),
)
DEFAULT_RANGE = "1h"


class RangeError(ValueError):
    """A `?range=` the console does not draw."""


def range_named(value: str | None) -> Range:
    """The range `?range=` names (the last hour when absent); RangeError for anything else."""
    name = DEFAULT_RANGE if value is None else value
    for r in RANGES:
        if r.name == name:
            return r
    raise RangeError(f"range must be one of {', '.join(r.name for r in RANGES)}")


def spread(
    start: float, end: float, rng: Range, first: int, last: int
) -> Iterator[tuple[int, float]]:
    """Each bucket in `first..last` that the interval `[start, end)` overlaps, with the share
    of the interval inside it (the shares of an interval inside the window sum to 1)."""
    span = end - start
    if span <= 0:
        i = rng.index(start)
        if first <= i <= last:
            yield i, 1.0
        return
    lo, hi = max(rng.index(start), first), min(rng.index(end - 1e-9), last)
    for i in range(lo, hi + 1):
        b0, b1 = rng.start(i), rng.start(i + 1)
        inside = min(end, b1) - max(start, b0)
        if inside > 0:
            yield i, inside / span


# -- energy --------------------------------------------------------------------------------


class EnergyPoint(NamedTuple):
    at: datetime
    power_w: float | None
    """The fleet's mean power over the part of the bucket the nodes' intervals cover (the
    whole bucket once it is past), None when no node reported in it."""
    co2e_g: float | None
    """CO2e of the energy reported in the bucket, None where no carbon intensity was known."""


@dataclass
class EnergyTrend:
    """Fleet power and CO2e per bucket, from each node's energy intervals (`energy.node`):
    an interval's energy and CO2e are shared among the buckets it overlaps, and a bucket's
    power is the energy in it over the time its intervals span (from the earliest start to
    the latest end in it), so the bucket under way, or one where reports begin, is not drawn
    low for the time nothing covered yet."""

    rng: Range
    energy_j: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    co2e_g: dict[int, float] = field(default_factory=dict)
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Per bucket, the earliest and latest time an interval in it covers."""

    def add(
        self,
        start: float,
        end: float,
        energy_j: float | None,
        co2e_g: float | None,
        window: tuple[int, int],
    ) -> None:
        """One node's interval; outside `window` it counts for nothing."""
        if energy_j is None:
            return
        for i, share in spread(start, end, self.rng, *window):
            self.energy_j[i] += energy_j * share
            if co2e_g is not None:
                self.co2e_g[i] = self.co2e_g.get(i, 0.0) + co2e_g * share
            lo, hi = max(start, self.rng.start(i)), min(end, self.rng.start(i + 1))
            held = self.spans.get(i)
            self.spans[i] = (lo, hi) if held is None else (min(held[0], lo), max(held[1], hi))

    def prune(self, first: int) -> None:
        for held in (self.energy_j, self.co2e_g, self.spans):
            for i in [i for i in held if i < first]:
                del held[i]

    def joules(self, window: tuple[int, int]) -> float:
        """The energy reported in the window's buckets."""
        return sum(self.energy_j.get(i, 0.0) for i in range(window[0], window[1] + 1))

    def points(self, window: tuple[int, int]) -> list[EnergyPoint]:
        out = []
        for i in range(window[0], window[1] + 1):
            lo, hi = self.spans.get(i, (0.0, 0.0))
            energy = self.energy_j.get(i)
            power = energy / (hi - lo) if energy is not None and hi > lo else None
            co2e = self.co2e_g.get(i) if power is not None else None
            out.append(EnergyPoint(self.rng.at(i), power, co2e))
        return out


# -- capacity ------------------------------------------------------------------------------


class Gpus(NamedTuple):
    """The GPUs (or MIG slices) of one model and profile drawn over time."""

    free: int
    used: int
    quarantined: int


CapacityKey = tuple[str, str]
"""(GPU model, profile)."""


@dataclass
class CapacityTrend:
    """Free, used and quarantined GPUs per model and profile: a step that holds from each
    change (`capacity.v1`, published when the counts change) to the next. A bucket shows the
    counts at its end; before the window's first change, the counts the change says were
    before it (`previous`), or the last change stored before the window."""

    rng: Range
    changes: dict[CapacityKey, dict[int, tuple[float, Gpus]]] = field(default_factory=dict)
    """Per series, per bucket, its newest change."""
    before: dict[CapacityKey, tuple[float, Gpus]] = field(default_factory=dict)
    """Per series, the newest change before the window."""
    first: dict[CapacityKey, tuple[float, Gpus | None]] = field(default_factory=dict)
    """Per series, the earliest change in the window and the counts it says were before it."""

    def add(
        self,
        at: float,
        key: CapacityKey,
        counts: Gpus,
        previous: Gpus | None,
        window: tuple[int, int],
    ) -> None:
        first, last = window
        i = self.rng.index(at)
        if i > last:
            return
        if i < first:
            known = self.before.get(key)
            if known is None or at >= known[0]:
                self.before[key] = (at, counts)
            return
        per = self.changes.setdefault(key, {})
        known = per.get(i)
        if known is None or at >= known[0]:
            per[i] = (at, counts)
        earliest = self.first.get(key)
        if earliest is None or at < earliest[0]:
            self.first[key] = (at, previous)

    def prune(self, first: int) -> None:
        for key, per in self.changes.items():
            gone = sorted(i for i in per if i < first)
            for i in gone:  # the step a bucket leaving the window ends with holds on
                at, counts = per.pop(i)
                known = self.before.get(key)
                if known is None or at >= known[0]:
                    self.before[key] = (at, counts)

    def points(self, window: tuple[int, int]) -> dict[CapacityKey, list[Gpus | None]]:
        out: dict[CapacityKey, list[Gpus | None]] = {}
        for key in sorted({*self.changes, *self.before}):
            held: Gpus | None = None
            if key in self.before:
                held = self.before[key][1]
            elif key in self.first:
                held = self.first[key][1]
            per = self.changes.get(key, {})
            line: list[Gpus | None] = []
            for i in range(window[0], window[1] + 1):
                if i in per:
                    held = per[i][1]
                line.append(held)
            out[key] = line
        return out


# -- sessions ------------------------------------------------------------------------------

ACTIVE, IDLE = "active", "idle"


class SessionPoint(NamedTuple):
    at: datetime
    active: int
    idle: int
    warned: int


@dataclass
class SessionTrend:
    """Sessions per bucket: active and idle as each session's last sample in the bucket
    said (`session.activity`), and warned: those the culler had warned at some time in the
    bucket (from its `warn` to its `cancel` or `stop`, or its deadline).

    One session counts once a bucket; its samples arrive in order, so only the bucket of
    its newest sample is remembered, not a set per bucket."""

    rng: Range
    counts: dict[int, dict[str, int]] = field(default_factory=dict)
    seen: dict[str, tuple[int, float, str]] = field(default_factory=dict)
    """Session -> the bucket, time and state of the sample it counts with."""
    warned: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """Bucket -> sessions warned in it, of the warnings that ended."""
    warned_upto: dict[str, int] = field(default_factory=dict)
    """Session -> the last bucket it was counted warned in."""
    open: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    """Session -> when the warning pending on it was given, and its deadline."""
    earliest: float | None = None
    """The earliest time known to be covered (a sample, or the stream's first message)."""

    def covered(self, t: float) -> None:
        """History is known from `t` on (a bucket before it is not drawn as zero)."""
        self.earliest = t if self.earliest is None else min(self.earliest, t)

    def sample(self, session: str, at: float, state: str, window: tuple[int, int]) -> None:
        first, last = window
        i = self.rng.index(at)
        if not first <= i <= last:
            return
        self.covered(at)
        known = self.seen.get(session)
        per = self.counts.setdefault(i, defaultdict(int))
        if known is None or i > known[0]:
            per[state] += 1
        elif i == known[0] and at >= known[1]:
            per[known[2]] -= 1
            per[state] += 1
        else:
            return  # an older sample than the one counted
        self.seen[session] = (i, at, state)

    def warn(self, session: str, at: float, deadline: float | None) -> None:
        """The culler warned `session` at `at`, to stop it at `deadline`."""
        self.covered(at)
        if session not in self.open:
            self.open[session] = (at, deadline)

    def end_warning(self, session: str, at: float, window: tuple[int, int]) -> None:
        """The warning on `session` ended at `at` (cancelled, or the session stopped)."""
        given = self.open.pop(session, None)
        if given is None:
            return
        since, deadline = given
        buckets = self._warned(session, since, min(at, deadline or at), window)
        for i in buckets:
            self.warned[i] += 1
        if buckets:
            self.warned_upto[session] = buckets[-1]

    def _warned(self, session: str, since: float, until: float, window: tuple[int, int]) -> range:
        """The buckets a warning from `since` to `until` adds `session` to (none twice)."""
        first, last = window
        done = self.warned_upto.get(session, first - 1)
        lo = max(self.rng.index(since), first, done + 1)
        end = self.rng.index(max(until - 1e-6, since))  # up to `until`, not the bucket it opens
        return range(lo, min(end, last) + 1)

    def settle(self, now: float, window: tuple[int, int]) -> None:
        """Warnings whose deadline passed with no stop or cancel end at their deadline."""
        for session, (_, deadline) in list(self.open.items()):
            if deadline is not None and deadline <= now:
                self.end_warning(session, deadline, window)

    def prune(self, first: int) -> None:
        for i in [i for i in self.counts if i < first]:
            del self.counts[i]
        for i in [i for i in self.warned if i < first]:
            del self.warned[i]
        for s in [s for s, (i, _, _) in self.seen.items() if i < first]:
            del self.seen[s]
        for s in [s for s, i in self.warned_upto.items() if i < first]:
            del self.warned_upto[s]
        if self.earliest is not None:
            self.earliest = max(self.earliest, self.rng.start(first))

    def points(self, now: float, window: tuple[int, int]) -> list[SessionPoint | None]:
        """Each bucket's counts; None before the history known (not zero)."""
        self.settle(now, window)
        pending: dict[int, int] = defaultdict(int)
        for session, (since, _) in self.open.items():
            # still pending (its deadline is ahead, `settle` ended the others): up to now,
            # the bucket holding now included
            for i in self._warned(session, since, now + 1e-3, window):
                pending[i] += 1
        out: list[SessionPoint | None] = []
        for i in range(window[0], window[1] + 1):
            if self.earliest is None or self.rng.start(i + 1) <= self.earliest:
                out.append(None)
                continue
            per = self.counts.get(i, {})
            out.append(
                SessionPoint(
                    self.rng.at(i),
                    per.get(ACTIVE, 0),
                    per.get(IDLE, 0),
                    self.warned.get(i, 0) + pending.get(i, 0),
                )
            )
        return out
