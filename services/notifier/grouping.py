"""Grouping, dedup and per-recipient rate limits: a storm becomes one message, not hundreds,
and a page is never held behind it.

Notices collect in groups by route, recipient and urgency. Info and warning notices that
take the same route to the same recipient share a digest: a new digest waits `group_wait`
for company; the next one for the same route and recipient is sent no sooner than
`group_interval` after the previous one; a recipient out of rate-limit tokens keeps
collecting until one is free. A critical notice goes out at once: it waits at most
`critical_wait` (1 s or less) for notices of its own incident, never for the digest's
interval, and has its own rate-limit tokens, so digests never spend them. Critical
notices of one topic group together: a storm (six nodes failing within milliseconds) is one
page that counts its decisions ("quarantine applied x3, quarantine refused
(circuit_breaker) x3"), and a page of the same topic within `group_interval` of the last
says it is an update of that storm, with the counts so far. Over the rate limit, the
recipient's critical notices of every topic collect in one message until a token is free;
a page whose incident was resolved (a `resolves` notice arrived) before it left is not
sent (`resolved_first`): it would say as new what is over. A user's notices are grouped per user: by the owner's address, else by the
session they are about. Within a group, repeats (same dedup key and
title) fold into one line with a count; a notice identical to one sent about the same
thing within `dedup_window` is recorded as a repeat and not sent again, by whichever
replica sees it (what was last sent about each thing is kept in KV, through the kernel's
`DedupWindow`).

Each notice's handler waits on its entry until the group is settled (sent, or
dead-lettered per channel), so its message is acked only then: nothing pending lives
only in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from pydantic import Field, field_validator

from nodeward.aio import within
from nodeward.bus import Delivery, RetryableError
from nodeward.bus.dlq import one_line
from nodeward.config import Section
from nodeward.durations import Duration
from schemas.base import Event
from schemas.notify import Notification, Severity
from services.kernel import DedupWindow
from services.notifier.routing import Audience, Route

SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
DIGEST = "digest"
THROTTLED = "critical"  # the lane of critical notices over the recipient's rate limit
MAX_CRITICAL_WAIT = timedelta(seconds=1)


class GroupingSettings(Section):
    group_wait: Duration = timedelta(seconds=10)
    """a new group waits this long for company"""
    group_interval: Duration = timedelta(minutes=2)
    """the least time between two messages of one route to one recipient"""
    dedup_window: Duration = timedelta(minutes=10)
    """a notice identical to one sent this recently is recorded, not re-sent"""
    critical_wait: Duration = timedelta(milliseconds=500)
    """a critical notice waits this long (at most 1s) for its own incident's"""

    @field_validator("critical_wait")
    @classmethod
    def _at_most_a_second(cls, value: timedelta) -> timedelta:
        if value > MAX_CRITICAL_WAIT:
            raise ValueError("a critical notice waits at most 1s")
        return value


class RateLimitSettings(Section):
    """Per recipient: at most `per_hour` messages an hour, in bursts of `burst`."""

    per_hour: float = Field(default=30.0, gt=0)
    burst: int = Field(default=5, ge=1)


