"""`nodeward status`: the fleet table (rich on a terminal) or one JSON object."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from nodeward.cli.common import bucket_name, connect_nats, echo_json
from nodeward.config import Settings
from nodeward.endpoints import DEFAULT_STATE_DIR
from nodeward.fleet_status import HEALTH_ORDER, FleetStatus, gather_status
from schemas.state.breaker import SHARED
from schemas.state.cordon import NODES, TAINT_KEY

_HEALTH_STYLE: Mapping[str, str] = MappingProxyType(
    {"failed": "bold red", "degraded": "yellow", "unknown": "dim", "healthy": "green"}
)


async def status(
    settings: Settings,
    *,
    as_json: bool,
    actions: int,
    agent_timeout: timedelta,
    state_dir: Path = DEFAULT_STATE_DIR,
) -> None:
    nc = await connect_nats(settings, "cli/status", state_dir)
    try:
        fleet = await gather_status(
            nc,
            nats_url=settings.bus.url,
            actions=actions,
            agent_timeout=agent_timeout,
            bucket=bucket_name(settings, "cordon", NODES),
            breaker_bucket=str(
                ((settings.services.get("cordon") or {}).get("breaker") or {}).get("bucket")
                or SHARED.name
            ),
        )
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    if as_json:
        echo_json(fleet.model_dump(mode="json"))
    else:
        Console(soft_wrap=False).print(render(fleet))


def render(fleet: FleetStatus) -> RenderableType:
    """Nodes, quarantines, the breaker, the DLQ and recent actions, one block each."""
    parts: list[RenderableType] = []
    nodes = Table(title=f"nodeward fleet at {fleet.nats_url}", title_justify="left")
    for col in ("node", "health", "GPUs", "agent", "quarantine"):
        nodes.add_column(col)
    for n in fleet.nodes:
        if n.agent_seen_at is None:
            agent = Text("-", style="dim")
        else:
            age = format_age((fleet.at - n.agent_seen_at).total_seconds())
            agent = Text(
                f"live ({age} ago)" if n.agent_live else f"silent {age}",
                style="green" if n.agent_live else "red",
            )
        q = n.quarantine
        quarantine = (
            Text(f"{'DRY-RUN ' if q.dry_run else ''}{q.phase} {format_age(q.age_s)}", style="red")
            if q
            else Text("-", style="dim")
        )
        nodes.add_row(
            n.name,
            Text(n.health, style=_HEALTH_STYLE.get(n.health, "")),
            gpu_summary(n.gpus),
            agent,
            quarantine,
        )
    if not fleet.nodes:
        nodes.add_row("(no node has reported yet)", "", "", "", "")
    parts.append(nodes)

    if fleet.quarantined:
        table = Table(title="quarantines", title_justify="left")
        for col in ("node", "age", "rule", "reason", "marks"):
            table.add_column(col)
        for node in fleet.quarantined:
            q = node.quarantine
            assert q is not None
            marks = ", ".join(
                [
                    *(f"taint {TAINT_KEY}:{t}" for t in q.taints),
                    *(["cordoned"] if q.cordoned else []),
                ]
            )
            table.add_row(node.name, format_age(q.age_s), q.rule, q.reason, marks or q.phase)
        parts.append(table)

    b = fleet.breaker
    breaker = (
        Text(f"circuit breaker: OPEN (tripped {b.trips}x) — {b.reason}", style="bold red")
        if b.open
        else Text(f"circuit breaker: closed ({b.admitted} admitted in the window)", style="green")
    )
    parts.append(breaker)

    if fleet.dlq:
        total = sum(fleet.dlq.values())
        parts.append(Text(f"DLQ: {total} held", style="yellow"))
        for subject, held in fleet.dlq.items():
            parts.append(Text(f"  {subject}  {held}"))
    else:
        parts.append(Text("DLQ: empty", style="green"))

    if fleet.recent_actions:
        table = Table(title=f"last {len(fleet.recent_actions)} actions", title_justify="left")
        for col in ("age", "action", "target", "outcome", "reason"):
            table.add_column(col)
        for a in fleet.recent_actions:
            table.add_row(
                format_age((fleet.at - a.time).total_seconds()),
                a.action,
                a.target,
                f"{a.outcome}{' (dry run)' if a.dry_run and a.outcome != 'dry_run' else ''}",
                a.reason,
            )
        parts.append(table)
    else:
        parts.append(Text("no actions recorded", style="dim"))
    for note in fleet.notes:
        parts.append(Text(note, style="yellow"))
    if fleet.missing:
        parts.append(Text(f"not found on this server: {', '.join(fleet.missing)}", style="dim"))
    return Group(*parts)


def format_age(seconds: float) -> str:
    """`42s`, `3m05s`, `2h10m`, `3d4h`: short enough for a table cell."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def gpu_summary(gpus: dict[str, str]) -> str:
    """`8/8 healthy`, or the counts per state with the unhealthy GPUs named."""
    if not gpus:
        return "-"
    healthy = sum(1 for s in gpus.values() if s == "healthy")
    if healthy == len(gpus):
        return f"{healthy}/{len(gpus)} healthy"
    parts = [f"{healthy}/{len(gpus)} healthy"]
    for state in HEALTH_ORDER[:-1]:
        keys = [k for k, s in gpus.items() if s == state]
        if keys:
            parts.append(f"{state}: {', '.join(keys)}")
    return "; ".join(parts)
