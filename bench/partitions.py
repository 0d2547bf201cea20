"""Benchmark: partitioned consumers draining a backlog with 1 and 2 replicas.

On one embedded nats-server with the streams in `--partitions` partitions, each case
purges the GPU stream, publishes `--events` `gpu.health.v1` changes over `--nodes` nodes,
then starts the replicas, each a process of its own (this script with `--replica`) running
a `PartitionedConsumer` of `gpu.health.>` with leases in KV, and times from the first
acknowledgement to the last. Handlers:

- `bare`: acks (the runtime alone: decode, identity check, order per node, ack);
- `kv`: one revision-checked KV update of the node's record per event, as the cordon
  service records a change (`TypedKV.update`), then acks.

Cases `bare` x1, `kv` x1, `kv` x2, `--runs` times each, medians printed with the ratio
of 2 replicas to 1. Usage:

    python bench/partitions.py [--events 20000] [--nodes 2000] [--partitions 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchlib import options
from pydantic import BaseModel

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class Seen(BaseModel):
    sequence: int


async def replica(url: str, name: str, bucket: str, partitions: int, mode: str) -> None:
    from nodeward.bus import Bus, ConsumerSpec, Delivery
    from nodeward.bus.kv import TypedKV
    from nodeward.config import BusSettings
    from schemas.base import Event
    from schemas.gpu import GpuHealth

    settings = BusSettings(url=url, partitions=partitions, provision=False)
    bus = await Bus.connect(settings, source="bench/replica")
    kv = await bus.kv(bucket, history=1)
    records: TypedKV[Seen] = TypedKV(kv, Seen)

    async def handle(event: Event[Any], delivery: Delivery) -> None:
        if mode == "kv":
            data: GpuHealth = event.data
            await records.update(f"node.{data.node}", lambda _: Seen(sequence=data.sequence))

    spec = ConsumerSpec(
        name=name,
        stream="GPU",
        subjects=("gpu.health.>",),
        types=frozenset({GpuHealth.TYPE}),
        partitions=partitions,
        order_key=lambda e: str(e.data.node),
        concurrency=16,
        lease_ttl=timedelta(seconds=6),
    )
    await bus.consume(spec, handle, leases=kv)
    await asyncio.Event().wait()


async def _acked(js: Any, name: str) -> int:
    infos = await js.consumers_info("GPU")
    return sum(
        (i.ack_floor.consumer_seq or 0) if i.ack_floor else 0
        for i in infos
        if i.name.startswith(f"{name}-p")
    )


async def case(bus: Any, args: argparse.Namespace, mode: str, replicas: int) -> float:
    from schemas.base import make_event
    from schemas.gpu import GpuHealth, HealthState

    await bus.js.purge_stream("GPU")
    nodes = [f"bn-{uuid.uuid4().hex[:6]}-{i}" for i in range(args.nodes)]
    now = datetime.now(UTC)
    events = [
        make_event(
            GpuHealth(
                node=(node := nodes[i % len(nodes)]),
                gpu_index=0,
                gpu_uuid=f"GPU-{node}-0",
                state=HealthState.HEALTHY,
                observed_at=now,
                agent_boot_id="boot-1",
                sequence=i // len(nodes) + 1,
            ),
            source=f"agent/gpu/{node}",
        )
        for i in range(args.events)
    ]
    for start in range(0, len(events), 1000):
        await bus.publish_many(events[start : start + 1000])
    name, bucket = f"bench-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, __file__, "--replica", bus.settings.url, name, bucket]
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 - replicas for the whole case
            [*argv, str(args.partitions), mode],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(replicas)
    ]
    try:
        first = None
        while True:
            acked = await _acked(bus.js, name)
            if acked and first is None:
                first = time.monotonic()
            if acked >= args.events:
                assert first is not None
                return float(args.events) / max(time.monotonic() - first, 1e-6)
            await asyncio.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def main(args: argparse.Namespace) -> None:
    from nodeward.bus import Bus
    from nodeward.bus.server import EmbeddedNats
    from nodeward.config import BusSettings

    server = EmbeddedNats(Path(tempfile.mkdtemp(prefix="nodeward-bench-partitions-")))
    await server.start()
    bus = await Bus.connect(
        BusSettings(url=server.url, partitions=args.partitions), source="bench/partitions"
    )
    cases = (("bare", 1), ("kv", 1), ("kv", 2))
    rates: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    try:
        for run in range(args.runs):
            for mode, replicas in cases:
                rate = await case(bus, args, mode, replicas)
                rates[(mode, replicas)].append(rate)
                print(f"  run {run + 1}: {mode} x{replicas}: {rate:,.0f} events/s", flush=True)
    finally:
        await bus.close(grace=1)
        await server.stop()
    print(
        f"\n{args.events} events over {args.nodes} nodes, {args.partitions} partitions,"
        f" medians of {args.runs}:"
    )
    med = {c: statistics.median(r) for c, r in rates.items()}
    for (mode, replicas), value in med.items():
        print(f"  {mode:4} x{replicas}: {value:,.0f} events/s")
    print(f"  kv x2 / kv x1: {med[('kv', 2)] / med[('kv', 1)]:.2f}")
    print(f"  kv x1 / bare x1: {med[('kv', 1)] / med[('bare', 1)]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--replica":
        url, name, bucket, partitions, mode = sys.argv[2:7]
        asyncio.run(replica(url, name, bucket, int(partitions), mode))
    else:
        parser = options(__doc__.splitlines()[0], events=20000, nodes=2000, partitions=4, runs=3)
        asyncio.run(main(parser.parse_args()))
