"""`nodeward status`: the fleet table (rich on a terminal) or one JSON object; `--node N` one
node in detail. Nodes needing attention come first; the quiet rest is one line past a dozen."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from nodeward.bus.snapshot import SnapshotError
from nodeward.cli.common import Fitted, connect_nats, echo_json, fail, table_console
from nodeward.config import Settings
from nodeward.durations import format_age
from nodeward.endpoints import DEFAULT_STATE_DIR
from nodeward.fleet_status import (
    HEALTH_ORDER,
    ActionSummary,
    Buckets,
    FleetStatus,
    GatherOptions,
    NodeReport,
    NodeStatus,
    gather_node,
    gather_status,
)
from nodeward.views import Column, Row, registered
from nodeward.views import Table as ViewTable
from schemas.state.breaker import SHARED
from schemas.state.energy import TOTALS

_HEALTH_STYLE: Mapping[str, str] = MappingProxyType(
    {"failed": "bold red", "degraded": "yellow", "unknown": "dim", "healthy": "green"}
)


QUIET_LISTED = 12
"""With more nodes than this with nothing to see, the table sums them up in one line."""


async def status(
    settings: Settings,
    *,
    as_json: bool,
    actions: int,
    agent_timeout: timedelta,
    state_dir: Path = DEFAULT_STATE_DIR,
    node: str | None = None,
    show_all: bool = False,
) -> None:
    nc = await connect_nats(settings, "cli/status", state_dir)
    options: GatherOptions = {
        "nats_url": settings.bus.url,
        "actions": actions,
        "agent_timeout": agent_timeout,
        "buckets": buckets_for(settings),
        "clock_skew": settings.bus.max_clock_skew,
        "views": registered(settings),
    }
    try:
        if node is not None:
            report = await gather_node(nc, node, **options)
        else:
            fleet = await gather_status(nc, **options)
    except SnapshotError as exc:
        fail(str(exc))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    if node is not None:
        if report is None:
            fail(f"no node {node} in what nodeward holds (GPU health, KV, energy, sessions)")
        if as_json:
            echo_json(report.model_dump(mode="json"))
        else:
            table_console().print(render_node(report))
    elif as_json:
        echo_json(fleet.model_dump(mode="json"))
    else:
        table_console().print(render(fleet, show_all=show_all))


def buckets_for(settings: Settings) -> Buckets:
    """The buckets the runtime reads itself, as configured (the declared names by default):
    the energy agent's totals (a service whose settings rename the shared circuit breaker's
    bucket reads it in its view)."""
    energy = (settings.agents.get("energy") or {}).get("bucket")
    return Buckets(breaker=SHARED.name, energy=str(energy or TOTALS.name))


IDENTIFYING = ("node", "pod", "session", "GPU", "target")
"""The columns that tell rows apart: never cut, whatever the width (the others wrap)."""
LEAST_NEEDED = ("power", "agents", "pods out by", "stop at", "since", "rule", "warned", "pods")
"""Left out, first named first, when a narrow terminal cannot hold every column readably
(`nodeward status --node NODE` shows each node whole)."""


def _whole(parts: list[RenderableType]) -> Group:
    return Group(
        *(
            Fitted(p, keep=IDENTIFYING, drop=LEAST_NEEDED) if isinstance(p, Table) else p
            for p in parts
        )
    )


def render(fleet: FleetStatus, *, show_all: bool = False) -> RenderableType:
    """Nodes needing attention first (then the rest, or one line for them), the services'
    views' tables, energy, what the views say of the fleet, the breaker, the DLQ and recent
    actions."""
    parts: list[RenderableType] = []
    attention = fleet.needing_attention()
    quiet = [n for n in fleet.nodes if not n.attention]
    listed = attention + (quiet if show_all or len(quiet) <= QUIET_LISTED else [])
    title = f"nodeward fleet at {fleet.nats_url}: {len(fleet.nodes)} node(s)"
    if attention:
        title += f", {len(attention)} needing attention"
    nodes = Table(title=title, title_justify="left")
    for col in ("node", "health", "GPUs", "marks", "pods", "power", "agents"):
        nodes.add_column(col)
    for n in listed:
        nodes.add_row(
            n.name,
            Text(n.health, style=_HEALTH_STYLE.get(n.health, "")),
            gpu_summary(n.gpus),
            marks_cell(n),
            pods_cell(n),
            power_cell(n),
            agents_cell(n),
        )
    if not fleet.nodes:
        nodes.add_row("(no node has reported yet)", "", "", "", "", "", "")
    parts.append(nodes)
    if len(listed) < len(fleet.nodes):
        parts.append(
            Text(
                f"... and {len(fleet.nodes) - len(listed)} more node(s) healthy, unmarked, "
                "agents live, nothing pending (--all lists them)",
                style="green",
            )
        )
    for table in fleet.tables:
        parts.extend(table_parts(table))
    parts.append(energy_line(fleet.nodes))
    parts.extend(rows_text(fleet.rows))
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
    parts.append(_actions(fleet.recent_actions, fleet.at))
    parts.extend(_footer(fleet.notes, fleet.missing))
    return _whole(parts)


def render_node(report: NodeReport) -> RenderableType:
    """One node: its GPUs, marks, the services' views' tables and rows about it, energy,
    agents and the recent actions on it."""
    n, at = report.node, report.at
    parts: list[RenderableType] = [
        Text.assemble(
            (f"node {n.name}: ", "bold"),
            (n.health, _HEALTH_STYLE.get(n.health, "")),
            f" at {report.nats_url}",
        ),
        Text(
            "attention: " + "; ".join(n.attention) if n.attention else "nothing to see",
            style="yellow" if n.attention else "green",
        ),
    ]
    gpus = Table(title="GPUs", title_justify="left")
    gpus.add_column("GPU")
    gpus.add_column("state")
    for key, state in n.gpus.items():
        gpus.add_row(key, Text(state, style=_HEALTH_STYLE.get(state, "")))
    if not n.gpus:
        gpus.add_row("-", "no GPU health reported")
    parts.append(gpus)
    parts.append(Text(f"marks: {marks_text(n) or 'none'}"))
    for table in report.tables:
        parts.extend(table_parts(table))
    parts.extend(rows_text(n.rows))
    parts.append(Text(f"energy: {energy_text(n) or 'none reported'}"))
    parts.append(Text(f"agents: {agents_cell(n).plain}"))
    parts.append(_actions(report.recent_actions, at, on=n.name))
    parts.extend(_footer(report.notes, report.missing))
    return _whole(parts)


def marks_text(n: NodeStatus) -> str:
    """Who holds the node, each in a word or two (the views' `marks` cells)."""
    return ", ".join(c.text for c in n.said("marks"))


def marks_cell(n: NodeStatus) -> Text:
    text = marks_text(n)
    return Text(text, style="red" if n.rank == 0 else "yellow") if text else Text("-", style="dim")


_CELL_STYLE: Mapping[str, str] = MappingProxyType(
    {"ok": "green", "info": "", "warning": "yellow", "critical": "bold red"}
)


def cells_text(n: NodeStatus, column: Column) -> Text:
    """The views' cells of one column, `; ` between, each in its severity's style."""
    cells = n.said(column)
    if not cells:
        return Text("-", style="dim")
    text = Text()
    for i, cell in enumerate(cells):
        text.append(("; " if i else "") + cell.text, style=_CELL_STYLE[cell.severity])
    return text


def pods_cell(n: NodeStatus) -> Text:
    return cells_text(n, "pods")


def table_parts(table: ViewTable) -> list[RenderableType]:
    """A view's table (its first column in its row's severity), the line under it; or its
    word for none."""
    if not table.rows:
        return [Text(table.empty, style="dim")] if table.empty else []
    drawn = Table(title=table.title, title_justify="left")
    for col in table.columns:
        drawn.add_column(col)
    for row in table.rows:
        first, *rest = row.cells
        drawn.add_row(Text(first, style=_CELL_STYLE[row.severity]), *rest)
    out: list[RenderableType] = [drawn]
    if table.more:
        out.append(Text(table.more))
    return out


def energy_text(n: NodeStatus) -> str:
    e = n.energy
    if e is None:
        return ""
    parts = []
    if e.avg_power_w is not None:
        parts.append(f"{format_power(e.avg_power_w)}")
    if e.co2e_g is not None:
        parts.append(f"{e.co2e_g:.3g} gCO2e")
    if e.interval_s:
        parts.append(f"over {format_age(e.interval_s)}")
    if e.g_per_kwh is not None:
        parts.append(f"at {e.g_per_kwh:.0f} g/kWh")
    if e.energy_total_j is not None:
        total = f"total {e.energy_total_j / 3.6e6:.3g} kWh"
        if e.co2e_total_g is not None:
            total += f", {e.co2e_total_g:.3g} gCO2e"
        parts.append(total)
    if e.degraded:
        parts.append("degraded: " + "; ".join(e.degraded))
    return " ".join(parts[:1]) + (", " + ", ".join(parts[1:]) if parts[1:] else "")


def power_cell(n: NodeStatus) -> Text:
    e = n.energy
    if e is None or e.avg_power_w is None:
        return Text("-", style="dim")
    co2 = f" {e.co2e_g:.3g} gCO2e" if e.co2e_g is not None else ""
    return Text(f"{format_power(e.avg_power_w)}{co2}", style="yellow" if e.degraded else "")


def agents_cell(n: NodeStatus) -> Text:
    """`gpu 3s energy 8s idle -`; a silent agent in red: `gpu silent 10m00s`."""
    text = Text()
    for i, (kind, seen) in enumerate(n.agents.items()):
        if i:
            text.append(" ")
        if seen.state == "never":
            text.append(f"{kind} -", style="dim")
        elif seen.state == "stale":
            text.append(f"{kind} silent {format_age(seen.age_s or 0)}", style="red")
        elif seen.state == "quiet":
            text.append(f"{kind} quiet {format_age(seen.age_s or 0)}", style="dim")
        else:
            text.append(f"{kind} {format_age(seen.age_s or 0)}", style="green")
    return text


def energy_line(nodes: list[NodeStatus]) -> Text:
    """The fleet's power and CO2e over the nodes' last intervals."""
    reporting = [n.energy for n in nodes if n.energy is not None and n.energy.avg_power_w]
    if not reporting:
        return Text("energy: no node reports power", style="dim")
    power = sum(e.avg_power_w or 0 for e in reporting)
    co2 = sum(e.co2e_g or 0 for e in reporting)
    return Text(
        f"energy: {len(reporting)} node(s) draw {format_power(power)}; "
        f"{co2:.3g} gCO2e over their last intervals"
    )


_SEVERITY_STYLE: Mapping[str, str] = MappingProxyType(
    {"ok": "green", "info": "", "warning": "yellow", "critical": "red"}
)


def rows_text(rows: list[Row]) -> list[RenderableType]:
    """The services' rows: `section: text` for a section's first, indented below it the
    rest, each in its severity's colour (a row with no text only asks for attention)."""
    out: list[RenderableType] = []
    said: set[str] = set()
    for row in rows:
        if not row.text:
            continue
        style = _SEVERITY_STYLE[row.severity]
        if row.section in said:
            out.append(Text(f"  {row.text}", style=style))
        else:
            said.add(row.section)
            out.append(Text(f"{row.section}: {row.text}", style=style))
    return out


def _actions(actions: list[ActionSummary], now: datetime, on: str | None = None) -> RenderableType:
    if not actions:
        return Text(f"no actions recorded{f' on {on}' if on else ''}", style="dim")
    title = f"last {len(actions)} actions" + (f" on {on} and its pods" if on else "")
    table = Table(title=title, title_justify="left")
    for col in ("age", "action", "target", "outcome", "reason"):
        table.add_column(col)
    for a in actions:
        table.add_row(
            format_age((now - a.time).total_seconds()),
            a.action,
            a.target,
            f"{a.outcome}{' (dry run)' if a.dry_run and a.outcome != 'dry_run' else ''}",
            a.reason,
        )
    return table


def _footer(notes: list[str], missing: list[str]) -> list[RenderableType]:
    parts: list[RenderableType] = [Text(note, style="yellow") for note in notes]
    if missing:
        parts.append(Text(f"not found on this server: {', '.join(missing)}", style="dim"))
    return parts


def format_power(watts: float) -> str:
    """`850 W`, `3.85 kW`, `1.2 MW`."""
    if watts >= 1e6:
        return f"{watts / 1e6:.3g} MW"
    if watts >= 1e3:
        return f"{watts / 1e3:.3g} kW"
    return f"{watts:.0f} W"


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
