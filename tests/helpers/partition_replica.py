"""A replica of a partitioned consumer in a process of its own, for tests that SIGKILL it.

`python -m tests.helpers.partition_replica URL BUCKET NAME PARTITIONS OUT`: consumes
`gpu.health.>` on the GPU stream as partitioned consumer NAME, leases in KV BUCKET, and
appends one line per handled event to OUT (`child <node> <sequence> <start> <end>`,
flushed before the handler returns, so the line is there before the ack). Appends
`held <partitions>` to OUT.held whenever what it holds changes.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import timedelta
from typing import Any

from nodeward.bus import Bus, ConsumerSpec, Delivery
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.config import BusSettings
from schemas.base import Event
from schemas.gpu import GpuHealth


def spec(name: str, partitions: int, ack_wait: float = 2.0) -> ConsumerSpec:
    """The partitioned consumer the partition tests run: GPU health in order per node."""
    return ConsumerSpec(
        name=name,
        stream="GPU",
        subjects=("gpu.health.>",),
        types=frozenset({GpuHealth.TYPE}),
        partitions=partitions,
        lease_ttl=timedelta(seconds=3),
        ack_wait=timedelta(seconds=ack_wait),
        order_key=lambda e: str(e.data.node),
    )


async def main(url: str, bucket: str, name: str, partitions: int, out: str) -> None:
    settings = BusSettings(url=url, stream_replicas=3, partitions=partitions)
    bus = await Bus.connect(settings, source="test/replica")
    kv = await bus.kv(bucket, history=1)
    with open(out, "a", buffering=1) as log:

        async def handle(event: Event[Any], delivery: Delivery) -> None:
            start = time.time()
            await asyncio.sleep(0.01)
            data: GpuHealth = event.data
            log.write(f"child {data.node} {data.sequence} {start} {time.time()}\n")
            log.flush()

        consumer = await bus.consume(spec(name, partitions), handle, leases=kv)
        assert isinstance(consumer, PartitionedConsumer)
        held: list[int] = []
        while True:
            if consumer.held != held and consumer.bound:
                held = consumer.held
                with open(f"{out}.held", "a") as f:
                    f.write("held " + ",".join(map(str, held)) + "\n")
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    url, bucket, name, partitions, out = sys.argv[1:6]
    asyncio.run(main(url, bucket, name, int(partitions), out))
