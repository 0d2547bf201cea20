"""The consume framework: a durable pull consumer that never blocks a stream or loses a message.

A service gives a `ConsumerSpec` and a handler. For each message the runtime:
- decodes it into the typed event; if it cannot, dead-letters it (reason `invalid`);
- checks that the data names who the subject names (`identity`: node, namespace, pod);
  if not, audits it as a security event, tells on-call once per publisher and window,
  and dead-letters it (reason `identity_mismatch`), never running the handler;
- runs the handler (bounded concurrency, in order per `order_key`), sending `in_progress`
  while it runs longer than a third of `ack_wait`;
- acks after the handler returns; naks with a growing delay when it raises;
- dead-letters at once on an error retrying cannot fix (`PermanentError`, a pydantic
  `ValidationError`, an invalid KV key, max payload exceeded: `errors.is_permanent`), or
  when deliveries reach `max_deliver` (reason `permanent` / `exhausted`). The DLQ write is
  acknowledged by JetStream before the original is acked; if it fails the original is
  nak'ed, and after `dead_letter_tries` failed writes terminated (AckTerm) and audited.
  A dead letter too big for max_payload keeps headers, size, sha256 and the first bytes.
Deliveries are counted by the client, not the server (server `max_deliver` is unlimited),
so a message whose handler kills the process is dead-lettered on its next delivery instead
of vanishing silently when the server stops redelivering it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from nodeward.aio import within
from nodeward.bus.dlq import dead_letter_event, one_line
from nodeward.bus.errors import IdentityRefused, RetryableError, is_permanent
from nodeward.bus.identity import Binding, Mismatch, bind, default_binding, mismatches
from nodeward.bus.provision import ensure_stream
from nodeward.bus.pull import GONE, Puller
from nodeward.config import BusSettings
from nodeward.metrics import Metrics, at_zero
from schemas.base import Event, EventData, make_event
from schemas.cloudevents import DecodeError, decode
from schemas.common import ObjectRef
from schemas.dlq import DeadLetter, DeadLetterReason
from schemas.ids import stable_id
from schemas.notify import Notification, Severity
from schemas.remediation import Outcome, Remediation
from schemas.streams import STREAMS, stream_spec

TERMINATED = "terminated"
"""The dead-letter counter's reason for a message that could not be dead-lettered and was
terminated (`Consumer._terminate`)."""
DEAD_LETTER_REASONS: tuple[str, ...] = (*(r.value for r in DeadLetterReason), TERMINATED)
"""Every `reason` of `nodeward_events_dead_lettered_total`: a closed set."""


class Bus(Protocol):
    """What a consumer needs of `nodeward.bus.Bus` (which owns its consumers)."""

    nc: NATS
    js: JetStreamContext
    metrics: Metrics
    source: str
    settings: BusSettings

    async def publish(self, event: Event[Any], *, timeout: float | None = None) -> api.PubAck: ...


def ack_info(msg: Msg) -> tuple[int, int | None]:
    """(delivery attempt, stream sequence) from a JetStream reply subject, cheaply.

    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...` (9 tokens) or, with domain and
    account hash, `$JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>...`.
    """
    tokens = (msg.reply or "").split(".")
    try:
        if len(tokens) == 9:
            return int(tokens[4]), int(tokens[5])
        if len(tokens) >= 11:
            return int(tokens[6]), int(tokens[7])
    except ValueError:
        pass
    try:
        md = msg.metadata
        return md.num_delivered or 1, md.sequence.stream
    except Exception:  # noqa: BLE001 - not a JetStream delivery
        return 1, None


def delivery_seq(msg: Msg) -> int | None:
    """The consumer sequence of a JetStream delivery (one per delivery, redeliveries
    included, contiguous for one consumer's deliveries), from its reply subject."""
    tokens = (msg.reply or "").split(".")
    try:
        if len(tokens) == 9:
            return int(tokens[6])
        if len(tokens) >= 11:
            return int(tokens[8])
    except ValueError:
        pass
    return None


@dataclass(slots=True)
class Delivery:
    """What a handler may want to know about the message beyond the event."""

    subject: str
    attempt: int
    stream_sequence: int | None
    headers: dict[str, str]
    _msg: Msg = field(repr=False)

    @property
    def msg(self) -> Msg:
        """The JetStream message itself (for `dlq.dead_letter_event`)."""
        return self._msg

    async def in_progress(self) -> None:
        """Extend the ack deadline now (the runtime also does this on its own)."""
        await self._msg.in_progress()


Handler = Callable[[Event[Any], Delivery], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerSpec:
    name: str
    stream: str
    subjects: tuple[str, ...]
    types: frozenset[str] | None = None
    max_deliver: int = 5
    ack_wait: timedelta = timedelta(seconds=30)
    retry_delays: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0)
    concurrency: int = 8
    batch: int = 64
    fetch_timeout: float = 1.0
    max_ack_pending: int = 1000
    handler_timeout: timedelta | None = None
    order_key: Callable[[Event[Any]], str] | None = None
    lag_interval: float = 5.0
    dead_letter_tries: int = 3
    # Which data fields must equal which subject tokens, per event type (`identity.bind`).
    # Types not listed get `identity.default_binding` (their <node>, <ns>, <pod> tokens).
    identity: tuple[Binding, ...] = ()
    identity_notice_window: timedelta = timedelta(minutes=15)
    # Partitions (`bus.partitions`): one durable `<name>-p<i>` per partition, each consumed
    # by the one replica holding its KV lease (`nodeward.bus.partitions`); 1: one durable
    # every replica shares (no order across replicas).
    partitions: int = 1
    lease_ttl: timedelta = timedelta(seconds=20)
    pull_expires: float = 10.0  # how long a pull request stays open on the server

    def __post_init__(self) -> None:
        if min(self.max_deliver, self.concurrency, self.batch, self.dead_letter_tries) < 1:
            raise ValueError(
                "max_deliver, concurrency, batch and dead_letter_tries must be at least 1"
            )
        if self.max_ack_pending < self.batch + self.concurrency:
            raise ValueError("max_ack_pending must cover batch + concurrency")
        if self.identity_notice_window.total_seconds() <= 0:
            raise ValueError("identity_notice_window must be positive")
        if self.partitions < 1:
            raise ValueError("partitions must be at least 1")
        if self.partitions > 1 and stream_spec(self.stream).partitioning is None:
            raise ValueError(f"stream {self.stream} is not partitioned (StreamSpec.partitioning)")
        if self.partitions > 1 and self.lease_ttl < timedelta(seconds=3):
            # A handover (pull requests of at least 1.5 s waited out, then a grace) must
            # finish inside the lease it was renewed under.
            raise ValueError("a partitioned consumer's lease_ttl must be at least 3s")

    def partition(self, index: int) -> ConsumerSpec:
        """The durable of partition `index`: `<name>-p<index>` on the same subjects narrowed
        to that partition's stored subjects (`gpu.health.>` -> `gpu.health.*.*.<index>`)."""
        partitioning = stream_spec(self.stream).partitioning
        if partitioning is None or not 0 <= index < self.partitions:
            raise ValueError(f"{self.name} has no partition {index}")
        return replace(
            self,
            name=f"{self.name}-p{index}",
            subjects=tuple(partitioning.narrow(s, index) for s in self.subjects),
            partitions=1,
            # Short pull requests: a replica handing the partition over waits them out.
            pull_expires=max(min(self.pull_expires, self.lease_ttl.total_seconds() / 4), 1.5),
        )

    @staticmethod
    def bind(model: type[EventData], *fields: str) -> Binding:
        """An `identity` entry: `fields` of `model` must equal the subject tokens its
        pattern names for them, e.g. `ConsumerSpec.bind(GpuHealth, "node")` binds
        `data.node` to token 2 of `gpu.health.<node>.<gpu>`."""
        return bind(model, *fields)

    def retry_delay(self, attempt: int) -> float:
        return (
            self.retry_delays[min(attempt, len(self.retry_delays)) - 1]
            if self.retry_delays
            else 0.0
        )

    def config(self) -> api.ConsumerConfig:
        subjects = list(self.subjects)
        return api.ConsumerConfig(
            name=self.name,
            durable_name=self.name,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=self.ack_wait.total_seconds(),
            max_deliver=-1,
            max_ack_pending=self.max_ack_pending,
            filter_subject=subjects[0] if len(subjects) == 1 else None,
            filter_subjects=subjects if len(subjects) > 1 else None,
        )


@dataclass
class _Item:
    msg: Msg
    event: Event[Any] | None
    error: DecodeError | None
    after: asyncio.Future[bool] | None  # the previous message of its key: True once handled,
    done: asyncio.Future[bool] | None  # False if given back unhandled (at stop)
    key: str | None


@dataclass(frozen=True)
class _Refusal:
    """An event refused before any handler sees it, and how that is recorded: the audit
    (`remediation.<action>.<target>`), on-call's notice and the dead letter's reason."""

    reason: DeadLetterReason
    action: str
    salt: str  # of the audit's and notice's stable ids
    policy: str
    guard: str
    error: str
    publisher: str
    target: ObjectRef
    about: ObjectRef  # whom on-call's notice is about
    details: dict[str, Any]
    severity: Severity
    topic: str
    title: str
    why: str
    what_you_can_do: list[str]


class Consumer:
    """Runs one `ConsumerSpec` against a bus until stopped.

    `exclusive`: no other process consumes this durable while this one runs (a partition,
    held under its lease). Then, on start, what an earlier holder left unacknowledged is
    taken back before anything newer is handled, in stream order (`_take_back`), and on
    stop what waits out a retry delay is handed back at once, so per-key order holds
    across holders by condition, whatever the server's redelivery timing
    (docs/delivery.md, "Taking a durable over")."""

    def __init__(
        self, bus: Bus, spec: ConsumerSpec, handler: Handler, *, exclusive: bool = False
    ) -> None:
        self.bus = bus
        self.spec = spec
        self.handler = handler
        self.exclusive = exclusive
        self.log = structlog.get_logger().bind(consumer=spec.name, stream=spec.stream)
        self.bound = False
        self._ready: deque[_Item] = deque()  # fetched, decoded, waiting for a worker
        # Idle workers wait here; a fetched batch of k wakes at most k of them (an Event
        # would wake them all: with thousands of workers, O(workers) wake-ups per batch).
        self._idle: deque[asyncio.Future[None]] = deque()
        self._has_space = asyncio.Event()
        self._has_space.set()
        self._held: dict[int, tuple[Msg, float]] = {}  # id(msg) -> (msg, since)
        self._withdrawn: list[Msg] = []  # set aside behind their key, given back at stop
        self._tails: dict[str, asyncio.Future[bool]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._fetcher: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._drained = asyncio.Event()  # set whenever nothing is held
        self._puller: Puller | None = None
        m = bus.metrics
        self._m_latency = m.handler_seconds.labels(spec.name)
        m.in_flight.labels(spec.name).set_function(lambda: len(self._held))
        at_zero(m.dead_lettered, consumer=[spec.name], reason=DEAD_LETTER_REASONS)
        self._m_handled: dict[tuple[str, str], Any] = {}
        self._dlq_failures: dict[int | str, int] = {}  # stream sequence -> failed DLQ writes
        self._delayed: dict[int, Msg] = {}  # stream sequence -> nak'ed with a retry delay
        self._last_delivery: int | None = None  # exclusive: the last consumer sequence seen
        self._bindings: dict[str, Binding] = {b.type: b for b in spec.identity}
        # (kind of refusal, publisher) -> when on-call was last told
        self._noticed: dict[tuple[str, str], float] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def silent_for(self) -> float:
        """Seconds its open pull requests have heard nothing from the server."""
        return self._puller.silent_for() if self.bound and self._puller is not None else 0.0

    # lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        js = self.bus.js
        await js.add_consumer(self.spec.stream, config=self.spec.config())
        self._puller = Puller(
            self.bus.nc,
            self.spec.stream,
            self.spec.name,
            batch=self.spec.batch,
            expires=self.spec.pull_expires,
            heartbeat=min(1.0, self.spec.pull_expires / 3),
            log=self.log,
        )
        await self._puller.start()
        self.bound = True
        self._fetcher = asyncio.create_task(self._fetch_loop(), name=f"fetch:{self.spec.name}")
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"worker:{self.spec.name}:{i}")
            for i in range(self.spec.concurrency)
        ]
        self._tasks.append(
            asyncio.create_task(self._heartbeat_loop(), name=f"wip:{self.spec.name}")
        )
        self._tasks.append(asyncio.create_task(self._lag_loop(), name=f"lag:{self.spec.name}"))
        self.log.info(
            "consumer.started", subjects=list(self.spec.subjects), concurrency=self.spec.concurrency
        )

    async def stop(self, grace: float = 10.0, *, handover: bool = False) -> None:
        """Stop fetching, finish in-flight work within `grace`, nak what is left.
        `handover`: also wait out the open pull requests (`pull_expires`), so that once
        this returns no message is out to this consumer (another replica takes over)."""
        self._stopping.set()
        self._has_space.set()
        if self._fetcher is not None:
            # The fetcher only waits for the puller's buffer; nothing is lost by cancelling it.
            self._fetcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._fetcher
        # What was fetched and not started goes back, but only after what is still running
        # has finished, and in stream order: the server redelivers in the order it is told,
        # and whoever consumes next must see each key's messages in order.
        left = await self._unfetched(self.spec.pull_expires + 0.5 if handover else 0.0)
        while self._ready:
            item = self._ready.popleft()
            left.append(item.msg)
            self._release(item, handled=False)
        if self._held:
            self._drained.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await within(self._drained.wait(), grace)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        left += [msg for msg, _ in self._held.values()]
        left += self._withdrawn
        self._withdrawn = []
        # Waiting out a retry delay on the server (tracked when exclusive): the next holder
        # takes every pending message back before it handles anything; hand these back now.
        left += self._delayed.values()
        self._delayed.clear()
        for msg in sorted(left, key=lambda m: ack_info(m)[1] or 0):
            await self._nak(msg, 0)
        self._held.clear()
        self.bound = False
        self.log.info("consumer.stopped")

    # fetching --------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        if self.exclusive:
            await self._take_back(start=True)
        failures = 0
        while not self._stopping.is_set():
            if len(self._ready) >= self.spec.batch:
                self._has_space.clear()
                await self._has_space.wait()
                continue
            assert self._puller is not None
            try:
                msgs = await self._puller.get(self.spec.batch, timeout=self.spec.fetch_timeout)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - connection trouble: back off, keep fetching
                failures += 1
                self.log.warning("consumer.fetch_failed", error=one_line(exc), failures=failures)
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(self._stopping.wait(), min(0.2 * 2**failures, 5.0))
                continue
            if self._puller.conflict is not None:
                await self._recover(self._puller.conflict)
            if not msgs:
                continue
            now = time.monotonic()
            for i, msg in enumerate(msgs):
                if self.exclusive and self._gap(msg):
                    # A delivery went elsewhere or was lost on the way (a nats-server died,
                    # a stale pull request): it is pending, and comes back; hold this and
                    # what follows until it has.
                    self._wake(i)
                    await self._take_back(arrived=msgs[i:])
                    break
                self._held[id(msg)] = (msg, now)
                self._ready.append(self._dispatch(msg))
            else:
                self._wake(len(msgs))

    def _gap(self, msg: Msg) -> bool:
        """True if `msg` is not the delivery after the last one this consumer saw: one or
        more deliveries in between went to no one here. A sequence that went back (a new
        consumer leader re-delivering what it had not replicated) starts again from it."""
        seq, last = delivery_seq(msg), self._last_delivery
        if seq is None:
            return False
        gap = last is not None and seq > last + 1
        self._last_delivery = seq
        if gap:
            self.log.warning("consumer.delivery_gap", after=last, got=seq)
        return gap

    async def _take_back(self, *, start: bool = False, arrived: Sequence[Msg] = ()) -> None:
        """Hold every message that arrives (and `arrived`) until all the consumer's
        unacknowledged messages (an earlier holder's, delivered to it and never acked, or
        nak'ed with a delay; or a delivery lost on its way here) are here, then handle what
        is held in stream order and go on. At `start`, before anything is handled; after a
        gap in the consumer sequence, while what was dispatched before it runs on.

        Decided by a condition, not a wait: only this process pulls, so once the server's
        count of unacknowledged messages (`num_ack_pending`) is no more than what this one
        holds, none is out elsewhere. The server redelivers each of them when its ack
        deadline passes (nats-server `checkPending`); however late its timer fires, or
        however it interleaves them with newer messages, nothing held is handled until
        every one is here. A message removed from the stream meanwhile leaves the count
        (`getNextMsg` terminates it), so the condition still comes true."""
        log = self.log
        if start:
            try:
                info = await self.bus.js.consumer_info(self.spec.stream, self.spec.name)
            except Exception as exc:  # noqa: BLE001 - gone or unreadable: nothing to take back
                log.warning("consumer.take_back_unread", error=one_line(exc))
                return
            self._last_delivery = info.delivered.consumer_seq
            if not info.num_ack_pending:
                return
            log.info("consumer.taking_back", pending=info.num_ack_pending)
        loop = asyncio.get_running_loop()
        began = told = loop.time()
        back: dict[int, Msg] = {}  # stream sequence -> its latest delivery to us
        unknown: list[Msg] = []  # no stream sequence (never from a JetStream consumer)
        outstanding = 0
        msgs = list(arrived)
        while True:
            now = time.monotonic()
            for msg in msgs:
                seq = ack_info(msg)[1]
                self._last_delivery = delivery_seq(msg) or self._last_delivery
                if seq is None:
                    unknown.append(msg)
                else:
                    earlier = back.get(seq)
                    if earlier is not None:  # delivered again while held: keep the latest
                        self._held.pop(id(earlier), None)
                    back[seq] = msg
                self._held[id(msg)] = (msg, now)
            try:
                outstanding = await self._outstanding(back)
            except Exception as exc:  # noqa: BLE001 - unreadable now: ask again next round
                log.warning("consumer.take_back_unread", error=one_line(exc))
                outstanding = 1
            if outstanding <= 0 or self._stopping.is_set():
                break
            if loop.time() - told >= self.spec.ack_wait.total_seconds():
                told = loop.time()
                # Out to another consumer still sending in-progress, or waiting out a
                # retry delay: order comes first; say so while it lasts.
                log.warning(
                    "consumer.taking_back_waits",
                    outstanding=outstanding,
                    held=len(back),
                    waited_s=round(told - began, 1),
                )
            assert self._puller is not None
            try:
                msgs = await self._puller.get(self.spec.batch, timeout=0.25)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - connection trouble: ask again
                log.warning("consumer.fetch_failed", error=one_line(exc))
                msgs = []
            if self._puller.conflict is not None:
                await self._recover(self._puller.conflict)
        taken = [back[seq] for seq in sorted(back)] + unknown
        for msg in taken:
            self._ready.append(self._dispatch(msg))
        self._wake(len(taken))
        log.info(
            "consumer.taken_back",
            messages=len(taken),
            waited_s=round(loop.time() - began, 2),
            outstanding=max(outstanding, 0),
        )

    async def _outstanding(self, back: dict[int, Msg]) -> int:
        """How many unacknowledged messages of the consumer are out elsewhere: the server's
        count less ours (less any removed from the stream since, which the server no
        longer counts)."""
        info = await self.bus.js.consumer_info(self.spec.stream, self.spec.name)
        pending = info.num_ack_pending or 0
        # Ours: held back, dispatched and not yet acked, and our own retries waiting out
        # their delay (they come back here, after newer ones: a retry always does).
        here = {ack_info(msg)[1] for msg, _ in self._held.values()} | set(back) | set(self._delayed)
        here.discard(None)
        if pending >= len(here):
            return pending - len(here)
        # Fewer pending than here: some were removed from the stream (limits discard from
        # its head); count only those still in it.
        first = (await self.bus.js.stream_info(self.spec.stream)).state.first_seq
        return pending - sum(seq >= first for seq in here if seq is not None)

    async def _recover(self, conflict: str) -> None:
        """After a 409 from a pull: recreate the consumer if it was deleted, else carry on.
        After no responders (the consumer is gone, say a nats-server restarted on a store
        that lost it): recreate it, and its stream first if that is gone too."""
        assert self._puller is not None
        self._puller.conflict = None
        if "deleted" not in conflict.lower() and conflict != GONE:
            return
        self.bound = False
        try:
            try:
                await self.bus.js.add_consumer(self.spec.stream, config=self.spec.config())
            except NotFoundError:
                spec = next((s for s in STREAMS if s.name == self.spec.stream), None)
                if spec is None:
                    raise
                # As provisioned: the bus's replica count, not the spec's default.
                spec = replace(spec, replicas=self.bus.settings.stream_replicas)
                self.log.warning("consumer.stream_recreated", stream=spec.name)
                await ensure_stream(self.bus.js, spec, partitions=self.bus.settings.partitions)
                await self.bus.js.add_consumer(self.spec.stream, config=self.spec.config())
        except Exception as exc:  # noqa: BLE001 - try again on the next conflict
            self.log.warning("consumer.recreate_failed", error=one_line(exc))
            with contextlib.suppress(asyncio.TimeoutError):
                await within(self._stopping.wait(), 1.0)
            return
        self.bound = True
        self.log.warning("consumer.recreated", reason=conflict)

    async def _unfetched(self, linger: float = 0.0) -> list[Msg]:
        """Stop pulling; what arrived but was never dispatched (for the caller to nak)."""
        return await self._puller.stop(linger) if self._puller is not None else []

    def _order_key(self, event: Event[Any]) -> str | None:
        if self.spec.order_key is None:
            return None
        try:
            return self.spec.order_key(event)
        except Exception as exc:  # noqa: BLE001 - a bad key function must not stop fetching
            self.log.error("consumer.order_key_failed", error=one_line(exc), event_id=event.id)
            return None

    def _dispatch(self, msg: Msg) -> _Item:
        if self._delayed:
            self._delayed.pop(ack_info(msg)[1] or 0, None)
        try:
            event: Event[Any] | None = decode(
                msg.subject, msg.headers, msg.data, expected_types=self.spec.types
            )
            error = None
        except DecodeError as exc:
            event, error = None, exc
        key = self._order_key(event) if event is not None else None
        after = done = None
        if key is not None:
            after = self._tails.get(key)
            done = asyncio.get_running_loop().create_future()
            self._tails[key] = done
        return _Item(msg, event, error, after, done, key)

    def _release(self, item: _Item, *, handled: bool = True) -> None:
        self._held.pop(id(item.msg), None)
        if not self._held:
            self._drained.set()
        if item.done is not None and not item.done.done():
            item.done.set_result(handled)
            if item.key is not None and self._tails.get(item.key) is item.done:
                del self._tails[item.key]

    def _wake(self, count: int) -> None:
        while count > 0 and self._idle:
            idle = self._idle.popleft()
            if not idle.done():
                idle.set_result(None)
                count -= 1

    # processing ------------------------------------------------------------------------
    async def _worker(self) -> None:
        ready = self._ready
        loop = asyncio.get_running_loop()
        while True:
            while not ready:
                idle = loop.create_future()
                self._idle.append(idle)
                await idle
            item = ready.popleft()
            if len(ready) < self.spec.batch:
                self._has_space.set()
            if item.after is not None and not item.after.done():
                # Its key's previous message is still being handled: set it aside until
                # then, so a worker never waits on a busy key while others' messages wait
                # behind it (a MIG node's instances held every worker in a storm).
                item.after.add_done_callback(functools.partial(self._unpark, item))
                continue
            if item.after is not None and not item.after.result():
                self._unpark(item, item.after)  # its predecessor was given back: so is it
                continue
            try:
                await self._process(item)
            finally:
                self._release(item)

    def _unpark(self, item: _Item, previous: asyncio.Future[bool]) -> None:
        """Its key's previous message is done: run it next; if that one was given back
        unhandled (stopping), give this one back too, never run it ahead of it."""
        if not previous.result():
            self._withdrawn.append(item.msg)
            self._release(item, handled=False)
            return
        self._ready.appendleft(item)
        self._wake(1)

    def _count(self, type_name: str, outcome: str) -> None:
        child = self._m_handled.get((type_name, outcome))
        if child is None:
            child = self.bus.metrics.handled.labels(self.spec.name, type_name, outcome)
            self._m_handled[(type_name, outcome)] = child
        child.inc()

    def _context(self, msg: Msg, event: Event[Any] | None, attempt: int) -> dict[str, Any]:
        """What names this message in every log line while it is handled (undecodable ones
        too: their id and type come from the headers, if any)."""
        headers = msg.headers or {}
        return {
            "consumer": self.spec.name,
            "subject": msg.subject,
            "event_id": event.id if event is not None else headers.get("ce-id"),
            "event_type": event.type if event is not None else headers.get("ce-type"),
            "attempt": attempt,
        }

    async def _process(self, item: _Item) -> None:
        msg = item.msg
        attempt, stream_seq = ack_info(msg)
        # Bound for this message only and reset after it, so no line names another message.
        with structlog.contextvars.bound_contextvars(**self._context(msg, item.event, attempt)):
            await self._handle(item, attempt, stream_seq)

    async def _handle(self, item: _Item, attempt: int, stream_seq: int | None) -> None:
        msg = item.msg
        if item.event is None:
            assert item.error is not None
            self._count(item.error.event_type or "unknown", "invalid")
            await self._dead_letter(msg, DeadLetterReason.INVALID, item.error)
            return
        event = item.event
        wrong = mismatches(self._binding(event.type), msg.subject, event)
        if wrong:
            await self._identity_mismatch(msg, event, wrong, attempt)
            return
        ahead = self._ahead(msg, event)
        if ahead is not None:
            await self._refuse(msg, event, attempt, self._future_refusal(msg, event, ahead))
            return
        if attempt > self.spec.max_deliver:
            self._count(event.type, "exhausted")
            await self._dead_letter(
                msg,
                DeadLetterReason.EXHAUSTED,
                f"delivered {attempt - 1} times without an ack (handler crashed or timed out)",
            )
            return
        delivery = Delivery(msg.subject, attempt, stream_seq, msg.headers or {}, msg)
        started = time.perf_counter()
        try:
            if self.spec.handler_timeout is None:
                await self.handler(event, delivery)
            else:
                async with asyncio.timeout(self.spec.handler_timeout.total_seconds()):
                    await self.handler(event, delivery)
        except asyncio.CancelledError:
            await self._nak(msg, 0)
            raise
        except IdentityRefused as exc:
            target = ObjectRef(kind=exc.target[0], name=exc.target[1], namespace=exc.target[2])
            await self._refuse(
                msg,
                event,
                attempt,
                self._identity_refusal(
                    msg,
                    event,
                    error=str(exc),
                    claimed=exc.claimed,
                    tokens={},
                    publisher=exc.publisher,
                    target=target,
                    about=target,
                ),
            )
        except Exception as exc:  # noqa: BLE001 - permanent ones dead-lettered, others retried
            if is_permanent(exc):
                self._count(event.type, "permanent")
                self.log.warning(
                    "handler.permanent_error", error=one_line(exc), error_type=type(exc).__name__
                )
                await self._dead_letter(msg, DeadLetterReason.PERMANENT, exc)
            else:
                await self._failed(msg, event, attempt, exc)
        else:
            self._count(event.type, "ok")
            await self._ack(msg)
        finally:
            self._m_latency.observe(time.perf_counter() - started)

    def _binding(self, type_name: str) -> Binding:
        binding = self._bindings.get(type_name)
        if binding is None:
            binding = self._bindings[type_name] = default_binding(type_name)
        return binding

    async def _identity_mismatch(
        self, msg: Msg, event: Event[Any], wrong: list[Mismatch], attempt: int
    ) -> None:
        """A publisher speaking about someone else: never handled (see `_refuse`)."""
        claimed = {m.field: m.claimed for m in wrong}
        data = event.data
        pod = getattr(data, "pod", None) or claimed.get("pod")
        if "node" in claimed:
            target = ObjectRef(kind="Node", name=claimed["node"])
        elif pod:
            target = ObjectRef(
                kind="Pod", name=str(pod), namespace=str(getattr(data, "namespace", None) or "")
            )
        else:  # bound to no node or pod (a notice's topic): the subject it came on
            target = ObjectRef(kind="Subject", name=msg.subject)
        publisher = self._publisher(msg.subject, event)
        by_node = "node" in dict(self._binding(event.type).fields)
        error = f"identity mismatch on {msg.subject}: " + "; ".join(str(m) for m in wrong)
        tokens = {m.field: m.token for m in wrong}
        # The node whose credentials spoke of another is who on-call must look at.
        about = ObjectRef(kind="Node", name=publisher) if by_node else target
        refusal = self._identity_refusal(
            msg,
            event,
            error=error,
            claimed=claimed,
            tokens=tokens,
            publisher=publisher,
            target=target,
            about=about,
        )
        await self._refuse(msg, event, attempt, refusal)

    def _identity_refusal(
        self,
        msg: Msg,
        event: Event[Any],
        *,
        error: str,
        claimed: dict[str, str],
        tokens: dict[str, str],
        publisher: str,
        target: ObjectRef,
        about: ObjectRef,
    ) -> _Refusal:
        said = ", ".join(f"{k} {v}" for k, v in claimed.items())
        return _Refusal(
            reason=DeadLetterReason.IDENTITY_MISMATCH,
            action="identity_mismatch",
            salt="identity",
            policy="subject-identity",
            guard="identity",
            error=error,
            publisher=publisher,
            target=target,
            about=about,
            details={
                "security": True,
                "claimed": claimed,
                "subject_tokens": tokens,
            },
            severity=Severity.CRITICAL,
            topic="security",
            title=f"{publisher} published {event.type} about {said}: refused",
            why="an event says what its publisher may not say (its data names another node or"
            " pod than its subject, or it addresses whom its publisher may not)",
            what_you_can_do=[
                f"check the credentials and agent of {publisher}",
                "nodeward tail 'remediation.identity_mismatch.>' --since 1h",
            ],
        )

    def _ahead(self, msg: Msg, event: Event[Any]) -> tuple[str, datetime, float] | None:
        """(field, its time, seconds ahead) of the first time `event` claims further ahead
        of when the bus stored it than `bus.max_clock_skew`; None when none is."""
        try:
            stored = msg.metadata.timestamp
        except Exception:  # noqa: BLE001 - not a JetStream delivery: nothing to hold it to
            return None
        limit = self.bus.settings.max_clock_skew.total_seconds()
        claims = [("time", event.time)]
        claims += [(name, getattr(event.data, name)) for name in event.data.OBSERVED]
        for name, at in claims:
            if isinstance(at, datetime) and (ahead := (at - stored).total_seconds()) > limit:
                return name, at, ahead
        return None

    def _future_refusal(
        self, msg: Msg, event: Event[Any], ahead: tuple[str, datetime, float]
    ) -> _Refusal:
        name, at, seconds = ahead
        limit = self.bus.settings.max_clock_skew.total_seconds()
        publisher = self._publisher(msg.subject, event)
        by_node = "node" in dict(self._binding(event.type).fields)
        target = (
            ObjectRef(kind="Node", name=publisher)
            if by_node
            else ObjectRef(kind="Subject", name=msg.subject)
        )
        return _Refusal(
            reason=DeadLetterReason.FUTURE,
            action="future_event",
            salt="future",
            policy="clock-skew",
            guard="clock",
            error=f"{event.type} on {msg.subject} claims {name} {at.isoformat()}, {seconds:.0f}s"
            f" ahead of when the bus stored it (at most {limit:g}s allowed)",
            publisher=publisher,
            target=target,
            about=target,
            details={"field": name, "claimed": at.isoformat(), "ahead_s": round(seconds, 3)},
            severity=Severity.WARNING,
            topic="clock",
            title=f"{publisher}'s clock is {seconds:.0f}s ahead: its events are refused",
            why="an event dated in the future would outrank every real one after it (a newer"
            " observation wins), so it is never acted on",
            what_you_can_do=[
                f"check NTP (chrony, timesyncd) on {publisher}",
                "nodeward tail 'remediation.future_event.>' --since 1h",
            ],
        )

    async def _refuse(self, msg: Msg, event: Event[Any], attempt: int, refusal: _Refusal) -> None:
        """What no handler may see: audited, on-call told once per publisher and window,
        then dead-lettered with the refusal's reason; if the record cannot be written,
        redelivered (bounded) rather than lost."""
        self._count(event.type, refusal.reason.value)
        self.log.warning(
            f"consumer.{refusal.action}", error=refusal.error, publisher=refusal.publisher
        )
        try:
            audit_id = await self._audit_refusal(msg, event, refusal)
            await self._notify_refusal(event, refusal, audit_id)
        except Exception as exc:  # noqa: BLE001 - the record matters: try again, bounded
            self.log.error("consumer.refusal_audit_failed", error=one_line(exc))
            if attempt < self.spec.max_deliver:
                await self._nak(msg, self.spec.retry_delay(attempt))
                return
        await self._dead_letter(msg, refusal.reason, refusal.error)

    def _publisher(self, subject: str, event: Event[Any]) -> str:
        """Whose credentials published it: the subject's node token, else (a subject no node
        or pod names) whoever may publish on `subject`."""
        tokens = subject.split(".")
        fields = dict(self._binding(event.type).fields)
        index = fields.get("node")
        if index is None:
            return f"a publisher of {subject}"
        return tokens[index] if index < len(tokens) else subject

    async def _audit_refusal(self, msg: Msg, event: Event[Any], refusal: _Refusal) -> str:
        audit = Remediation(
            action=refusal.action,
            target=refusal.target,
            outcome=Outcome.REFUSED,
            reason=refusal.error,
            policy=refusal.policy,
            guard=refusal.guard,
            actor=self.bus.source,
            trigger_event_id=event.id,
            details={
                "consumer": self.spec.name,
                "subject": msg.subject,
                "publisher": refusal.publisher,
                "event_type": event.type,
                "ce_source": event.source,
                **refusal.details,
            },
        )
        # Derived from the event, so a redelivery audits once (JetStream drops the repeat).
        audit_event = make_event(
            audit, source=self.bus.source, id=stable_id(event.time, refusal.salt, event.id)
        )
        await self.bus.publish(audit_event)
        return audit_event.id

    async def _notify_refusal(self, event: Event[Any], refusal: _Refusal, audit_id: str) -> None:
        """On-call hears of a publisher once per `identity_notice_window`, not per message
        nor per consumer: every consumer that refuses it (replicas, and other services
        reading the same stream) derives the same notice id, which the NOTIFY stream stores
        once within its duplicate window."""
        window = self.spec.identity_notice_window.total_seconds()
        now = time.monotonic()
        key = (refusal.salt, refusal.publisher)
        last = self._noticed.get(key)
        if last is not None and now - last < window:
            return
        note = Notification(
            severity=refusal.severity,
            topic=refusal.topic,
            title=refusal.title[:300],
            body=(
                f"{refusal.error}. The events were not acted on and are in dlq."
                f"{self.spec.stream}.<consumer> (first refused by {self.spec.name}); further"
                f" ones from {refusal.publisher} in the next {int(window)} s are refused"
                " without another notice."
            ),
            audience="oncall",
            targets=[refusal.about],
            dedup_key=f"{refusal.salt}/{refusal.publisher}",
            audit_event_id=audit_id,
            why=refusal.why,
            what_you_can_do=refusal.what_you_can_do,
        )
        # One id per publisher and window, so every consumer's notice is stored once.
        bucket = datetime.fromtimestamp(int(time.time() // window * window), UTC)
        notice_id = stable_id(bucket, f"{refusal.salt}-notice", refusal.publisher)
        await self.bus.publish(make_event(note, source=self.bus.source, id=notice_id))
        self._noticed[key] = now

    async def _failed(self, msg: Msg, event: Event[Any], attempt: int, exc: Exception) -> None:
        if attempt >= self.spec.max_deliver:
            self._count(event.type, "exhausted")
            self.log.warning(
                "handler.exhausted", error=one_line(exc), max_deliver=self.spec.max_deliver
            )
            await self._dead_letter(msg, DeadLetterReason.EXHAUSTED, exc)
            return
        delay = (
            exc.delay
            if isinstance(exc, RetryableError) and exc.delay is not None
            else self.spec.retry_delay(attempt)
        )
        self._count(event.type, "retry")
        self.log.info(
            "handler.retry", error=one_line(exc), error_type=type(exc).__name__, delay_s=delay
        )
        await self._nak(msg, delay)

    async def _dead_letter(
        self, msg: Msg, reason: DeadLetterReason, error: BaseException | str
    ) -> None:
        """Write the dead letter, then ack the original. If it cannot be written, the
        original comes back later; after `dead_letter_tries` failures it is terminated
        (AckTerm) and the termination audited, so poison never circulates forever."""
        dl = dead_letter_event(
            msg,
            stream=self.spec.stream,
            consumer=self.spec.name,
            reason=reason,
            error=error,
            source=f"{self.bus.source}/{self.spec.name}",
            max_bytes=self.bus.nc.max_payload or None,
        )
        key = dl.data.stream_sequence if dl.data.stream_sequence is not None else dl.id
        try:
            await self.bus.publish(dl)
        except Exception as exc:  # noqa: BLE001 - keep the original; it comes back later
            tries = self._dlq_failures.get(key, 0) + 1
            self.log.error(
                "dlq.publish_failed", error=one_line(exc), reason=reason.value, tries=tries
            )
            if tries < self.spec.dead_letter_tries:
                self._dlq_failures[key] = tries
                await self._nak(msg, self.spec.retry_delay(tries))
                return
            self._dlq_failures.pop(key, None)
            await self._terminate(msg, dl.data, exc, tries)
            return
        self._dlq_failures.pop(key, None)
        self.bus.metrics.dead_lettered.labels(self.spec.name, reason.value).inc()
        self.log.warning(
            "dlq.dead_lettered",
            reason=reason.value,
            error=dl.data.error,
            subject=msg.subject,
            stream_sequence=dl.data.stream_sequence,
            dlq_subject=dl.data.nats_subject(),
            size=dl.data.payload_size,
            truncated=dl.data.truncated,
        )
        await self._ack(msg)

    async def _terminate(self, msg: Msg, dl: DeadLetter, error: Exception, tries: int) -> None:
        """Give up on a message that cannot be dead-lettered: AckTerm, and an audit record
        (`remediation.terminate.<stream>_<seq>`) with what is known of it."""
        try:
            await msg.term()
        except Exception as exc:  # noqa: BLE001 - it comes back; the next try terminates again
            self.log.error("consumer.term_failed", error=one_line(exc))
            return
        self.bus.metrics.dead_lettered.labels(self.spec.name, TERMINATED).inc()
        reason = f"could not be dead-lettered after {tries} tries: {one_line(error, 500)}"
        self.log.error("dlq.terminated", reason=reason, stream_sequence=dl.stream_sequence)
        audit = Remediation(
            action="terminate",
            target=ObjectRef(kind="Message", name=f"{dl.stream}/{dl.stream_sequence or 0}"),
            outcome=Outcome.APPLIED,
            reason=reason,
            policy="poison",
            actor=self.bus.source,
            trigger_event_id=dl.original_headers.get("ce-id"),
            details={
                "stream": dl.stream,
                "consumer": dl.consumer,
                "subject": dl.original_subject,
                "stream_sequence": dl.stream_sequence,
                "dead_letter_reason": dl.reason.value,
                "dead_letter_error": dl.error,
                "size": dl.payload_size,
                "sha256": dl.payload_sha256,
                "headers": {k: v for k, v in dl.original_headers.items() if k.startswith("ce-")},
            },
        )
        try:
            await self.bus.publish(make_event(audit, source=self.bus.source))
        except Exception as exc:  # noqa: BLE001 - the log line above is the record left
            self.log.error("dlq.terminate_audit_failed", error=one_line(exc))

    async def _ack(self, msg: Msg) -> None:
        try:
            await msg.ack()
        except Exception as exc:  # noqa: BLE001 - redelivered after ack_wait; handlers are idempotent
            self.log.warning("consumer.ack_failed", error=one_line(exc))

    async def _nak(self, msg: Msg, delay: float) -> None:
        seq = ack_info(msg)[1] if self.exclusive else None
        if seq is not None:
            if delay:
                self._delayed[seq] = msg
            else:
                self._delayed.pop(seq, None)
        try:
            await msg.nak(delay=delay or None)
        except Exception as exc:  # noqa: BLE001 - redelivered after ack_wait anyway
            self.log.warning("consumer.nak_failed", error=one_line(exc))

    # background loops ------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        """Send `in_progress` for every message held longer than a third of `ack_wait`."""
        every = max(self.spec.ack_wait.total_seconds() / 3, 0.1)
        while True:
            await asyncio.sleep(every)
            cutoff = time.monotonic() - every
            for msg, since in list(self._held.values()):
                if since <= cutoff:
                    with contextlib.suppress(Exception):
                        await msg.in_progress()

    async def _lag_loop(self) -> None:
        pending = self.bus.metrics.consumer_pending.labels(self.spec.stream, self.spec.name)
        ack_pending = self.bus.metrics.consumer_ack_pending.labels(self.spec.stream, self.spec.name)
        while True:
            try:
                info = await self.bus.js.consumer_info(self.spec.stream, self.spec.name)
                pending.set(info.num_pending or 0)
                ack_pending.set(info.num_ack_pending or 0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - lag metrics only
                self.log.debug("consumer.info_failed", error=one_line(exc))
            await asyncio.sleep(self.spec.lag_interval)
