"""Running nodeward: the embedded bus (`nodeward bus`) and the whole platform (`nodeward up`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

import structlog

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon, install_signal_handlers, serve
from nodeward.endpoints import Endpoints
from nodeward.kube import Cluster
from nodeward.sim.cluster.embedded import EmbeddedCluster, embedded_cluster
from nodeward.sim.cluster.seed import Seed, load_seed
from nodeward.sim.inject import InjectReply
from nodeward.sim.nats_server import EmbeddedNats
from nodeward.sim.scenario import Step, play


async def bus_daemon(
    name: str,
    settings: Settings,
    *,
    source: str,
    provision: bool | None = None,
    consumers: int = 0,
) -> tuple[Daemon, Bus]:
    """A daemon with its bus connection: readiness follows the connection, shutdown drains it.

    `provision=False` for node agents: they publish, and have no rights to create streams.
    `consumers`: how many consumers the daemon runs; it is not ready until all are bound
    (its consume tasks start after `start()`, so an empty list is not "all bound").
    """
    daemon = Daemon(name, settings.daemon)
    bus_settings = settings.bus
    if provision is not None:
        bus_settings = bus_settings.model_copy(update={"provision": provision})
    bus = await Bus.connect(bus_settings, source=source, metrics=daemon.metrics)
    daemon.add_readiness_check("bus", lambda: bus.connected)
    daemon.add_readiness_check(
        "consumers",
        lambda: len(bus.consumers) >= consumers and all(c.bound for c in bus.consumers),
    )
    daemon.add_shutdown_hook(
        lambda: bus.close(grace=settings.daemon.shutdown_timeout.total_seconds() / 2)
    )
    return daemon, bus


async def acting_daemon(
    name: str, settings: Settings, *, source: str, consumers: int = 1
) -> tuple[Daemon, Bus, Cluster]:
    """A service's daemon with its bus and its cluster port (as the `name` ServiceAccount).

    On shutdown the consumers drain first (their handlers use the cluster), then the
    cluster client closes.
    """
    daemon, bus = await bus_daemon(name, settings, source=source, consumers=consumers)
    cluster = Cluster.connect(settings.cluster, service=name)
    grace = settings.daemon.shutdown_timeout.total_seconds() / 2

    async def close() -> None:
        # Hooks run last-added first; closing the bus again later is harmless.
        await bus.close(grace=grace)
        await cluster.close()

    daemon.add_shutdown_hook(close)
    return daemon, bus, cluster


@dataclass(frozen=True)
class UpContext:
    """What `nodeward up` hands each component when it builds its daemons."""

    settings: Settings
    state_dir: Path
    seed: Seed | None  # the sim cluster's seed, when `up` runs the sim cluster
    cluster: EmbeddedCluster | None  # the sim cluster itself, when `up` runs it
    endpoints: dict[str, Any] = field(default_factory=dict)
    """Fields of `endpoints.json` a component adds while it builds (the Falco ingest URL)."""

    def settings_for(self, service: str) -> Settings:
        """Settings whose cluster credentials are `service`'s own ServiceAccount."""
        if self.cluster is None:
            return self.settings
        return self.settings.model_copy(update={"cluster": self.cluster.settings_for(service)})


@dataclass(frozen=True)
class Component:
    """An agent or service `nodeward up` runs: a name and how to build its daemons.

    Components register through the `nodeward.components` entry point group, so the
    runtime never imports `agents/` or `services/` (they import it).
    """

    name: str
    build: Callable[[UpContext], Awaitable[list[Daemon]]]


def components() -> list[Component]:
    """Every registered component, in name order."""
    found = []
    for entry in sorted(entry_points(group="nodeward.components"), key=lambda e: e.name):
        component = entry.load()
        if not isinstance(component, Component):
            raise TypeError(f"entry point {entry.name} is not a nodeward Component")
        found.append(component)
    return found


@dataclass(frozen=True)
class Standalone:
    """How `nodeward agent NAME` / `nodeward service NAME` runs one daemon on its own.

    Registered in the `nodeward.agents` / `nodeward.services` entry point groups. `admin`
    holds one-shot operator commands (e.g. `reset-breaker`), each returning what it did.
    """

    build: Callable[[Settings], Awaitable[Daemon]]
    admin: Mapping[str, Callable[[Settings], Awaitable[str]]] = field(default_factory=dict)


def standalone_names(kind: Literal["agent", "service"]) -> list[str]:
    return sorted(e.name for e in entry_points(group=f"nodeward.{kind}s"))


def standalone(kind: Literal["agent", "service"], name: str) -> Standalone:
    for entry in entry_points(group=f"nodeward.{kind}s"):
        if entry.name == name:
            found = entry.load()
            if not isinstance(found, Standalone):
                raise TypeError(f"entry point {kind} {name} is not a nodeward Standalone")
            return found
    known = ", ".join(standalone_names(kind)) or "none"
    raise LookupError(f"no {kind} named {name!r} (known: {known})")


