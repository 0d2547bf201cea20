"""Every event type survives publish → JetStream → consume as the same typed model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodeward.bus import Bus, ConsumerSpec, Delivery
from schemas import REGISTRY, Event, example_event, make_event
from schemas.gpu import GpuHealth
from tests.conftest import wait_for


@pytest.mark.parametrize("type_name", sorted(REGISTRY))
async def test_every_type_round_trips(bus: Bus, type_name: str) -> None:
    et = REGISTRY[type_name]
    sent = example_event(type_name)
    ack = await bus.publish(sent)
    assert ack.stream == et.stream.name

    got: dict[str, Event[Any]] = {}

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        got[event.id] = event

    spec = ConsumerSpec(
        name=f"rt-{sent.id[-12:]}",
        stream=et.stream.name,
        subjects=(sent.nats_subject,),
        concurrency=2,
        batch=16,
        max_ack_pending=64,
    )
    await bus.consume(spec, handler)
    received = await wait_for(lambda: got.get(sent.id), what=f"{type_name} delivered")
    assert received == sent
    assert type(received.data) is et.model
    assert received.model_dump() == sent.model_dump()


async def test_same_id_is_stored_once(bus: Bus, node: str) -> None:
    data = GpuHealth.example().model_copy(update={"node": node})
    event = make_event(data, source=f"agent/gpu/{node}")
    first = await bus.publish(event)
    second = await bus.publish(event)
    assert not first.duplicate
    assert second.duplicate
    assert second.seq == first.seq
    info = await bus.js.stream_info("GPU", subjects_filter=f"gpu.health.{node}.>")
    assert info.state.subjects == {event.nats_subject: 1}


async def test_publish_many_acks_every_event(bus: Bus, node: str) -> None:
    data = GpuHealth.example().model_copy(update={"node": node})
    events = [make_event(data.model_copy(update={"sequence": i}), source="t") for i in range(200)]
    acks = await bus.publish_many(events)
    assert len(acks) == 200 and len({a.seq for a in acks}) == 200
    info = await bus.js.stream_info("GPU", subjects_filter=f"gpu.health.{node}.>")
    assert sum(info.state.subjects.values()) == 200


def ordered(name: str, *subjects: str, concurrency: int, batch: int, pending: int) -> ConsumerSpec:
    """A GPU-stream consumer in order per node."""
    return ConsumerSpec(
        name=name,
        stream="GPU",
        subjects=subjects,
        concurrency=concurrency,
        batch=batch,
        max_ack_pending=pending,
        order_key=lambda e: e.data.node,
    )


async def test_order_key_keeps_per_key_order(bus: Bus, node: str) -> None:
    """With concurrency 8, events of one key are still handled in publish order."""
    seen: list[int] = []
    done = asyncio.Event()

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        # Later events finish faster, which would reorder them without the key ordering.
        await asyncio.sleep(0.02 * (10 - event.data.sequence % 10) / 10)
        seen.append(event.data.sequence)
        if len(seen) == 30:
            done.set()

    base = GpuHealth.example().model_copy(update={"node": node})
    await bus.publish_many(
        [make_event(base.model_copy(update={"sequence": i}), source="t") for i in range(30)]
    )
    spec = ordered(f"order-{node}", f"gpu.health.{node}.>", concurrency=8, batch=32, pending=64)
    await bus.consume(spec, handler)
    await asyncio.wait_for(done.wait(), 10)
    assert seen == list(range(30))


async def test_a_busy_key_never_holds_the_workers_from_other_keys(bus: Bus, node: str) -> None:
    """Messages queued behind their key's busy predecessor are set aside, not waited on
    by a worker: with 2 workers, a third key is handled while the first key's head is
    stuck, and the stuck key's messages still run in order once it is released."""
    stuck, other = f"{node}a", f"{node}b"
    release = asyncio.Event()
    seen: list[tuple[str, int]] = []

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        if event.data.node == stuck and event.data.sequence == 0:
            await release.wait()
        seen.append((event.data.node, event.data.sequence))

    base = GpuHealth.example()
    await bus.publish_many(
        [
            make_event(base.model_copy(update={"node": stuck, "sequence": i}), source="t")
            for i in range(4)
        ]
        + [make_event(base.model_copy(update={"node": other, "sequence": 0}), source="t")]
    )
    spec = ordered(
        f"hol-{node}",
        f"gpu.health.{stuck}.>",
        f"gpu.health.{other}.>",
        concurrency=2,
        batch=8,
        pending=16,
    )
    await bus.consume(spec, handler)
    await wait_for(lambda: (other, 0) in seen, timeout=5, what="the other key handled")
    assert seen == [(other, 0)]  # the stuck key's head still holds its followers
    release.set()
    await wait_for(lambda: len(seen) == 5, timeout=5, what="the stuck key's messages")
    assert seen[1:] == [(stuck, i) for i in range(4)]


async def test_stopping_finishes_what_waits_behind_its_key_in_order(bus: Bus, node: str) -> None:
    """A consumer stopping while its key's head is being handled finishes it within the
    grace, then the followers set aside behind it, in order: none lost, none run ahead."""
    started, release = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        if event.data.sequence == 0 and not seen:
            started.set()
            await release.wait()
        seen.append(event.data.sequence)

    base = GpuHealth.example().model_copy(update={"node": node})
    await bus.publish_many(
        [make_event(base.model_copy(update={"sequence": i}), source="t") for i in range(3)]
    )
    spec = ordered(f"give-back-{node}", f"gpu.health.{node}.>", concurrency=4, batch=8, pending=16)
    first = await bus.consume(spec, handler)
    await asyncio.wait_for(started.wait(), 5)
    stopping = asyncio.create_task(first.stop(grace=5))
    await wait_for(first._stopping.is_set, timeout=2, what="stopping")
    release.set()
    await stopping
    assert seen == [0, 1, 2]  # the head, then its followers, none lost or reordered
