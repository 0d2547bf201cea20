"""A partition handed from one replica to another mid-stream: the new holder consumes at
once (the old one waited out its pull requests and marked the lease released), far inside
`ack_wait`, and the nodes' order holds across the two."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from nodeward.bus import Bus, Delivery
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from schemas.base import Event
from schemas.gpu import HealthState
from tests.conftest import wait_for
from tests.helpers.partition_replica import spec
from tests.integration.cordon_fixtures import health

pytestmark = pytest.mark.timeout(120)

ACK_WAIT = 30.0


async def test_a_handed_over_partition_is_consumed_at_once_in_order(
    own_nats: EmbeddedNats,
) -> None:
    settings = BusSettings(url=own_nats.url, partitions=4)
    a = await Bus.connect(settings, source="test/a")
    b = await Bus.connect(settings, source="test/b")
    kv = await a.kv(f"leases-{uuid.uuid4().hex[:6]}", history=1)
    name = f"handover-{uuid.uuid4().hex[:6]}"
    handled: list[tuple[str, str, int]] = []

    def handler(who: str) -> Any:
        async def handle(event: Event[Any], delivery: Delivery) -> None:
            await asyncio.sleep(0.01)
            handled.append((who, event.data.node, event.data.sequence))

        return handle

    nodes = [f"hn-{uuid.uuid4().hex[:6]}-{i}" for i in range(40)]
    first = await a.consume(spec(name, 4, ACK_WAIT), handler("a"), leases=kv)
    assert isinstance(first, PartitionedConsumer) and first.held == [0, 1, 2, 3]
    for seq in range(1, 101):  # a backlog a is busy with when b joins
        await a.publish_many([health(n, HealthState.HEALTHY, seq=seq) for n in nodes])
    await wait_for(lambda: len(handled) > 200, timeout=20)
    joined = time.monotonic()
    second = await b.consume(spec(name, 4, ACK_WAIT), handler("b"), leases=kv)
    assert isinstance(second, PartitionedConsumer)

    def b_consumes() -> bool:
        return len(second.held) == 2 and all(second.owns_index(i) for i in second.held)

    await wait_for(b_consumes, timeout=ACK_WAIT / 3, what="b consuming its two partitions")
    assert time.monotonic() - joined < ACK_WAIT / 3
    # Events after the handover: b's partitions' share is b's, even if a loaded machine let
    # a finish the whole backlog first.
    for seq in range(101, 111):
        await a.publish_many([health(n, HealthState.HEALTHY, seq=seq) for n in nodes])
    await wait_for(
        lambda: {(n, s) for _, n, s in handled} >= {(n, s) for n in nodes for s in range(1, 111)},
        timeout=60,
    )
    per_node: dict[str, list[int]] = defaultdict(list)
    for _, node, seq in handled:
        per_node[node].append(seq)
    for node, seqs in per_node.items():
        assert seqs == sorted(seqs), node
    assert {w for w, _, _ in handled} == {"a", "b"}
    await second.stop(1)
    await first.stop(1)
    await a.close(grace=1)
    await b.close(grace=1)
