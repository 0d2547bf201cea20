"""KV state: revision-checked updates never lose a write; a lease has one holder at a time."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from nodeward.bus import Bus, Delivery
from nodeward.bus.kv import Lease, TypedKV
from schemas import Event
from schemas.capacity import GpuCounts
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot, NodeCapacity
from tests.conftest import wait_for
from tests.helpers.health import health_events, health_spec


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


class Flag(BaseModel):
    done: bool = False
    count: int = 0


class CountingReads:
    """The bucket, counting reads (what `remember` saves)."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.reads, self._name = kv, 0, kv._name

    async def get(self, key: str) -> Any:
        self.reads += 1
        return await self.kv.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


async def remembering_and_not(
    bus: Bus, remember: int
) -> tuple[CountingReads, TypedKV[Counter], TypedKV[Counter]]:
    """A fresh bucket counting its reads, a writer remembering up to `remember` values of it,
    and another writer that remembers nothing."""
    bucket = await bus.kv(f"t{uuid.uuid4().hex[:8]}")
    counted = CountingReads(bucket)
    mine = TypedKV(counted, Counter, remember=remember)  # type: ignore[arg-type]
    return counted, mine, TypedKV(bucket, Counter)


def add(name: str) -> Any:
    """A change that counts one more write, by `name`."""
    return lambda cur: Counter(
        value=(cur.value if cur else 0) + 1, writers=[*(cur.writers if cur else []), name]
    )


async def test_remembering_skips_the_read_and_never_loses_another_writers_value(
    bus: Bus,
) -> None:
    counted, mine, other = await remembering_and_not(bus, remember=100)

    await mine.update("c", add("a"))
    reads = counted.reads
    for _ in range(5):
        await mine.update("c", add("a"))
    assert counted.reads == reads  # each started from the value it wrote last

    await other.update("c", add("b"))  # behind its back: what it remembers is stale
    result = await mine.update("c", add("a"))
    assert result is not None and result.value.value == 8
    assert result.value.writers == ["a"] * 6 + ["b", "a"]  # b's write kept, not overwritten
    assert counted.reads == reads + 1  # the conflict read the key afresh


async def test_remembering_confirms_a_change_that_writes_nothing_on_a_fresh_read(
    bus: Bus,
) -> None:
    bucket = await bus.kv(f"t{uuid.uuid4().hex[:8]}")
    mine = TypedKV(bucket, Flag, remember=100)
    other = TypedKV(bucket, Flag)

    def finish(cur: Flag | None) -> Flag | None:
        return None if cur is not None and cur.done else Flag(done=True, count=1)

    await mine.update("f", finish)
    await other.put("f", Flag(done=False, count=5))  # undone behind its back
    # On memory alone the change would write nothing; it must see the key as it is.
    result = await mine.update("f", finish)
    assert result is not None and result.value.done
    stored = await other.get("f")
    assert stored is not None and stored.value.done


async def test_remembering_is_bounded(bus: Bus) -> None:
    counted, mine, _ = await remembering_and_not(bus, remember=2)
    for key in ("a", "b", "c"):
        await mine.update(key, lambda cur: Counter(value=1))
    reads = counted.reads
    await mine.update("c", lambda cur: Counter(value=(cur.value if cur else 0) + 1))
    assert counted.reads == reads  # remembered
    await mine.update("a", lambda cur: Counter(value=(cur.value if cur else 0) + 1))
    assert counted.reads == reads + 1  # the oldest was forgotten
    assert len(mine._memory) == 2


async def test_a_key_read_as_absent_is_created_without_a_read_and_never_over_another(
    bus: Bus,
) -> None:
    counted, mine, other = await remembering_and_not(bus, remember=100)

    assert await mine.get("x") is None
    reads = counted.reads
    await mine.update("x", add("a"))
    assert counted.reads == reads  # created from the absence it read

    assert await mine.get("y") is None
    await other.update("y", add("b"))  # created behind its back: the create must fail
    result = await mine.update("y", add("a"))
    assert result is not None and result.value.writers == ["b", "a"]
    stored = await other.get("y")
    assert stored is not None and stored.value.value == 2


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

    await bus.publish_many(health_events(node, range(5)))
    name = f"shut-{node}"
    spec = health_spec(name, node, concurrency=1, batch=5, max_ack_pending=16)
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
