"""The capacity service's command: `nodeward capacity`, named in its plugin
(`services.capacity.SERVICE`). Typer only at import: what it runs (`services.capacity.show`:
nats, rich, the schemas) loads when it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from nodeward.cli.common import defer_websocket_client, settings_for
from nodeward.cli.options import ConfigOpt, JsonObjectOpt, NatsOpt, StateDirOpt
from nodeward.endpoints import DEFAULT_STATE_DIR


def capacity(  # noqa: PLR0917 - typer maps parameters to options
    model: Annotated[
        str | None, typer.Option("--model", help="only this GPU model (part of it: H100)")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="only this profile: gpu, or MIG 1g.10gb")
    ] = None,
    request: Annotated[
        list[str] | None,
        typer.Option(
            "--request",
            help="RESOURCE=COUNT (nvidia.com/gpu=4): does such a pod fit now, and where? "
            "Exit 0 if it fits, 3 if not",
        ),
    ] = None,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonObjectOpt = False,
) -> None:
    """Free GPUs per model and MIG profile, per node and in total; with --request, whether
    a pod asking that many fits now and on which nodes."""
    import asyncio

    defer_websocket_client()
    from services.capacity.show import capacity as do_capacity
    from services.capacity.show import parse_request

    for spec in request or []:
        try:
            parse_request(spec)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--request") from None
    code = asyncio.run(
        do_capacity(
            settings_for(config, nats, state_dir),
            as_json=as_json,
            model=model,
            profile=profile,
            requests=list(request or []),
            state_dir=state_dir,
        )
    )
    if code:
        raise typer.Exit(code)
