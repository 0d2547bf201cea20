"""How daemons are assembled: bus and acting daemons, components for `nodeward up`, standalones,
and the embedded bus (`nodeward bus`). `launch.up` composes these into the whole platform."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import ClusterSettings, Settings
from nodeward.daemon import Daemon, install_signal_handlers
from nodeward.kube import Access, Cluster
from nodeward.metrics import at_zero
from nodeward.plugin import names, resolve, service, services
from schemas.registry import types_on


class BusNotAnswering(RuntimeError):
    """What `/readyz` says of a bus that does not answer."""


async def bus_daemon(
    name: str,
    settings: Settings,
    *,
    source: str,
    provision: bool | None = None,
    consumers: int = 0,
    publishes: Iterable[str] = (),
) -> tuple[Daemon, Bus]:
    """A daemon with its bus connection: readiness follows the connection, shutdown drains it.

    `provision=False` for node agents: they publish, and have no rights to create streams.
    `consumers`: how many consumers the daemon runs; it is not ready until all are bound
    (its consume tasks start after `start()`, so an empty list is not "all bound").
    `publishes`: the subjects it may publish on (its NATS grants);
    `nodeward_publish_failures_total` starts at 0 for each event type they carry.
    """
    daemon = Daemon(name, settings.daemon)
    at_zero(daemon.metrics.publish_failures, type=types_on(publishes))
    bus_settings = settings.bus
    if provision is not None:
        bus_settings = bus_settings.model_copy(update={"provision": provision})
    bus = await Bus.connect(bus_settings, source=source, metrics=daemon.metrics)

    def answering() -> bool:
        if (problem := bus.not_answering()) is not None:
            raise BusNotAnswering(problem)
        return True

    daemon.add_readiness_check("bus", answering)
    daemon.add_task(bus.watch, name="bus.watch")
    daemon.add_readiness_check(
        "consumers",
        lambda: len(bus.consumers) >= consumers and all(c.bound for c in bus.consumers),
    )
    daemon.add_shutdown_hook(
        lambda: bus.close(grace=settings.daemon.shutdown_timeout.total_seconds() / 2)
    )
    return daemon, bus


async def acting_daemon(
    name: str,
    settings: Settings,
    *,
    source: str,
    access: Access,
    consumers: int = 1,
    publishes: Iterable[str] = (),
) -> tuple[Daemon, Bus, Cluster]:
    """A service's daemon with its bus and its cluster port, which allows only what the
    service declares in `access` (its package's `access.py`); `consumers` and `publishes`
    as `bus_daemon`'s.

    On shutdown the consumers drain first (their handlers use the cluster), then the
    cluster client closes.
    """
    daemon, bus = await bus_daemon(
        name, settings, source=source, consumers=consumers, publishes=publishes
    )
    cluster = Cluster.connect(settings.cluster, access=access)
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
    identities: Callable[[str | None], ClusterSettings] | None = None
    """Cluster credentials per ServiceAccount, when `up` runs the sim cluster."""
    endpoints: dict[str, Any] = field(default_factory=dict)
    """Fields of `endpoints.json` a component adds while it builds (the Falco ingest URL)."""

    def settings_for(self, service: str) -> Settings:
        """Settings whose cluster credentials are `service`'s own ServiceAccount."""
        if self.identities is None:
            return self.settings
        return self.settings.model_copy(update={"cluster": self.identities(service)})


@dataclass(frozen=True)
class Component:
    """An agent or service `nodeward up` runs: a name and how to build its daemons.

    A service names its component in its plugin (`nodeward.plugin`); the composition
    root's other components register in the `nodeward.components` entry point group. The
    runtime never imports `agents/` or `services/` (they import it).
    """

    name: str
    build: Callable[[UpContext], Awaitable[list[Daemon]]]


def components() -> list[Component]:
    """Every registered service's component and every other registered component, in
    name order."""
    found = [(p.name, p.ref(p.component), resolve(p.ref(p.component))) for p in services()]
    found += [(e.name, e.value, e.load()) for e in entry_points(group="nodeward.components")]
    for name, ref, component in found:
        if not isinstance(component, Component):
            raise TypeError(f"{name} ({ref}) is not a nodeward Component")
    return [c for _, _, c in sorted(found, key=lambda f: f[0])]


@dataclass(frozen=True)
class Standalone:
    """How `nodeward agent NAME` / `nodeward service NAME` runs one daemon on its own.

    Named by a service's plugin, or registered in the `nodeward.agents` group. `admin`
    holds one-shot operator commands (e.g. `reset-breaker`), each returning what it did.
    """

    build: Callable[[Settings], Awaitable[Daemon]]
    admin: Mapping[str, Callable[[Settings], Awaitable[str]]] = field(default_factory=dict)


def standalone_names(kind: Literal["agent", "service"]) -> list[str]:
    if kind == "service":
        return names()
    return sorted(e.name for e in entry_points(group="nodeward.agents"))


def standalone(kind: Literal["agent", "service"], name: str) -> Standalone:
    """What `nodeward agent|service NAME` runs; LookupError if nothing is registered as
    `name`, PluginError if its plugin does not load."""
    if kind == "service":
        plugin = service(name)
        ref = plugin.ref(plugin.standalone)
    else:
        refs = {e.name: e.value for e in entry_points(group="nodeward.agents")}
        if name not in refs:
            known = ", ".join(sorted(refs)) or "none"
            raise LookupError(f"no agent named {name!r} (known: {known})")
        ref = refs[name]
    found = resolve(ref)
    if not isinstance(found, Standalone):
        raise TypeError(f"{kind} {name} ({ref}) is not a nodeward Standalone")
    return found


async def wait_for_signal() -> None:
    stop = asyncio.Event()
    remove = install_signal_handlers(lambda _: stop.set())
    try:
        await stop.wait()
    finally:
        remove()


async def run_bus(state_dir: Path, port: int, announce: Callable[[str], None]) -> None:
    """Embedded nats-server with every stream provisioned, until SIGINT/SIGTERM."""
    server = EmbeddedNats(state_dir / "nats", port=port, dies_with_parent=True)
    await server.start()
    try:
        from nodeward.config import BusSettings

        bus = await Bus.connect(BusSettings(url=server.url), source="nodeward/bus")
        await bus.close(grace=1)
        announce(server.url)
        await wait_for_signal()
    finally:
        await server.stop()
