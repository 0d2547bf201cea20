"""The console's one reader of the bus's stored history, for the trends of its pages.

What each trend reads (the console writes nothing, so any rollup is made here, in memory):

| trend | stream: subjects | what is kept of each |
|---|---|---|
| energy | ENERGY: `energy.node.>` | each node's interval, its energy and CO2e shared among the buckets it overlaps |
| capacity | CAPACITY: `capacity.>` | each change of a model and profile's counts (and, once, the last change of each stored before the window) |
| sessions | SESSIONS: `session.activity.>`; AUDIT: `remediation.{warn,cancel,stop}.>` | each session's state per bucket; the culler's warnings, from warn to cancel, stop or deadline |

One `Trends` per process holds each trend for each range (`trends.RANGES`), whoever looks:
the first view of a range reads its window once, by start time, with an ordered consumer
whose messages are folded into the buckets as they come (nothing is kept but the buckets);
later views read only what was stored since (by sequence), and no more often than once a
bucket width. A view waits for a read at most `trend_wait_s`, and is drawn from what has
been read so far. A first read that would take more than `trend_messages` messages reads only
the newest of them (the page says from when).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
from nats.js import api
from pydantic import ValidationError

from nodeward.aio import within
from nodeward.bus.snapshot import last_per_subject, stream_info
from schemas import DecodeError, decode
from schemas.capacity import CapacityChanged, GpuCounts
from schemas.energy import EnergyNode
from schemas.remediation import Outcome, Remediation
from schemas.session import SessionActivity
from services.console.settings import ConsoleSettings
from services.console.trends import (
    CapacityTrend,
    EnergyTrend,
    Gpus,
    Range,
    SessionTrend,
)

Trend = EnergyTrend | CapacityTrend | SessionTrend
Window = tuple[int, int]
Fold = Callable[[Any, str, dict[str, str] | None, bytes, Window], None]
"""Hands one stored message (subject, headers, body) to a trend, in a window."""

RETRY_S = 15.0
"""After a failed read, how long before a view tries again."""
YIELD_EVERY = 500
"""Messages folded between two yields to the event loop (pages and the live feed go on)."""
STALL_S = 10.0
"""A read that receives nothing for this long while messages are pending fails."""
PENDING = 1 << 16
"""Messages the client may hold unfolded (flow control keeps it far below)."""
TOOK = (Outcome.APPLIED, Outcome.DRY_RUN)


@dataclass(frozen=True)
class Kept:
    """What one stream keeps: its name, how long (0: no time limit), its oldest message."""

    stream: str
    max_age_s: float
    first: datetime | None


@dataclass(frozen=True)
class Stream:
    """A stream as its info says: what it keeps, its first and last sequence."""

    kept: Kept
    first_seq: int
    last_seq: int


def _stamp(value: str) -> datetime:
    """An RFC 3339 time with nanoseconds (the server's) as a UTC datetime."""
    head, _, frac = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").astimezone(UTC)


@dataclass(frozen=True)
class Reads:
    """One stream a trend reads: its name, the subjects, how each message is folded."""

    stream: str
    filters: tuple[str, ...]
    fold: Fold


@dataclass
class Held:
    """One trend over one range, as read so far."""

    source: str
    rng: Range
    trend: Trend
    next_seq: dict[str, int] = field(default_factory=dict)
    """Per stream, the sequence the next read starts at (none yet: by start time)."""
    kept: dict[str, Kept | None] = field(default_factory=dict)
    """Per stream, what it keeps (None: no such stream on this server)."""
    limited: dict[str, datetime] = field(default_factory=dict)
    """Per stream, when the first read was limited to its newest messages: from when."""
    read_at: datetime | None = None
    due: float = 0.0
    """Monotonic time from which a view reads again."""
    error: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def reading(self) -> bool:
        return self.task is not None and not self.task.done()


def _data(subject: str, headers: dict[str, str] | None, body: bytes) -> Any:
    """The event in a message, or None when it is not one the console can read."""
    try:
        return decode(subject, headers, body)
    except (DecodeError, ValidationError, ValueError):
        return None


def _gpus(counts: GpuCounts) -> Gpus:
    return Gpus(counts.free, counts.used, counts.quarantined)


def fold_energy(trend: Any, subject: str, headers: Any, body: bytes, window: Window) -> None:
    event = _data(subject, headers, body)
    if event is not None and isinstance(event.data, EnergyNode):
        d = event.data
        trend.add(
            d.interval.start.timestamp(), d.interval.end.timestamp(), d.energy_j, d.co2e_g, window
        )


def fold_capacity(trend: Any, subject: str, headers: Any, body: bytes, window: Window) -> None:
    event = _data(subject, headers, body)
    if event is not None and isinstance(event.data, CapacityChanged):
        d = event.data
        previous = _gpus(d.previous) if d.previous is not None else None
        trend.add(event.time.timestamp(), (d.model, d.profile), _gpus(d.counts), previous, window)


def fold_activity(trend: Any, subject: str, headers: Any, body: bytes, window: Window) -> None:
    event = _data(subject, headers, body)
    if event is not None and isinstance(event.data, SessionActivity):
        d = event.data
        trend.sample(f"{d.namespace}/{d.pod}", d.sampled_at.timestamp(), d.state.value, window)


def session_of(r: Remediation) -> str | None:
    """The session (`namespace/pod`) a culler's audit record is about."""
    named = str(r.details.get("pod") or "")
    if "/" in named:
        return named
    return f"{r.target.namespace}/{r.target.name}" if r.target.namespace else None


def _deadline(r: Remediation) -> float | None:
    with contextlib.suppress(TypeError, ValueError):
        return datetime.fromisoformat(str(r.details["deadline"])).timestamp()
    return None


def culler_fold(actor: str) -> Fold:
    """How the culler's warnings (audit records by `actor`) are folded into a session trend."""

    def fold(trend: Any, subject: str, headers: Any, body: bytes, window: Window) -> None:
        event = _data(subject, headers, body)
        if event is None or not isinstance(event.data, Remediation):
            return
        r = event.data
        session = session_of(r)
        if r.actor != actor or r.outcome not in TOOK or session is None:
            return
        at = event.time.timestamp()
        if r.action == "warn":
            trend.warn(session, at, _deadline(r))
        elif r.action in ("cancel", "stop"):
            trend.end_warning(session, at, window)

    return fold


def sources(settings: ConsoleSettings) -> dict[str, tuple[Callable[[Range], Trend], list[Reads]]]:
    """Each trend: how its accumulator is made, and the streams it reads."""
    return {
        "energy": (EnergyTrend, [Reads("ENERGY", ("energy.node.>",), fold_energy)]),
        "capacity": (CapacityTrend, [Reads("CAPACITY", ("capacity.>",), fold_capacity)]),
        "sessions": (
            SessionTrend,
            [
                Reads("SESSIONS", ("session.activity.>",), fold_activity),
                Reads(
                    "AUDIT",
                    ("remediation.warn.>", "remediation.cancel.>", "remediation.stop.>"),
                    culler_fold(settings.culler_actor),
                ),
            ],
        ),
    }


class Trends:
    """Every trend the pages draw, per range, read from the bus by one process for all its
    viewers."""

    def __init__(
        self, nc: Any, settings: ConsoleSettings, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.clock = clock
        self.log = structlog.get_logger().bind(component="console")
        self._sources = sources(settings)
        self._held: dict[tuple[str, str], Held] = {}

    async def get(self, source: str, rng: Range) -> Held:
        """The trend as read: read again first when a bucket width has passed since the last
        read (waiting for it at most `trend_wait_s`)."""
        key = (source, rng.name)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = Held(source, rng, self._sources[source][0](rng))
        if not held.reading and time.monotonic() >= held.due:
            held.task = asyncio.create_task(self._read(held), name=f"trend-{source}-{rng.name}")
        if held.task is not None and not held.task.done():
            with contextlib.suppress(TimeoutError):
                await within(asyncio.shield(held.task), self.settings.trend_wait_s)
        return held

    async def stop(self) -> None:
        tasks = [h.task for h in self._held.values() if h.task is not None and not h.task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _read(self, held: Held) -> None:
        began = time.monotonic()
        now = self.clock()
        window = held.rng.window(now)
        held.trend.prune(window[0])
        taken = 0
        try:
            for reads in self._sources[held.source][1]:
                taken += await self._read_stream(held, reads, window)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the page says it; a later view tries again
            held.error = " ".join(str(exc).split()) or type(exc).__name__
            held.due = time.monotonic() + RETRY_S
            self.log.warning(
                "console.trend_failed", trend=held.source, range=held.rng.name, error=held.error
            )
            return
        held.error = None
        held.read_at = datetime.fromtimestamp(now, UTC)
        held.due = began + held.rng.width
        self.log.debug(
            "console.trend_read",
            trend=held.source,
            range=held.rng.name,
            messages=taken,
            seconds=round(time.monotonic() - began, 3),
        )

    async def _read_stream(self, held: Held, reads: Reads, window: Window) -> int:
        """Fold what `reads.stream` stored since the last read (the first: since the window's
        start) into the trend; how many messages were read."""
        state = await self._stream(reads.stream)
        held.kept[reads.stream] = state.kept if state is not None else None
        if state is None:
            return 0
        first = state.kept.first
        seq = held.next_seq.get(reads.stream)
        if seq is not None and seq > state.last_seq + 1:
            seq = None  # the stream was made again: read it afresh
        limited = False
        start: int | datetime
        if seq is not None:
            if seq > state.last_seq:
                return 0  # nothing stored since
            start = seq
        else:
            if first is not None and isinstance(held.trend, SessionTrend):
                held.trend.covered(first.timestamp())
            if isinstance(held.trend, CapacityTrend):
                await self._baseline(held, reads, window)
            since = datetime.fromtimestamp(held.rng.start(window[0]), UTC)
            pending = await self._pending(reads, since)
            if not pending:
                held.next_seq[reads.stream] = state.last_seq + 1
                return 0
            start, limited = since, pending > self.settings.trend_messages
            if limited:
                start = max(state.first_seq, state.last_seq - self.settings.trend_messages + 1)
        last, taken, began = await self._follow(held, reads, start, window)
        if limited and began is not None:
            held.limited[reads.stream] = began
        held.next_seq[reads.stream] = max(last, state.last_seq) + 1
        return taken

    async def _stream(self, stream: str) -> Stream | None:
        """What `stream` holds now, from the server's `STREAM.INFO` (with the time of its
        first message, which nats-py leaves out); None when there is no such stream."""
        reply = await stream_info(self.nc, stream, timeout=STALL_S)
        if reply is None:
            return None
        config, state = reply.get("config") or {}, reply.get("state") or {}
        first = None
        if state.get("messages") and state.get("first_ts"):
            first = _stamp(str(state["first_ts"]))
        return Stream(
            Kept(stream, int(config.get("max_age") or 0) / 1e9, first),
            int(state.get("first_seq") or 0),
            int(state.get("last_seq") or 0),
        )

    async def _pending(self, reads: Reads, since: datetime) -> int:
        """How many messages of `reads` were stored since `since` (a consumer made to count
        them, and deleted)."""
        js = self.nc.jetstream()
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.NONE,
            deliver_policy=api.DeliverPolicy.BY_START_TIME,
            opt_start_time=since,
            filter_subject=reads.filters[0] if len(reads.filters) == 1 else None,
            filter_subjects=list(reads.filters) if len(reads.filters) > 1 else None,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=30.0,
        )
        probe = await js.add_consumer(reads.stream, config=config)
        with contextlib.suppress(Exception):
            await js.delete_consumer(reads.stream, probe.name)
        return int(probe.num_pending or 0)

    async def _baseline(self, held: Held, reads: Reads, window: Window) -> None:
        """The last change of each series stored before the window: what holds at its start."""
        stored = await last_per_subject(self.nc, reads.stream, list(reads.filters)) or []
        for m in stored:
            reads.fold(held.trend, m.subject, m.headers, m.data, window)

    async def _follow(
        self, held: Held, reads: Reads, start: int | datetime, window: Window
    ) -> tuple[int, int, datetime | None]:
        """Read `reads.stream` from `start` (a sequence, or a time) to its end as it is now,
        with an ordered consumer, folding each message as it comes: the last sequence read,
        how many, and when the first was stored."""
        js = self.nc.jetstream()
        done = asyncio.Event()
        seen = {"last": start - 1 if isinstance(start, int) else 0, "taken": 0, "upto": 0}
        began: list[datetime] = []

        async def take(msg: Any) -> None:
            try:
                meta = msg.metadata
            except Exception:  # noqa: BLE001 - not a stored message
                return
            seen["last"] = meta.sequence.stream
            seen["taken"] += 1
            # what is folded is never read again, even when the read fails further on
            held.next_seq[reads.stream] = meta.sequence.stream + 1
            if not began:
                began.append(meta.timestamp)
            reads.fold(
                held.trend,
                msg.subject,
                dict(msg.headers) if msg.headers else None,
                msg.data or b"",
                window,
            )
            if meta.num_pending == 0 or (seen["upto"] and meta.sequence.stream >= seen["upto"]):
                done.set()
            if seen["taken"] % YIELD_EVERY == 0:
                await asyncio.sleep(0)

        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_TIME
            if isinstance(start, datetime)
            else api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_time=start if isinstance(start, datetime) else None,
            opt_start_seq=start if isinstance(start, int) else None,
            filter_subjects=list(reads.filters) if len(reads.filters) > 1 else None,
        )
        sub = await js.subscribe(
            reads.filters[0],
            stream=reads.stream,
            config=config,
            ordered_consumer=True,
            cb=take,
            pending_msgs_limit=PENDING,
            pending_bytes_limit=-1,
        )
        try:
            consumer = await sub.consumer_info()
            if not consumer.num_pending:
                seen["upto"] = int(consumer.delivered.stream_seq)
                if seen["last"] >= seen["upto"]:
                    done.set()
            last = -1
            while not done.is_set():
                if seen["taken"] == last:
                    raise TimeoutError(
                        f"stream {reads.stream}: {last} messages read, then nothing for "
                        f"{STALL_S:g}s"
                    )
                last = seen["taken"]
                with contextlib.suppress(TimeoutError):
                    await within(done.wait(), STALL_S)
        finally:
            name = getattr(sub, "_consumer", None)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if name:
                with contextlib.suppress(Exception):
                    await js.delete_consumer(reads.stream, name)
        return seen["last"], seen["taken"], began[0] if began else None
