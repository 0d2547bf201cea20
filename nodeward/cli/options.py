"""The options every command line of nodeward takes alike: the runtime's commands, the
composition root's (`up`, `sim`) and those a service registers (`nodeward.cli.plugins`).

Typer only: importing this loads no client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

NatsOpt = Annotated[
    str | None,
    typer.Option(
        "--nats",
        envvar="NODEWARD_NATS_URL",
        help="NATS URL (default: a running `nodeward up`, else nats://127.0.0.1:4222)",
    ),
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML config file, a section per daemon")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON output, one object per line")]
JsonObjectOpt = Annotated[bool, typer.Option("--json", help="one JSON object")]
StateDirOpt = Annotated[
    Path,
    typer.Option(
        "--state-dir", help="where a running `nodeward up` wrote endpoints.json (to find NATS)"
    ),
]
