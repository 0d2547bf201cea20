"""`nodeward.bus.mirror` against a real JetStream: mirrors answer what the bus would, follow
changes (deleted and purged keys too) and a server restart; and the console, drawing its
picture again after every change, makes no consumer once it has started."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from nodeward.bus import Bus
from nodeward.bus.mirror import Mirrors, Watched, covers
from nodeward.bus.server import EmbeddedNats
from nodeward.bus.snapshot import BusReads, Stored
from nodeward.config import BusSettings, Settings
from nodeward.fleet_status import Buckets
from nodeward.views import registered
from schemas.state.cordon import NODES, NodeRecord
from services.console.live import Live
from services.console.settings import ConsoleSettings
from tests.conftest import wait_for


def _said(stored: list[Stored] | None) -> list[tuple[str, bytes, int]]:
    assert stored is not None
    return [(m.subject, m.data, m.seq) for m in stored]


def test_a_pattern_covers_another_as_nats_subjects_do() -> None:
    assert covers("gpu.health.>", "gpu.health.*.>")
    assert covers("gpu.*.*", "gpu.health.*")
    assert covers("session.*.*.>", "session.*.node-1.>")
    assert not covers("gpu.health.*", "gpu.health.>")
    assert not covers("gpu.health.>", ">")
    assert not covers("remediation.isolate.>", "remediation.*.pod")


async def test_mirrors_answer_what_the_bus_answers_and_follow_every_change(
    own_bus: Bus,
) -> None:
    js, nc = own_bus.js, own_bus.nc
    kv = await js.create_key_value(bucket="mirrortest", history=1)
    for subject, body in (
        ("gpu.health.a.0", b"a0-1"),
        ("gpu.health.a.0", b"a0-2"),
        ("gpu.health.b.0", b"b0-1"),
        ("gpu.xid.a.0", b"xid"),
    ):
        await js.publish(subject, body)
    await kv.put("node.a", b"1")
    await kv.put("node.b", b"1")
    await kv.put("node.c", b"1")
    await kv.delete("node.c")
    told: list[int] = []
    mirrors = Mirrors(
        nc,
        [Watched("GPU", ("gpu.health.>",)), Watched.bucket("mirrortest")],
        on_change=lambda: told.append(1),
    )
    bus = BusReads(nc)
    await mirrors.start()
    try:
        assert mirrors.consumers == 2

        async def same() -> None:
            for filters in (["gpu.health.>"], ["gpu.health.a.>", "gpu.health.b.*"]):
                assert _said(await mirrors.last("GPU", filters)) == _said(
                    await bus.last("GPU", filters)
                )
            assert await mirrors.kv("mirrortest", ["node."]) == await bus.kv(
                "mirrortest", ["node."]
            )
            assert await mirrors.subjects("GPU", "gpu.health.*.>") == await bus.subjects(
                "GPU", "gpu.health.*.>"
            )
            assert _said(await mirrors.newest("GPU", 1, filters=["gpu.health.>"])) == _said(
                await bus.newest("GPU", 1, filters=["gpu.health.>"])
            )
            assert _said(await mirrors.newest("KV_mirrortest", 1)) == _said(
                await bus.newest("KV_mirrortest", 1)
            )
            start = datetime.now(UTC) - timedelta(minutes=1)
            mine = {
                m.subject: m.data for m in await mirrors.since("GPU", ["gpu.health.>"], start) or []
            }
            theirs = {
                m.subject: m.data for m in await bus.since("GPU", ["gpu.health.>"], start) or []
            }
            assert mine == theirs  # the newest of each subject

        await same()
        assert await mirrors.kv("mirrortest", ["node."]) == {"node.a": b"1", "node.b": b"1"}
        # Not watched: the bus answers (the xid subjects, a stream not mirrored, counts).
        assert _said(await mirrors.last("GPU", ["gpu.xid.>"])) == [("gpu.xid.a.0", b"xid", 4)]
        assert await mirrors.last("NO-SUCH-STREAM", [">"]) is None

        told.clear()
        await js.publish("gpu.health.c.1", b"c1-1")
        await kv.put("node.a", b"2")
        await kv.purge("node.b")
        await kv.put("node.d", b"1")
        await wait_for(lambda: len(told) >= 4, timeout=30, what="the mirrors told four changes")
        await same()
        assert await mirrors.kv("mirrortest", ["node."]) == {"node.a": b"2", "node.d": b"1"}
    finally:
        await mirrors.stop()
    info = await js.stream_info("GPU")
    assert info.state.consumer_count == 0  # stopped mirrors leave no consumer behind


async def test_a_mirror_follows_across_a_server_restart(own_nats: EmbeddedNats) -> None:
    bus = await Bus.connect(BusSettings(url=own_nats.url), source="test/mirror")
    try:
        kv = await bus.js.create_key_value(bucket="restarted", history=1)
        await kv.put("k", b"before")
        mirrors = Mirrors(bus.nc, [Watched.bucket("restarted")])  # a whole stream
        await mirrors.start()
        assert await mirrors.kv("restarted", ["k"]) == {"k": b"before"}
        port = own_nats.port
        await own_nats.kill()
        own_nats.port = port
        await own_nats.start()
        await wait_for(lambda: bus.nc.is_connected, timeout=20, what="reconnected")
        kv = await bus.js.key_value("restarted")
        await kv.put("k", b"after")
        mirror = mirrors._mirrors["KV_restarted"]
        await wait_for(
            lambda: mirror.last["$KV.restarted.k"].data == b"after",
            timeout=40,
            what="the mirror, its consumer made again, holds the value put after the restart",
        )
        await mirrors.stop()
    finally:
        await bus.close(grace=1)


async def test_the_console_draws_every_change_and_makes_no_consumer_for_it(
    own_bus: Bus,
) -> None:
    """The console used to read the whole picture again after each change with a dozen
    ephemeral consumers (created and deleted about every 0.6 s in `nodeward up`); it now
    draws from mirrors, so once it has started the server sees no consumer created."""
    nc = own_bus.nc
    created: list[str] = []

    async def advisory(msg: Any) -> None:
        created.append(msg.subject)

    sub = await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>", cb=advisory)
    nodes = await own_bus.kv(NODES.name)
    live = Live(nc, ConsoleSettings(settle_s=0.05), buckets=Buckets(), views=registered(Settings()))
    await live.start()
    keeping = asyncio.create_task(live.keep())
    try:
        assert live.ready.is_set()
        await nc.flush()
        started = len(created)
        assert started > 0  # the mirrors' consumers, once
        for i in range(20):
            name = f"gpu-node-{i:02d}"
            await nodes.put(NODES.key(name), NodeRecord().model_dump_json().encode())
            await wait_for(lambda n=name: n in live.nodes, timeout=30, what=f"{name} drawn")  # type: ignore[misc]
        await nc.flush()
        assert created[started:] == []
    finally:
        keeping.cancel()
        await live.stop()
        await sub.unsubscribe()
