"""Running one agent or service in the foreground from a command (`nodeward agent NAME`,
`nodeward service NAME`, and a service's own command that runs its daemon). Typer only at
import: the daemon's code loads when it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import typer

from nodeward.cli.common import CliError


def daemon_logging(ctx: typer.Context, settings: Any) -> None:
    """A daemon logs at the config's `log.level` (info: its start facts show) and in its
    `log.format`, unless `--log-level` says otherwise."""
    from nodeward.logs import configure_logging

    explicit = ctx.find_root().params.get("log_level")
    configure_logging(explicit or settings.log.level, settings.log.format)


def run_daemon(
    ctx: typer.Context, kind: Literal["agent", "service"], name: str, settings: Any
) -> None:
    """Run the registered agent or service `name` until SIGTERM/SIGINT; what stops it
    (a port in use, no cluster, no NATS) in one line, the traceback only when debugging."""
    from nodeward.platform import standalone
    from nodeward.plugin import PluginError

    daemon_logging(ctx, settings)
    try:
        build = standalone(kind, name).build
    except (LookupError, PluginError) as exc:
        raise CliError(str(exc)) from None
    run_built(ctx, build, settings)


def run_built(ctx: typer.Context, build: Callable[[Any], Awaitable[Any]], settings: Any) -> None:
    """Build one daemon from `settings` and serve it until SIGTERM/SIGINT; what stops it in
    one line, the traceback only when debugging."""
    from nodeward.bus import BusError
    from nodeward.daemon import DaemonError, serve
    from nodeward.kube.errors import KubeError

    async def run() -> None:
        await serve([await build(settings)], handle_signals=True)

    try:
        asyncio.run(run())
    except (DaemonError, KubeError, BusError) as exc:
        if ctx.find_root().params.get("log_level") == "debug":
            raise
        raise CliError(" ".join(str(exc).split()) or type(exc).__name__) from None
