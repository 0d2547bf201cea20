"""Partitioned consumers: several replicas of a service share a stream in order per key.

A partitioned stream stores each subject with its partition appended (`schemas.streams.
Partitioning`: every subject of one node, or one pod, lands in one partition). A
`ConsumerSpec` with `partitions` P > 1 has one durable per partition (`<name>-p<i>`), and
each is consumed by at most one replica at a time: the one holding KV lease
`lease.<group>.p<i>` (`nodeward.bus.kv.Lease`) in the service's bucket. A group may hold
several specs of the same partition count (cordon's changes, heartbeats and XIDs): the
replica holding partition i consumes partition i of each, so one replica acts on a node.

Each replica also holds a membership lease (`lease.<name>.member.<holder>`), so each knows
how many replicas R are live and holds about ceil(P/R) partitions: it takes free or expired
ones up to that, and gives back extras (stopping their consumer first) when another replica
joins. A replica that dies keeps its leases until they expire (`lease_ttl`); the others then
take its partitions over. A replica stops consuming a partition (finishing in-flight messages
within a grace, nak-ing the rest) before its lease can expire: when it loses the lease to
another, when it gives a partition back, and when it has not renewed for half the TTL. A
replica taking over a partition that was not handed over cleanly first waits until none of
the old holder's pull requests is open on the server. Every partition's consumer is
`exclusive`: it takes back what the old holder left unacknowledged before it handles
anything, in stream order (`Consumer._take_back`, by condition, not by a wait), so per-key
order holds across replicas and no message is handled by two at once
(docs/delivery.md, "Taking a durable over").

Leases compare wall clocks (`expires_at`): replicas' clocks must agree to well under the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import re
import socket
import time
import uuid
import zlib
from collections.abc import Sequence

import structlog
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from nodeward.aio import within
from nodeward.bus.consumer import Bus, Consumer, ConsumerSpec, Handler
from nodeward.bus.dlq import one_line
from nodeward.bus.kv import Lease
from nodeward.bus.snapshot import kv_entries
from schemas.state.lease import LeaseRecord, lease_key
from schemas.streams import Partitioning


def replica_id() -> str:
    """This process's name among replicas: host, pid and a random suffix (a KV key token)."""
    raw = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return re.sub(r"[^A-Za-z0-9_-]", "_", raw)


