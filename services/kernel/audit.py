"""Audit and notification: every decision becomes a `remediation.v1` and a `notify.v1`;
a restatement at the rate of its input is counted and audited per window (`Tally`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import structlog
from nats.js.errors import NotFoundError
from prometheus_client import Counter

from nodeward.bus import Bus
from schemas.base import Event, make_event, utcnow
from schemas.cloudevents import MSG_ID
from schemas.ids import new_id, stable_id
from schemas.notify import Notification, Severity
from schemas.remediation import Outcome, Remediation
from services.kernel.proposal import Proposal
from services.kernel.tally import Tally, Window

DEFAULT_SEVERITY: Mapping[Outcome, Severity] = {
    Outcome.APPLIED: Severity.CRITICAL,
    Outcome.REFUSED: Severity.CRITICAL,
    Outcome.FAILED: Severity.CRITICAL,
    Outcome.DRY_RUN: Severity.WARNING,
    Outcome.UNDONE: Severity.WARNING,
    Outcome.SKIPPED: Severity.INFO,
}


def decision_log(proposal: Proposal, outcome: Outcome, guard: str | None) -> Any:
    """The logger bound to a decision as the kernel logs each: its action, target, outcome
    and guard."""
    return structlog.get_logger().bind(
        action=proposal.action, target=proposal.target.key(), outcome=outcome.value, guard=guard
    )


class Auditor:
    """Publishes the audit record of a decision, then the notification that points at it.

    Ids are derived from the trigger event, action, outcome and guard, so a redelivered
    trigger re-publishes the same ids and JetStream drops the duplicates. Decisions the
    `tally` takes (noisy skips, proposals marked `tally`) are audited in full once per key
    and window and counted otherwise; each window's count is audited when it closes (a
    task of the auditor's), and what is open when the bus closes, then.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        actor: str,
        topic: str,
        severities: Mapping[str, Mapping[Outcome, Severity]] | None = None,
        tally: Tally | None = None,
    ) -> None:
        self.bus = bus
        self.actor = actor
        self.topic = topic
        self.severities = severities or {}
        self.tally = tally or Tally()
        self._flusher: asyncio.Task[None] | None = None
        self._tallied = Counter(
            "nodeward_remediations_tallied",
            "Decisions counted in a tally window instead of audited one by one",
            ["action", "outcome", "guard"],
            registry=bus.metrics.registry,
        )
        bus.before_close(self.flush_all)
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
        guard: str | None,
        details: Mapping[str, Any] | None,
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
        publish: bool = True,
        admitted: bool = False,
        once: bool = False,
    ) -> Remediation:
        """Publish the audit record of a decision, then its notification; or, for one the
        tally counts, build it and count it (`admitted`: the tally was asked already).
        `publish=False` only builds it (it restates one audited: logged, not published).

        `once`: the decision resumes one a restart cut short, whose audit may be stored
        already, longer ago than the stream's duplicate window: not published again if
        the last record on its subject is it (`stored`)."""
        remediation = self.build(proposal, outcome, reason, guard, details)
        if not publish or (not admitted and await self.tallied(proposal, outcome, reason, guard)):
            return remediation
        key = (self.actor, proposal.action, outcome.value, guard or "", proposal.target.key())
        if proposal.trigger_id is not None and proposal.trigger_time is not None:
            audit_id = stable_id(proposal.trigger_time, proposal.trigger_id, *key)
            notify_id = stable_id(proposal.trigger_time, proposal.trigger_id, "notify", *key)
        else:
            audit_id, notify_id = new_id(), new_id()
        if once and await self.stored(remediation.nats_subject(), audit_id):
            structlog.get_logger().info(
                "action.audited_before", action=proposal.action, audit_id=audit_id
            )
            return remediation
        now = utcnow()
        audit = make_event(remediation, source=self.actor, id=audit_id, time=now)
        severity = proposal.severity or self.severity(proposal.action, outcome)
        decision = f"{proposal.action} {outcome.value}" + (f" ({guard})" if guard else "")
        title = f"{proposal.title or proposal.target.name}: {decision}"
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
            decision=decision[:200],
        )
        self.decisions.labels(proposal.action, outcome.value, guard or "").inc()
        # One round trip; the audit record is first on the wire.
        await self.bus.publish_many(
            [audit, make_event(note, source=self.actor, id=notify_id, time=now)]
        )
        decision_log(proposal, outcome, guard).info("action.audited", audit_id=audit_id)
        return remediation

    async def stored(self, subject: str, audit_id: str) -> bool:
        """True if the last audit record on `subject` is the one with id `audit_id`."""
        try:
            last = await self.bus.js.get_last_msg(Remediation.STREAM, subject)
        except NotFoundError:
            return False
        return (last.headers or {}).get(MSG_ID) == audit_id

    # the tally's windows ------------------------------------------------------------------
    async def tallied(
        self, proposal: Proposal, outcome: Outcome, reason: str, guard: str | None = None
    ) -> bool:
        """Whether the tally counts the decision (its window has had its first already): then
        it is not audited (nor acted on) on its own; else it is, in full."""
        if not self.tally.applies(proposal, outcome, guard):
            return False
        await self.flush()
        if self.tally.admit(proposal, outcome, reason, guard):
            return False
        self.decisions.labels(proposal.action, outcome.value, guard or "").inc()
        self._tallied.labels(proposal.action, outcome.value, guard or "").inc()
        decision_log(proposal, outcome, guard).debug("action.tallied")
        self._flush_later()
        return True

    async def flush(self, *, everything: bool = False) -> int:
        """Audit the windows that have closed (all, with `everything`): one aggregate
        record each, no notice. Returns how many were audited."""
        windows = self.tally.closed(everything=everything)
        if windows:
            await self.bus.publish_many([self._aggregate(w) for w in windows])
        for w in windows:
            structlog.get_logger().info(
                "action.tally_audited",
                action=w.proposal.action,
                target=w.proposal.target.key(),
                guard=w.guard,
                counted=w.counted,
            )
        return len(windows)

    async def flush_all(self) -> None:
        """At the bus's close: the open windows' counts audited, the flusher stopped."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        try:
            await self.flush(everything=True)
        except Exception as exc:  # noqa: BLE001 - closing: counts are lost, not the acts
            structlog.get_logger().warning(
                "action.tally_lost", counted=self.tally.counting, error=str(exc)
            )

    def _flush_later(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_when_due(), name="tally-flush")

    async def _flush_when_due(self) -> None:
        while (due := self.tally.next_close()) is not None:
            await asyncio.sleep(max((due - utcnow()).total_seconds(), 0.0) + 0.01)
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - the bus is away: try again later
                structlog.get_logger().warning("action.tally_flush_failed", error=str(exc))
                await asyncio.sleep(1.0)

    def _aggregate(self, w: Window) -> Event[Remediation]:
        p = w.proposal
        span = f"{w.first:%H:%M:%S}-{w.last:%H:%M:%S}" if w.first and w.last else ""
        record = Remediation(
            action=p.action,
            target=p.target,
            outcome=Outcome(w.key[1]),
            reason=f"{w.counted} more like this in {self.tally.window} (UTC {span}),"
            f" counted not audited one by one; the last: {w.reason}",
            policy=p.policy,
            guard=w.guard,
            dry_run=w.key[1] == Outcome.DRY_RUN.value,
            actor=self.actor,
            details={
                **p.details,
                "tally": {
                    "counted": w.counted,
                    "window_s": self.tally.window.total_seconds(),
                    "opened": w.opened.isoformat(),
                    "first": w.first.isoformat() if w.first else None,
                    "last": w.last.isoformat() if w.last else None,
                    "triggers": w.triggers,
                },
            },
        )
        return make_event(
            record,
            source=self.actor,
            id=stable_id(w.opened, self.actor, "tally", *w.key),
            time=utcnow(),
        )
