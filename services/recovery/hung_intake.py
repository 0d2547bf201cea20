"""The intake of hung nodes: the detector's `NodeHealth` events (`node.health.<node>`) start
a recovery of plan `hang` on the node's group's ladder, or turn one under way into it.

- No recovery under way (or only finished ones): a new one, `recover` proposed through the
  exemptions, the operators' pause, the group's `min_healthy` floor, the retry limit and the
  breaker; a node no ladder selects is left alone (logged).
- A recovery draining, blocked, remediating or validating (the node hung after its fault,
  e.g. XID 79 then the host): it becomes the ladder's, under the same incident; its
  maintenance is taken back (a drain cannot finish on a node whose kubelet is gone).
- A recovery waiting for its reboot: that reboot is the ladder's first step already; when
  its `reboot_timeout` passes with the node not Ready, the steps turn it into the ladder's
  next rung (`RecoverySteps._no_reboot`).
- A recovery already of plan `hang`: nothing. An escalated one of the same episode (the
  node unresponsive since before it escalated): nothing, on-call has it.
- A start the retry limit refuses (a node that keeps hanging) escalates: a human's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from nodeward.bus import Delivery
from nodeward.kube import NotFound
from nodeward.kube.base import Obj
from schemas.base import Event
from schemas.node import NodeHealth
from schemas.remediation import Outcome
from services.kernel import Guard, Proposal, node_ref
from services.recovery.common import Kit, RetryLimit
from services.recovery.hang import Ladder
from services.recovery.state import Plan, RecoveryRecord, Step, node_key
from services.recovery.steps import RecoverySteps

TURNED = frozenset({Step.DRAINING, Step.BLOCKED, Step.REMEDIATING, Step.VALIDATING})
"""The steps of a recovery that a hang turns into the ladder's."""


@dataclass(frozen=True)
class HungIntake:
    kit: Kit
    steps: RecoverySteps

    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        """A node turned unresponsive: its ladder starts (or takes over its recovery)."""
        health: NodeHealth = event.data
        if health.responsive or not self.kit.settings.hang.enabled:
            return
        age = (datetime.now(UTC) - event.time).total_seconds()
        if age > self.kit.settings.max_trigger_age.total_seconds():
            return  # a replay: decided then
        node = health.node
        with structlog.contextvars.bound_contextvars(node=node, event_id=event.id):
            async with self.kit.node_lock(node):
                try:
                    obj = await self.kit.cluster.nodes.get(node)
                except NotFound:
                    return
                ladder = await self.steps.hung.ladder_for(node)
                if ladder is None:
                    self.kit.log.info("recovery.hung_no_ladder", summary=health.summary)
                    return
                current = await self.kit.records.get(node_key(node))
                record = current.value if current else None
                causes = [c.line() for c in health.causes]
                if (
                    record is not None
                    and record.step == Step.ESCALATED
                    and record.plan == Plan.HANG
                    and health.since.timestamp() <= record.updated_at
                ):
                    return  # the same episode on-call was told of: theirs
                if record is not None and not record.terminal:
                    if record.incident == f"hang-{event.id}":  # a redelivery after a restart
                        await self._start(event, health, ladder, causes, obj, again=True)
                    elif record.plan != Plan.HANG and record.step in TURNED:
                        await self._turn(record, ladder, causes, health.summary)
                    return
                await self._start(event, health, ladder, causes, obj)

    async def _start(
        self,
        event: Event[Any],
        health: NodeHealth,
        ladder: Ladder,
        causes: list[str],
        obj: Obj,
        *,
        again: bool = False,
    ) -> None:
        """A new recovery of plan `hang`; `again`: its record was saved before a restart,
        its audit is written again (the same id: stored once)."""
        node, incident = health.node, f"hang-{event.id}"
        proposal = Proposal(
            action="recover",
            target=node_ref(node),
            reason=f"{health.summary}: the ladder {ladder.name} "
            f"({', '.join(r.action.value for r in ladder.steps)})",
            policy=Plan.HANG.value,
            trigger_id=incident,
            trigger_time=event.time,
            obj=obj,
            details={"incident": incident, "ladder": ladder.name, "causes": causes},
        )
        now = time.time()
        record = RecoveryRecord(
            node=node, incident=incident, plan=Plan.HANG, remediator="", reason=health.summary,
            step=Step.HUNG, started_at=now, updated_at=now, ladder=ladder.name, causes=causes,
        )  # fmt: skip

        done = {"plan": Plan.HANG.value, "ladder": ladder.name}
        if again:
            await self.kit.runner.record(proposal, Outcome.APPLIED, details=done)
            return

        async def act() -> dict[str, Any]:
            await self.kit.retry_limit.count(node, event.time.timestamp())
            await self.kit.records.put(node_key(node), record)
            self.kit.marks.failpoints.hit("recovery.hung")  # saved, not yet audited
            return done

        # the floor before the breaker: a node the floor refuses takes no place in its window
        kit = self.kit
        guards: list[Guard] = [kit.exemptions, kit.pause, kit.retry_limit, kit.floor, kit.breaker]
        decided = await self.kit.runner.run(proposal, act, guards, retry=False)
        if decided.outcome == Outcome.APPLIED:
            self.kit.wake.set()
        elif decided.guard == RetryLimit.name and decided.outcome == Outcome.REFUSED:
            # A node that keeps hanging is a human's (told once per episode: above).
            await self.steps.escalate(record, self.kit.retry_limit.why(node), rma=False)

    async def _turn(
        self, record: RecoveryRecord, ladder: Ladder, causes: list[str], summary: str
    ) -> None:
        """The recovery under way becomes the ladder's: its maintenance taken back first."""
        if "draining: requested" in record.history:
            await self.steps.take_back_maintenance(record)
        await self.steps.record_step(
            record, "recover", f"{summary}: its recovery ({record.plan.value}, "
            f"{record.step.value}) goes on through the ladder {ladder.name}", what="hung",
            ladder=ladder.name, causes=causes,
        )  # fmt: skip
        record = await self.steps.update(
            record, plan=Plan.HANG, ladder=ladder.name, rung=0, rung_started_at=None,
            power=None, power_sent=False, causes=causes, asked_at=None,
        )  # fmt: skip
        await self.steps.save(record, Step.HUNG, f"hung: {summary}")
        self.kit.wake.set()
