"""The console's daemon: one bus connection (read only), the shared picture, the web server.

`nodeward console` (and `nodeward service console`, what the chart's Deployment runs) runs it
alone; `nodeward up` runs it on a free loopback port and writes its URL to endpoints.json
(`console_url`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeward.config import ConfigError, Settings, section
from nodeward.daemon import Daemon
from nodeward.fleet_status import Buckets
from nodeward.platform import Component, Standalone, UpContext, bus_daemon
from nodeward.views import registered
from services.console.live import Live
from services.console.settings import ConsoleSettings
from services.console.web import Console, ConsoleError, check

NAME = "console"
ACTOR = "service/console"


@dataclass
class Assembled:
    daemon: Daemon
    live: Live
    console: Console


async def assemble(settings: Settings) -> Assembled:
    """The daemon with its web server already listening; the picture is read by a task, and
    the daemon is ready once it has been read whole."""
    config: ConsoleSettings = section(settings, "services", NAME, ConsoleSettings)
    try:
        token = check(config)  # before connecting anything: one line, and nothing else
    except ConsoleError as exc:
        raise ConfigError(f"services.{NAME}: {exc}") from None
    # provision=False: the console only reads, and its NATS user may create nothing.
    daemon, bus = await bus_daemon(NAME, settings, source=ACTOR, provision=False)
    live = Live(
        bus.nc,
        config,
        buckets=Buckets(),
        views=registered(settings),
        registry=daemon.metrics.registry,
    )
    console = Console(live, config, token)

    async def close() -> None:
        await console.stop()
        await live.stop()

    daemon.add_shutdown_hook(close)  # runs before the bus closes (hooks run last-added first)

    async def watch() -> None:
        await live.start()
        await live.keep()

    daemon.add_task(watch, name="picture")
    daemon.add_readiness_check("picture", live.ready.is_set)
    try:
        await console.start()
    except ConsoleError as exc:
        await bus.close(grace=1)
        raise ConfigError(f"services.{NAME}: {exc}") from None
    return Assembled(daemon, live, console)


async def build(settings: Settings) -> Daemon:
    """What `nodeward console` and `nodeward service console` run."""
    return (await assemble(settings)).daemon


async def _build_for_up(context: UpContext) -> list[Daemon]:
    """The console on a free loopback port (unless the config says otherwise)."""
    settings = context.settings
    raw = dict(settings.services.get(NAME) or {})
    raw.setdefault("port", 0)
    settings = settings.model_copy(update={"services": {**settings.services, NAME: raw}})
    assembled = await assemble(settings)
    context.endpoints["console_url"] = assembled.console.url
    return [assembled.daemon]


component = Component(NAME, _build_for_up)
standalone = Standalone(build)
