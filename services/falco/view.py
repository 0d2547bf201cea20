"""What the falco service adds to `nodeward status` and the console: the pods it isolated
(from the audit trail) and the nodes it marked (its cordon's intents in its marks bucket).

Light to import (`nodeward status` loads it): the schemas and the runtime's views only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import Reads, Stored
from nodeward.config import Settings
from nodeward.durations import ago
from nodeward.views import Cell, MarkHeld, Shown, Table, TableRow, decoded, marks_held
from schemas.remediation import Outcome, Remediation
from schemas.state.marks import FALCO_MARKS, intents

SECTION = "falco"
DEFAULTS: dict[str, list[object]] = {"isolated": []}
ISOLATE = "isolate"
UNDO_ACTIONS = frozenset({"release", "unisolate", "lift"})
"""Actions on an isolated pod that end its isolation, when applied (or any undone one)."""
AUDIT = ("AUDIT", f"remediation.{ISOLATE}.>")


class IsolatedPod(BaseModel):
    pod: str = Field(description="namespace/name")
    node: str | None
    since: datetime
    rule: str | None = Field(description="the Falco rule")
    reason: str
    dry_run: bool


def _pod(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _another_pod(isolation: Remediation, later: Remediation) -> bool:
    """`later` is about another pod of the isolated one's name (another uid): a successor
    (a StatefulSet's, a pod made again), not the pod that was isolated."""
    was, now = isolation.details.get("pod_uid"), later.details.get("pod_uid")
    return bool(was and now and was != now)


async def isolations(reads: Reads) -> tuple[list[IsolatedPod], list[str]]:
    """Pods whose newest isolate decision was applied, unless a later decision on the same
    pod undid it or was about another pod of its name (another `pod_uid`); with the streams
    not found.

    The falco service keeps the newest decision true: when an isolated pod is gone from the
    API, replaced, ended or unlabelled by someone else, it audits the end on the same
    subject (outcome skipped, guard `pod_gone` or `label_removed`)."""
    got = await reads.last(AUDIT[0], [AUDIT[1]])
    if got is None:
        return [], ["stream AUDIT"]
    isolated: dict[str, tuple[Stored, Remediation]] = {}
    for m, event in decoded(got):
        data = event.data
        if isinstance(data, Remediation) and data.outcome in (Outcome.APPLIED, Outcome.DRY_RUN):
            isolated[m.subject.split(".", 2)[2]] = (m, data)
    if isolated:
        later = await reads.last(AUDIT[0], [f"remediation.*.{t}" for t in sorted(isolated)])
        for m, event in decoded(later or []):
            t = m.subject.split(".", 2)[2]
            data = event.data
            if t not in isolated or not isinstance(data, Remediation):
                continue
            if m.seq > isolated[t][0].seq and (
                data.outcome == Outcome.UNDONE
                or (data.action in UNDO_ACTIONS and data.outcome == Outcome.APPLIED)
                or _another_pod(isolated[t][1], data)
            ):
                del isolated[t]
    out = []
    for m, data in isolated.values():
        node = data.details.get("node") or data.details.get("hostname")
        out.append(
            IsolatedPod(
                pod=_pod(data.target.namespace, data.target.name),
                node=str(node) if node else None,
                since=m.time,
                rule=data.details.get("falco_rule") or data.policy,
                reason=data.reason,
                dry_run=data.outcome == Outcome.DRY_RUN,
            )
        )
    return out, []


def _table(isolated: Sequence[IsolatedPod], now: datetime) -> Table:
    return Table(
        section=SECTION,
        title="pods isolated by Falco",
        columns=["pod", "node", "since", "rule"],
        rows=[
            TableRow(
                node=i.node,
                severity="critical",
                cells=[
                    i.pod,
                    i.node or "?",
                    ago(i.since, now) + (" (dry run)" if i.dry_run else ""),
                    i.rule or "-",
                ],
            )
            for i in isolated
        ],
    )


def shown(
    isolated: Sequence[IsolatedPod],
    marks: Sequence[MarkHeld],
    now: datetime,
    *,
    node: str | None = None,
) -> Shown:
    """The picture's part from what was read, pure; with `node`, that node's alone."""
    if node is not None:
        isolated = [i for i in isolated if i.node == node]
    out = Shown(defaults=dict(DEFAULTS))
    by_node: dict[str, list[IsolatedPod]] = {}
    for i in sorted(isolated, key=lambda i: i.pod):
        by_node.setdefault(i.node or "", []).append(i)
    for name, pods in by_node.items():
        if not name:
            continue  # on no node it names: not shown
        out.parts[name] = {"isolated": pods}
        out.pods[name] = [i.pod for i in pods]
        out.needs_look(SECTION, name, "critical", f"{len(pods)} pod(s) isolated by Falco", 0)
        out.cells.append(
            Cell(node=name, column="pods", text=f"{len(pods)} isolated", severity="critical")
        )
        out.cells.append(Cell(node=name, column="badge", text="falco", severity="critical"))
    for mark in marks:
        out.marks.append(mark)
        out.cells.append(Cell(node=mark.node, column="badge", text="falco", severity="critical"))
        out.held(mark, SECTION, "critical", rank=0)
    ordered = [i for name, pods in by_node.items() if name for i in pods]
    if ordered:
        out.tables.append(_table(ordered, now))
    elif node is not None:
        out.tables.append(Table(section=SECTION, title="", columns=[], empty="isolated pods: none"))
    return out


@dataclass(frozen=True)
class FalcoView:
    """The view: the audit trail's isolations, and the marks bucket it is configured with."""

    marks_bucket: str = FALCO_MARKS.name

    def watched(self) -> Sequence[Watched]:
        return [Watched.bucket(self.marks_bucket), Watched("AUDIT", ("remediation.>",))]

    async def read(self, reads: Reads, *, node: str | None, now: datetime) -> Shown:
        marks = intents(self.marks_bucket)
        raw = await reads.kv(self.marks_bucket, [marks.key(node) if node else marks.prefix])
        isolated, missing = await isolations(reads)
        out = shown(
            isolated, marks_held(self.marks_bucket, raw or {}), now.astimezone(UTC), node=node
        )
        out.missing.extend(missing)
        return out


def view(settings: Settings) -> FalcoView:
    configured = (settings.services.get("falco") or {}).get("marks_bucket")
    return FalcoView(marks_bucket=str(configured or FALCO_MARKS.name))
