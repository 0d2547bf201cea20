"""Partitioned consumers on a three-server NATS cluster: replicas share the partitions
through KV leases, a SIGKILLed replica's partitions are taken over within the lease TTL,
and across the handover every acknowledged event is handled, in order per node, never by
two replicas at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus, Delivery
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.config import BusSettings
from schemas.base import Event
from schemas.gpu import GpuHealth, HealthState
from schemas.streams import Partitioning
from tests.conftest import wait_for
from tests.helpers.nats_cluster import NatsCluster
from tests.helpers.partition_replica import spec
from tests.helpers.replicas import Replica, Row, order_broken, overlapping
from tests.integration.cordon_fixtures import health

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4
TTL = 3.0


async def test_replicas_share_partitions_and_a_killed_ones_are_taken_over(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    settings = BusSettings(
        url=nats_cluster.url, stream_replicas=3, partitions=PARTITIONS, publish_timeout="5s"
    )
    bus = await Bus.connect(settings, source="test/partitions")
    name, bucket = f"parts-{uuid.uuid4().hex[:6]}", f"leases-{uuid.uuid4().hex[:6]}"
    kv = await bus.kv(bucket, history=1)
    handled: list[Row] = []
    busy: set[str] = set()
    overlaps: list[str] = []

    async def handle(event: Event[Any], delivery: Delivery) -> None:
        data: GpuHealth = event.data
        if data.node in busy:
            overlaps.append(data.node)
        busy.add(data.node)
        start = time.time()
        await asyncio.sleep(0.01)
        busy.discard(data.node)
        handled.append(Row("parent", data.node, data.sequence, start, time.time()))

    child = Replica(nats_cluster.url, bucket, name, PARTITIONS, tmp_path / "child.log")
    consumer: PartitionedConsumer | None = None
    try:
        # Alone, it comes to hold every partition (under load a first claim may time out
        # and a later tick take the rest).
        await wait_for(
            lambda: child.held() == "held 0,1,2,3", timeout=60, what="the child's partitions"
        )
        started = await bus.consume(spec(name, PARTITIONS), handle, leases=kv)
        assert isinstance(started, PartitionedConsumer)
        consumer = started

        # Two live replicas: two partitions each (the child gives two back).
        await wait_for(
            lambda: len(consumer.held) == 2 and consumer.bound and child.held() != "held 0,1,2,3",
            timeout=4 * TTL,
            what="the partitions shared",
        )
        nodes = [f"pn-{uuid.uuid4().hex[:6]}-{i}" for i in range(24)]
        published: list[tuple[str, int]] = []

        async def wave(seqs: range) -> None:
            for seq in seqs:
                events = [health(n, HealthState.HEALTHY, seq=seq) for n in nodes]
                await bus.publish_many(events)
                published.extend((n, seq) for n in nodes)

        await wave(range(1, 4))

        await wait_for(lambda: len(child.rows()) > 10, timeout=20, what="the child handling")
        # Mid-stream: the child dies without a word (its leases stay until they expire).
        writer = asyncio.create_task(wave(range(4, 12)))
        await wait_for(lambda: len(published) >= 6 * len(nodes), timeout=20)
        child.kill()
        killed_at = time.monotonic()
        await writer
        await wait_for(
            lambda: consumer.held == list(range(PARTITIONS)),
            timeout=TTL + 2,
            what="the survivor holding every partition",
        )
        assert time.monotonic() - killed_at <= TTL + 2

        def done() -> bool:
            seen = {(r.node, r.seq) for r in handled + child.rows()}
            return all(p in seen for p in published)

        await wait_for(done, timeout=60, interval=0.2, what="every acknowledged event handled")
        rows = handled + child.rows()
        assert not overlaps
        # In order per node; what the child handled but never acked may come again, in order.
        assert not order_broken(rows)
        assert not overlapping(rows), "handled by two replicas at once"
        # The parent took over partitions the child held: both handled some nodes' events.
        assert {r.who for r in rows} == {"parent", "child"}
        subjects = (
            await bus.js.stream_info("GPU", subjects_filter=f"gpu.health.{nodes[0]}.>")
        ).state.subjects
        # Stored with the partition appended, the one the runtime computes for the node.
        want = Partitioning.index((nodes[0],), PARTITIONS)
        assert subjects and all(s.split(".")[-1] == str(want) for s in subjects), subjects
    finally:
        child.kill()
        if consumer is not None:
            await consumer.stop(1)
        await bus.close(grace=1)
