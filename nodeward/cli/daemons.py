"""Running one agent or service in the foreground from a command (`nodeward agent NAME`,
`nodeward service NAME`, and a service's own command that runs its daemon). Typer only at
import: the daemon's code loads when it runs."""

from __future__ import annotations

import asyncio
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
    from nodeward.bus import BusError
    from nodeward.daemon import DaemonError
    from nodeward.kube.errors import KubeError
    from nodeward.platform import run_standalone, standalone
    from nodeward.plugin import PluginError

    daemon_logging(ctx, settings)
    try:
        standalone(kind, name)
    except (LookupError, PluginError) as exc:
        raise CliError(str(exc)) from None
    try:
        asyncio.run(run_standalone(kind, name, settings))
    except (DaemonError, KubeError, BusError) as exc:
        if ctx.find_root().params.get("log_level") == "debug":
            raise
        raise CliError(" ".join(str(exc).split()) or type(exc).__name__) from None
