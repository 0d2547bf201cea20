"""The maintenance workflow's steps, on the kernel's workflow engine (`services.kernel.workflow`).

requested -> notified (every pod's owner told) -> checkpointing (at the start time: the node
cordoned, then every opted-in pod's containers checkpointed, one pod at a time per slot of
`parallelism`, each pod recorded done in the step's durable cursor) -> checkpointed ->
moving (`--move` only: `services.maintenance.moving`) -> draining (the shared drain; held pods until the deadline) -> done, or failed (the node gone
or exempt before the work starts); `cancelled` is the controls'. Each step moves the record
on in one revision-checked write with what it decided; each act is a kernel proposal whose
audit and event ids derive from the maintenance, so a step re-run after a SIGKILL repeats
nothing. One replica (the holder of the workflow lease) drives them, one task per node
(`Driver`); a replica that loses the lease lets the calls in flight finish and starts none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from nodeward.aio import within
from nodeward.bus import RetryableError
from nodeward.bus.kv import Lease
from nodeward.kube import KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.errors import CheckpointFailed
from schemas.common import PodRef
from schemas.maintenance import CheckpointRecord, MaintenancePhase
from schemas.remediation import Outcome
from schemas.state.marks import EventSpec, MarkEntry, MarkSpec
from services.kernel import (
    DrainSettings,
    Driver,
    Guard,
    Retry,
    Step,
    Workflow,
    drain,
    in_scope,
    node_ref,
)
from services.maintenance.common import (
    ACTOR,
    ARCHIVE_ANNOTATION,
    CORDON_ANNOTATION,
    FINAL_CHECKPOINT_ERRORS,
    MAINTENANCE_ANNOTATION,
    Kit,
    now,
    pod_ref,
)
from services.maintenance.moving import Mover, moving
from services.maintenance.plan import (
    announcement,
    checkpoint_failed,
    cuda_checkpoint,
    hold,
    merge_drain,
    plan_pods,
    wants_move,
    when,
)
from services.maintenance.state import (
    MaintenanceState,
    PodPlan,
    history_key,
    state_key,
)

WORKFLOW = "maintenance"
"""The workflow's name: its engine's failpoints are `maintenance.<phase>` (after each move)."""


def _moved(state: MaintenanceState) -> int:
    return sum(1 for p in state.pods.values() if p.move is not None and p.move.stage == "running")


def _with_checkpoint(record: CheckpointRecord) -> Callable[[PodPlan], PodPlan]:
    def add(plan: PodPlan) -> PodPlan:
        return plan.model_copy(update={"checkpoints": [*plan.checkpoints, record]})

    return add


class MaintenanceWorkflow:
    """The steps of a node's maintenance, and the lease-held loop that drives them."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        tick = kit.settings.tick.total_seconds()
        self._save_lock = asyncio.Lock()
        # A step that failed (the API or the bus unavailable) is tried again each tick; the
        # maintenance's deadline bounds what waits (held pods, checkpoints retried).
        retry = Retry(first_s=tick, cap_s=tick)
        phase = MaintenancePhase
        self.flow: Workflow[MaintenanceState] = Workflow(
            WORKFLOW,
            kit.states,
            {
                phase.REQUESTED: Step(self._announce, retry=retry),
                phase.NOTIFIED: Step(self._start, retry=retry),
                phase.CHECKPOINTING: Step(self._checkpoint_all, retry=retry),
                phase.CHECKPOINTED: Step(self._to_draining, retry=retry),
                phase.MOVING: Step(self._move_all, retry=retry),
                phase.DRAINING: Step(self._drain, retry=retry),
            },
            prefix="node.",
            key_of=lambda s: state_key(s.node),
            identity=lambda s: s.maintenance_id,
            step_of=lambda s: s.phase.value,
            with_step=lambda s, to: s.model_copy(update={"phase": MaintenancePhase(to)}),
            cancelled=lambda s: s.phase == MaintenancePhase.CANCELLED,
            on_cancelled=self._cancelled,
            errors=(RetryableError, KubeError),
            failpoints=kit.marks.failpoints,
        )
        self.driver = Driver(self.flow, tick=tick)

    @property
    def halt(self) -> asyncio.Event:
        """Set on shutdown or a lost lease: no new step or checkpoint call starts."""
        return self.driver.halt

    # the loop ---------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Drive every maintenance in KV (one holder of the lease at a time) until stopping."""
        settings = self.kit.settings
        lease = Lease(
            self.kit.kv, "workflow", self.kit.holder, ttl=settings.lease_ttl.total_seconds()
        )
        tick = settings.tick.total_seconds()
        try:
            while not stopping.is_set():
                try:
                    async with lease.held() as lost:
                        await self._drive(stopping, lost)
                except Exception as exc:  # noqa: BLE001 - the loop outlives a bus hiccup
                    self.kit.log.warning("maintenance.loop_failed", error=str(exc))
                    with contextlib.suppress(TimeoutError):
                        await within(stopping.wait(), tick)
        finally:
            await self.driver.stop()

    async def _drive(self, stopping: asyncio.Event, lost: asyncio.Event) -> None:
        self.kit.leading = True
        try:
            await self._drive_held(stopping, lost)
        finally:
            self.kit.leading = False

    async def _drive_held(self, stopping: asyncio.Event, lost: asyncio.Event) -> None:
        while not stopping.is_set() and not lost.is_set():
            self.kit.wake.clear()  # before the scan: a request stored during it wakes the next
            await self.driver.spawn()
            self.driver.wake()  # a change (a cancel) is seen now, not at the next tick
            waits = [asyncio.ensure_future(e.wait()) for e in (stopping, lost, self.kit.wake)]
            try:
                with contextlib.suppress(TimeoutError):
                    await within(
                        asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED),
                        self.kit.settings.rescan.total_seconds(),
                    )
            finally:
                for w in waits:
                    w.cancel()
        if lost.is_set():
            # Another holder drives them now: finish the calls in flight, then wait.
            await self.driver.stop()
            self.driver.halt.clear()

    async def _cancelled(self, state: MaintenanceState) -> None:
        """Cancelled while a step cordoned the node: the cordon comes off."""
        if await self.kit.marks.holds(state.node):
            await self.kit.marks.release(state.node)

    # state and events -------------------------------------------------------------------
    async def _save(
        self, state: MaintenanceState, change: Callable[[MaintenanceState], MaintenanceState]
    ) -> MaintenanceState:
        """Apply `change` to the stored state of this maintenance (revision-checked; the
        engine's `Gone` or `Cancelled` when it is no longer this maintenance's to change)."""
        async with self._save_lock:
            return await self.flow.save(
                state, lambda s: change(s).model_copy(update={"updated_at": now()})
            )

    async def _advance(
        self,
        state: MaintenanceState,
        phase: MaintenancePhase,
        change: Callable[[MaintenanceState], MaintenanceState] | None = None,
        **fields: Any,
    ) -> MaintenanceState:
        """Publish the phase (an id derived from the maintenance: a repeat is dropped), then
        move the workflow on."""
        await self.kit.bus.publish(self.kit.phase_event(state, phase, **fields))

        def moved(s: MaintenanceState) -> MaintenanceState:
            s = change(s) if change else s
            return s.model_copy(update={"updated_at": now()})

        async with self._save_lock:
            saved = await self.flow.advance(state, phase.value, moved)
        if saved.terminal:
            # Kept for `nodeward maintenance restore` once a later maintenance replaces it.
            await self.kit.states.put(history_key(saved.node, saved.maintenance_id), saved)
        if not saved.dry_run:
            with contextlib.suppress(KubeError):
                await self.kit.cluster.nodes.set_annotations(
                    state.node, {MAINTENANCE_ANNOTATION: phase.value}
                )
        self.kit.log.info("maintenance.phase", to=phase.value)
        return saved

    async def _fail(self, state: MaintenanceState, error: str) -> float | None:
        """End the workflow `failed` (only ever before its cordon: nothing to take back)."""
        await self.kit.runner.fail(self.kit.proposal("fail", state, node_ref(state.node), error))
        await self._advance(
            state,
            MaintenancePhase.FAILED,
            lambda s: s.model_copy(update={"error": error, "finished_at": now()}),
            error=error,
            failures=state.failures,
            checkpoints=state.checkpoints(),
        )
        return None

    # requested -> notified --------------------------------------------------------------
    async def _announce(self, state: MaintenanceState) -> float | None:
        try:
            node = await self.kit.cluster.nodes.get(state.node)
        except NotFound:
            return await self._fail(state, f"node {state.node} no longer exists")
        exempt = await self.kit.exemptions.exempt_reason(node)
        if exempt:
            await self.kit.runner.skip(
                self.kit.proposal("announce", state, node_ref(state.node), exempt),
                guard="exempt",
                reason=f"skipped: {exempt}",
            )
            return await self._fail(state, f"not maintained: {exempt}")
        plans = state.pods
        if not plans:
            # Exempt pods stay (the drain keeps them too), and so do the pods outside its
            # scope: not planned, not told.
            scope = state.scope_keys()
            moving = [
                pod
                for pod in await self.kit.cluster.pods.on_node(state.node)
                if in_scope(pod, scope) and await self.kit.exemptions.exempt_reason(pod) is None
            ]
            plans = plan_pods(
                node,
                moving,
                self.kit.settings.skip_namespaces,
                move=state.move,
                moving_namespaces=await self._moving_namespaces(state, moving),
            )
        state = await self._save(
            state,
            lambda s: s.model_copy(
                update={"pods": plans, "cuda_checkpoint": cuda_checkpoint(node)}
            ),
        )
        for plan in state.pods.values():
            if plan.status == "not_checkpointable":
                await self.kit.runner.skip(
                    self.kit.proposal(
                        "checkpoint",
                        state,
                        pod_ref(plan),
                        f"{plan.key} not checkpointable: {plan.reason}",
                        obj=None,
                    ),
                    guard="no_cuda_checkpoint",
                    reason=f"{plan.key} will be evicted at the deadline without a checkpoint: "
                    f"{plan.reason}",
                )
        opted = sum(1 for p in state.pods.values() if p.opted_in)
        proposal = self.kit.proposal(
            "announce",
            state,
            node_ref(state.node),
            f"maintenance of {state.node} from {when(state.start_at)} "
            f"({state.reason or 'no reason given'}): {len(state.pods)} pod(s) to move, "
            f"{opted} opted into checkpoints",
            obj=node,
            pods=sorted(state.pods),
        )

        async def tell_owners() -> dict[str, Any]:
            for plan in state.pods.values():
                await self.kit.notify_owner(state, plan, announcement(state, plan))
            return {"owners_told": len(state.pods)}

        await self.kit.runner.run(proposal, tell_owners, [])
        await self._advance(state, MaintenancePhase.NOTIFIED)
        return None

    async def _moving_namespaces(self, state: MaintenanceState, pods: list[Obj]) -> frozenset[str]:
        """The namespaces of `pods` annotated `nodeward.io/move=true` (a --move only)."""
        if not state.move:
            return frozenset()
        names = {p["metadata"]["namespace"] for p in pods}
        out = set()
        for name in sorted(names):
            try:
                ns = await self.kit.cluster.namespaces.get(name)
            except NotFound:
                continue
            if wants_move(ns, frozenset()):
                out.add(name)
        return frozenset(out)

    # notified -> checkpointing ----------------------------------------------------------
    async def _start(self, state: MaintenanceState) -> float | None:
        if now() < state.start_at:
            return max(0.05, (state.start_at - now()).total_seconds())
        try:
            node = await self.kit.cluster.nodes.get(state.node)
        except NotFound:
            return await self._fail(state, f"node {state.node} no longer exists")
        if state.prior_unschedulable is None:
            # Ownership is decided once, from the node before any change.
            prior = bool((node.get("spec") or {}).get("unschedulable"))
            state = await self._save(
                state,
                lambda s: s.model_copy(update={"prior_unschedulable": prior}),
            )
        prior = bool(state.prior_unschedulable)
        proposal = self.kit.proposal(
            "cordon",
            state,
            node_ref(state.node),
            f"{state.node} cordoned for maintenance {state.maintenance_id}"
            + (" (it was cordoned already: nodeward will not uncordon it)" if prior else ""),
            obj=node,
            protective=True,
            prior_unschedulable=prior,
        )
        spec = MarkSpec(
            cordon=True,
            event=EventSpec(
                reason="NodeMaintenance",
                action="Cordon",
                note=f"maintenance {state.maintenance_id}: {state.reason}"[:1024],
                type="Warning",
            ),
        )

        def mark(entry: MarkEntry) -> dict[str, str]:
            note = {
                "by": ACTOR,
                "maintenance": state.maintenance_id,
                "prior_unschedulable": entry.prior_unschedulable,
                "time": now().isoformat().replace("+00:00", "Z"),
            }
            return {CORDON_ANNOTATION: json.dumps(note, separators=(",", ":"))}

        async def cordon() -> dict[str, Any]:
            done = await self.kit.marks.apply(state.node, state.maintenance_id, spec, annotate=mark)
            return {
                "cordoned": done["cordoned"],
                "prior_unschedulable": done["prior_unschedulable"],
            }

        result = await self.kit.runner.run(proposal, cordon, self.cordon_guards(state))
        if result.outcome == Outcome.SKIPPED:
            return await self._fail(state, result.reason)
        if result.outcome == Outcome.REFUSED and result.guard == "circuit_breaker":
            return await self._fail(state, result.reason)
        # NodeMarks' view: a node another nodeward owner cordoned (a GPU quarantine) is
        # nodeward's cordon, not an operator's.
        prior = bool(result.details.get("prior_unschedulable", prior))
        cordoned = result.outcome == Outcome.APPLIED and not prior
        await self._advance(
            state,
            MaintenancePhase.CHECKPOINTING,
            lambda s: s.model_copy(
                update={"cordoned": cordoned, "prior_unschedulable": prior, "started_at": now()}
            ),
        )
        self.kit.marks.failpoints.hit("maintenance.cordon.advanced")
        return None

    def cordon_guards(self, state: MaintenanceState) -> list[Guard]:
        """Exemptions and the rate limit always; the shared circuit breaker only when a
        service asked (`requested_by` `service/...`, e.g. a GPU quarantine rule).

        An operator's explicit request (the CLI, the node annotation) is a human decision
        to take that node out of service: refusing it because automation removed other
        nodes would get in the operator's way exactly when they are handling an incident.
        A service's request is automation like any other and counts against the window.
        """
        guards: list[Guard] = [self.kit.exemptions, self.kit.limiter]
        if self.kit.breaker is not None and (state.requested_by or "").startswith("service/"):
            guards.append(self.kit.breaker)
        return guards

    # checkpointing -> checkpointed ------------------------------------------------------
    async def _checkpoint_all(self, state: MaintenanceState) -> float | None:
        pending = [p.key for p in state.pods.values() if p.status == "pending"]

        async def one(key: str) -> bool:
            await self._checkpoint_pod(state, state.pods[key])
            return True  # resolved (checkpointed, failed for good, not opted in, dry run)

        # Each pod once, recorded in the step's cursor; every pod's call ends before the
        # step does (a failed step must not leave calls running that a retry would
        # repeat); then the first error, if any, is raised. Halted: no new call starts.
        await self.flow.each(
            state, pending, one, parallelism=self.kit.settings.parallelism, halt=self.halt
        )
        current = await self.kit.states.get(state_key(state.node))
        if current is None:
            return None
        state = current.value
        if any(p.status == "pending" for p in state.pods.values()):
            return None  # stopped before every pod was done: the next holder goes on
        failures = [
            f"{p.key}: not checkpointed: {p.reason}"
            for p in state.pods.values()
            if p.status in ("failed", "not_checkpointable")
        ]
        await self._advance(
            state,
            MaintenancePhase.CHECKPOINTED,
            lambda s: s.model_copy(update={"failures": failures}),
            checkpoints=state.checkpoints(),
            failures=failures,
        )
        return None

    async def _update_pod(
        self, state: MaintenanceState, key: str, change: Callable[[PodPlan], PodPlan]
    ) -> PodPlan:
        saved = await self._save(
            state,
            lambda s: s.model_copy(update={"pods": {**s.pods, key: change(s.pods[key])}}),
        )
        return saved.pods[key]

    async def _checkpoint_pod(self, state: MaintenanceState, plan: PodPlan) -> None:
        log = self.kit.log.bind(pod=plan.key)
        try:
            pod: Obj | None = await self.kit.cluster.pods.get(plan.namespace, plan.name)
        except NotFound:
            pod = None
        if pod is None or (plan.uid and pod["metadata"].get("uid") != plan.uid):
            await self._update_pod(
                state,
                plan.key,
                lambda p: p.model_copy(
                    update={"status": "failed", "reason": "the pod was gone before its checkpoint"}
                ),
            )
            return
        images = {
            c.get("name"): c.get("image") for c in (pod.get("spec") or {}).get("containers") or []
        }
        proposal = self.kit.proposal(
            "checkpoint",
            state,
            pod_ref(plan),
            f"checkpoint {plan.key} on {state.node} before maintenance {state.maintenance_id}",
            obj=pod,
            containers=sorted(str(n) for n in images),
        )
        timeout = int(self.kit.settings.call_timeout.total_seconds())

        async def act() -> dict[str, Any]:
            current = plan
            for container, image in images.items():
                if any(c.pod.container == container and c.path for c in current.checkpoints):
                    continue  # recorded before a restart: never checkpointed twice
                try:
                    path = await within(
                        self.kit.cluster.checkpoints.create(
                            state.node, plan.namespace, plan.name, str(container), timeout_s=timeout
                        ),
                        timeout + 10,
                    )
                except TimeoutError:
                    raise CheckpointFailed(
                        f"checkpoint of {plan.key}/{container} on {state.node} timed out "
                        f"after {timeout}s"
                    ) from None
                record = CheckpointRecord(
                    pod=PodRef(
                        namespace=plan.namespace,
                        name=plan.name,
                        container=str(container),
                        uid=plan.uid,
                    ),
                    path=path,
                    node=state.node,
                    image=image,
                    at=now(),
                )
                log.info("checkpoint.recorded", container=container, path=path)
                current = await self._update_pod(state, plan.key, _with_checkpoint(record))
            note = json.dumps(
                {
                    "by": ACTOR,
                    "maintenance": state.maintenance_id,
                    "node": state.node,
                    "containers": {
                        c.pod.container: {
                            "path": c.path,
                            "image": c.image,
                            "time": c.at.isoformat() if c.at else None,
                        }
                        for c in current.checkpoints
                    },
                },
                separators=(",", ":"),
            )
            await self.kit.cluster.pods.set_annotations(
                plan.namespace, plan.name, {ARCHIVE_ANNOTATION: note}
            )
            return {"archives": [c.path for c in current.checkpoints]}

        try:
            result = await self.kit.runner.run(proposal, act, [self.kit.exemptions])
        except RetryableError as exc:
            reason = str(exc.__cause__ or exc)
            deadline = state.deadline_at()
            final = isinstance(exc.__cause__, FINAL_CHECKPOINT_ERRORS)
            if not final and (deadline is None or now() < deadline):
                raise  # transient (API unavailable, the annotation): tried again next step
            log.warning("checkpoint.failed", error=reason)
            failed = await self._update_pod(
                state,
                plan.key,
                lambda p: p.model_copy(update={"status": "failed", "reason": reason}),
            )
            await self._checkpoint_failed(state, failed)
            return
        if result.outcome == Outcome.DRY_RUN:
            await self._update_pod(
                state,
                plan.key,
                lambda p: p.model_copy(update={"status": "dry_run", "reason": "dry run"}),
            )
            return
        if result.outcome != Outcome.APPLIED:
            await self._update_pod(
                state,
                plan.key,
                lambda p: p.model_copy(
                    update={"status": "not_opted_in", "opted_in": False, "reason": result.reason}
                ),
            )
            return
        current = await self.kit.states.get(state_key(state.node))
        recorded = current.value.pods[plan.key].checkpoints if current else []
        # The event first: a restart before the status is saved publishes it again under
        # the same id (dropped), without checkpointing again.
        await self.kit.bus.publish(
            self.kit.phase_event(
                state, MaintenancePhase.CHECKPOINTED, plan.key, checkpoints=recorded
            )
        )
        await self._update_pod(
            state,
            plan.key,
            lambda p: p.model_copy(update={"status": "checkpointed", "annotated": True}),
        )

    async def _checkpoint_failed(self, state: MaintenanceState, plan: PodPlan) -> None:
        deadline = state.deadline_at() or now()
        await self.kit.notify_owner(state, plan, checkpoint_failed(state, plan, deadline))

    # checkpointed -> draining -> done -----------------------------------------------------
    async def _to_draining(self, state: MaintenanceState) -> float | None:
        if moving(state):
            await self._advance(state, MaintenancePhase.MOVING)
        else:
            await self._advance(state, MaintenancePhase.DRAINING)
        return None

    # moving -> draining ---------------------------------------------------------------
    async def _move_all(self, state: MaintenanceState) -> float | None:
        async def save(key: str, change: Callable[[PodPlan], PodPlan]) -> PodPlan:
            return await self._update_pod(state, key, change)

        mover = Mover(self.kit, state, save)

        async def one(key: str) -> bool:
            current = await self.kit.states.get(state_key(state.node))
            plan = (current.value if current else state).pods[key]
            await mover.move(plan)
            return True

        await self.flow.each(
            state, moving(state), one, parallelism=self.kit.settings.parallelism, halt=self.halt
        )
        current = await self.kit.states.get(state_key(state.node))
        if current is None:
            return None
        state = current.value
        if moving(state):
            return None  # stopped before every pod was done: the next holder goes on
        failures = list(state.failures) + [
            f"{p.key}: not moved: {p.move.reason}"
            for p in state.pods.values()
            if p.move is not None and p.move.stage == "failed" and p.status == "checkpointed"
        ]
        await self._advance(
            state,
            MaintenancePhase.DRAINING,
            lambda s: s.model_copy(update={"failures": failures}),
        )
        return None

    async def _drain(self, state: MaintenanceState) -> float | None:
        deadline = state.deadline_at() or now()
        first = state.drain is None
        if not first and now() < deadline:
            return None  # held pods wait for the deadline
        remaining = max((deadline - now()).total_seconds(), 1.0)
        wait = remaining if first else self.kit.settings.evict_timeout.total_seconds()
        settings = DrainSettings(
            enabled=True,
            deadline=timedelta(seconds=wait),
            grace_period=self.kit.settings.grace_period,
            skip_namespaces=self.kit.settings.skip_namespaces,
        )
        hold_for = hold(state) if first else None
        action = "drain" if first else "evict-held"
        scope = state.scope_keys()
        which = "every pod but DaemonSets" if scope is None else f"its {len(scope)} pod(s) only"
        proposal = self.kit.proposal(
            action,
            state,
            node_ref(state.node),
            (
                f"drain {state.node} for maintenance {state.maintenance_id}: {which}, PDBs "
                f"honoured, until {when(deadline)}"
                if first
                else f"deadline {when(deadline)} of maintenance {state.maintenance_id} reached: "
                f"evicting the pods held on {state.node}"
            ),
        )

        async def act() -> dict[str, Any]:
            stop, finished = asyncio.Event(), asyncio.Event()
            watch = asyncio.create_task(self._until_cancelled(state, stop, finished))
            try:
                result = await drain(
                    self.kit.cluster,
                    state.node,
                    settings,
                    self.kit.exemptions,
                    hold=hold_for,
                    stop=stop,
                    only=scope,
                )
            finally:
                # Set as well as cancelled: a cancel that lands as a KV read completes can
                # be lost (asyncio.wait_for in nats-py), and the loop must still end.
                finished.set()
                watch.cancel()
            return result.to_json() | ({"stopped": True} if stop.is_set() else {})

        outcome = await self.kit.runner.run(proposal, act, [])
        if outcome.details.get("stopped"):
            return None  # cancelled by its requester mid-drain: the workflow ends it
        result = dict(outcome.details) if outcome.outcome == Outcome.APPLIED else {}
        merged = merge_drain(state.drain, result, outcome.outcome.value)
        # Pods a budget blocked until the deadline had their time; held pods have not.
        if first and merged.get("held"):
            await self._save(state, lambda s: s.model_copy(update={"drain": merged}))
            return None
        return await self._finish(state, merged)

    async def _until_cancelled(
        self, state: MaintenanceState, stop: asyncio.Event, finished: asyncio.Event
    ) -> None:
        """Set `stop` once the maintenance is cancelled (read from KV each tick: any replica
        may have answered the cancellation), until the drain has `finished`."""
        while not finished.is_set():
            try:
                current = await self.kit.states.get(state_key(state.node))
            except Exception as exc:  # noqa: BLE001 - a bus hiccup: look again next tick
                self.kit.log.warning("maintenance.cancel_watch_failed", error=str(exc))
                await asyncio.sleep(self.kit.settings.tick.total_seconds())
                continue
            if (
                current is None
                or current.value.maintenance_id != state.maintenance_id
                or current.value.phase == MaintenancePhase.CANCELLED
            ):
                stop.set()
                return
            await asyncio.sleep(self.kit.settings.tick.total_seconds())

    async def _finish(self, state: MaintenanceState, drained: dict[str, Any]) -> float | None:
        current = await self.kit.states.get(state_key(state.node))
        state = current.value if current else state
        failures = list(state.failures)
        terminating = set(drained.get("terminating", []))
        evicted = set(drained.get("evicted", [])) | set(drained.get("gone", [])) | terminating
        for plan in state.pods.values():
            if plan.held and plan.key in evicted:
                failures = [f for f in failures if not f.startswith(f"{plan.key}: ")]
                failures.append(
                    f"{plan.key}: evicted at the deadline without a checkpoint ({plan.reason})"
                )
        failures += [
            f"{pod}: not evicted: {why}" for pod, why in drained.get("blocked", {}).items()
        ]
        failures += [
            f"{pod}: evicted, still terminating at the deadline" for pod in sorted(terminating)
        ]
        scope = state.scope_keys()
        summary = (
            f"maintenance {state.maintenance_id} of {state.node}"
            + ("" if scope is None else f" ({len(scope)} pod(s) in its scope)")
            + " done: "
            f"{sum(1 for p in state.pods.values() if p.status == 'checkpointed')} pod(s) "
            f"checkpointed, {_moved(state)} moved, {len(evicted)} evicted"
            + (f"; {len(failures)} failure(s): " + "; ".join(failures) if failures else "")
        )
        await self.kit.runner.record(
            self.kit.proposal("complete", state, node_ref(state.node), summary, failures=failures),
            Outcome.APPLIED,
            summary,
        )
        await self._advance(
            state,
            MaintenancePhase.DONE,
            lambda s: s.model_copy(
                update={"drain": drained, "failures": failures, "finished_at": now()}
            ),
            checkpoints=state.checkpoints(),
            failures=failures,
            drained=sorted(evicted),
        )
        return None
