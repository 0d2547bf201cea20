"""The cordon service's commands: `nodeward quarantine release|list` and `nodeward breaker
status|reset` (the cordon service answers for the shared circuit breaker).

Named in its plugin (`services.cordon.SERVICE`). `release` and `reset` are
operator controls (`nodeward.cli.controls`): requests the cordon service answers and
audits; `list` and `status` read its records in KV as `schemas.state` declares them.
Typer only at import: the bus, the schemas and nats load when a command runs.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer

from nodeward.cli.common import bucket_name, echo_json, settings_for
from nodeward.cli.controls import control, records
from nodeward.cli.options import ConfigOpt, JsonObjectOpt, NatsOpt, StateDirOpt
from nodeward.endpoints import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from schemas.state.breaker import BreakerState
    from schemas.state.cordon import NodeRecord

quarantine_app = typer.Typer(
    help="GPU quarantines: list them, release one nodeward applied.", no_args_is_help=True
)
breaker_app = typer.Typer(
    help="The circuit breaker on removing nodes from service: status, reset.",
    no_args_is_help=True,
)


def _at(ts: float | datetime | None) -> str:
    if ts is None:
        return "-"
    when = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, UTC)
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


def quarantine_lines(held: dict[str, NodeRecord]) -> list[str]:
    """One line per node with a quarantine or an operator's release."""
    lines = []
    for node, record in sorted(held.items()):
        q = record.quarantine
        if q is not None:
            marks = ", ".join(
                [*(f"taint {e}" for e in q.taints), *(["cordoned"] if q.cordoned else [])]
            )
            state: str = "dry run" if q.dry_run else "applied"
            if q.operator_released:
                state += ", taken back by hand"
            lines.append(
                f"{node:<28} quarantined since {_at(q.started_at)} [{q.rule}] ({state}) "
                f"GPUs {', '.join(q.gpus)}; {marks or 'no marks'}; incident {q.incident}"
            )
        elif record.operator_release is not None:
            r = record.operator_release
            lines.append(
                f"{node:<28} released by operator {r.operator} at {_at(r.at)} from incident "
                f"{r.incident}: {r.reason or '-'}"
            )
    return lines


@quarantine_app.command("release")
@control("cordon", "release", "NODE")
def quarantine_release() -> None:
    """Undo nodeward's quarantine of NODE (taint, cordon, label, condition); refuses a node
    nodeward did not quarantine."""


@quarantine_app.command("list")
def quarantine_list(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonObjectOpt = False,
) -> None:
    """Every node nodeward holds in quarantine (and those an operator released)."""
    from schemas.state.cordon import NODES

    settings = settings_for(config, nats, state_dir)
    found: dict[str, NodeRecord] = asyncio.run(
        records(settings, NODES, bucket_name(settings, "cordon", NODES), state_dir)
    )
    held = {n: r for n, r in found.items() if r.quarantine or r.operator_release}
    if as_json:
        echo_json({n: r.model_dump(mode="json", exclude={"gpus"}) for n, r in sorted(held.items())})
        return
    lines = quarantine_lines(held)
    for line in lines or ["no node is quarantined by nodeward"]:
        typer.echo(line)


def breaker_line(state: BreakerState) -> str:
    """The breaker in one line."""
    admitted = ", ".join(sorted(state.admitted)) or "none"
    if state.tripped_at is None:
        return f"circuit breaker closed; admitted in its window: {admitted}"
    return (
        f"circuit breaker TRIPPED at {_at(state.tripped_at)}: {state.trip_reason or '-'}; "
        f"admitted in its window: {admitted}; `nodeward breaker reset --reason R` closes it"
    )


@breaker_app.command("status")
def breaker_status(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonObjectOpt = False,
) -> None:
    """Whether the shared circuit breaker is tripped, and what it admitted in its window."""
    from schemas.state.breaker import SHARED, BreakerState

    settings = settings_for(config, nats, state_dir)
    cordon = settings.services.get("cordon") or {}
    name = str((cordon.get("breaker") or {}).get("bucket") or SHARED.name)
    found = asyncio.run(records(settings, SHARED, name, state_dir))
    state = found.get("", BreakerState())
    if as_json:
        typer.echo(state.model_dump_json())
    else:
        typer.echo(breaker_line(state))


@breaker_app.command("reset")
@control("cordon", "reset-breaker")
def breaker_reset() -> None:
    """Close a tripped circuit breaker (the cordon service answers; audited)."""
