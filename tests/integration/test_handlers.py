"""A service declared with `nodeward.handlers`, run against a real nats-server: one call
builds a daemon that consumes what it declares (in order per key), answers its controls
(counted per verb and status), runs its tasks, is ready only once its consumers are bound
and its checks pass; a setting refused by `@prepare` connects nothing, and a failing
`setup` closes what was opened. Its grants are its declarations'."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import Field

from nodeward.bus import Bus, Delivery
from nodeward.bus.consumer import DEAD_LETTER_REASONS
from nodeward.bus.control import request
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, ConfigError, DaemonSettings, Section, Settings
from nodeward.daemon import Daemon
from nodeward.handlers import FromSettings, Runtime, Service, setting
from nodeward.nats_auth import ServiceGrants
from schemas import Event, make_event
from schemas.control import ControlReply, ControlRequest, ControlStatus
from schemas.session import ActivityState, SessionActivity, SessionIdle, SessionKind
from tests.conftest import wait_for


class ToySettings(Section):
    consumer: str = "toy"
    subjects: list[str] = Field(default_factory=lambda: ["session.activity.>"])
    concurrency: int = 4
    broken: bool = False
    refuse: bool = False


@dataclass
class Toy:
    kv: Any = None
    seen: list[tuple[str, str]] = field(default_factory=list)
    ticks: int = 0
    released: list[str] = field(default_factory=list)
    group: PartitionedConsumer | None = None


def declare(name: str, *, one_lease: bool = False) -> Service[ToySettings]:
    app = Service(
        name, settings=ToySettings, buckets=(name,), publishes=("toy.>",), one_lease=one_lease
    )

    @app.prepare
    async def prepare(config: ToySettings) -> str:
        if config.refuse:
            raise ConfigError(f"services.{name}: refused")
        return "prepared"

    @app.setup
    async def setup(rt: Runtime[ToySettings]) -> Toy:
        assert rt.prepared == "prepared"
        if rt.config.broken:
            raise RuntimeError("setup failed")
        return Toy(kv=await rt.kv(name, history=1))

    @app.consumes(
        "SESSIONS",
        subjects=setting("subjects"),
        types=(SessionActivity,),
        concurrency=setting("concurrency"),
        order_key=lambda e: e.data.pod,
        retry_delays=FromSettings(lambda c: (0.1,)),
        leases=lambda toy: toy.kv,
        lease_ttl=FromSettings(lambda c: timedelta(seconds=3)),
    )
    async def on_activity(toy: Toy, event: Event[Any], delivery: Delivery) -> None:
        toy.seen.append((event.data.pod, event.id))

    if one_lease:

        @app.consumes(
            "SESSIONS",
            suffix="idle",
            subjects=["session.idle.>"],
            types=(SessionIdle,),
            leases=lambda toy: toy.kv,
            lease_ttl=timedelta(seconds=3),
        )
        async def on_idle(toy: Toy, event: Event[Any], delivery: Delivery) -> None:
            toy.seen.append((event.data.pod, event.id))

        @app.claimed
        def claimed(toy: Toy, group: PartitionedConsumer) -> None:
            toy.group = group

    @app.control("release")
    async def release(toy: Toy, req: ControlRequest) -> ControlReply:
        toy.released.append(req.target or "")
        return ControlReply.ok(f"released {req.target}")

    @app.task("tick")
    async def tick(toy: Toy) -> None:
        toy.ticks += 1
        await asyncio.Event().wait()

    @app.ready("ticked")
    def ticked(toy: Toy) -> bool:
        return toy.ticks > 0

    return app


def _settings(bus_settings: BusSettings, name: str, **section: Any) -> Settings:
    return Settings(
        bus=bus_settings,
        daemon=DaemonSettings(port=0, shutdown_timeout="4s"),
        services={name: {"consumer": f"{name}-c", **section}},
    )


def _activity(node: str, pod: str) -> Event[SessionActivity]:
    now = datetime.now(UTC)
    data = SessionActivity(
        namespace="team-a",
        pod=pod,
        node=node,
        kind=SessionKind.JOB,
        state=ActivityState.ACTIVE,
        last_activity=now,
        sampled_at=now,
    )
    return make_event(data, source=f"agent/idle/{node}", time=now)


def test_the_grants_are_the_declarations() -> None:
    app = declare("toy")
    assert app.grants() == ServiceGrants(
        consumers=(("SESSIONS", "toy"),),
        buckets=("toy",),
        publish=("toy.>",),
        controls=("release",),
        partitioned=("toy",),
    )
    [(_, spec)] = app.specs(ToySettings(consumer="other", subjects=["session.activity.n1.>"]))
    assert (spec.name, spec.subjects, spec.concurrency, spec.retry_delays) == (
        "other",
        ("session.activity.n1.>",),
        4,
        (0.1,),
    )


def test_a_consumer_that_is_off_runs_not_but_is_granted() -> None:
    app = declare("toy")

    @app.consumes(
        "NODES", suffix="extra", subjects=["node.finding.>"], types=(), when=setting("broken")
    )
    async def extra(toy: Toy, event: Event[Any], delivery: Delivery) -> None: ...

    assert [s.name for _, s in app.specs(ToySettings())] == ["toy"]
    assert [s.name for _, s in app.specs(ToySettings(broken=True))] == ["toy", "toy-extra"]
    assert app.grants().consumers == (("SESSIONS", "toy"), ("NODES", "toy-extra"))


def test_an_unknown_consumer_option_is_refused_where_it_is_declared() -> None:
    app = declare("toy")
    with pytest.raises(TypeError, match="not consumer options: ordr_key"):
        app.consumes("SESSIONS", subjects=["session.>"], types=(), ordr_key=str)


async def test_one_call_builds_the_declared_daemon(bus_settings: BusSettings, node: str) -> None:
    name = f"toy-{uuid.uuid4().hex[:8]}"
    subjects = [f"session.activity.{node}.>"]
    try:
        async with running(declare(name), bus_settings, subjects=subjects) as (daemon, toy, pub):
            sent = [_activity(node, f"pod-{i % 2}") for i in range(6)]
            await pub.publish_many(sent)
            await wait_for(lambda: len(toy.seen) == 6, what="all handled")
            for pod in ("pod-0", "pod-1"):  # in order per key
                assert [i for p, i in toy.seen if p == pod] == [
                    e.id for e in sent if e.data.pod == pod
                ]
            reply = await request(
                pub.nc,
                ControlRequest(service=name, verb="release", operator="ann", target="team-a/p"),
                timeout=5,
            )
            assert (reply.status, reply.message, toy.released) == (
                ControlStatus.OK,
                "released team-a/p",
                ["team-a/p"],
            )
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"{daemon.url}/metrics")).text
            assert 'nodeward_control_answers_total{status="ok",verb="release"} 1.0' in metrics
            # Nothing failed, and every failure counter it can move is there at 0: its
            # consumer's dead letters, the publishes its grants allow (its dead letters, the
            # runtime's refusal audits and notices; `toy.>` carries no event type).
            for reason in DEAD_LETTER_REASONS:
                series = f'{{consumer="{name}-c",reason="{reason}"}} 0.0'
                assert f"nodeward_events_dead_lettered_total{series}" in metrics
            failures = re.findall(r'nodeward_publish_failures_total\{type="([^"]+)"\} 0.0', metrics)
            assert failures == ["dlq.v1", "notify.v1", "remediation.v1"]
            assert f"{name}:tick" in {t.get_name() for t in asyncio.all_tasks()}
    finally:
        await _forget(bus_settings, f"{name}-c")


@contextlib.asynccontextmanager
async def running(
    app: Service[ToySettings], bus_settings: BusSettings, **section: Any
) -> AsyncIterator[tuple[Daemon, Toy, Bus]]:
    """The declared daemon started and ready, its service, and a publisher."""
    built = await app.assemble(_settings(bus_settings, app.name, **section))
    daemon, toy = built.daemon, built.service
    assert isinstance(toy, Toy)
    await daemon.start()
    publisher = await Bus.connect(bus_settings, source="test/toy")
    try:
        await wait_for(lambda: _ready(daemon.url), what="ready")
        yield daemon, toy, publisher
    finally:
        await publisher.close(grace=1)
        await daemon.stop()


async def _ready(url: str) -> bool:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{url}/readyz")).status_code == 200


async def _forget(bus_settings: BusSettings, durable: str) -> None:
    bus = await Bus.connect(bus_settings, source="test/toy")
    try:
        await bus.js.delete_consumer("SESSIONS", durable)
    finally:
        await bus.close(grace=1)


async def test_a_refused_setting_connects_nothing(bus_settings: BusSettings) -> None:
    name = f"toy-{uuid.uuid4().hex[:8]}"
    unreachable = bus_settings.model_copy(update={"url": "nats://127.0.0.1:1"})
    with pytest.raises(ConfigError, match="refused"):
        await declare(name).build(_settings(unreachable, name, refuse=True))


async def test_a_failing_setup_closes_the_bus(bus_settings: BusSettings) -> None:
    name = f"toy-{uuid.uuid4().hex[:8]}"
    opened: list[Bus] = []
    connect = Bus.connect

    async def recording(*args: Any, **kwargs: Any) -> Bus:
        bus = await connect(*args, **kwargs)
        opened.append(bus)
        return bus

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Bus, "connect", recording)
        with pytest.raises(RuntimeError, match="setup failed"):
            await declare(name).build(_settings(bus_settings, name, broken=True))
    assert [b.nc.is_closed for b in opened] == [True]


async def test_with_partitions_a_declared_lease_partitions_the_consumer(
    own_nats: EmbeddedNats, node: str
) -> None:
    """`bus.partitions` > 1: the consumer that declares its leases is partitioned (one
    durable per partition, claimed in the service's bucket), and still handles everything."""
    name = f"toy-{uuid.uuid4().hex[:8]}"
    bus_settings = BusSettings(url=own_nats.url, partitions=2)
    async with running(declare(name), bus_settings) as (_, toy, publisher):
        await publisher.publish_many([_activity(node, f"pod-{i}") for i in range(4)])
        await wait_for(lambda: len(toy.seen) == 4, what="all handled")
        infos = [await publisher.js.consumer_info("SESSIONS", f"{name}-c-p{i}") for i in (0, 1)]
        assert all(i.config.durable_name for i in infos)


async def test_with_one_lease_the_partitioned_consumers_are_claimed_together(
    own_nats: EmbeddedNats, node: str
) -> None:
    """`one_lease`: partition i of each leased consumer is claimed by one replica, as one
    lease group the service is told of; the daemon is ready once the group is bound."""
    name = f"toy-{uuid.uuid4().hex[:8]}"
    bus_settings = BusSettings(url=own_nats.url, partitions=2)
    async with running(declare(name, one_lease=True), bus_settings) as (_, toy, publisher):
        assert isinstance(toy.group, PartitionedConsumer)
        assert toy.group.owns("any-key")  # the one replica holds every partition
        await publisher.publish_many([_activity(node, f"pod-{i}") for i in range(4)])
        await wait_for(lambda: len(toy.seen) == 4, what="all handled")
        for durable in (f"{name}-c-p0", f"{name}-c-p1", f"{name}-c-idle-p0", f"{name}-c-idle-p1"):
            assert (await publisher.js.consumer_info("SESSIONS", durable)).config.durable_name
