"""KV state: revision-checked updates never lose a write; a lease has one holder at a time."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from nodeward.bus import Bus, ConsumerSpec, Delivery
from nodeward.bus.kv import Lease, TypedKV
from schemas import Event, make_event
from schemas.capacity import GpuCounts
from schemas.gpu import GpuHealth
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot, NodeCapacity
from tests.conftest import wait_for


class Counter(BaseModel):
    value: int = 0
    writers: list[str] = []


async def test_concurrent_updates_lose_nothing(bus: Bus) -> None:
    kv = TypedKV(await bus.kv(f"t{uuid.uuid4().hex[:8]}"), Counter)

    async def writer(name: str) -> None:
        for _ in range(15):
            await kv.update(
                "c",
                lambda cur: Counter(
                    value=(cur.value if cur else 0) + 1,
                    writers=[*(cur.writers if cur else []), name],
                ),
            )

    await asyncio.gather(*(writer(f"w{i}") for i in range(4)))
    final = await kv.get("c")
    assert final is not None
    assert final.value.value == 60
    assert len(final.value.writers) == 60


async def test_update_returning_none_leaves_value(bus: Bus) -> None:
    kv = TypedKV(await bus.kv(f"t{uuid.uuid4().hex[:8]}"), Counter)
    await kv.put("k", Counter(value=7))
    result = await kv.update("k", lambda cur: None)
    assert result is not None and result.value.value == 7


async def test_lease_has_one_holder(bus: Bus) -> None:
    bucket = await bus.kv(f"lease{uuid.uuid4().hex[:8]}")
    a = Lease(bucket, "scheduler", "replica-a", ttl=2.0)
    b = Lease(bucket, "scheduler", "replica-b", ttl=2.0)
    assert await a.try_acquire()
    assert not await b.try_acquire()
    assert await a.try_acquire()  # renewal by the holder
    await a.release()
    assert await b.try_acquire()
    assert not await a.try_acquire()


async def test_lease_expires_when_holder_stops_renewing(bus: Bus) -> None:
    bucket = await bus.kv(f"lease{uuid.uuid4().hex[:8]}")
    a = Lease(bucket, "loop", "a", ttl=0.5)
    b = Lease(bucket, "loop", "b", ttl=0.5)
    assert await a.try_acquire()
    await wait_for(b.try_acquire, timeout=5, interval=0.1, what="lease taken over after expiry")


async def test_shutdown_finishes_in_flight_and_returns_the_rest(
    bus: Bus, bus_settings: Any, node: str
) -> None:
    """stop(): the running handler finishes and is acked; unstarted messages go back un-acked."""
    finished: list[int] = []
    started = asyncio.Event()

    async def slow(event: Event[Any], delivery: Delivery) -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(event.data.sequence)

    base = GpuHealth.example().model_copy(update={"node": node})
    await bus.publish_many(
        [make_event(base.model_copy(update={"sequence": i}), source="t") for i in range(5)]
    )
    name = f"shut-{node}"
    spec = ConsumerSpec(
        name=name,
        stream="GPU",
        subjects=(f"gpu.health.{node}.>",),
        concurrency=1,
        batch=5,
        max_ack_pending=16,
    )
    other = await Bus.connect(bus_settings, source="test/other")
    consumer = await other.consume(spec, slow)
    await asyncio.wait_for(started.wait(), 5)
    await consumer.stop(grace=5)
    assert finished == [0]
    await other.close(grace=1)

    # A new replica gets exactly the four that were not handled, at once (nak'ed, not timed out).
    rest: list[int] = []

    async def quick(event: Event[Any], delivery: Delivery) -> None:
        rest.append(event.data.sequence)

    await bus.consume(spec, quick)
    await wait_for(lambda: len(rest) >= 4, timeout=5, what="the rest redelivered")
    assert sorted(rest) == [1, 2, 3, 4]


async def test_a_fleet_wide_record_over_max_payload_is_stored_compressed(bus: Bus) -> None:
    """The capacity snapshot of 5,000 nodes is JSON past nats-server's 1 MiB max_payload:
    it is stored gzip-compressed, and every reader (the typed KV, a raw read through
    the record's `Bucket`, as the console does) gets it back; small records stay JSON."""
    nodes = [
        NodeCapacity(
            node=f"gpu-h100-{i:04d}",
            model="NVIDIA-H100-80GB-HBM3",
            profiles={"gpu": GpuCounts(used=i % 8, free=8 - i % 8)},
            failed_gpus={"3": None} if i % 97 == 0 else {},
        )
        for i in range(5000)
    ]
    snapshot = CapacitySnapshot(at=datetime.now(UTC), nodes=nodes)
    assert len(snapshot.model_dump_json()) > bus.nc.max_payload  # plain, NATS refuses it
    raw_kv = await bus.kv(f"t{uuid.uuid4().hex[:8]}")
    kv = TypedKV(raw_kv, CapacitySnapshot)
    await kv.put(SNAPSHOT.key(), snapshot)
    stored = await raw_kv.get(SNAPSHOT.key())
    assert stored.value is not None and stored.value[:2] == b"\x1f\x8b"
    assert len(stored.value) < bus.nc.max_payload // 4
    assert SNAPSHOT.load(stored.value) == snapshot
    got = await kv.get(SNAPSHOT.key())
    assert got is not None and got.value == snapshot
    updated = await kv.update(
        SNAPSHOT.key(), lambda cur: cur and cur.model_copy(update={"nodes": nodes[:10]})
    )
    assert updated is not None and (await raw_kv.get(SNAPSHOT.key())).value[:1] == b"{"
    assert SNAPSHOT.load((await raw_kv.get(SNAPSHOT.key())).value).nodes == nodes[:10]
