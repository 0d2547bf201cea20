"""Streams and KV buckets kept in memory by watching them, instead of reading them again.

A `Mirror` is one long-lived ordered push consumer on a stream: it starts with each
subject's last message (`DeliverPolicy.LAST_PER_SUBJECT`) and then takes every new one, so
it always holds the newest message on each subject it watches. After a gap, or a server
that restarted and lost the consumer, the client makes it again from the next sequence
(nats-py's ordered consumer), so nothing is missed and nothing is read twice.

`Mirrors` answers `Reads` (what `nodeward.fleet_status.read_fleet` asks) from its mirrors,
and passes to the bus only what they cannot answer: a stream not watched (or not there yet),
a filter wider than the watched subjects, bodies from a headers-only mirror, more than the
newest message, message counts. A page that is drawn again after every change reads
memory: no consumer is made and deleted for each drawing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from nats.js import api
from nats.js.errors import NotFoundError

from nodeward.aio import within
from nodeward.bus.snapshot import BusReads, Stored, kv_filter, kv_live
from schemas.streams import subject_matches

_PENDING_LIMIT = 1 << 22
_RETRY_S = 5.0
"""How often a mirror whose stream was not there (or whose start failed) is tried again."""


def covers(wide: str, narrow: str) -> bool:
    """Whether every subject that `narrow` matches, `wide` matches too."""
    w, n = wide.split("."), narrow.split(".")
    for i, tok in enumerate(w):
        if tok == ">":
            return len(n) > i
        if i >= len(n) or n[i] == ">":
            return False
        if tok != "*" and tok != n[i]:
            return False
    return len(n) == len(w)


@dataclass(frozen=True, slots=True)
class Watched:
    """What a mirror watches: a stream, its subjects `filters`, whether it keeps headers
    only, and whether a change is told (`tell`; periodic messages such as heartbeats need
    not wake anybody)."""

    stream: str
    filters: tuple[str, ...]
    headers_only: bool = False
    tell: bool = True

    @classmethod
    def bucket(cls, bucket: str, *, tell: bool = True) -> Watched:
        return cls(f"KV_{bucket}", (f"$KV.{bucket}.>",), tell=tell)

    def holds(self, filters: Sequence[str], *, headers_only: bool) -> bool:
        """Whether this mirror has what a read of `filters` asks for."""
        if self.headers_only and not headers_only:
            return False
        return all(any(covers(w, f) for w in self.filters) for f in filters or (">",))


class Mirror:
    """The newest message on each subject a `Watched` names, in stream order."""

    def __init__(self, nc: Any, watched: Watched, on_change: Callable[[], None] | None) -> None:
        self.nc = nc
        self.watched = watched
        self.on_change = on_change
        self.last: dict[str, Stored] = {}
        """Subject -> its newest message; insertion order is stream order."""
        self.ready = asyncio.Event()
        """Set once everything stored when it started is held."""
        self.max_age_s = 0.0
        self.started = False
        self.whole = False
        """Whether it watches every subject of the stream."""
        self._tried = -_RETRY_S
        self._upto: int | None = None
        self._sub: Any = None

    async def start(self) -> bool:
        """Start watching (once); False if the stream is not there, or the start failed and
        is not due to be tried again yet."""
        if self.started:
            return True
        if time.monotonic() - self._tried < _RETRY_S:
            return False
        self._tried = time.monotonic()
        js = self.nc.jetstream()
        w = self.watched
        try:
            info = await js.stream_info(w.stream)
        except NotFoundError:
            return False
        self.max_age_s = float(info.config.max_age or 0)
        self.whole = all(
            any(covers(f, subject) for f in w.filters) for subject in info.config.subjects or ()
        )
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
            filter_subjects=list(w.filters) if len(w.filters) > 1 else None,
            headers_only=w.headers_only or None,
        )
        self._sub = await js.subscribe(
            w.filters[0],
            stream=w.stream,
            config=config,
            ordered_consumer=True,
            cb=self._take,
            pending_msgs_limit=_PENDING_LIMIT,
            pending_bytes_limit=-1,
        )
        self.started = True
        consumer = await self._sub.consumer_info()
        if not consumer.num_pending:
            self._upto = consumer.delivered.stream_seq
            if not self.last or max(s.seq for s in self.last.values()) >= self._upto:
                self._caught_up()
        return True

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        name = getattr(sub, "_consumer", None)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if name:
            with contextlib.suppress(Exception):
                await self.nc.jetstream().delete_consumer(self.watched.stream, name)

    def _caught_up(self) -> None:
        if not self.ready.is_set():
            self.ready.set()
            if self.on_change is not None:
                self.on_change()

    async def _take(self, msg: Any) -> None:
        try:
            meta = msg.metadata
        except Exception:  # noqa: BLE001 - not a stored message
            return
        stored = Stored(
            subject=msg.subject,
            headers=dict(msg.headers) if msg.headers else None,
            data=msg.data or b"",
            seq=meta.sequence.stream,
            time=meta.timestamp,
        )
        self.last.pop(stored.subject, None)
        self.last[stored.subject] = stored
        if self.ready.is_set():
            if self.on_change is not None:
                self.on_change()
        elif meta.num_pending == 0 or (self._upto is not None and stored.seq >= self._upto):
            self._caught_up()

    def held(self, filters: Sequence[str]) -> list[Stored]:
        """The held messages on subjects matching `filters`, in stream order; those older
        than the stream keeps messages are dropped first, as the server drops them."""
        if self.max_age_s:
            cutoff = datetime.now(UTC) - timedelta(seconds=self.max_age_s)
            for subject, stored in list(self.last.items()):
                if stored.time >= cutoff:
                    break
                del self.last[subject]
        if not filters or set(self.watched.filters) <= set(filters):
            return list(self.last.values())  # all it holds matches
        return [
            s for s in self.last.values() if any(subject_matches(f, s.subject) for f in filters)
        ]


class Mirrors:
    """`Reads` answered from mirrors of the `watched` streams; `on_change` is called after
    each change a telling mirror takes (and when one has caught up)."""

    def __init__(
        self,
        nc: Any,
        watched: Iterable[Watched],
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.bus = BusReads(nc)
        self.log = structlog.get_logger().bind(component="mirrors")
        self._mirrors = {w.stream: Mirror(nc, w, on_change if w.tell else None) for w in watched}

    async def start(self, timeout: float = 10.0) -> None:
        """Start every mirror and wait (up to `timeout`) for each to catch up; until one has,
        its reads go to the bus."""
        await asyncio.gather(*(self._start(m) for m in self._mirrors.values()))
        waits = [m.ready.wait() for m in self._mirrors.values() if m.started]
        with contextlib.suppress(TimeoutError):
            await within(asyncio.gather(*waits), timeout)

    async def _start(self, mirror: Mirror) -> None:
        try:
            await mirror.start()
        except Exception as exc:  # noqa: BLE001 - tried again on a later read
            self.log.warning(
                "mirror.start_failed",
                stream=mirror.watched.stream,
                error=" ".join(str(exc).split()) or type(exc).__name__,
            )

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self._mirrors.values()))

    @property
    def consumers(self) -> int:
        """How many mirrors are watching."""
        return sum(1 for m in self._mirrors.values() if m.started)

    async def _holding(
        self, stream: str, filters: Sequence[str], *, headers_only: bool = False
    ) -> Mirror | None:
        mirror = self._mirrors.get(stream)
        if mirror is None or not mirror.watched.holds(filters, headers_only=headers_only):
            return None
        if not mirror.started:
            await self._start(mirror)
        return mirror if mirror.ready.is_set() else None

    async def last(
        self, stream: str, filters: Sequence[str], *, headers_only: bool = False
    ) -> list[Stored] | None:
        mirror = await self._holding(stream, filters, headers_only=headers_only)
        if mirror is None:
            return await self.bus.last(stream, filters, headers_only=headers_only)
        return mirror.held(filters)

    async def since(
        self, stream: str, filters: Sequence[str], start: datetime
    ) -> list[Stored] | None:
        mirror = await self._holding(stream, filters)
        if mirror is None:
            return await self.bus.since(stream, filters, start)
        return [s for s in mirror.held(filters) if s.time >= start]

    async def newest(
        self, stream: str, count: int, *, filters: Sequence[str] = ()
    ) -> list[Stored] | None:
        """The newest message from a mirror of the whole stream (the stream's newest is its
        subject's last); more than one from the bus."""
        mirror = await self._holding(stream, filters) if count == 1 else None
        if mirror is None or not mirror.whole:
            return await self.bus.newest(stream, count, filters=filters)
        held = mirror.held(())
        newest = held[-1:]
        return [m for m in newest if any(subject_matches(f, m.subject) for f in filters or (">",))]

    async def subjects(self, stream: str, subjects_filter: str) -> set[str] | None:
        mirror = await self._holding(stream, [subjects_filter], headers_only=True)
        if mirror is None:
            return await self.bus.subjects(stream, subjects_filter)
        return {s.subject for s in mirror.held([subjects_filter])}

    async def counts(self, stream: str, subjects_filter: str) -> dict[str, int] | None:
        return await self.bus.counts(stream, subjects_filter)

    async def kv(self, bucket: str, prefixes: Sequence[str]) -> dict[str, bytes] | None:
        stored = await self.last(f"KV_{bucket}", [kv_filter(bucket, p) for p in prefixes])
        return None if stored is None else kv_live(bucket, stored)