@dataclass
class Entry:
    """One notice waiting in a group for the channels it still needs on this route."""

    event: Event[Notification]
    audience: Audience
    channels: tuple[str, ...]
    delivery: Delivery | None = None
    arrived: float = 0.0
    done: asyncio.Future[dict[str, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    @property
    def note(self) -> Notification:
        return self.event.data


@dataclass
class Item:
    """One line of a message: the latest of a notice's repeats, and how many there were."""

    entries: list[Entry]

    @property
    def latest(self) -> Entry:
        return self.entries[-1]

    @property
    def note(self) -> Notification:
        return self.latest.note

    @property
    def count(self) -> int:
        return len(self.entries)

    @property
    def first_time(self) -> datetime:
        return min(e.event.time for e in self.entries)

    @property
    def last_time(self) -> datetime:
        return max(e.event.time for e in self.entries)


def fold(entries: list[Entry]) -> list[Item]:
    """Fold repeats (same dedup key, or none, and same title) into items, in arrival order."""
    items: dict[tuple[str, str], Item] = {}
    for entry in entries:
        note = entry.note
        key = (note.dedup_key or f"id:{entry.event.id}", note.title)
        if key in items:
            items[key].entries.append(entry)
        else:
            items[key] = Item([entry])
    return list(items.values())


def fingerprint(note: Notification) -> tuple[str, str]:
    """(what it is about, what it says): repeats share both."""
    about = note.dedup_key or note.title
    return about, f"{note.severity.value}\x00{note.title}\x00{note.body}"


class RecentSends:
    """What was last said about each thing, to recognise a repeat within the dedup window."""

    def __init__(self, window: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._last: dict[tuple[str, str], tuple[str, float, str]] = {}

    def repeat_of(self, route: str, note: Notification) -> str | None:
        """The event id of the identical notice sent within the window, if there is one."""
        about, said = fingerprint(note)
        last = self._last.get((route, about))
        if last is None or last[0] != said or self.clock() - last[1] > self.window:
            return None
        return last[2]

    def sent(self, route: str, note: Notification, event_id: str) -> None:
        about, said = fingerprint(note)
        now = self.clock()
        self._last[(route, about)] = (said, now, event_id)
        if len(self._last) > 50_000:
            cutoff = now - self.window
            self._last = {k: v for k, v in self._last.items() if v[1] >= cutoff}


class SharedRecentSends:
    """`RecentSends` that every replica agrees on: what was last sent about each thing is
    also kept in KV (`window`: the kernel's `DedupWindow`), this replica's memory in front.

    Marked only once sent, as `RecentSends` is. KV trouble never holds a notice back: it
    is then judged on this replica's memory alone.
    """

    def __init__(self, local: RecentSends, window: DedupWindow | None = None) -> None:
        self.local = local
        self.window = window
        self.log = structlog.get_logger().bind(component="notify-dedup")

    @staticmethod
    def _key(route: str, note: Notification) -> tuple[str, str]:
        about, said = fingerprint(note)
        return f"{route}\x1f{about}", hashlib.sha256(said.encode()).hexdigest()[:32]

    async def repeat_of(self, route: str, note: Notification) -> str | None:
        """The event id of the identical notice sent within the window, if there is one."""
        earlier = self.local.repeat_of(route, note)
        if earlier is not None or self.window is None:
            return earlier
        key, content = self._key(route, note)
        try:
            record = await self.window.repeat_of(key, content=content)
        except Exception as exc:  # noqa: BLE001 - better a repeat sent than a notice lost
            self.log.warning("notify.dedup_read_failed", error=one_line(exc))
            return None
        return record.first if record is not None else None

    async def sent(self, route: str, note: Notification, event_id: str) -> None:
        self.local.sent(route, note, event_id)
        if self.window is None:
            return
        key, content = self._key(route, note)
        try:
            await self.window.mark(key, event_id, content=content)
        except Exception as exc:  # noqa: BLE001 - other replicas may send it once more
            self.log.warning("notify.dedup_mark_failed", error=one_line(exc))


class TokenBucket:
    def __init__(self, settings: RateLimitSettings, now: float) -> None:
        self.rate = settings.per_hour / 3600.0
        self.burst = float(settings.burst)
        self.tokens = self.burst
        self.updated = now

    def wait_time(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self) -> None:
        self.tokens -= 1.0


@dataclass
class Group:
    route: Route
    recipient: str | None  # the owner's address for a user's notice, else None (on-call)
    opened: float
    due: float
    personal: bool = False  # users' notices on a `to_owner` route: mailed to `recipient`
    entries: list[Entry] = field(default_factory=list)
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    who: str = "oncall"  # whom it is for: the address, `user:<ns>/<name>`, or on-call
    lane: str = DIGEST  # `digest`, `critical:<topic>`, or `critical` (over the limit)
    resolved_first: set[str] = field(default_factory=set)
    """Event ids of pages whose incident ended before the page left: not sent."""
    storm: Storm | None = None
    """For a page: the storm it belongs to, counted up to and with this page."""

    @property
    def key(self) -> tuple[str, str, str]:
        return self.route.name, self.who, self.lane

    @property
    def severity(self) -> Severity:
        return max((e.note.severity for e in self.entries), key=SEVERITY_RANK.__getitem__)

    @property
    def addressee(self) -> str:
        """Whom the message is for, in words (the outbox's `To:`)."""
        if not self.personal:
            return "on-call"
        if self.recipient:
            return self.recipient
        return f"the owner of {self.who.removeprefix('user:')} (no address on record)"


@dataclass
class Storm:
    """The pages of one topic to one recipient, each within `group_interval` of the last."""

    since: datetime
    pages: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    last: float = 0.0

    def count(self, entries: list[Entry]) -> None:
        self.pages += 1
        for e in entries:
            said = e.note.decision or e.note.title
            self.decisions[said] = self.decisions.get(said, 0) + 1


def recipient_key(recipient: str | None, audience: Audience, *, personal: bool) -> str:
    """Whom a group is for: a user's notices group per owner address, else per session
    (never with other users'); on-call's notices group together."""
    if not personal:
        return recipient or "oncall"
    return recipient or str(audience)


def lane(note: Notification) -> str:
    """Critical notices group per topic (a storm is one page); info and warning ones in
    the digest."""
    if note.severity == Severity.CRITICAL:
        return f"critical:{note.topic}"
    return DIGEST


Flush = Callable[[Group], Awaitable[None]]


class Grouper:
    """Collects entries into groups and hands each due group to `flush`, which settles every
    entry's `done` future. `add` returns that future's result to the notice's handler."""

    def __init__(
        self,
        grouping: GroupingSettings,
        rate_limit: RateLimitSettings,
        flush: Flush,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[BaseException, Group], None] | None = None,
        capacity: int | None = None,
    ) -> None:
        """`capacity`: when this many notices wait, every open group is sent at once (the
        consumer holds at most so many unacked; a full house would block other routes)."""
        self.grouping = grouping
        self.rate_limit = rate_limit
        self.flush = flush
        self.clock = clock
        self.on_error = on_error
        self.capacity = capacity
        self._open: dict[tuple[str, str, str], Group] = {}
        self._last_sent: dict[tuple[str, str, str], float] = {}
        self._buckets: dict[str, TokenBucket] = {}
        # Per route and recipient: the critical group waiting for a rate-limit token, which
        # every further critical notice joins, whatever its incident.
        self._throttled: dict[tuple[str, str], Group] = {}
        self._pending: dict[tuple[str, str], asyncio.Future[dict[str, str]]] = {}
        self._resolved: dict[str, float] = {}  # incident -> when a notice ended it
        self._storms: dict[tuple[str, str, str], Storm] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def open_groups(self) -> int:
        return len(self._open)

    @property
    def waiting(self) -> int:
        """Notices in groups not sent yet."""
        return sum(len(g.entries) for g in self._open.values())

    def bucket(self, recipient: str) -> TokenBucket:
        found = self._buckets.get(recipient)
        if found is None:
            found = self._buckets[recipient] = TokenBucket(self.rate_limit, self.clock())
        return found

    async def add(self, route: Route, recipient: str | None, entry: Entry) -> dict[str, str]:
        """Put `entry` in its group and wait until the group is settled: channel -> outcome.

        A notice already waiting on this route (a redelivery while its group is open)
        waits on the first one's result instead of joining twice.
        """
        pending_key = (entry.event.id, route.name)
        waiting = self._pending.get(pending_key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        self._pending[pending_key] = entry.done

        def forget(done: asyncio.Future[dict[str, str]]) -> None:
            self._pending.pop(pending_key, None)
            if not done.cancelled():
                done.exception()  # retrieved here: its handler may be gone (shutdown)

        entry.done.add_done_callback(forget)
        entry.arrived = self.clock()
        if entry.note.resolves:
            self._ended(entry.note.incident_key(), entry.arrived)
        group = self._group_for(route, recipient, entry)
        group.entries.append(entry)
        if self.capacity is not None and self.waiting >= self.capacity:
            structlog.get_logger().warning(
                "notify.groups_full", waiting=self.waiting, capacity=self.capacity
            )
            for full in self._open.values():
                full.hurry.set()
        return await asyncio.shield(entry.done)

    def _group_for(self, route: Route, recipient: str | None, entry: Entry) -> Group:
        """The open group `entry` joins, opened (and its task started) when there is none."""
        personal = route.to_owner and entry.audience.kind == "user"
        who = recipient_key(recipient, entry.audience, personal=personal)
        kind = lane(entry.note)
        if kind != DIGEST:
            throttled = self._throttled.get((route.name, who))
            if throttled is not None:
                return throttled
        group = self._open.get((route.name, who, kind))
        if group is not None:
            return group
        now = self.clock()
        wait = route.group_wait if route.group_wait is not None else self.grouping.group_wait
        if kind == DIGEST:
            due = now + wait.total_seconds()
            last = self._last_sent.get((route.name, who, kind))
            if last is not None:
                due = max(due, last + self.grouping.group_interval.total_seconds())
        else:  # critical: never held by an interval; its incident's company only briefly
            due = now + min(wait, self.grouping.critical_wait).total_seconds()
        group = Group(route, recipient, now, due, personal, who=who, lane=kind)
        self._open[group.key] = group
        if kind != DIGEST and self._bucket_for(group).wait_time(now) > 0:
            self._throttled[(route.name, who)] = group  # over the limit: the others join it
        if self._closing:
            group.hurry.set()
        task = asyncio.create_task(self._run(group), name=f"notify-group:{route.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return group

    def _ended(self, incident: str, at: float) -> None:
        self._resolved[incident] = at
        if len(self._resolved) > 10_000:  # bounded: a page waits an hour at the most
            horizon = at - 3600.0
            self._resolved = {k: t for k, t in self._resolved.items() if t >= horizon}

    def _resolved_first(self, group: Group) -> None:
        """Mark the pages of `group` whose incident ended after they arrived."""
        if group.lane == DIGEST:
            return
        for e in group.entries:
            ended = self._resolved.get(e.note.incident_key())
            if not e.note.resolves and ended is not None and ended >= e.arrived:
                group.resolved_first.add(e.event.id)

    def _storm_of(self, group: Group, now: float) -> Storm | None:
        """The storm a page belongs to (a new one past `group_interval`), counted with it."""
        if group.lane == DIGEST:
            return None
        live = [e for e in group.entries if e.event.id not in group.resolved_first]
        if not live:
            return None
        interval = self.grouping.group_interval.total_seconds()
        key = (group.route.name, group.who, group.lane)
        storm = self._storms.get(key)
        if storm is None or now - storm.last > interval:
            storm = self._storms[key] = Storm(since=min(e.event.time for e in live))
        storm.count(live)
        storm.last = now
        if len(self._storms) > 10_000:
            self._storms = {k: v for k, v in self._storms.items() if now - v.last <= interval}
        return Storm(storm.since, storm.pages, dict(storm.decisions), storm.last)

    def _bucket_for(self, group: Group) -> TokenBucket:
        """Critical groups spend their own tokens, so digests never delay a page."""
        who = group.recipient or (group.who if group.personal else f"route:{group.route.name}")
        return self.bucket(who if group.lane == DIGEST else f"{THROTTLED}:{who}")

    async def _sleep(self, group: Group, seconds: float) -> None:
        if seconds > 0 and not group.hurry.is_set():
            with contextlib.suppress(TimeoutError):
                await within(group.hurry.wait(), seconds)

    async def _run(self, group: Group) -> None:
        await self._sleep(group, group.due - self.clock())
        bucket = self._bucket_for(group)
        throttled = (group.route.name, group.who)
        while (wait := bucket.wait_time(self.clock())) > 0 and not group.hurry.is_set():
            if group.lane != DIGEST:
                holder = self._throttled.setdefault(throttled, group)
                if holder is not group:  # pages over the limit go out together
                    holder.entries.extend(group.entries)
                    if self._open.get(group.key) is group:
                        del self._open[group.key]
                    return
            await self._sleep(group, wait)  # over the limit: keep collecting meanwhile
        self._resolved_first(group)
        if len(group.resolved_first) < len(group.entries):
            bucket.take()  # a page that says nothing new spends no token
        if self._throttled.get(throttled) is group:
            del self._throttled[throttled]
        if self._open.get(group.key) is group:
            del self._open[group.key]
        now = self._last_sent[group.key] = self.clock()
        group.storm = self._storm_of(group, now)
        if len(self._last_sent) > 10_000:  # bounded: forget groups past their interval
            horizon = now - self.grouping.group_interval.total_seconds()
            self._last_sent = {k: t for k, t in self._last_sent.items() if t >= horizon}
        try:
            await self.flush(group)
        except Exception as exc:  # noqa: BLE001 - the entries are retried through redelivery
            if self.on_error is not None:
                self.on_error(exc, group)
        finally:
            for entry in group.entries:
                if not entry.done.done():
                    entry.done.set_exception(
                        RetryableError("the notice's group was not settled; retried later")
                    )

    def hurry_all(self) -> None:
        """Send every open group now (on shutdown), rate limits and windows aside."""
        self._closing = True
        for group in self._open.values():
            group.hurry.set()

    async def close(self, grace: float) -> None:
        """Send what is open within `grace`; cancel what is still running after it."""
        self.hurry_all()
        tasks = list(self._tasks)
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)


def summary(group: Group) -> dict[str, Any]:
    """A short description of a group for logs."""
    return {
        "route": group.route.name,
        "recipient": group.recipient or group.who,
        "lane": group.lane,
        "notices": len(group.entries),
    }
