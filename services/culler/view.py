"""What the culler adds to `nodeward status` and the console: the sessions it watches (its
`SessionRecord`s in KV), those warned with when they are stopped unless used again.

Light to import (`nodeward status` loads it): the schemas and the runtime's views only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

from nodeward.bus.snapshot import Reads
from nodeward.config import Settings
from nodeward.durations import ago, clock, format_age
from nodeward.views import BucketView, Cell, Shown, Table, TableRow, records
from services.culler.state import SESSIONS, SessionRecord

SECTION = "idle sessions"
LISTED = 20
"""At most this many warned sessions are listed under the fleet; a line says the rest."""
DEFAULTS: dict[str, list[object]] = {"sessions": []}
IDLE_AGENT = "idle"
"""The agent that reports a node's sessions' activity: it publishes only while the node has
sessions, so its silence matters only where one is warned."""


class SessionView(BaseModel):
    pod: str = Field(description="namespace/name")
    node: str | None
    state: Literal["warned", "stopped", "watched"]
    reason: str | None
    idle_since: datetime | None
    warned_at: datetime | None
    deadline: datetime | None = Field(description="when it is stopped unless used again")
    dry_run: bool
    stopped_at: datetime | None
    stop_outcome: str | None


OWN = frozenset({"pod", "state"})
"""The fields of a `SessionView` that are not its record's."""


def session_view(key: str, rec: SessionRecord) -> SessionView:
    state: Literal["warned", "stopped", "watched"] = (
        "stopped" if rec.stopped_at is not None else "warned" if rec.pending else "watched"
    )
    # Every other field is the record's own, as it is.
    copied = {name: getattr(rec, name) for name in SessionView.model_fields if name not in OWN}
    return SessionView(pod=key, state=state, **copied)


def by_pod(held: Mapping[str, SessionRecord]) -> dict[str, SessionRecord]:
    """The records by `namespace/pod`, from their key suffixes `<ns token>.<pod token>`: a
    namespace has no dot, and a pod name's dots became `_`."""
    return {
        f"{k.split('.', 1)[0]}/{k.split('.', 1)[1].replace('_', '.')}": v
        for k, v in held.items()
        if "." in k
    }


def _table(sessions: Sequence[SessionView], now: datetime, title: str) -> Table:
    rows = []
    for s in sessions:
        if s.state == "stopped":
            stop = f"stopped {ago(s.stopped_at, now)} ({s.stop_outcome or '?'})"
        elif s.deadline is not None:
            stop = clock(s.deadline, now)
        else:
            stop = "-"
        rows.append(
            TableRow(
                node=s.node,
                severity="warning" if s.state == "warned" else "info",
                cells=[
                    s.pod,
                    s.node or "?",
                    s.state
                    + (" (dry run)" if s.dry_run else "")
                    + (f": {s.reason}" if s.reason else ""),
                    ago(s.idle_since, now) if s.idle_since else "-",
                    ago(s.warned_at, now) if s.warned_at else "-",
                    stop,
                ],
            )
        )
    return Table(
        section=SECTION,
        title=title,
        columns=["session", "node", "state", "idle since", "warned", "stop at"],
        rows=rows,
    )


def shown(
    sessions: Mapping[str, SessionRecord], now: datetime, *, node: str | None = None
) -> Shown:
    """The picture's part from the records (by `namespace/pod`), pure; with `node`, that
    node's sessions alone, every one."""
    out = Shown(defaults=dict(DEFAULTS))
    by_node: dict[str, list[SessionView]] = {}
    for key, rec in sessions.items():
        if node is None or rec.node == node:
            by_node.setdefault(rec.node or "", []).append(session_view(key, rec))
    for name in sorted(by_node):
        views = sorted(by_node[name], key=lambda v: (v.deadline or now, v.pod))
        if not name:
            continue
        out.parts[name] = {"sessions": views}
        out.pods[name] = [v.pod for v in views]
        warned = [v for v in views if v.state == "warned"]
        if not warned:
            continue
        out.expects[name] = [IDLE_AGENT]
        out.needs_look(SECTION, name, "warning", f"{len(warned)} idle session(s) warned", 3)
        first = min((s.deadline for s in warned if s.deadline), default=None)
        when = f", stop in {format_age((first - now).total_seconds())}" if first else ""
        out.cells.append(
            Cell(node=name, column="pods", text=f"{len(warned)} idle{when}", severity="warning")
        )
    if node is not None:
        views = out.parts.get(node, {}).get("sessions", [])
        if views:
            out.tables.append(_table(views, now, f"sessions on {node}"))
        else:
            out.tables.append(
                Table(
                    section=SECTION, title="", columns=[], empty="sessions: none the culler holds"
                )
            )
        return out
    warned = sorted(
        (s for n, views in by_node.items() if n for s in views if s.state == "warned"),
        key=lambda s: (s.deadline or now, s.pod),
    )
    if not warned:
        out.tables.append(
            Table(section=SECTION, title="", columns=[], empty="idle sessions: none warned")
        )
        return out
    table = _table(warned[:LISTED], now, "idle sessions warned, soonest first")
    if len(warned) > LISTED:
        table.more = f"... and {len(warned) - LISTED} more warned session(s)"
    out.tables.append(table)
    return out


async def read(reads: Reads, bucket: str, node: str | None, now: datetime) -> Shown:
    """The culler's part, from its sessions in `bucket`."""
    raw = await reads.kv(bucket, [SESSIONS.prefix])
    return shown(by_pod(records(SESSIONS, raw or {})), now.astimezone(UTC), node=node)


def view(settings: Settings) -> BucketView:
    """The view, reading the bucket the culler is configured with."""
    return BucketView.of(settings, "culler", SESSIONS.name, read)
