"""The accounting service's command: `nodeward report`, named in its plugin
(`services.accounting.SERVICE`). Typer only at import: what it runs (`services.accounting.show`
and `.report`: nats, the schemas) loads when it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from nodeward.cli.common import defer_websocket_client, settings_for
from nodeward.cli.options import ConfigOpt, NatsOpt, StateDirOpt
from nodeward.endpoints import DEFAULT_STATE_DIR


def report(  # noqa: PLR0917 - typer maps parameters to options
    since: Annotated[
        str,
        typer.Option("--since", help="a duration back from now (7d, 1h) or an RFC 3339 time"),
    ],
    until: Annotated[
        str | None,
        typer.Option("--until", help="a duration back from now or an RFC 3339 time (default: now)"),
    ] = None,
    by: Annotated[
        str,
        typer.Option(
            "--by",
            help="namespace, owner, node, model (GPU model), group or experiment (the "
            "namespaces' directory labels; (unknown) without)",
        ),
    ] = "namespace",
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Energy (kWh), CO2e, GPU-hours allocated and idle, sessions warned and stopped, per
    namespace, owner, node, GPU model, group or experiment, over whole hours; gaps in the
    readings shown."""
    import asyncio
    from datetime import UTC, datetime

    defer_websocket_client()
    from nodeward.cli.replay import parse_since
    from services.accounting.show import FORMATS
    from services.accounting.show import report as do_report

    if by not in ("namespace", "owner", "node", "model", "group", "experiment"):
        raise typer.BadParameter(
            f"{by!r}: use namespace, owner, node, model, group or experiment", param_hint="--by"
        )
    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: use table, csv or json", param_hint="--format")
    now = datetime.now(UTC)
    try:
        start = parse_since(since, now)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from None
    try:
        end = parse_since(until, now) if until is not None else now
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--until") from None
    if end <= start:
        raise typer.BadParameter("must be after --since", param_hint="--until")
    asyncio.run(
        do_report(
            settings_for(config, nats, state_dir),
            since=start,
            until=end,
            by=by,  # type: ignore[arg-type]
            fmt=fmt,
            state_dir=state_dir,
        )
    )
