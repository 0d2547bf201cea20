"""The bus a daemon talks to: publish typed events, run consumers, use KV."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
from nats.aio.client import Client as NATS
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError
from nats.js.kv import KeyValue

from nodeward.aio import within
from nodeward.bus.connection import connect_nats
from nodeward.bus.consumer import Consumer, ConsumerSpec, Handler
from nodeward.bus.control import ControlHandler, serve
from nodeward.bus.dlq import one_line
from nodeward.bus.errors import PublishError
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.bus.provision import AGENT_BUCKETS, SHARED_BUCKETS, ensure_kv, ensure_streams
from nodeward.bus.responsive import Responsiveness
from nodeward.config import BusSettings
from nodeward.metrics import Metrics
from schemas.base import Event
from schemas.cloudevents import WireMessage, encode
from schemas.streams import STREAMS


def wire_size(wire: WireMessage) -> int:
    """Bytes the server counts against max_payload: the headers block plus the body."""
    headers = sum(len(k) + len(v) + 4 for k, v in wire.headers.items()) + 12
    return headers + len(wire.body)


PING_PATIENCE_S = 3600
"""How long one ping waits for its pong; readiness fails long before (`ready_deadline`)."""


class Bus:
    """One daemon's NATS connection. Create with `await Bus.connect(...)`."""

    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        settings: BusSettings,
        *,
        source: str,
        metrics: Metrics,
    ) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings
        self.source = source
        self.metrics = metrics
        self.consumers: list[Consumer | PartitionedConsumer] = []
        self.responsive = Responsiveness(
            settings.ready_deadline.total_seconds(), lambda: self.consumers
        )
        self.log = structlog.get_logger().bind(component="bus", source=source)
        self._m_published: dict[str, Any] = {}
        self._before_close: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def connect(
        cls,
        settings: BusSettings,
        *,
        source: str,
        metrics: Metrics | None = None,
        wait: bool = True,
    ) -> Bus:
        """Connect (retrying forever when `wait`), and provision streams if configured to."""
        metrics = metrics or Metrics(source)
        nc, js = await connect_nats(settings, name=source, metrics=metrics, wait=wait)
        bus = cls(nc, js, settings, source=source, metrics=metrics)
        if settings.provision:
            await bus.provision()
        return bus

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    def not_answering(self) -> str | None:
        """Why the bus counts as not answering (for `/readyz`), or None: see `responsive`."""
        return self.responsive.problem(connected=self.connected)

    async def watch(self) -> None:
        """Ping the server every `ping_interval` until cancelled (a daemon task), so
        `not_answering` sees a hung server as well as a lost connection."""
        await self.responsive.watch(
            lambda: self.nc.flush(timeout=PING_PATIENCE_S),
            connected=lambda: self.connected,
            reconnects=lambda: int(self.nc.stats.get("reconnects", 0)),
            interval=self.settings.ping_interval.total_seconds(),
            log=self.log,
            gauge=self.metrics.bus_responsive,
        )

    async def provision(self) -> dict[str, str]:
        """Every stream, the KV buckets of node agents (which may not create them) and the
        buckets several services share."""
        done = await ensure_streams(
            self.js,
            STREAMS,
            replicas=self.settings.stream_replicas,
            partitions=self.settings.partitions,
        )
        # Agents' buckets allow direct get (a node's NATS user may read its own key only).
        js, replicas = self.js, self.settings.stream_replicas
        for buckets, direct in ((AGENT_BUCKETS, True), (SHARED_BUCKETS, False)):
            for name, (history, about) in buckets.items():
                await ensure_kv(
                    js, name, history=history, replicas=replicas, description=about, direct=direct
                )
        return done

    # publishing ------------------------------------------------------------------------
    def _count(self, type_name: str, n: int = 1) -> None:
        child = self._m_published.get(type_name)
        if child is None:
            child = self._m_published[type_name] = self.metrics.published.labels(type_name)
        child.inc(n)

    async def publish(self, event: Event[Any], *, timeout: float | None = None) -> api.PubAck:
        """Publish and wait for JetStream's ack, retrying on timeout.

        Retries resend the same `Nats-Msg-Id`, so a publish whose ack was lost is stored once.
        """
        wire = encode(event)
        acks = await self._publish_wires([wire], timeout=timeout)
        self._count(event.type)
        return acks[0]

    async def publish_many(
        self, events: Sequence[Event[Any]], *, timeout: float | None = None
    ) -> list[api.PubAck]:
        """Publish a batch pipelined (publish_async), then wait for every ack; retries the rest."""
        acks = await self._publish_wires([encode(e) for e in events], timeout=timeout)
        for type_name, n in Counter(e.type for e in events).items():
            self._count(type_name, n)
        return acks

    async def _publish_wires(
        self, wires: list[WireMessage], *, timeout: float | None
    ) -> list[api.PubAck]:
        wait = timeout if timeout is not None else self.settings.publish_timeout.total_seconds()
        limit = self.nc.max_payload
        for wire in wires:
            size = wire_size(wire)
            if limit and size > limit:
                # The server would refuse it (and drop the connection): no retry can help.
                self.metrics.publish_failures.labels(wire.headers.get("ce-type", "unknown")).inc()
                raise PublishError(
                    f"{wire.subject!r} is {size} bytes, over the server's max_payload of {limit}"
                    " (maximum payload exceeded)",
                    permanent=True,
                )
        results: list[api.PubAck | None] = [None] * len(wires)
        todo = list(range(len(wires)))
        last_error = "no ack"
        for attempt in range(self.settings.publish_retries + 1):
            futures: dict[int, asyncio.Future[api.PubAck]] = {}
            submit = self.js.publish_async
            try:
                for i in todo:
                    wire = wires[i]
                    futures[i] = await submit(wire.subject, wire.body, headers=wire.headers)
            except MaxPayloadError as exc:  # never retried: the same bytes fail the same way
                raise PublishError(f"{wire.subject!r}: {exc}", permanent=True) from exc
            except Exception as exc:  # noqa: BLE001 - disconnected or stalled: retried below
                last_error = one_line(exc)
            if futures:
                await asyncio.wait(futures.values(), timeout=wait)
            failed = []
            for i in todo:
                fut = futures.get(i)
                if fut is None or not fut.done():
                    if fut is not None:
                        fut.cancel()
                    failed.append(i)
                    continue
                err = fut.exception()
                if err is None:
                    results[i] = fut.result()
                elif isinstance(err, NoStreamResponseError):  # no stream, or JetStream restarting
                    last_error = f"no stream answered for subject {wires[i].subject!r}"
                    failed.append(i)
                elif isinstance(err, APIError) and err.code is not None and err.code < 500:
                    raise PublishError(
                        f"JetStream refused {wires[i].subject!r}: {one_line(err)}", permanent=True
                    )
                else:
                    last_error = one_line(err)
                    failed.append(i)
            todo = failed
            if not todo:
                self.responsive.published()
                return [r for r in results if r is not None]
            self.responsive.publish_failed(last_error)
            self.log.warning(
                "bus.publish_retry", attempt=attempt + 1, pending=len(todo), error=last_error
            )
            await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        for i in todo:
            self.metrics.publish_failures.labels(wires[i].headers.get("ce-type", "unknown")).inc()
        raise PublishError(
            f"{len(todo)} event(s) not acknowledged after {self.settings.publish_retries + 1} attempts: {last_error}"
        )

    # consuming -------------------------------------------------------------------------
    async def consume(
        self, spec: ConsumerSpec, handler: Handler, *, leases: KeyValue | None = None
    ) -> Consumer | PartitionedConsumer:
        """Start a durable consumer; it runs until `close()` (or its own `stop()`).

        With `spec.partitions` > 1, one durable per partition, claimed with leases in KV
        bucket `leases` (the service's own) against the service's other replicas."""
        consumer: Consumer | PartitionedConsumer
        if spec.partitions > 1:
            if leases is None:
                raise ValueError(f"{spec.name}: a partitioned consumer needs a leases bucket")
            consumer = PartitionedConsumer(self, [(spec, handler)], leases)
        else:
            consumer = Consumer(self, spec, handler)
        await consumer.start()
        self.consumers.append(consumer)
        return consumer

    async def consume_partitioned(
        self, name: str, consumers: Sequence[tuple[ConsumerSpec, Handler]], leases: KeyValue
    ) -> PartitionedConsumer:
        """Several partitioned specs claimed together (partition i of each by one replica),
        as lease group `name` in KV bucket `leases` (`nodeward.bus.partitions`)."""
        consumer = PartitionedConsumer(self, consumers, leases, name=name)
        await consumer.start()
        self.consumers.append(consumer)
        return consumer

    # operator controls -----------------------------------------------------------------
    async def control(self, service: str, verb: str, handler: ControlHandler) -> None:
        """Answer operator requests on `control.<service>.<verb>` with `handler` (one
        replica of the service answers each); served until the connection drains."""
        await serve(self.nc, service, verb, handler)

    # state -----------------------------------------------------------------------------
    async def kv(self, bucket: str, *, history: int = 5, ttl_s: float | None = None) -> KeyValue:
        return await ensure_kv(
            self.js, bucket, history=history, ttl_s=ttl_s, replicas=self.settings.stream_replicas
        )

    # shutdown --------------------------------------------------------------------------
    def before_close(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `await hook()` in `close()` once the consumers have stopped, before the last
        publishes are flushed: what a component still has to say (a tally's counts)."""
        self._before_close.append(hook)

    async def close(self, grace: float = 10.0) -> None:
        """Stop consumers (finish or nak in-flight work), run the `before_close` hooks,
        flush publishes, drain the connection: all of it within `grace` seconds (the drain
        gets at least 0.5 s), the budget a daemon's shutdown gives it, not `grace` a step."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace

        def left() -> float:
            return max(deadline - loop.time(), 0.0)

        await asyncio.gather(*(c.stop(left()) for c in self.consumers), return_exceptions=True)
        self.consumers.clear()
        hooks, self._before_close = self._before_close, []
        for hook in hooks:
            with contextlib.suppress(Exception):
                await within(hook(), left())
        with contextlib.suppress(Exception):
            if self.js.publish_async_pending():
                await within(self.js.publish_async_completed(), left())
        with contextlib.suppress(Exception):
            await within(self.nc.drain(), max(left(), 0.5))
        with contextlib.suppress(Exception):
            await self.nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
