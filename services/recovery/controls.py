"""The recovery service's operator controls, each audited as the operator's proposal
through the kernel: `force-drain` (`control.recovery.force-drain`), the operator's word to
delete the pods a PodDisruptionBudget keeps on a node whose recovery is blocked; `pause` and
`resume`, the switch that stops all new remediation at once (KV `pause`: recoveries under
way wait where they stand, audited once, and go on when it is lifted)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from nodeward.kube import NotFound
from nodeward.kube.base import Obj
from schemas.common import ObjectRef
from schemas.control import ControlReply, ControlRequest
from schemas.notify import Severity
from services.kernel import (
    Proposal,
    blockers,
    node_ref,
)
from services.kernel.control import (
    named_node,
    operator_proposal,
    refuse,
    reply_for,
)
from services.kernel.drain import EVIDENCE
from services.recovery.common import Kit
from services.recovery.state import (
    PAUSE_KEY,
    PauseRecord,
    Step,
    node_key,
)


@dataclass(frozen=True)
class Controls:
    """`force-drain`, answered by any replica under the node's lock."""

    kit: Kit

    async def force_drain_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward recovery force-drain NODE`: the operator's word to delete the pods a
        PodDisruptionBudget keeps on a node whose recovery is blocked (nodeward never does
        on its own). Exempt pods and Falco's evidence stay: each needs its own act."""
        node = named_node(request)
        if isinstance(node, ControlReply):
            return node
        with structlog.contextvars.bound_contextvars(node=node):
            async with self.kit.node_lock(node):
                return await self._force_drain(request, node)

    async def _force_drain(self, request: ControlRequest, node: str) -> ControlReply:
        current = await self.kit.records.get(node_key(node))
        record = current.value if current else None
        try:
            obj: Obj | None = await self.kit.cluster.nodes.get(node)
        except NotFound:
            obj = None
        proposal = operator_proposal(
            request,
            action="force-drain",
            target=node_ref(node),
            what=f"forced drain of {node} past its pods' disruption budgets",
            obj=obj,
            policy=record.plan.value if record else None,
            details={"incident": record.incident} if record else None,
        )
        if record is None or record.step != Step.BLOCKED:
            where = f" (its recovery is {record.step.value})" if record else ""
            why = f"refused: no recovery of {node} is blocked on its drain{where}"
            return await refuse(self.kit.runner, proposal, guard="not_blocked", reason=why)
        left = await blockers(  # of a reset's scope only: the other GPUs' pods run on
            self.kit.cluster,
            node,
            self.kit.exemptions,
            self.kit.settings.skip_namespaces,
            only=record.scope(),
        )
        kept = {p: w for p, w in left.items() if w.startswith("exempt") or w == EVIDENCE}
        forced = [p for p in left if p not in kept]
        still = "; ".join(f"{p}: {w}" for p, w in sorted(kept.items()))
        if not forced:
            why = f"refused: nothing a budget keeps on {node}; what is left needs its own act: {still}"
            return await refuse(self.kit.runner, proposal, guard="nothing_to_force", reason=why)

        async def act() -> dict[str, Any]:
            deleted = []
            for pod in await self.kit.cluster.pods.on_node(node):
                meta = pod["metadata"]
                ref = f"{meta['namespace']}/{meta['name']}"
                if ref in forced and await self.kit.cluster.pods.delete(
                    meta["namespace"], meta["name"], uid=meta.get("uid")
                ):
                    deleted.append(ref)
            return {"deleted": deleted, "kept": kept}

        decided = await self.kit.runner.run(proposal, act, self.kit.control_guards, retry=False)
        self.kit.wake.set()
        deleted = decided.details.get("deleted") or []
        rest = f"; still there: {still}" if still else "; the recovery goes on once they are gone"
        return reply_for(
            decided, done=f"deleted {len(deleted)} pod(s) on {node}: {', '.join(deleted)}{rest}"
        )

    async def pause_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward recovery pause --reason R`: no new remediation (a recovery's start, a
        drain, a reset, a reboot, a BMC power off or on, a fence) until `resume`."""
        proposal = self._switch(request, "pause", "all new remediation paused")
        current = await self.kit.pause.current()
        if current is not None:
            why = f"refused: already paused by {current.by} ({current.reason})"
            return await refuse(self.kit.runner, proposal, guard="already_paused", reason=why)

        async def act() -> dict[str, Any]:
            record = PauseRecord(by=request.operator, reason=request.reason, at=time.time())
            await self.kit.pause.pauses.put(PAUSE_KEY, record)
            return {"by": request.operator}

        decided = await self.kit.runner.run(proposal, act, self.kit.control_guards, retry=False)
        return reply_for(
            decided, done="paused: no new remediation until `nodeward recovery resume`"
        )

    async def resume_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward recovery resume --reason R`: the pause lifted; recoveries go on."""
        proposal = self._switch(request, "resume", "remediation resumed")
        current = await self.kit.pause.current()
        if current is None:
            return await refuse(
                self.kit.runner, proposal, guard="not_paused", reason="refused: not paused"
            )

        async def act() -> dict[str, Any]:
            await self.kit.pause.pauses.delete(PAUSE_KEY)
            return {"paused_by": current.by, "paused_for_s": round(time.time() - current.at)}

        decided = await self.kit.runner.run(proposal, act, self.kit.control_guards, retry=False)
        self.kit.wake.set()
        return reply_for(decided, done=f"resumed (paused by {current.by}: {current.reason})")

    @staticmethod
    def _switch(request: ControlRequest, action: str, what: str) -> Proposal:
        return operator_proposal(
            request,
            action=action,
            target=ObjectRef(kind="Service", name="recovery"),
            what=what,
            severity=Severity.WARNING,
        )
