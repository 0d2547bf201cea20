"""What the maintenance (checkpoint) service adds to `nodeward status` and the console: each
node's latest maintenance (`MaintenanceState` in KV) and the marks it holds for it.

Light to import (`nodeward status` loads it): the schemas and the runtime's views only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from nodeward.bus.snapshot import Reads
from nodeward.config import Settings
from nodeward.durations import ago, clock
from nodeward.views import (
    BucketView,
    Cell,
    MarkHeld,
    Row,
    Shown,
    Table,
    TableRow,
    marks_held,
    records,
)
from schemas.state.marks import intents
from services.maintenance.state import MAINTENANCES, MaintenanceState

SECTION = "maintenance"
DEFAULTS = {"maintenance": None}


class MaintenanceView(BaseModel):
    """A node's maintenance as the picture shows it (`status --json`: the node's
    `maintenance`)."""

    maintenance_id: str
    phase: str
    active: bool = Field(description="not done or failed yet")
    reason: str
    requested_by: str | None
    requested_at: datetime
    start_at: datetime
    started_at: datetime | None
    deadline_at: datetime | None
    finished_at: datetime | None
    cordoned: bool = Field(description="nodeward cordoned the node for it")
    dry_run: bool
    pods: dict[str, str] = Field(
        description="namespace/pod -> its plan's status, or its move's (`moved to NODE`)"
    )
    scope: list[str] | None = Field(
        default=None, description="the only pods it drains (`namespace/pod`); None: all"
    )
    failures: list[str]
    error: str | None


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def maintenance(state: MaintenanceState) -> MaintenanceView:
    return MaintenanceView(
        maintenance_id=state.maintenance_id,
        phase=state.phase.value,
        active=not state.terminal,
        reason=state.reason,
        requested_by=state.requested_by,
        requested_at=_aware(state.requested_at),
        start_at=_aware(state.start_at),
        started_at=state.started_at,
        deadline_at=state.deadline_at(),
        finished_at=state.finished_at,
        cordoned=state.cordoned,
        dry_run=state.dry_run,
        pods={key: plan.shown for key, plan in sorted(state.pods.items())},
        scope=sorted(keys) if (keys := state.scope_keys()) is not None else None,
        failures=state.failures,
        error=state.error,
    )


def _detail(node: str, m: MaintenanceView, now: datetime) -> list[Row]:
    """`status --node`: the maintenance in a line, then its pods' plans and its failures."""
    section = f"maintenance {m.maintenance_id}"
    text = (
        m.phase
        + (" (dry run)" if m.dry_run else "")
        + f", requested {ago(m.requested_at, now)} by {m.requested_by or '?'}"
        + (f": {m.reason}" if m.reason else "")
        + (
            f"; pods out by {clock(m.deadline_at, now)}"
            if m.active and m.deadline_at
            else f"; finished {ago(m.finished_at, now)}"
            if m.finished_at
            else ""
        )
        + ("; nodeward cordoned the node" if m.cordoned else "")
    )
    severity = "warning" if m.active or m.cordoned else "info"
    out = [Row(section=section, node=node, text=text, severity=severity)]
    out += [Row(section=section, node=node, text=f"{p}: {plan}") for p, plan in m.pods.items()]
    out += [
        Row(section=section, node=node, text=f"failure: {f}", severity="critical")
        for f in m.failures
    ]
    return out


def shown(
    states: Mapping[str, MaintenanceState],
    marks: Sequence[MarkHeld],
    now: datetime,
    *,
    node: str | None = None,
) -> Shown:
    """The picture's part from the records read (`states` by node), pure; with `node` its
    detail too."""
    out = Shown(defaults=dict(DEFAULTS))
    views = {name: maintenance(s) for name, s in states.items()}
    marked = {m.node for m in marks}
    table = Table(
        section=SECTION,
        title="maintenance",
        columns=["node", "phase", "requested", "pods out by", "pods", "reason"],
    )
    for name in sorted(views):
        m = views[name]
        out.parts[name] = {"maintenance": m}
        out.pods[name] = list(m.pods)
        if m.active:
            dry = " (dry run)" if m.dry_run else ""
            out.needs_look(SECTION, name, "warning", f"maintenance {m.phase}{dry}", 1)
        elif m.phase == "failed":
            why = m.error or "; ".join(m.failures) or "?"
            out.needs_look(SECTION, name, "critical", f"maintenance failed: {why}", 1)
        if m.active or m.phase == "failed":
            out.cells.append(
                Cell(node=name, column="marks", text=f"maintenance {m.phase}", severity="warning")
            )
        if m.active:
            out.cells.append(
                Cell(node=name, column="badge", text="maintenance", severity="warning")
            )
        if m.active or m.phase == "failed" or name in marked:
            table.rows.append(
                TableRow(
                    node=name,
                    cells=[
                        name,
                        m.phase
                        + (" (dry run)" if m.dry_run else "")
                        + (", cordoned" if m.cordoned else ""),
                        f"{ago(m.requested_at, now)} by {m.requested_by or '?'}",
                        (
                            f"finished {ago(m.finished_at, now)}"
                            if not m.active
                            else clock(m.deadline_at, now)
                        ),
                        str(len(m.pods)),
                        m.reason,
                    ],
                )
            )
    for mark in marks:
        out.marks.append(mark)
        out.cells.append(
            Cell(node=mark.node, column="badge", text="maintenance", severity="warning")
        )
        held = views.get(mark.node)
        if held is not None and held.active:
            if mark.cordon:
                out.cells.append(
                    Cell(node=mark.node, column="marks", text="cordoned", severity="warning")
                )
            continue  # its attention is the maintenance's, with its phase
        after = f" (maintenance {held.phase})" if held is not None else ""
        out.held(mark, SECTION, "warning", rank=1, after=after)
    if node is not None:
        mine = views.get(node)
        if mine is not None:
            out.rows.extend(_detail(node, mine, now))
        else:
            out.tables.append(
                Table(section=SECTION, title="", columns=[], empty="maintenance: none")
            )
    elif table.rows:
        out.tables.append(table)
    return out


async def read(reads: Reads, bucket: str, node: str | None, now: datetime) -> Shown:
    """The service's part, from its maintenances and marks in `bucket`."""
    marks = intents(bucket)
    wanted = [
        MAINTENANCES.key(node) if node else MAINTENANCES.prefix,
        marks.key(node) if node else marks.prefix,
    ]
    raw = await reads.kv(bucket, wanted) or {}
    states = {s.node: s for s in records(MAINTENANCES, raw).values()}
    return shown(states, marks_held(bucket, raw), now.astimezone(UTC), node=node)


def view(settings: Settings) -> BucketView:
    """Its view, reading the bucket the service is configured with: the service's settings
    section is `checkpoint`, its daemon's name."""
    return BucketView.of(settings, "checkpoint", MAINTENANCES.name, read)
