"""Crashes and restarts: a killed consumer's message comes back; a restarted server loses no ack."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from nodeward.bus import Bus, ConsumerSpec, Delivery, PublishError
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from schemas import Event, make_event
from schemas.gpu import GpuHealth
from tests.conftest import REPO, wait_for


async def test_sigkill_mid_handler_redelivers_to_a_new_consumer(
    bus: Bus, nats_url: str, node: str, tmp_path: Path
) -> None:
    durable = f"crash-{node}"
    subject = f"gpu.health.{node}.>"
    marker = tmp_path / "started"
    event = make_event(GpuHealth.example().model_copy(update={"node": node}), source="t")
    await bus.publish(event)

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.helpers.hanging_consumer",
        nats_url,
        durable,
        subject,
        str(marker),
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    try:
        await wait_for(
            lambda: marker.exists() and marker.read_text().strip(),
            timeout=20,
            what="handler started",
        )
        assert marker.read_text().split() == [event.id, "1"]
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    got: list[tuple[str, int]] = []

    async def handler(e: Event[Any], delivery: Delivery) -> None:
        got.append((e.id, delivery.attempt))

    spec = ConsumerSpec(
        name=durable,
        stream="GPU",
        subjects=(subject,),
        ack_wait=timedelta(seconds=1),
        concurrency=1,
        batch=1,
        max_ack_pending=8,
    )
    await bus.consume(spec, handler)
    await wait_for(lambda: got, timeout=10, what="redelivery after SIGKILL")
    assert got[0] == (event.id, 2)


async def test_restarted_server_loses_no_acknowledged_event(
    own_nats: EmbeddedNats, node: str
) -> None:
    settings = BusSettings(url=own_nats.url, publish_timeout="1s", publish_retries=20)  # type: ignore[arg-type]
    bus = await Bus.connect(settings, source="test/publisher")
    acked: list[str] = []
    failed: list[str] = []
    stop = asyncio.Event()
    base = GpuHealth.example().model_copy(update={"node": node})

    async def publisher() -> None:
        i = 0
        while not stop.is_set():
            event = make_event(base.model_copy(update={"sequence": i}), source="t")
            try:
                await bus.publish(event)
                acked.append(event.id)
            except PublishError:
                failed.append(event.id)
            i += 1

    task = asyncio.create_task(publisher())
    try:
        await wait_for(lambda: len(acked) >= 200, what="publishing under way")
        port = own_nats.port
        await own_nats.kill()  # SIGKILL: no clean shutdown of the store
        before_restart = len(acked)
        own_nats.port = port
        await own_nats.start()
        await wait_for(
            lambda: len(acked) >= before_restart + 200, timeout=30, what="publishing resumed"
        )
    finally:
        stop.set()
        await task

    # Every acknowledged event is in the stream after the crash.
    psub = await bus.js.pull_subscribe(f"gpu.health.{node}.>", stream="GPU")
    stored: set[str] = set()
    while True:
        try:
            msgs = await psub.fetch(500, timeout=1)
        except TimeoutError:
            break
        for m in msgs:
            stored.add((m.headers or {})["ce-id"])
            await m.ack()
    await psub.unsubscribe()
    await bus.close(grace=1)
    missing = [i for i in acked if i not in stored]
    assert not missing, f"{len(missing)} acknowledged events lost of {len(acked)}"
    assert len(acked) >= 400


async def test_consumer_resumes_after_server_restart(own_nats: EmbeddedNats, node: str) -> None:
    """Pull requests die with the connection; the consumer notices and asks again."""
    settings = BusSettings(url=own_nats.url, publish_timeout="1s", publish_retries=20)  # type: ignore[arg-type]
    bus = await Bus.connect(settings, source="test/consumer")
    seen: set[int] = set()

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        seen.add(event.data.sequence)

    base = GpuHealth.example().model_copy(update={"node": node})
    try:
        spec = ConsumerSpec(
            name=f"resume-{node}",
            stream="GPU",
            subjects=(f"gpu.health.{node}.>",),
            batch=16,
            concurrency=2,
            max_ack_pending=64,
        )
        await bus.consume(spec, handler)
        await bus.publish_many(
            [make_event(base.model_copy(update={"sequence": i}), source="t") for i in range(10)]
        )
        await wait_for(lambda: len(seen) == 10, what="first ten handled")
        port = own_nats.port
        await own_nats.kill()
        own_nats.port = port
        await own_nats.start()
        await bus.publish_many(
            [make_event(base.model_copy(update={"sequence": i}), source="t") for i in range(10, 20)]
        )
        await wait_for(
            lambda: len(seen) == 20, timeout=20, what="the next ten handled after the restart"
        )
        assert seen == set(range(20))
    finally:
        await bus.close(grace=1)


async def test_deleted_consumer_is_recreated(bus: Bus, node: str) -> None:
    seen: set[int] = set()

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        seen.add(event.data.sequence)

    base = GpuHealth.example().model_copy(update={"node": node})
    name = f"recreate-{node}"
    spec = ConsumerSpec(
        name=name,
        stream="GPU",
        subjects=(f"gpu.health.{node}.>",),
        batch=16,
        concurrency=2,
        max_ack_pending=64,
    )
    consumer = await bus.consume(spec, handler)
    await bus.publish(make_event(base.model_copy(update={"sequence": 1}), source="t"))
    await wait_for(lambda: 1 in seen, what="first handled")
    await bus.js.delete_consumer("GPU", name)  # an operator, or a lost JetStream state
    await bus.publish(make_event(base.model_copy(update={"sequence": 2}), source="t"))
    await wait_for(lambda: 2 in seen, timeout=15, what="handled after the consumer was recreated")
    assert consumer.bound


async def test_consumer_rebinds_after_a_restart_on_an_empty_store(
    own_nats: EmbeddedNats, node: str
) -> None:
    """A server back on the same port without its JetStream state: no responders to the pull
    requests, so the consumer re-creates its stream and itself, and handles what comes next."""
    settings = BusSettings(url=own_nats.url, publish_timeout="1s", publish_retries=20)  # type: ignore[arg-type]
    bus = await Bus.connect(settings, source="test/consumer")
    seen: set[int] = set()

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        seen.add(event.data.sequence)

    base = GpuHealth.example().model_copy(update={"node": node})
    try:
        spec = ConsumerSpec(
            name=f"rebind-{node}",
            stream="GPU",
            subjects=(f"gpu.health.{node}.>",),
            batch=16,
            concurrency=2,
            max_ack_pending=64,
        )
        consumer = await bus.consume(spec, handler)
        await bus.publish(make_event(base.model_copy(update={"sequence": 1}), source="t"))
        await wait_for(lambda: 1 in seen, what="first handled")
        port = own_nats.port
        await own_nats.kill()
        shutil.rmtree(own_nats.store_dir / "jetstream")
        own_nats.port = port
        await own_nats.start()
        # Published once the consumer has put the stream back (the publisher retries).
        await bus.publish(make_event(base.model_copy(update={"sequence": 2}), source="t"))
        await wait_for(lambda: 2 in seen, timeout=20, what="handled after the re-bind")
        assert consumer.bound
        assert "GPU" in [s.config.name for s in await bus.js.streams_info()]
    finally:
        await bus.close(grace=1)
