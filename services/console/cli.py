"""The console's command: `nodeward console`, its daemon in the foreground (what the chart's
console Deployment runs). Named in its plugin (`services.console.SERVICE`). Typer only at
import."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nodeward.cli.common import settings_for
from nodeward.cli.daemons import run_daemon
from nodeward.cli.options import ConfigOpt, NatsOpt

NAME = "console"


def console(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    nats: NatsOpt = None,
    host: Annotated[
        str | None,
        typer.Option(
            "--host", help="bind address (default 127.0.0.1; elsewhere a token is needed)"
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=0, max=65535, help="default 8480; 0 picks one")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="the viewers' token (needed off loopback)"),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """The read-only web console of the fleet, live (what the chart's console Deployment runs)."""
    settings = settings_for(config, nats)
    raw = dict(settings.services.get(NAME) or {})
    for key, value in (("host", host), ("port", port), ("token_file", token_file)):
        if value is not None:
            raw[key] = str(value) if isinstance(value, Path) else value
    settings.services[NAME] = raw
    run_daemon(ctx, "service", NAME, settings)
