"""How far this host's clock is from the bus's, read from a message it published itself.

JetStream stamps every stored message with the server's time (`Nats-Time-Stamp`); a
nodeward event carries its publisher's (`ce-time`). A direct get of the daemon's own newest
message on one of its subjects gives both: their difference is the clock offset plus the
publish's delay (milliseconds for a heartbeat, which is never queued). Consumers refuse an
event dated more than `bus.max_clock_skew` ahead of its store time, and judge staleness
across agent boots within it, so an agent whose clock is off says so: at start (its first
message read back), in `nodeward_clock_offset_seconds`, and in `nodeward status` (which
reads the same two times from each node's newest messages).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from nats.errors import TimeoutError as NatsTimeout

from nodeward.bus.bus import Bus
from schemas.streams import stream_for_subject


@dataclass(frozen=True)
class ClockReading:
    """One read-back message: its publisher's time, the server's, and the difference."""

    subject: str
    claimed: datetime
    stored: datetime

    @property
    def offset_s(self) -> float:
        """Seconds this host's clock ran ahead (+) or behind (-) of the bus."""
        return (self.claimed - self.stored).total_seconds()


def reading(subject: str, headers: dict[str, str] | None) -> ClockReading | None:
    """The reading a direct get's headers hold, or None (no such message, or one that does
    not say its publisher's time)."""
    h = headers or {}
    claimed, stored = h.get("ce-time"), h.get("Nats-Time-Stamp")
    if not claimed or not stored:
        return None
    try:
        return ClockReading(subject, _utc(claimed), _utc(stored))
    except ValueError:
        return None


def _utc(text: str) -> datetime:
    at = datetime.fromisoformat(text)  # Python keeps microseconds of the server's nanoseconds
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


class ClockProbe:
    """Reads back this daemon's newest message on `subject` (a subject of its own that it
    publishes regularly, in a stream with direct get) and says how far its clock is off."""

    def __init__(self, bus: Bus, subject: str, *, interval: float = 600.0) -> None:
        spec = stream_for_subject(subject)
        if spec is None or not spec.allow_direct:
            raise ValueError(f"{subject}: not in a stream that allows direct get")
        stored = subject
        if spec.partitioning is not None:
            stored = spec.partitioning.stored(subject, bus.settings.partitions)
        self.bus = bus
        self.subject = subject
        self.api = f"$JS.API.DIRECT.GET.{spec.name}.{stored}"
        self.interval = interval
        self.skew = bus.settings.max_clock_skew.total_seconds()
        self.last: ClockReading | None = None
        self.log = structlog.get_logger().bind(component="clock", subject=subject)
        self.gauge = bus.metrics.clock_offset.labels(subject)

    async def read(self) -> ClockReading | None:
        """One reading, or None when nothing of ours is stored yet (or the bus is away)."""
        try:
            msg = await self.bus.nc.request(self.api, b"", timeout=2.0)
        except (TimeoutError, NatsTimeout):
            return None
        except Exception as exc:  # noqa: BLE001 - no permission, no stream: said once below
            self.log.warning("clock.unreadable", error=str(exc))
            return None
        return reading(self.subject, msg.headers)

    async def run(self, *, first_wait: float = 1.0) -> None:
        """Until cancelled (a daemon task): the first reading as soon as one of ours is
        stored (asked again after 1 s, 2 s, 4 s ... up to `interval`), then one every
        `interval`."""
        wait = first_wait
        while True:
            got = await self.read()
            if got is not None:
                self.judge(got, first=self.last is None)
                self.last = got
            await asyncio.sleep(self.interval if self.last is not None else wait)
            wait = min(wait * 2, self.interval)

    def judge(self, got: ClockReading, *, first: bool) -> None:
        """The gauge, and one log line: at the first reading always, after it when the
        clock is (or stops being) off by more than `bus.max_clock_skew`."""
        offset = got.offset_s
        self.gauge.set(offset)
        off = abs(offset) > self.skew
        was_off = self.last is not None and abs(self.last.offset_s) > self.skew
        if off and (first or not was_off):
            effect = (
                "its events are refused as from the future"
                if offset > 0
                else "its events may be judged older than they are"
            )
            self.log.warning(
                "clock.off",
                offset_s=round(offset, 3),
                max_clock_skew_s=self.skew,
                problem=f"this host's clock is {abs(offset):.1f}s "
                f"{'ahead of' if offset > 0 else 'behind'} the bus: {effect}; check NTP",
            )
        elif first or (was_off and not off):
            self.log.info("clock.ok", offset_s=round(offset, 3), max_clock_skew_s=self.skew)
