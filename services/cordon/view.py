"""What the cordon service adds to `nodeward status` and the console: each node's quarantine
(its `NodeRecord` in KV), the marks it holds, the GPU states it last acted on, and its
circuit breaker's older record.

Light to import (`nodeward status` loads it): the schemas and the runtime's views only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import Reads
from nodeward.config import Settings
from nodeward.durations import format_age
from nodeward.views import Cell, MarkHeld, Shown, Table, TableRow, marks_held, records
from schemas.state.breaker import SHARED, BreakerState
from schemas.state.cordon import BREAKER, NODES, TAINT_KEY, NodeRecord
from schemas.state.marks import intents

SECTION = "quarantines"


class Quarantined(BaseModel):
    """A node's quarantine as the picture shows it (`status --json`: the node's `quarantine`)."""

    reason: str
    rule: str
    gpus: list[str]
    since: datetime
    age_s: float
    phase: str
    dry_run: bool
    cordoned: bool
    taints: list[str]


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def quarantined(record: NodeRecord, now: datetime) -> Quarantined | None:
    q = record.quarantine
    if q is None:
        return None
    since = _aware(q.started_at)
    return Quarantined(
        reason=q.reason,
        rule=q.rule,
        gpus=q.gpus,
        since=since,
        age_s=max((now - since).total_seconds(), 0.0),
        phase="applied",  # recorded once applied; its progress is the kernel's intent
        dry_run=q.dry_run,
        cordoned=q.cordoned,
        taints=q.taints,
    )


def shown(
    nodes: Mapping[str, NodeRecord],
    marks: Sequence[MarkHeld],
    now: datetime,
) -> Shown:
    """The picture's part from the records read: pure, so it is tested without a server."""
    out = Shown(defaults={"quarantine": None, "last_decision": None})
    table = Table(
        section=SECTION,
        title="quarantines",
        columns=["node", "age", "rule", "reason", "marks"],
    )
    for name in sorted(nodes):
        record = nodes[name]
        q = quarantined(record, now)
        out.parts[name] = {"quarantine": q, "last_decision": record.last_decision}
        if record.gpus:
            out.gpus[name] = {k: g.state.value for k, g in record.gpus.items()}
        if q is None:
            continue
        dry = "dry run, " if q.dry_run else ""
        out.needs_look(SECTION, name, "critical", f"quarantined ({dry}{q.phase})", 0)
        word = f"quarantine {'DRY-RUN ' if q.dry_run else ''}{q.phase} {format_age(q.age_s)}"
        out.cells.append(Cell(node=name, column="marks", text=word, severity="critical"))
        out.cells.append(Cell(node=name, column="badge", text="quarantined", severity="critical"))
        if q.cordoned:
            out.cells.append(Cell(node=name, column="badge", text="cordoned"))
        held = ", ".join(
            [*(f"taint {TAINT_KEY}:{t}" for t in q.taints), *(["cordoned"] if q.cordoned else [])]
        )
        table.rows.append(
            TableRow(
                node=name,
                cells=[name, format_age(q.age_s), q.rule, q.reason, held or q.phase],
            )
        )
    for mark in marks:
        out.marks.append(mark)
        if nodes.get(mark.node, NodeRecord()).quarantine is not None:
            continue  # said with the quarantine
        out.held(mark, SECTION, "warning", rank=1)
    if table.rows:
        out.tables.append(table)
    return out


@dataclass(frozen=True)
class CordonView:
    """The view, reading the bucket the cordon service is configured with."""

    bucket: str = NODES.name
    breaker: str = SHARED.name
    """The shared circuit breaker's bucket, as the service is configured: read here only when
    renamed (the runtime reads the declared one)."""

    def watched(self) -> Sequence[Watched]:
        renamed = [Watched.bucket(self.breaker)] if self.breaker != SHARED.name else []
        return [Watched.bucket(self.bucket), *renamed]

    async def _breaker(self, reads: Reads) -> BreakerState | None:
        if self.breaker == SHARED.name:
            return None
        return records(SHARED, await reads.kv(self.breaker, [SHARED.prefix]) or {}).get("")

    async def read(self, reads: Reads, *, node: str | None, now: datetime) -> Shown:
        marks = intents(self.bucket)
        wanted = [
            NODES.key(node) if node else NODES.prefix,
            BREAKER.prefix,
            marks.key(node) if node else marks.prefix,
        ]
        raw = await reads.kv(self.bucket, wanted)
        if raw is None:
            return Shown(
                missing=[f"KV {self.bucket}"], defaults={"quarantine": None, "last_decision": None}
            )
        out = shown(records(NODES, raw), marks_held(self.bucket, raw), now.astimezone(UTC))
        out.breaker = await self._breaker(reads)
        out.breaker_before = records(BREAKER, raw).get("")
        return out


def view(settings: Settings) -> CordonView:
    section = settings.services.get("cordon") or {}
    breaker = (section.get("breaker") or {}).get("bucket")
    return CordonView(
        bucket=str(section.get("bucket") or NODES.name), breaker=str(breaker or SHARED.name)
    )
