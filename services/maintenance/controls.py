"""The maintenance service's operator controls (`control.checkpoint.<verb>`): `cancel` (before
the drain, or by its requester mid-drain: it ends `cancelled`, nodeward's cordon comes off)
and `finish` (after done: nodeward's cordon comes off). Each is an operator's proposal
through the kernel (exemptions, the operator's rate limit, audit)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from nodeward.kube import KubeError, NotFound
from nodeward.kube.base import Obj
from schemas.control import ControlReply, ControlRequest
from schemas.maintenance import MaintenancePhase
from services.kernel import Gone, Proposal, Workflow, node_ref
from services.kernel.control import named_node, operator_proposal, refuse, reply_for
from services.maintenance.common import ENDED, Kit, now
from services.maintenance.plan import cancellation
from services.maintenance.state import MaintenanceState, history_key, state_key


@dataclass(frozen=True)
class Controls:
    """`cancel` and `finish`, answered by any replica (the workflow reads KV each step)."""

    kit: Kit
    flow: Workflow[MaintenanceState]

    async def _target(
        self, request: ControlRequest, action: str, what: str
    ) -> tuple[str, Obj | None, MaintenanceState | None, Proposal] | ControlReply:
        """The node a control names (an error reply when it is no node name), the node as
        read, its maintenance, and the operator's proposal of `action` (the `what` of
        maintenance <id> of <node>)."""
        node = named_node(request)
        if isinstance(node, ControlReply):
            return node
        try:
            obj: Obj | None = await self.kit.cluster.nodes.get(node)
        except NotFound:
            obj = None
        current = await self.kit.states.get(state_key(node))
        state = current.value if current else None
        details: dict[str, Any] = {"node": node}
        if state is not None:
            details |= {"maintenance": state.maintenance_id, "phase": state.phase.value}
        proposal = operator_proposal(
            request,
            action=action,
            target=node_ref(node),
            what=(
                f"{what} of maintenance {state.maintenance_id} of {node}"
                if state
                else f"{what} of a maintenance of {node}"
            ),
            obj=obj,
            policy=f"maintenance/{state.maintenance_id}" if state else None,
            details=details,
            resolves=True,
        )
        return node, obj, state, proposal

    async def cancel_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward maintenance cancel NODE`: stop a maintenance before its drain (the
        cordon nodeward put on comes off); once the drain began, say what was done."""
        found = await self._target(request, "cancel", "cancellation")
        if isinstance(found, ControlReply):
            return found
        node, _, state, proposal = found
        if state is None:
            why = f"refused: no maintenance of {node} by nodeward; nothing to cancel"
            return await refuse(self.kit.runner, proposal, guard="not_ours", reason=why)
        if state.terminal:
            why = (
                f"refused: maintenance {state.maintenance_id} of {node} already ended "
                f"({state.phase.value}); done: {done_so_far(state)}"
            )
            return await refuse(self.kit.runner, proposal, guard="ended", reason=why)
        # Its requester (recovery, for a quarantine an operator released) may stop a drain
        # under way: the evictions still waiting are given up, the cordon comes off.
        own = request.operator == state.requested_by
        if (state.phase == MaintenancePhase.DRAINING or state.drain is not None) and not own:
            why = (
                f"refused: the drain of {node} for maintenance {state.maintenance_id} has "
                f"begun; already done: {done_so_far(state)}; `nodeward maintenance finish "
                f"{node}` uncordons it once the maintenance is done"
            )
            return await refuse(self.kit.runner, proposal, guard="draining", reason=why)
        before = state.phase

        def cancel(current: MaintenanceState) -> MaintenanceState | None:
            if current.phase == MaintenancePhase.DRAINING and not own:
                return None
            update = {
                "phase": MaintenancePhase.CANCELLED,
                "ended_by": request.operator,
                "finished_at": now(),
                "updated_at": now(),
            }
            return current.model_copy(update=update)

        async def act() -> dict[str, Any]:
            # The workflow engine's cancel: one revision-checked write; the workflow, at
            # its next write, finds it cancelled and stops (taking back a cordon it put on
            # after this release).
            cancelled = await self.flow.cancel(state, request.operator, cancel)
            if cancelled is None or cancelled.phase != MaintenancePhase.CANCELLED:
                stored = await self.kit.states.get(state_key(node))
                phase = stored.value.phase.value if stored else "gone"
                raise RuntimeError(f"maintenance {state.maintenance_id} moved on ({phase})")
            released = await self.kit.marks.release(node, note=proposal.reason) or {}
            if released:
                with contextlib.suppress(Gone):
                    cancelled = await self.flow.save(
                        cancelled,
                        lambda s: s.model_copy(update={"released_at": now()}),
                        cancelled_too=True,
                    )
            await self.kit.states.put(history_key(node, cancelled.maintenance_id), cancelled)
            await self.kit.bus.publish(
                self.kit.phase_event(cancelled, MaintenancePhase.CANCELLED, error=proposal.reason)
            )
            if before != MaintenancePhase.REQUESTED:  # owners were warned: tell them it is off
                for plan in cancelled.pods.values():
                    notice = cancellation(cancelled, plan, request.operator)
                    await self.kit.notify_owner(cancelled, plan, notice)
            with contextlib.suppress(KubeError):  # nothing of the maintenance left on the node
                await self.kit.cluster.nodes.set_annotations(node, ENDED)
            self.kit.wake.set()
            return {"was": before.value, **released}

        decided = await self.kit.runner.run(proposal, act, self.kit.control_guards, retry=False)
        details = decided.details
        if details.get("uncordoned"):
            cordon = "uncordoned it"
        elif details.get("kept_cordon"):
            cordon = "it stays cordoned: it was cordoned before nodeward's maintenance"
        else:
            cordon = "it was not cordoned yet"
        checkpointed = sum(1 for p in state.pods.values() if p.status == "checkpointed")
        kept = f"; {checkpointed} checkpoint(s) taken are kept" if checkpointed else ""
        return reply_for(
            decided,
            done=f"cancelled maintenance {state.maintenance_id} of {node} ({before.value}); "
            f"{cordon}{kept}",
        )

    async def finish_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward maintenance finish NODE`: the work is over; take nodeward's cordon off
        (a node cordoned before the maintenance stays cordoned)."""
        found = await self._target(request, "finish", "finish")
        if isinstance(found, ControlReply):
            return found
        node, obj, state, proposal = found
        cordoned = bool(obj and (obj.get("spec") or {}).get("unschedulable"))
        stays = " (it stays cordoned)" if cordoned else ""
        if state is None or not await self.kit.marks.holds(node):
            ended = f" (maintenance {state.maintenance_id}: {state.phase.value})" if state else ""
            why = (
                f"refused: nodeward holds no maintenance cordon on {node}{ended}{stays}; "
                "nodeward undoes only what it did"
            )
            return await refuse(self.kit.runner, proposal, guard="not_ours", reason=why)
        if state.phase != MaintenancePhase.DONE:
            why = (
                f"refused: maintenance {state.maintenance_id} of {node} is still "
                f"{state.phase.value}; wait for it to be done, or `nodeward maintenance cancel "
                f"{node}` before its drain"
            )
            return await refuse(self.kit.runner, proposal, guard="not_done", reason=why)

        async def act() -> dict[str, Any]:
            released = await self.kit.marks.release(node, note=proposal.reason) or {}

            def finished(current: MaintenanceState) -> MaintenanceState:
                return current.model_copy(
                    update={"ended_by": request.operator, "released_at": now()}
                )

            with contextlib.suppress(Gone):
                stored = await self.flow.save(state, finished, cancelled_too=True)
                await self.kit.states.put(history_key(node, state.maintenance_id), stored)
            with contextlib.suppress(KubeError):  # nothing of the maintenance left on the node
                await self.kit.cluster.nodes.set_annotations(node, ENDED)
            return released

        decided = await self.kit.runner.run(proposal, act, self.kit.control_guards, retry=False)
        if decided.details.get("uncordoned"):
            cordon = "uncordoned it"
        else:
            cordon = (
                "it stays cordoned: it was cordoned before the maintenance, or another "
                "owner of nodeward still holds it"
            )
        return reply_for(
            decided, done=f"finished maintenance {state.maintenance_id} of {node}; {cordon}"
        )


def done_so_far(state: MaintenanceState) -> str:
    """What a maintenance did to its node and pods, in one phrase."""
    parts = []
    if state.cordoned:
        parts.append(f"{state.node} cordoned by nodeward")
    elif state.prior_unschedulable:
        parts.append(f"{state.node} was cordoned before")
    checkpointed = sum(1 for p in state.pods.values() if p.status == "checkpointed")
    parts.append(f"{checkpointed} pod(s) checkpointed")
    drained = state.drain or {}
    evicted = len(drained.get("evicted", [])) + len(drained.get("gone", []))
    parts.append(f"{evicted} evicted")
    held = drained.get("held") or []
    if held:
        parts.append(f"{len(held)} held until the deadline")
    return ", ".join(parts)
