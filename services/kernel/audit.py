"""Audit and notification: every decision becomes a `remediation.v1` and a `notify.v1`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from prometheus_client import Counter

from nodeward.bus import Bus
from schemas.base import make_event, utcnow
from schemas.ids import new_id, stable_id
from schemas.notify import Notification, Severity
from schemas.remediation import Outcome, Remediation
from services.kernel.proposal import Proposal

DEFAULT_SEVERITY: Mapping[Outcome, Severity] = {
    Outcome.APPLIED: Severity.CRITICAL,
    Outcome.REFUSED: Severity.CRITICAL,
    Outcome.FAILED: Severity.CRITICAL,
    Outcome.DRY_RUN: Severity.WARNING,
    Outcome.UNDONE: Severity.WARNING,
    Outcome.SKIPPED: Severity.INFO,
}


class Auditor:
    """Publishes the audit record of a decision, then the notification that points at it.

    Ids are derived from the trigger event, action, outcome and guard, so a redelivered
    trigger re-publishes the same ids and JetStream drops the duplicates.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        actor: str,
        topic: str,
        severities: Mapping[str, Mapping[Outcome, Severity]] | None = None,
    ) -> None:
        self.bus = bus
        self.actor = actor
        self.topic = topic
        self.severities = severities or {}
        self.decisions = Counter(
            "nodeward_remediations",
            "Decisions audited (remediation.v1), by action, outcome and guard",
            ["action", "outcome", "guard"],
            registry=bus.metrics.registry,
        )

    def severity(self, action: str, outcome: Outcome) -> Severity:
        return self.severities.get(action, {}).get(outcome, DEFAULT_SEVERITY[outcome])

    def build(
        self,
        proposal: Proposal,
        outcome: Outcome,
        reason: str,
        *,
        guard: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> Remediation:
        """The audit record of a decision, not published."""
        return Remediation(
            action=proposal.action,
            target=proposal.target,
            outcome=outcome,
            reason=reason,
            policy=proposal.policy,
            guard=guard,
            dry_run=outcome == Outcome.DRY_RUN,
            actor=self.actor,
            trigger_event_id=proposal.trigger_id,
            details={**proposal.details, **(details or {})},
        )

    async def record(
        self,
        proposal: Proposal,
        outcome: Outcome,
        reason: str,
        *,
        guard: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> Remediation:
        """Publish the audit record of a decision, then its notification."""
        remediation = self.build(proposal, outcome, reason, guard=guard, details=details)
        key = (self.actor, proposal.action, outcome.value, guard or "", proposal.target.key())
        if proposal.trigger_id is not None and proposal.trigger_time is not None:
            audit_id = stable_id(proposal.trigger_time, proposal.trigger_id, *key)
            notify_id = stable_id(proposal.trigger_time, proposal.trigger_id, "notify", *key)
        else:
            audit_id, notify_id = new_id(), new_id()
        now = utcnow()
        audit = make_event(remediation, source=self.actor, id=audit_id, time=now)
        severity = proposal.severity or self.severity(proposal.action, outcome)
        title = f"{proposal.title or proposal.target.name}: {proposal.action} {outcome.value}"
        if guard:
            title += f" ({guard})"
        note = Notification(
            severity=severity,
            topic=self.topic,
            title=title[:300],
            body=reason,
            targets=[proposal.target],
            dedup_key=f"{proposal.action}/{proposal.target.key()}",
            incident=f"{self.topic}/{proposal.target.key()}",
            resolves=proposal.resolves and outcome in (Outcome.APPLIED, Outcome.UNDONE),
            audit_event_id=audit_id,
        )
        self.decisions.labels(proposal.action, outcome.value, guard or "").inc()
        # One round trip; the audit record is first on the wire.
        await self.bus.publish_many(
            [audit, make_event(note, source=self.actor, id=notify_id, time=now)]
        )
        structlog.get_logger().info(
            "action.audited",
            action=proposal.action,
            target=proposal.target.key(),
            outcome=outcome.value,
            guard=guard,
            audit_id=audit_id,
        )
        return remediation
