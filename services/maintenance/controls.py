"""The maintenance service's operator controls (`control.checkpoint.<verb>`): `cancel` (before
the drain, or by its requester mid-drain: it ends `cancelled`, nodeward's cordon comes off),
`finish` (after done: nodeward's cordon comes off) and `restore` (a checkpointed pod run again
from its images, on a node of the operator's choice or where it fits). Each is an operator's proposal
through the kernel (exemptions, the operator's rate limit, audit)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js.errors import NoKeysError

from nodeward.kube import KubeError, NotFound
from nodeward.kube.base import Obj
from schemas.common import ObjectRef
from schemas.control import ControlReply, ControlRequest
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Outcome
from services.kernel import Gone, Proposal, Workflow, node_ref
from services.kernel.control import named_node, operator_proposal, refuse, reply_for
from services.maintenance.common import ENDED, Kit, now
from services.maintenance.moving import Mover
from services.maintenance.placement import restored_by
from services.maintenance.plan import cancellation
from services.maintenance.restore import restorable
from services.maintenance.state import (
    HISTORY,
    MAINTENANCES,
    MaintenanceState,
    MovePlan,
    PodPlan,
    history_key,
    state_key,
)


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

    async def restore_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward maintenance restore NS/POD [--to NODE]`: run a pod again from its
        newest recorded checkpoint, on NODE or where it fits (as a move chooses): its
        images built and pushed if they are not yet, then its replacement created and
        waited for. A pod of that name still running is never restored twice; a repeat
        after a crash goes on from the stage it reached."""
        key = request.target or ""
        namespace, _, name = key.partition("/")
        to = request.options.get("to") or None
        ref = ObjectRef(kind="Pod", name=name or key, namespace=namespace or None, api_version="v1")
        found = await self._restorable(key)
        mid = found[1].maintenance_id if not isinstance(found, str) else None
        proposal = operator_proposal(
            request,
            action="restore-request",
            target=ref,
            what=f"restore of {key}" + (f" on {to}" if to else ""),
            policy=f"maintenance/{mid}" if mid else None,
            details={"maintenance": mid, "to": to},
        )
        if isinstance(found, str):
            return await refuse(self.kit.runner, proposal, guard="no_checkpoint", reason=found)
        record_key, state, plan = found
        if plan.move is not None and plan.move.stage == "running":
            why = f"refused: {key} was moved to {plan.move.target} already"
            return await refuse(self.kit.runner, proposal, guard="restored", reason=why)
        owner = next((o for o in plan.owners if o.get("controller")), None)
        if owner is not None:
            why = (
                f"refused: {key} is owned by {owner.get('kind')} {owner.get('name')}, which runs "
                "it from its template; a controller's pod moves only with its owner "
                "(maintenance start --move)"
            )
            return await refuse(self.kit.runner, proposal, guard="owned", reason=why)
        if not all(
            c.checkpoint_image or (c.path and not c.archive_deleted) for c in plan.checkpoints
        ):
            why = f"refused: {key}'s checkpoint has neither an image nor an archive left"
            return await refuse(self.kit.runner, proposal, guard="no_checkpoint", reason=why)
        try:
            live: Obj | None = await self.kit.cluster.pods.get(namespace, name)
        except NotFound:
            live = None
        ours = live is not None and restored_by(live, state.maintenance_id)
        if live is not None and not (ours and (live.get("status") or {}).get("phase") != "Running"):
            where = (live.get("spec") or {}).get("nodeName") or "no node yet"
            why = (
                f"refused: a pod {key} exists ({where}); restoring would run the session "
                "twice: delete it first"
            )
            return await refuse(self.kit.runner, proposal, guard="running", reason=why)

        async def accept() -> dict[str, Any]:
            """The operator's request taken (guards passed, not a dry run): nodeward's own
            replacement that did not run is deleted first, then the stages run as a move's."""
            if live is None:
                return {}
            uid = live["metadata"]["uid"]
            # Evicted, not deleted (the role has no pods delete): a pod that never ran
            # counts against no disruption budget.
            await self.kit.cluster.pods.evict(namespace, name, uid=uid)
            if not await self.kit.cluster.pods.wait_gone(namespace, name, uid):
                raise TimeoutError(f"nodeward's failed replacement {key} is still terminating")
            return {"deleted_replacement": uid}

        accepted = await self.kit.runner.run(
            proposal, accept, self.kit.control_guards, retry=False, fails=(TimeoutError,)
        )
        if accepted.outcome != Outcome.APPLIED:
            return reply_for(accepted)  # refused by a guard, a dry run, or the delete failed
        imaged = all(c.checkpoint_image for c in plan.checkpoints)
        stage = "imaged" if imaged else "planned"
        start = plan.model_copy(update={"move": MovePlan(stage=stage, target=to)})

        async def save(_: str, change: Callable[[PodPlan], PodPlan]) -> PodPlan:
            def apply(current: MaintenanceState | None) -> MaintenanceState | None:
                if current is None or current.maintenance_id != state.maintenance_id:
                    return None
                pods = {**current.pods, key: change(current.pods[key])}
                return current.model_copy(update={"pods": pods, "updated_at": now()})

            stored = await self.kit.states.update(record_key, apply)
            if stored is None or stored.value.maintenance_id != state.maintenance_id:
                raise Gone(f"maintenance {state.maintenance_id} is no longer at {record_key}")
            return stored.value.pods[key]

        await save(key, lambda _: start)
        asked = state.model_copy(update={"trigger_id": request.id, "requested_at": request.time})
        mover = Mover(
            self.kit,
            asked,
            save,
            pinned=to is not None,
            absent=True,
            details={"operator": request.operator, "asked": proposal.reason},
        )
        await mover.move(start)
        stored = await self.kit.states.get(record_key)
        final = stored.value.pods[key].move if stored else None
        if final is not None and final.stage == "running":
            return ControlReply.ok(f"restored {key} on {final.target} from its checkpoint")
        reason = final.reason if final else "its record is gone"
        return ControlReply.error(f"{key} not restored: {reason}")

    async def _restorable(self, key: str) -> tuple[str, MaintenanceState, PodPlan] | str:
        """The KV key, maintenance and plan of the newest checkpoint of `key`, or why none."""
        try:
            keys = await self.kit.kv.keys()
        except NoKeysError:
            keys = []
        records: list[tuple[str, MaintenanceState]] = []
        for k in keys:
            if k.startswith((MAINTENANCES.prefix, HISTORY.prefix)):
                got = await self.kit.states.get(k)
                if got is not None:
                    records.append((k, got.value))
        found = restorable([state for _, state in records], key)
        if isinstance(found, str):
            return f"refused: {found}"
        state, plan = found
        mine = [k for k, s in records if s.maintenance_id == state.maintenance_id]
        live = state_key(state.node)
        return (live if live in mine else mine[0]), state, plan


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
