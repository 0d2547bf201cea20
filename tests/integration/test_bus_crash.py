"""Crashes and restarts: a killed consumer's message comes back; a restarted server loses no ack."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from nodeward.bus import Bus, Delivery, PublishError
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from schemas import Event, make_event
from schemas.gpu import GpuHealth
from tests.conftest import REPO, wait_for
from tests.helpers.hanging_consumer import crash_spec
from tests.helpers.health import Sequences, health_event, health_events, health_spec


async def _own_bus(own_nats: EmbeddedNats, source: str) -> Bus:
    """A bus on `own_nats` that retries its publishes through a server restart."""
    settings = BusSettings(url=own_nats.url, publish_timeout="1s", publish_retries=20)  # type: ignore[arg-type]
    return await Bus.connect(settings, source=source)


async def _restart(own_nats: EmbeddedNats, *, empty: bool = False) -> None:
    """SIGKILL the server (no clean shutdown of the store) and start it on the same port;
    `empty`: without its JetStream state."""
    port = own_nats.port
    await own_nats.kill()
    if empty:
        shutil.rmtree(own_nats.store_dir / "jetstream")
    own_nats.port = port
    await own_nats.start()


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

    await bus.consume(crash_spec(durable, subject), handler)
    await wait_for(lambda: got, timeout=10, what="redelivery after SIGKILL")
    assert got[0] == (event.id, 2)


async def test_restarted_server_loses_no_acknowledged_event(
    own_nats: EmbeddedNats, node: str
) -> None:
    bus = await _own_bus(own_nats, "test/publisher")
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
        before_restart = len(acked)
        await _restart(own_nats)
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
    bus = await _own_bus(own_nats, "test/consumer")
    handled = Sequences()
    try:
        await bus.consume(health_spec(f"resume-{node}", node), handled)
        await bus.publish_many(health_events(node, range(10)))
        await wait_for(lambda: len(handled.seen) == 10, what="first ten handled")
        await _restart(own_nats)
        await bus.publish_many(health_events(node, range(10, 20)))
        await wait_for(
            lambda: len(handled.seen) == 20,
            timeout=20,
            what="the next ten handled after the restart",
        )
        assert handled.seen == set(range(20))
    finally:
        await bus.close(grace=1)


async def test_deleted_consumer_is_recreated(bus: Bus, node: str) -> None:
    handled = Sequences()
    name = f"recreate-{node}"
    consumer = await bus.consume(health_spec(name, node), handled)
    await bus.publish(health_event(node, 1))
    await wait_for(lambda: 1 in handled.seen, what="first handled")
    await bus.js.delete_consumer("GPU", name)  # an operator, or a lost JetStream state
    await bus.publish(health_event(node, 2))
    await wait_for(
        lambda: 2 in handled.seen, timeout=15, what="handled after the consumer was recreated"
    )
    assert consumer.bound


async def test_consumer_rebinds_after_a_restart_on_an_empty_store(
    own_nats: EmbeddedNats, node: str
) -> None:
    """A server back on the same port without its JetStream state: no responders to the pull
    requests, so the consumer re-creates its stream and itself, and handles what comes next."""
    bus = await _own_bus(own_nats, "test/consumer")
    handled = Sequences()
    try:
        consumer = await bus.consume(health_spec(f"rebind-{node}", node), handled)
        await bus.publish(health_event(node, 1))
        await wait_for(lambda: 1 in handled.seen, what="first handled")
        await _restart(own_nats, empty=True)
        # Published once the consumer has put the stream back (the publisher retries).
        await bus.publish(health_event(node, 2))
        await wait_for(lambda: 2 in handled.seen, timeout=20, what="handled after the re-bind")
        assert consumer.bound
        assert "GPU" in [s.config.name for s in await bus.js.streams_info()]
    finally:
        await bus.close(grace=1)
