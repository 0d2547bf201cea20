"""What the recovery service adds to `nodeward status` and the console: where a node's
recovery stands (`RecoveryRecord` in KV), or that it was given up to a human.

An escalation holds only while the node is still under the quarantine it was for: the
view reads the cordon service's record of the node (its bucket) to tell.

Light to import (`nodeward status` loads it): the schemas and the runtime's views only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import Reads
from nodeward.config import Settings
from nodeward.views import Severity, Shown, configured, records
from schemas.state.cordon import NODES, NodeRecord
from services.recovery.state import RECOVERIES, RecoveryRecord, Step

SECTION = "recovery"
DEFAULTS = {"recovery": None}


class RecoveryView(BaseModel):
    """Where services.recovery stands with the node: a recovery under way, or the node given
    up to a human (escalated: it stays quarantined until an operator releases it)."""

    step: str
    plan: str
    incident: str
    since: datetime = Field(description="when it entered this step")
    why: str = Field(description="what the step's last entry in its history says")
    attempts: int = 0
    held: bool = Field(description="recovery's release hold is on the node")

    @property
    def escalated(self) -> bool:
        return self.step == Step.ESCALATED.value


def recovery(record: RecoveryRecord, node: NodeRecord) -> RecoveryView | None:
    """A recovery under way, or an escalation the node is still quarantined for; None once
    it is over (released, gone) or its quarantine was released."""
    if record.step in (Step.RELEASED, Step.GONE):
        return None
    q = node.quarantine
    if record.step == Step.ESCALATED and (q is None or q.incident != record.incident):
        return None  # an operator released that quarantine: the escalation is over
    said = record.history[-1].split(": ", 1)[-1] if record.history else record.reason
    return RecoveryView(
        step=record.step.value,
        plan=record.plan.value,
        incident=record.incident,
        since=datetime.fromtimestamp(record.updated_at, UTC),
        why=said,
        attempts=record.attempts,
        held=record.held,
    )


def shown(recoveries: Mapping[str, RecoveryRecord], nodes: Mapping[str, NodeRecord]) -> Shown:
    """The picture's part from the records read (both by node): pure."""
    out = Shown(defaults=dict(DEFAULTS))
    for name in sorted(recoveries):
        r = recovery(recoveries[name], nodes.get(name, NodeRecord()))
        if r is None:
            continue
        out.parts[name] = {"recovery": r}
        severity: Severity = "critical" if r.escalated else "warning"
        attention = (
            f"escalated to a human: {r.why}" if r.escalated else f"recovery ({r.plan}) {r.step}"
        )
        rank = 0 if r.escalated else 1
        out.needs_look(SECTION, name, severity, attention, rank)
    return out


@dataclass(frozen=True)
class RecoveryBoard:
    """The view: the recovery service's bucket, and the cordon service's node records."""

    bucket: str = RECOVERIES.name
    quarantines: str = NODES.name

    def watched(self) -> Sequence[Watched]:
        return [Watched.bucket(self.bucket), Watched.bucket(self.quarantines)]

    async def read(self, reads: Reads, *, node: str | None, now: datetime) -> Shown:
        raw = await reads.kv(self.bucket, [RECOVERIES.key(node) if node else RECOVERIES.prefix])
        held = {rec.node: rec for rec in records(RECOVERIES, raw or {}).values()}
        if not held:
            return Shown(defaults=dict(DEFAULTS))
        quarantines = await reads.kv(self.quarantines, [NODES.key(node) if node else NODES.prefix])
        return shown(held, records(NODES, quarantines or {}))


def view(settings: Settings) -> RecoveryBoard:
    return RecoveryBoard(
        bucket=configured(settings, "recovery", RECOVERIES.name),
        quarantines=configured(settings, "cordon", NODES.name),
    )