async def run_standalone(kind: Literal["agent", "service"], name: str, settings: Settings) -> None:
    """One agent or service in this process until SIGTERM/SIGINT (what a Pod runs)."""
    daemon = await standalone(kind, name).build(settings)
    await serve([daemon], handle_signals=True)


async def _platform_daemon(settings: Settings) -> tuple[Daemon, Bus]:
    """The `up` process's own daemon: health of the bus it provisioned, and its metrics."""
    return await bus_daemon("platform", settings, source="nodeward/up")


def _play_scenario(daemon: Daemon, bus: Bus, scenario: list[Step], daemons: list[Daemon]) -> None:
    """Run the scenario's injections as a task of the platform daemon. Its clock starts when
    every daemon is ready (a GPU agent takes no injection before it watches its GPUs)."""
    if scenario:
        log = structlog.get_logger().bind(component="scenario")

        def report(step: Step, reply: InjectReply | None, error: str | None) -> None:
            if error is None and reply is not None and reply.ok:
                log.info("scenario.injected", node=step.node, gpu=reply.gpu, applied=reply.applied)
            else:
                log.warning(
                    "scenario.failed",
                    node=step.node,
                    error=error or (reply.error if reply else None),
                )

        async def run() -> None:
            while not all([(await d.readiness()).ready for d in daemons]):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            await play(bus.nc, scenario, on_reply=report)

        daemon.add_task(run, name="scenario")


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    remove = install_signal_handlers(lambda _: stop.set())
    try:
        await stop.wait()
    finally:
        remove()


async def run_bus(state_dir: Path, port: int, announce: Callable[[str], None]) -> None:
    """Embedded nats-server with every stream provisioned, until SIGINT/SIGTERM."""
    server = EmbeddedNats(state_dir / "nats", port=port)
    await server.start()
    try:
        from nodeward.config import BusSettings

        bus = await Bus.connect(BusSettings(url=server.url), source="nodeward/bus")
        await bus.close(grace=1)
        announce(server.url)
        await wait_for_signal()
    finally:
        await server.stop()


async def run_up(
    settings: Settings,
    state_dir: Path,
    *,
    nats_port: int = 0,
    external_nats: bool = False,
    seed: Path | Seed | None = None,
    scenario: list[Step] | None = None,
    announce: Callable[[Endpoints], None],
    story: Callable[[Endpoints], Awaitable[None]] | None = None,
) -> None:
    """The whole platform in this process until SIGINT/SIGTERM.

    Without a kubeconfig in `settings.cluster` the sim cluster runs too, and its kubeconfig
    is written to `<state-dir>/kubeconfig`. `story(endpoints)` runs as a task of the
    platform daemon once everything has started (it must not raise).
    """
    log = structlog.get_logger().bind(component="up")
    state_dir = state_dir.resolve()  # noqa: ASYNC240 - once, before anything runs
    outbox = state_dir / "outbox"
    outbox.mkdir(parents=True, exist_ok=True)
    endpoints: Endpoints | None = None
    async with contextlib.AsyncExitStack() as stack:
        if not external_nats:
            server = EmbeddedNats(state_dir / "nats", port=nats_port)
            await stack.enter_async_context(server)
            settings.bus.url = server.url
        kube_api: str | None = None
        cluster: EmbeddedCluster | None = None
        seed_data: Seed | None = None
        if settings.cluster.kubeconfig is None:
            seed_data = seed if isinstance(seed, Seed) else load_seed(seed)
            cluster = await stack.enter_async_context(embedded_cluster(state_dir, seed=seed_data))
            settings.cluster = cluster.settings_for(None)
            kube_api = cluster.url
        # The platform daemon goes first: its bus provisions the streams the others use.
        platform, platform_bus = await _platform_daemon(settings)
        daemons = [platform]
        context = UpContext(settings, state_dir, seed_data, cluster)
        for component in components():
            daemons.extend(await component.build(context))
        for d in daemons:
            await d.start()
        endpoints = Endpoints(
            nats_url=settings.bus.url,
            state_dir=state_dir,
            outbox=outbox,
            kubeconfig=settings.cluster.kubeconfig,
            kube_api=kube_api,
            metrics={d.name: d.url for d in daemons},
            **context.endpoints,
        )
        if story is not None:
            told = endpoints

            async def tell() -> None:
                await story(told)

            platform.add_task(tell, name="story")
        _play_scenario(platform, platform_bus, scenario or [], daemons)
        stack.callback(endpoints.remove)
        endpoints.write()
        log.info(
            "up.ready", nats=settings.bus.url, kube=kube_api, daemons=[d.name for d in daemons]
        )
        announce(endpoints)
        await serve(daemons, handle_signals=True)
