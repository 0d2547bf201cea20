"""The recovery service's intake: cordon's quarantines (a recovery starts, or the fault grew)
and the ends of maintenances (a draining recovery moves on, or escalates)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from nodeward.bus import Delivery
from nodeward.kube import NotFound
from schemas.base import Event
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.remediation import Outcome, Remediation
from services.kernel import (
    Proposal,
    node_ref,
)
from services.recovery.common import CORDON_ACTOR, Kit, RetryLimit
from services.recovery.policy import (
    Kind,
    decide,
    gpu_indices,
)
from services.recovery.scope import drain_scope, reset_drains
from services.recovery.state import (
    Plan,
    RecoveryRecord,
    Step,
    node_key,
)
from services.recovery.steps import RecoverySteps


@dataclass(frozen=True)
class Intake:
    """The two consumers' handlers; each takes the node's lock the loop steps it under."""

    kit: Kit
    steps: RecoverySteps

    async def handle_quarantine(self, event: Event[Any], delivery: Delivery) -> None:
        """A quarantine cordon applied: recover the node if its fault calls for it."""
        audit: Remediation = event.data
        grew = audit.outcome == Outcome.SKIPPED and audit.guard in (
            "already_quarantined",
            "flapping",
        )
        # Another GPU joined the quarantine (applied under the quarantine's incident, not its
        # own): the fault grew too, unless nothing of recovery's is under way for the node.
        joined = audit.details.get("incident") not in (None, audit.trigger_event_id)
        if (
            audit.actor != CORDON_ACTOR
            or (audit.outcome != Outcome.APPLIED and not grew)
            or audit.target.kind != "Node"
            or audit.trigger_event_id is None
        ):
            return
        age = (datetime.now(UTC) - event.time).total_seconds()
        if age > self.kit.settings.max_trigger_age.total_seconds():
            return  # a replay: the quarantine's recovery, if any, was decided then
        node = audit.target.name
        decision = decide(
            audit.details.get("recommended_actions") or [],
            audit.details.get("xids") or [],
            self.kit.catalog,
        )
        if decision.kind == Kind.NONE:
            return
        with structlog.contextvars.bound_contextvars(node=node, incident=audit.trigger_event_id):
            async with self.kit.node_lock(node):
                if grew or (joined and await self._engaged(node, audit.details["incident"])):
                    await self._fault_grew(audit, decision.kind, decision.plan, decision.why)
                else:
                    await self._start(event, audit, decision.kind, decision.plan, decision.why)

    async def _engaged(self, node: str, incident: str) -> bool:
        """True while a recovery of `node` is under way, or quarantine `incident`'s was
        handed to a human (escalated): a later failure of its quarantine is that recovery's,
        never one of its own (which would reboot and release a node on-call was told needs
        them). An escalation of an earlier quarantine, long over, engages nothing."""
        current = await self.kit.records.get(node_key(node))
        if current is None:
            return False
        record = current.value
        return not record.terminal or (
            record.step == Step.ESCALATED and record.incident == incident
        )

    async def _fault_grew(
        self, audit: Remediation, kind: Kind, plan: Plan | None, why: str
    ) -> None:
        """A quarantined node's fault got worse (a GPU of it reported more, a later finding):
        an RMA fault escalates the recovery under way; a reboot replaces a reset not yet
        asked for."""
        current = await self.kit.records.get(node_key(audit.target.name))
        record = current.value if current else None
        if record is None or record.terminal:
            return
        flap = audit.details.get("flapping")
        if flap:  # a reset or reboot more would only be the next flap's
            await self.steps.escalate(record, f"{flap} (flapping)", rma=False)
        elif kind == Kind.ESCALATE:
            await self.steps.escalate(record, f"the fault grew: {audit.reason}; {why}")
        elif (
            plan == Plan.REBOOT
            and record.plan == Plan.RESET
            and record.step in (Step.DRAINING, Step.BLOCKED, Step.REMEDIATING)
            and record.asked_at is None
        ):
            remediator = self.kit.settings.remediators[Plan.REBOOT]
            record = await self.steps.update(record, plan=Plan.REBOOT, remediator=remediator)
            await self.steps.save(record, record.step, f"plan now reboot: {why}", note_only=True)

    async def _start(
        self, event: Event[Any], audit: Remediation, kind: Kind, plan: Plan | None, why: str
    ) -> None:
        node, incident = audit.target.name, str(audit.trigger_event_id)
        current = await self.kit.records.get(node_key(node))
        if (
            current is not None
            and current.value.incident != incident
            and not current.value.terminal
        ):
            return  # another GPU of the quarantine under way (its own record is the first's)
        gpus = gpu_indices(audit.details.get("gpus") or [audit.details.get("gpu", "")])
        xids = [int(x) for x in audit.details.get("xids") or []]
        flap = audit.details.get("flapping")
        if flap:  # a GPU that keeps failing: on-call's, not another reboot's
            kind, why = Kind.ESCALATE, f"{flap} (flapping)"
        reason = f"{audit.reason}; {why}"  # cordon's reason starts with the node
        try:
            obj = await self.kit.cluster.nodes.get(node)
        except NotFound:
            return
        proposal = Proposal(
            action="recover" if kind == Kind.RECOVER else "escalate",
            target=node_ref(node),
            reason=reason,
            policy=plan.value if plan else "rma",
            trigger_id=incident,
            trigger_time=event.time,
            obj=obj,
            details={"incident": incident, "gpus": gpus, "xids": xids},
        )
        if current is not None and current.value.incident == incident:
            # A redelivery (a restart between the record and its audit): the audit again,
            # under the same id, which JetStream stores once.
            if kind == Kind.RECOVER:
                was = current.value
                done: dict[str, Any] = {"plan": was.plan.value, "remediator": was.remediator}
                done |= {"drain_pods": was.drain_pods, "drain": was.drain_why}
                await self.kit.runner.record(proposal, Outcome.APPLIED, details=done)
            return
        if kind == Kind.ESCALATE:
            record = self._new(node, incident, Plan.REBOOT, gpus, xids, reason)
            # What failed, then why no cure: on-call reads the fault, not only the catalog.
            fault = audit.reason.removeprefix(f"{node}: ")
            await self.steps.escalate(record, f"{fault}; {why}", rma=not flap)
            return
        assert plan is not None
        remediator = self.kit.settings.remediators[plan]
        record = self._new(node, incident, plan, gpus, xids, reason, remediator=remediator)
        # A reset drains only the failed GPUs' holders, where the quarantine names them.
        scope = drain_scope(
            plan, gpus, audit.details.get("holders"),
            *reset_drains(obj, self.kit.settings.reset_drains),
        )  # fmt: skip
        record = record.model_copy(update={"drain_pods": scope.pods, "drain_why": scope.why})

        async def act() -> dict[str, Any]:
            await self.kit.retry_limit.count(node, event.time.timestamp())
            await self.kit.records.put(node_key(node), record)
            done = {"plan": plan.value, "remediator": remediator}
            return done | {"drain_pods": scope.pods, "drain": scope.why}

        decided = await self.kit.runner.run(proposal, act, self.kit.start_guards, retry=False)
        if decided.outcome == Outcome.APPLIED:
            self.kit.wake.set()
        elif decided.guard == RetryLimit.name and decided.outcome == Outcome.REFUSED:
            # A node that keeps failing is a human's: held, so that no automatic release
            # (cordon's healthy period) puts it back in service behind on-call's back.
            await self.steps.escalate(record, self.kit.retry_limit.why(node), rma=False)

    def _new(  # noqa: PLR0917 - the record's fields, once
        self,
        node: str,
        incident: str,
        plan: Plan,
        gpus: list[int],
        xids: list[int],
        reason: str,
        *,
        remediator: str = "",
    ) -> RecoveryRecord:
        now = time.time()
        return RecoveryRecord(
            node=node,
            incident=incident,
            plan=plan,
            remediator=remediator,
            gpus=gpus,
            xids=xids,
            reason=reason,
            started_at=now,
            updated_at=now,
            maintenance_id=f"mnt-recovery-{incident}",
        )

    async def handle_maintenance(self, event: Event[Any], delivery: Delivery) -> None:
        """A maintenance ended: a draining recovery of its node moves on (or escalates)."""
        data: Maintenance = event.data
        async with self.kit.node_lock(data.node):
            current = await self.kit.records.get(node_key(data.node))
            record = current.value if current else None
            if record is None or record.step != Step.DRAINING:
                return
            if event.time.timestamp() < record.started_at - 5:
                return  # a maintenance that ended before this recovery began
            ours = data.maintenance_id == record.maintenance_id
            if data.phase == MaintenancePhase.DONE:
                # Ours, or one already under way when ours was asked. Done is not drained:
                # the node is drained only when no pod a reset or reboot would harm is left.
                await self.steps.drained(
                    record, f"maintenance {data.maintenance_id}", data.failures
                )
            elif ours and "already in maintenance" not in (data.error or ""):
                await self.steps.escalate(
                    record,
                    f"maintenance {data.maintenance_id} {data.phase.value}: {data.error or ''}",
                    rma=False,
                )
