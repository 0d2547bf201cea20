"""The stress form of the takeover test: a replica is SIGKILLed mid-stream again and again
on a three-server cluster while a competing process keeps a core busy, and on every cycle the survivor takes its
partitions over with each node's events handled in order, none lost, never two replicas at
once (`docs/delivery.md`, "After a replica's death").

`NODEWARD_STRESS_CYCLES` sets the number of cycles (30 by default); `make test` runs it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus, Delivery
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.config import BusSettings
from schemas.base import Event
from schemas.gpu import GpuHealth, HealthState
from tests.conftest import wait_for
from tests.helpers.nats_cluster import NatsCluster
from tests.helpers.partition_replica import spec
from tests.helpers.replicas import Replica, Row, order_broken, overlapping
from tests.integration.cordon_fixtures import health

CYCLES = int(os.environ.get("NODEWARD_STRESS_CYCLES", "30"))
PARTITIONS = 4
NODES = 16
HOGS = int(os.environ.get("NODEWARD_STRESS_HOGS", "1"))  # competing busy processes
PACE = 0.1  # seconds between waves of events

pytestmark = [pytest.mark.timeout(120 + 40 * CYCLES), pytest.mark.xdist_group("stress")]


async def test_per_node_order_holds_across_many_replica_deaths_on_a_busy_cpu(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOGS)]
    settings = BusSettings(
        url=nats_cluster.url, stream_replicas=3, partitions=PARTITIONS, publish_timeout="5s"
    )
    bus = await Bus.connect(settings, source="test/stress")
    name, bucket = f"stress-{uuid.uuid4().hex[:6]}", f"leases-{uuid.uuid4().hex[:6]}"
    kv = await bus.kv(bucket, history=1)
    handled: dict[str, list[Row]] = defaultdict(list)  # node -> the survivor's rows

    async def handle(event: Event[Any], delivery: Delivery) -> None:
        data: GpuHealth = event.data
        start = time.time()
        await asyncio.sleep(0.005)
        handled[data.node].append(Row("parent", data.node, data.sequence, start, time.time()))

    survivor = await bus.consume(spec(name, PARTITIONS), handle, leases=kv)
    assert isinstance(survivor, PartitionedConsumer)
    report: list[str] = []
    try:
        for cycle in range(CYCLES):
            report += await one_cycle(
                bus,
                survivor,
                handled,
                nats_cluster.url,
                bucket,
                name,
                tmp_path / f"child-{cycle}.log",
                cycle,
            )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        await survivor.stop(1)
        await bus.close(grace=1)
    assert not report, f"{len(report)} of {CYCLES} cycles broke order or lost events:\n" + (
        "\n".join(report)
    )


async def one_cycle(
    bus: Bus,
    survivor: PartitionedConsumer,
    handled: dict[str, list[Row]],
    url: str,
    bucket: str,
    name: str,
    out: Path,
    cycle: int,
) -> list[str]:
    """Events flow all through the cycle: a child joins (two partitions handed to it
    cleanly, under traffic), handles, is killed mid-stream; the survivor takes everything
    over. What went wrong in this cycle, one line each."""
    nodes = [f"st{cycle}-{uuid.uuid4().hex[:6]}-{i}" for i in range(NODES)]
    mine = set(nodes)
    published: list[tuple[str, int]] = []
    taken_over = asyncio.Event()

    async def waves() -> None:
        # Through the hand-over, the death and the takeover, and a few waves past it: the
        # survivor's first pulls meet new events as well as the dead one's.
        seq, after = 0, 3
        while after:
            seq += 1
            await bus.publish_many([health(n, HealthState.HEALTHY, seq=seq) for n in nodes])
            published.extend((n, seq) for n in nodes)
            after -= taken_over.is_set()
            await asyncio.sleep(PACE)

    writer = asyncio.create_task(waves())
    child: Replica | None = None
    try:
        await wait_for(
            lambda: sum(len(handled[n]) for n in nodes) >= NODES,
            interval=0.1,
            timeout=60,
            what=f"cycle {cycle}: the survivor handling",
        )
        child = Replica(url, bucket, name, PARTITIONS, out)
        await wait_for(
            lambda: (
                len(survivor.held) == PARTITIONS // 2
                and survivor.bound
                and (child.held() or "").count(",") == PARTITIONS // 2 - 1
            ),
            timeout=60,
            what=f"cycle {cycle}: the partitions shared",
        )
        # Killed mid-stream, once it has handled some of this cycle's events.
        await wait_for(
            lambda: sum(r.node in mine for r in child.rows()) >= NODES,
            interval=0.1,
            timeout=60,
            what=f"cycle {cycle}: the child handling",
        )
        child.kill()
        await wait_for(
            lambda: survivor.held == list(range(PARTITIONS)) and survivor.bound,
            timeout=60,
            what=f"cycle {cycle}: the survivor holding every partition",
        )
        taken_over.set()
        await writer
        theirs = [r for r in child.rows() if r.node in mine]  # it is dead: final

        def complete() -> bool:
            seen = {(r.node, r.seq) for r in theirs + [r for n in nodes for r in handled[n]]}
            return all(p in seen for p in published)

        # Whatever is missing after a minute is reported below as lost.
        with contextlib.suppress(AssertionError):
            await wait_for(complete, timeout=60, interval=0.2)
        rows = theirs + [r for n in nodes for r in handled[n]]
        seen = {(r.node, r.seq) for r in rows}
        problems = []
        lost = [p for p in published if p not in seen]
        if lost:
            problems.append(f"cycle {cycle}: {len(lost)} events never handled, e.g. {lost[:3]}")
        if broken := order_broken(rows):
            problems.append(f"cycle {cycle}: {len(broken)} nodes out of order: {broken}")
        if both := overlapping(rows):
            problems.append(f"cycle {cycle}: handled by two replicas at once: {both}")
        if not {r.who for r in rows} >= {"child", "parent"}:
            problems.append(f"cycle {cycle}: no takeover seen ({ {r.who for r in rows} })")
        return problems
    finally:
        taken_over.set()
        if child is not None:
            child.kill()
        await writer