class PartitionedConsumer:
    """Claims partitions of group `name` with KV leases in `kv` and, for each partition it
    holds, runs a `Consumer` of that partition of every spec in `consumers`. `bound` once
    it consumes its share (or found none free). `name` defaults to the first spec's."""

    def __init__(
        self,
        bus: Bus,
        consumers: Sequence[tuple[ConsumerSpec, Handler]],
        kv: KeyValue,
        *,
        name: str | None = None,
        holder: str | None = None,
    ) -> None:
        if not consumers:
            raise ValueError("a partitioned consumer needs at least one spec")
        spec = consumers[0][0]
        if spec.partitions < 2 or any(s.partitions != spec.partitions for s, _ in consumers):
            raise ValueError(f"{spec.name}: partitioned specs need one count above 1")
        self.bus = bus
        self.spec = spec
        self.consumers = list(consumers)
        self.name = name or spec.name
        self.partitions = spec.partitions
        self.kv = kv
        self.holder = holder or replica_id()
        self.ttl = spec.lease_ttl.total_seconds()
        self.leases = [
            Lease(kv, f"{self.name}.p{i}", self.holder, ttl=self.ttl)
            for i in range(spec.partitions)
        ]
        self.member = Lease(kv, f"{self.name}.member.{self.holder}", self.holder, ttl=self.ttl)
        self.running: dict[int, list[Consumer]] = {}
        self._starting: dict[int, asyncio.Task[None]] = {}  # partition -> its start
        self._leaving: dict[int, asyncio.Task[None]] = {}  # partition -> its handover
        self.renewed: dict[int, float] = {}  # partition -> monotonic time its renewal began
        self.bound = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        # Start each replica's search for free partitions at a different one.
        self._offset = zlib.crc32(self.holder.encode()) % spec.partitions
        self._live = 1  # replicas last counted; until read, take every free partition
        self.log = structlog.get_logger().bind(consumer=self.name, holder=self.holder)

    @property
    def held(self) -> list[int]:
        return sorted(self.running)

    def silent_for(self) -> float:
        """The longest any of its running consumers' pull requests has heard nothing."""
        return max((c.silent_for() for cs in self.running.values() for c in cs), default=0.0)

    def owns(self, *keys: str) -> bool:
        """True if this replica consumes the partition of `keys` (the stream's key tokens,
        e.g. a node's subject token) now: work on that key outside the consumers (a
        reconcile pass) is this replica's to do."""
        return self.owns_index(Partitioning.index(keys, self.partitions))

    def owns_index(self, index: int) -> bool:
        """True if this replica consumes partition `index` now (held and started)."""
        return index in self.running and index not in self._starting

    async def start(self) -> None:
        try:
            await self.tick()
        except Exception as exc:  # noqa: BLE001 - KV trouble at start: the loop tries again
            self.log.warning("partitions.tick_failed", error=one_line(exc))
            await self._drop_overdue()
        self._task = asyncio.create_task(self._loop(), name=f"partitions:{self.name}")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop every partition's consumer (finish or nak in-flight work), then give the
        leases back so other replicas take over at once."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(
            *self._leaving.values(), *(self._give_back(i, grace) for i in list(self.running))
        )
        with contextlib.suppress(Exception):
            await self.member.release()
        self.bound = False

    # the claim loop ----------------------------------------------------------------------
    async def _loop(self) -> None:
        every = self.ttl / 6
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await within(self._stopping.wait(), every)
            if self._stopping.is_set():
                return
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - KV trouble: the next tick tries again
                self.log.warning("partitions.tick_failed", error=one_line(exc))
                await self._drop_overdue()

    async def tick(self) -> None:
        """Renew what is held, drop what is lost, then take or give back partitions until
        this replica holds its share of the live replicas'."""
        await self._renew(self.member)
        lost = []
        for i in list(self.running):
            began = time.monotonic()
            ours = await self._renew(self.leases[i])
            if ours is True:
                self.renewed[i] = began
            elif ours is False:
                self.log.warning("partitions.lease_lost", partition=i)
                lost.append(i)
        await asyncio.gather(*(self._give_back(i, self._grace, release=False) for i in lost))
        await self._drop_overdue()
        share = math.ceil(self.partitions / await self._replicas())
        for i in sorted(self.running, reverse=True)[: max(len(self.running) - share, 0)]:
            self.log.info("partitions.rebalance", partition=i, share=share)
            self._hand_back(i)
        for step in range(self.partitions):
            if len(self.running) >= share or self._stopping.is_set():
                break
            i = (self._offset + step) % self.partitions
            if i in self.running or i in self._leaving:
                continue
            prior = await self.leases[i].store.get(lease_key(self.leases[i].name))
            began = time.monotonic()
            if await self._renew(self.leases[i]) is True:
                self.renewed[i] = began
                # Never held, or handed over cleanly: nothing is out to another replica.
                clean = prior is None or prior.value.released
                await self._take(i, clean=clean)
        # Bound: every partition held is consumed, or waits for a dead holder's messages.
        self.bound = all(
            i in self._starting or all(c.bound for c in cs) for i, cs in self.running.items()
        )

    @property
    def _grace(self) -> float:
        return self.ttl / 8

    async def _renew(self, lease: Lease) -> bool | None:
        """True: held; False: another holds it; None: could not tell (KV unreachable)."""
        try:
            async with asyncio.timeout(self.ttl / 6):
                return await lease.try_acquire()
        except Exception as exc:  # noqa: BLE001 - unknown; `_drop_overdue` bounds the risk
            self.log.warning("partitions.renew_failed", lease=lease.name, error=one_line(exc))
            return None

    async def _drop_overdue(self) -> None:
        """Stop consuming any partition not renewed for half the TTL: it must be stopped
        before its lease can expire and another replica take it."""
        now = time.monotonic()
        overdue = [i for i in self.running if now - self.renewed.get(i, now) > self.ttl / 2]
        for i in overdue:
            self.log.warning("partitions.renewal_overdue", partition=i)
        await asyncio.gather(*(self._give_back(i, self._grace, release=False) for i in overdue))

    async def _replicas(self) -> int:
        """Live replicas: unexpired membership leases (this one counts even if unread)."""
        prefix = lease_key(f"{self.name}.member.")
        try:
            entries = await kv_entries(
                self.bus.nc, self.kv._name, [prefix], timeout=max(self.ttl / 6, 1.0)
            )
        except Exception as exc:  # noqa: BLE001 - unread: the count last read stands
            self.log.warning("partitions.members_unread", error=one_line(exc))
            return self._live
        now = time.time()
        live = {self.holder}
        for raw in (entries or {}).values():
            record = LeaseRecord.model_validate_json(raw)
            if record.expires_at > now:
                live.add(record.holder)
        self._live = len(live)
        return self._live

    async def _take(self, index: int, *, clean: bool = False) -> None:
        specs = [(spec.partition(index), handler) for spec, handler in self.consumers]
        consumers = self.running[index] = [
            Consumer(self.bus, s, h, exclusive=True) for s, h in specs
        ]
        self._starting[index] = asyncio.create_task(
            self._start(index, consumers, clean=clean), name=f"partition:{self.name}-p{index}"
        )

    async def _start(self, index: int, consumers: list[Consumer], *, clean: bool) -> None:
        async def one(consumer: Consumer) -> None:
            if not clean:
                await self._await_requests(index, consumer.spec)
            await consumer.start()

        try:
            await asyncio.gather(*(one(c) for c in consumers))
        except Exception as exc:  # noqa: BLE001 - give it back; a later tick takes it again
            self.log.warning("partitions.start_failed", partition=index, error=one_line(exc))
            self._starting.pop(index, None)
            # Marked released only if it was clean: an old holder's messages may still be
            # out, and whoever takes it next must wait for them as this one would have.
            await self._give_back(index, self._grace, release=clean)
            return
        self._starting.pop(index, None)
        self.log.info("partitions.taken", partition=index, clean=clean)

    async def _await_requests(self, index: int, spec: ConsumerSpec) -> None:
        """Before consuming a partition a holder may have left without handing it over:
        wait until no pull request of the old holder is open on the server, so none can
        take a message after this consumer counted what is out (`Consumer._take_back`).
        They expire within the old holder's `pull_expires`; past that (and a whole
        `ack_wait`) it says so and goes on. What such a request took before the count is
        still taken back; one that takes a message after it could reorder that key."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(spec.ack_wait.total_seconds(), spec.pull_expires + 1.0)
        while True:
            try:
                info = await self.bus.js.consumer_info(spec.stream, spec.name)
            except NotFoundError:
                return  # never created: nothing was ever delivered
            if not info.num_waiting:
                return
            if loop.time() >= deadline:
                self.log.warning(
                    "partitions.requests_still_open",
                    partition=index,
                    consumer=spec.name,
                    waiting=info.num_waiting,
                )
                return
            await asyncio.sleep(0.2)

    def _hand_back(self, index: int) -> None:
        """Give partition `index` back in the background, so the claim loop goes on renewing
        the others meanwhile (a handover waits out open pull requests). The lease, renewed
        in this tick, outlasts the handover: `pull_expires` + 0.5 s + grace < TTL."""
        task = asyncio.create_task(
            self._wind_down(index, *self._detach(index), grace=self._grace, release=True),
            name=f"handover:{self.name}-p{index}",
        )
        self._leaving[index] = task
        task.add_done_callback(functools.partial(self._left, index))

    def _left(self, index: int, task: asyncio.Task[None]) -> None:
        self._leaving.pop(index, None)

    async def _give_back(self, index: int, grace: float, *, release: bool = True) -> None:
        await self._wind_down(index, *self._detach(index), grace=grace, release=release)

    def _detach(self, index: int) -> tuple[list[Consumer], asyncio.Task[None] | None]:
        """Stop counting partition `index` as held or owned: its consumers and start task."""
        self.renewed.pop(index, None)
        return self.running.pop(index, []), self._starting.pop(index, None)

    async def _wind_down(
        self,
        index: int,
        consumers: list[Consumer],
        starting: asyncio.Task[None] | None,
        *,
        grace: float,
        release: bool,
    ) -> None:
        if starting is not None and starting is not asyncio.current_task():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        # Handing over (the lease still ours): also wait out the open pull requests, so
        # nothing is left out to this replica and the next holder starts at once.
        await asyncio.gather(*(c.stop(grace, handover=release) for c in consumers if c.bound))
        if release:
            with contextlib.suppress(Exception):
                await self.leases[index].release(handover=True)
        self.log.info("partitions.given_back", partition=index, released=release)
