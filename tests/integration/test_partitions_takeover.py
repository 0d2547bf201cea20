"""Taking over a partition whose holder stopped without handing it over, while one of the
old holder's pull requests is still open on the server: the next message for a node goes
to that request and is lost to it until `ack_wait`. The new holder must not handle the
node's later messages first: it waits until the old request is gone, sees the message
out, and waits for it to come back."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from nats.aio.msg import Msg

from nodeward.bus import Bus, Delivery
from nodeward.bus.consumer import Consumer
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from schemas.base import Event
from schemas.gpu import HealthState
from schemas.state.lease import LeaseRecord, lease_key
from schemas.streams import Partitioning
from tests.conftest import wait_for
from tests.helpers.partition_replica import spec
from tests.integration.cordon_fixtures import health

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 4
ACK_WAIT = 2.0


async def test_an_old_holders_open_pull_request_does_not_reorder_a_node(
    own_nats: EmbeddedNats,
) -> None:
    bus = await Bus.connect(BusSettings(url=own_nats.url, partitions=PARTITIONS), source="t")
    kv = await bus.kv(f"leases-{uuid.uuid4().hex[:6]}", history=1)
    name = f"takeover-{uuid.uuid4().hex[:6]}"
    node = f"tn-{uuid.uuid4().hex[:6]}"
    part = spec(name, PARTITIONS, ACK_WAIT).partition(Partitioning.index((node,), PARTITIONS))
    await bus.js.add_consumer(part.stream, config=part.config())
    # The old holder: its lease expired without a handover, and its last pull request (one
    # message, a few seconds) is still open; it will never ack what that request gets.
    index = int(part.name.rsplit("-p", 1)[1])
    dead = LeaseRecord(holder="dead-replica", expires_at=time.time() - 1, acquired_at=0.0)
    await kv.put(lease_key(f"{name}.p{index}"), dead.model_dump_json().encode())
    zombie: list[Msg] = []

    async def lost(msg: Msg) -> None:
        if not msg.headers or "Status" not in msg.headers:
            zombie.append(msg)

    inbox = bus.nc.new_inbox()
    sub = await bus.nc.subscribe(inbox, cb=lost)
    request = {"batch": 1, "expires": int(4e9)}
    await bus.nc.publish(
        f"$JS.API.CONSUMER.MSG.NEXT.{part.stream}.{part.name}",
        json.dumps(request).encode(),
        reply=inbox,
    )
    await bus.nc.flush()
    handled: list[int] = []

    async def handle(event: Event[Any], delivery: Delivery) -> None:
        handled.append(event.data.sequence)

    consumer = await bus.consume(spec(name, PARTITIONS, ACK_WAIT), handle, leases=kv)
    assert isinstance(consumer, PartitionedConsumer)
    try:
        assert consumer.held == list(range(PARTITIONS))
        await bus.publish(health(node, HealthState.HEALTHY, seq=1))
        await wait_for(lambda: zombie, timeout=5, what="the old request taking event 1")
        await bus.publish(health(node, HealthState.HEALTHY, seq=2))
        await wait_for(lambda: len(handled) >= 2, timeout=20, what="both events handled")
        # Event 1 came back (after ack_wait) and was handled before event 2.
        assert handled == [1, 2]
        assert consumer.owns(node)
    finally:
        await sub.unsubscribe()
        await consumer.stop(1)
        await bus.close(grace=1)


async def test_a_delivery_that_went_elsewhere_is_waited_for_before_newer_ones(
    own_nats: EmbeddedNats,
) -> None:
    """A pull request this consumer did not count (opened by a stale holder after the
    takeover, or a delivery lost with a nats-server) takes event 1; event 2 comes here.
    The gap in the consumer sequence holds 2 back until 1 has come back (its `ack_wait`),
    then both are handled in order."""
    bus = await Bus.connect(BusSettings(url=own_nats.url, partitions=PARTITIONS), source="t")
    node = f"tn-{uuid.uuid4().hex[:6]}"
    index = Partitioning.index((node,), PARTITIONS)
    part = spec(f"gap-{uuid.uuid4().hex[:6]}", PARTITIONS, ACK_WAIT).partition(index)
    await bus.js.add_consumer(part.stream, config=part.config())
    handled: list[int] = []

    async def handle(event: Event[Any], delivery: Delivery) -> None:
        handled.append(event.data.sequence)

    consumer = Consumer(bus, part, handle, exclusive=True)
    await consumer.start()
    zombie: list[Msg] = []

    async def lost(msg: Msg) -> None:
        if not msg.headers or "Status" not in msg.headers:
            zombie.append(msg)

    sub = await bus.nc.subscribe(inbox := bus.nc.new_inbox(), cb=lost)
    try:
        # First in the server's queue of waiting requests (they are served in order): the
        # consumer's own open request is answered by event 1 only if it came first.
        await wait_for(
            lambda: consumer._puller is not None and consumer._puller._outstanding,
            what="the consumer's request",
        )
        await bus.nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{part.stream}.{part.name}",
            json.dumps({"batch": 1, "expires": int(20e9)}).encode(),
            reply=inbox,
        )
        await bus.nc.flush()
        seq = 0
        while not zombie:  # until one goes to the other request (the consumer's may be first)
            seq += 1
            await bus.publish(health(node, HealthState.HEALTHY, seq=seq))
            await wait_for(lambda s=seq: zombie or s in handled, timeout=10)  # type: ignore[misc]
        taken = zombie[0].metadata.sequence.stream
        await bus.publish(health(node, HealthState.HEALTHY, seq=seq + 1))
        await wait_for(lambda: len(handled) >= seq + 1, timeout=20, what="every event handled")
        assert handled == list(range(1, seq + 2)), (handled, taken)
    finally:
        await sub.unsubscribe()
        await consumer.stop(1)
        await bus.close(grace=1)
