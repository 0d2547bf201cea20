"""services.maintenance (the `checkpoint` daemon): node maintenance as a workflow that does not surprise the pods' users.

A request (`maintenance.requested.<node>`: from `nodeward maintenance start`, from the node
annotation `nodeward.io/maintenance=requested`, or from anything that may publish it) runs
through these phases, each published as `maintenance.<phase>.<node>`:

requested -> notified (every pod's owner is told when and what happens to their pod)
-> checkpointing (at the start time: the node is cordoned, its prior `unschedulable`
recorded, then every container of every `nodeward.io/checkpoint=true` pod is checkpointed
through the node proxy, with bounded parallelism and a per-call timeout; each pod's
archives go to KV, to the pod annotation `nodeward.io/checkpoint-archive` and to a
`maintenance.checkpointed` event) -> checkpointed (every opted-in pod resolved) ->
draining (the shared drain action evicts every pod but DaemonSets, PDBs honoured; an
opted-in pod whose checkpoint failed, or a GPU pod on a node without
`nodeward.io/cuda-checkpoint=true`, is held until the deadline, its owner and on-call told
why, then evicted) -> done (failures listed) or failed (the node is gone or exempt
before the work starts).

The workflow lives in KV (`node.<node>`, `schemas.state.maintenance.MaintenanceState`), saved
after each phase and after each container's checkpoint, so a restart resumes from the last
phase: a container whose archive is recorded is never checkpointed again, and nothing is
evicted before every opted-in pod's checkpoint is recorded. A stopping service finishes
the checkpoint calls in flight and starts no new ones. Phase events have ids derived from
the maintenance, so a phase re-published after a restart is dropped by JetStream.
Every action (announce, cordon, checkpoint, drain) goes through the shared path
(exemptions, rate limit on starts, dry-run, audit, on-call notice). Operators end a
maintenance through controls it answers: `finish` (after done: nodeward's cordon comes
off) and `cancel` (before the drain: it ends `cancelled`), on `control.checkpoint.<verb>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import structlog
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue
from pydantic import Field

from nodeward.aio import within
from nodeward.bus import Bus, ConsumerSpec, Delivery, PermanentError, RetryableError
from nodeward.bus.kv import Lease, TypedKV
from nodeward.config import Section, Settings, section
from nodeward.daemon import Daemon
from nodeward.durations import Duration
from nodeward.kube import Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.errors import CheckpointFailed, Forbidden
from nodeward.platform import acting_daemon, one_daemon
from schemas.base import Event, make_event
from schemas.common import ObjectRef, PodRef, dns_subdomain
from schemas.control import ControlReply, ControlRequest
from schemas.ids import stable_id
from schemas.maintenance import CheckpointRecord, Maintenance, MaintenancePhase
from schemas.remediation import Outcome
from schemas.state.maintenance import (
    MAINTENANCES,
    MaintenanceState,
    PodPlan,
    history_key,
    state_key,
)
from schemas.state.marks import EventSpec, MarkEntry, MarkSpec
from services.kernel import (
    BreakerSettings,
    CircuitBreaker,
    DrainSettings,
    Guard,
    OwnerNotice,
    Proposal,
    RateLimiter,
    RateLimitSettings,
    acting,
    drain,
    per_action,
    table,
    tell_owner,
)
from services.kernel.breaker import node_breaker
from services.kernel.control import (
    ControlSettings,
    operator_proposal,
    refuse,
    reply_for,
)
from services.kernel.marks import NodeMarks
from services.kernel.severities import LOUD, QUIET, SKIP_WARNS
from services.maintenance.access import ACCESS
from services.maintenance.plan import (
    Notice,
    announcement,
    cancellation,
    checkpoint_failed,
    cuda_checkpoint,
    hold,
    merge_drain,
    plan_pods,
    when,
)

NAME = "checkpoint"
ACTOR = "service/checkpoint"
OWNER = "maintenance"  # of its marks on the node (services.kernel.marks)
TOPIC = "maintenance"
MAINTENANCE_ANNOTATION = "nodeward.io/maintenance"
"""`requested` on a node starts a maintenance; the service then writes the phase there."""
REASON_ANNOTATION = "nodeward.io/maintenance-reason"
CORDON_ANNOTATION = "nodeward.io/maintenance-cordon"
ARCHIVE_ANNOTATION = "nodeward.io/checkpoint-archive"
_ENDED = MappingProxyType({MAINTENANCE_ANNOTATION: None, REASON_ANNOTATION: None})
"""A finished or cancelled maintenance takes its phase and reason off the node."""
# A checkpoint that failed with these is not tried again (the runtime cannot, the kubelet's
# API is off or the container is gone, or the role is not allowed); others are retried
# until the deadline.
FINAL_CHECKPOINT_ERRORS = (CheckpointFailed, NotFound, Forbidden)
# Each step is news on-call hears of; a skip or a refusal (a maintenance left undone) warns,
# and so does taking the node out of service (cordon, drain); a failure pages.
_QUIET = table(QUIET, SKIP_WARNS)
SEVERITIES = per_action(
    (_QUIET, ("announce", "checkpoint", "complete", "fail")),
    (table(_QUIET, LOUD), ("cordon", "drain", "evict-held")),
)


class CheckpointSettings(Section):
    """`services.checkpoint` in the config file."""

    dry_run: bool = False
    consumer: str = "checkpoint"
    subjects: list[str] = Field(default_factory=lambda: ["maintenance.requested.>"], min_length=1)
    bucket: str = MAINTENANCES.name
    parallelism: int = Field(default=4, ge=1, description="checkpoint calls at once")
    call_timeout: Duration = Field(
        default=timedelta(minutes=2), description="per checkpoint call (the kubelet's default)"
    )
    deadline: Duration = Field(
        default=timedelta(minutes=30), description="a request without --deadline gets this"
    )
    evict_timeout: Duration = Field(
        default=timedelta(minutes=2),
        description="how long the evictions at the deadline wait on PodDisruptionBudgets",
    )
    grace_period: int | None = Field(default=None, ge=0, description="None: each pod's own")
    skip_namespaces: list[str] = Field(default_factory=lambda: ["kube-system", "nodeward"])
    tick: Duration = Field(
        default=timedelta(seconds=1), description="how often a waiting workflow looks again"
    )
    rescan: Duration = Field(
        default=timedelta(seconds=15),
        description="how often KV is read for workflows to resume (a new request wakes it)",
    )
    annotation_interval: Duration | None = Field(
        default=timedelta(seconds=10),
        description="how often nodes are read for nodeward.io/maintenance=requested (None: off)",
    )
    max_request_age: Duration = Field(
        default=timedelta(minutes=10),
        description="older requests (a replay of the stream) are logged, never acted on",
    )
    rate_limit: RateLimitSettings = RateLimitSettings(per_minute=6, burst=3)
    breaker: BreakerSettings = Field(
        default_factory=BreakerSettings,
        description="the shared breaker; guards only service-requested maintenance cordons",
    )
    # The workflow's lease and, with bus.partitions > 1, the partitions': above twice
    # nats-server's longest election (9 s) of the bucket's leader, as cordon's.
    lease_ttl: Duration = timedelta(seconds=20)
    controls: ControlSettings = ControlSettings()


def _pod_ref(plan: PodPlan) -> ObjectRef:
    return ObjectRef(kind="Pod", name=plan.name, namespace=plan.namespace, api_version="v1")


def _node_ref(node: str) -> ObjectRef:
    return ObjectRef(kind="Node", name=node, api_version="v1")


def _now() -> datetime:
    return datetime.now(UTC)


def _with_checkpoint(record: CheckpointRecord) -> Callable[[PodPlan], PodPlan]:
    def add(plan: PodPlan) -> PodPlan:
        return plan.model_copy(update={"checkpoints": [*plan.checkpoints, record]})

    return add


class CheckpointService:
    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        *,
        states: TypedKV[MaintenanceState],
        kv: KeyValue,
        settings: CheckpointSettings,
        holder: str,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.states = states
        self.kv = kv
        self.settings = settings
        self.holder = holder
        # True while this replica holds the workflow lease: it alone drives workflows and
        # turns node annotations into requests.
        self.leading = False
        # Every decision, acted on or not, is audited through the runner (the kernel).
        # An operator's finish or cancel: exemptions and the operator's rate limit.
        kernel = acting(
            bus,
            actor=ACTOR,
            topic=TOPIC,
            severities=SEVERITIES,
            dry_run=settings.dry_run,
            namespace_labels=cluster.namespaces.labels,
            controls=settings.controls,
        )
        self.runner, self.exemptions = kernel.runner, kernel.exemptions
        self.control_guards = kernel.control_guards
        self.limiter = RateLimiter(settings.rate_limit)
        self.breaker = breaker
        self.marks = NodeMarks(cluster, kv, OWNER)
        self.halt = asyncio.Event()
        """Set on shutdown: no new step or checkpoint call starts."""
        self.wake = asyncio.Event()
        self.workflows: dict[str, asyncio.Task[None]] = {}
        self._save_lock = asyncio.Lock()
        self.log = structlog.get_logger().bind(service=NAME)

    # requests ---------------------------------------------------------------------------
    def consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            name=self.settings.consumer,
            stream="MAINTENANCE",
            subjects=tuple(self.settings.subjects),
            types=frozenset({Maintenance.TYPE}),
            concurrency=4,
            order_key=lambda e: str(e.data.node),
            retry_delays=(1.0, 5.0, 15.0, 30.0),
            max_deliver=6,
            # maintenance.<phase>.<node>: the request is about the node in its subject.
            identity=(ConsumerSpec.bind(Maintenance, "node"),),
        )

    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        """A `maintenance.requested`: recorded in KV for the workflow loop (one per node)."""
        data: Maintenance = event.data
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, node=data.node, maintenance=data.maintenance_id
        ):
            if data.phase != MaintenancePhase.REQUESTED:
                return
            age = (_now() - event.time).total_seconds()
            if age > self.settings.max_request_age.total_seconds():
                # A replay (a new consumer reading the stream's history) starts nothing.
                self.log.warning("maintenance.old_request", age_s=round(age))
                return
            try:
                await self.cluster.nodes.get(data.node)
            except NotFound:
                error = f"no node named {data.node} in the cluster"
                await self._publish_request_failed(event, data, error)
                raise PermanentError(error) from None
            state = MaintenanceState(
                maintenance_id=data.maintenance_id,
                node=data.node,
                reason=data.reason,
                requested_by=data.requested_by,
                requested_at=event.time,
                trigger_id=event.id,
                start_at=data.start_at or event.time,
                deadline_s=data.deadline_s or self.settings.deadline.total_seconds(),
                dry_run=self.settings.dry_run,
                updated_at=_now(),
            )

            def accept(current: MaintenanceState | None) -> MaintenanceState | None:
                if current is not None and (
                    not current.terminal or current.maintenance_id == data.maintenance_id
                ):
                    return None  # one maintenance at a time per node; a redelivery is a no-op
                return state

            stored = await self.states.update(state_key(data.node), accept)
            assert stored is not None
            if stored.value.maintenance_id != data.maintenance_id:
                busy = stored.value
                await self._publish_request_failed(
                    event,
                    data,
                    f"node {data.node} is already in maintenance {busy.maintenance_id} "
                    f"({busy.phase.value})",
                )
                return
            self.log.info("maintenance.accepted", start_at=state.start_at.isoformat())
            self.wake.set()

    async def _publish_request_failed(
        self, event: Event[Any], data: Maintenance, error: str
    ) -> None:
        self.log.warning("maintenance.request_failed", error=error)
        failed = data.model_copy(update={"phase": MaintenancePhase.FAILED, "error": error})
        await self.bus.publish(
            make_event(
                failed,
                source=ACTOR,
                id=stable_id(event.time, data.maintenance_id, "failed", event.id),
            )
        )

    async def watch_annotations(self, stopping: asyncio.Event) -> None:
        """Publish a request for each node annotated `nodeward.io/maintenance=requested`."""
        interval = self.settings.annotation_interval
        if interval is None:
            return
        while not stopping.is_set():
            try:
                await self._requests_from_annotations()
            except Exception as exc:  # noqa: BLE001 - a failed scan is retried, never fatal
                self.log.warning("maintenance.annotation_scan_failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), interval.total_seconds())

    async def _requests_from_annotations(self) -> None:
        if not self.leading:
            return  # the replica holding the workflow lease scans (one request per node)
        for node in await self.cluster.nodes.list():
            meta = node.get("metadata") or {}
            notes = meta.get("annotations") or {}
            if notes.get(MAINTENANCE_ANNOTATION) != "requested":
                continue
            name = str(meta["name"])
            current = await self.states.get(state_key(name))
            if current is not None and not current.value.terminal:
                continue
            now = _now()
            request = Maintenance(
                node=name,
                phase=MaintenancePhase.REQUESTED,
                maintenance_id=f"mnt-{now:%Y%m%dT%H%M%S}-{name}",
                reason=str(notes.get(REASON_ANNOTATION) or "requested by node annotation"),
                requested_by=f"annotation/{MAINTENANCE_ANNOTATION}",
            )
            await self.bus.publish(make_event(request, source=ACTOR))
            # The handshake, not an action: the request is taken (the phases follow).
            await self.cluster.nodes.set_annotations(name, {MAINTENANCE_ANNOTATION: "accepted"})
            self.log.info("maintenance.requested_by_annotation", node=name)

    # the workflow loop ------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Drive every maintenance in KV (one holder of the lease at a time) until stopping."""
        lease = Lease(self.kv, "workflow", self.holder, ttl=self.settings.lease_ttl.total_seconds())
        tick = self.settings.tick.total_seconds()
        try:
            while not stopping.is_set():
                try:
                    async with lease.held() as lost:
                        await self._drive(stopping, lost)
                except Exception as exc:  # noqa: BLE001 - the loop outlives a bus hiccup
                    self.log.warning("maintenance.loop_failed", error=str(exc))
                    with contextlib.suppress(TimeoutError):
                        await within(stopping.wait(), tick)
        finally:
            await self._stop_workflows()

    async def _drive(self, stopping: asyncio.Event, lost: asyncio.Event) -> None:
        self.leading = True
        try:
            await self._drive_held(stopping, lost)
        finally:
            self.leading = False

    async def _drive_held(self, stopping: asyncio.Event, lost: asyncio.Event) -> None:
        while not stopping.is_set() and not lost.is_set():
            self.wake.clear()  # before the scan: a request stored during it wakes the next
            await self._spawn_workflows()
            waits = [asyncio.ensure_future(e.wait()) for e in (stopping, lost, self.wake)]
            try:
                with contextlib.suppress(TimeoutError):
                    await within(
                        asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED),
                        self.settings.rescan.total_seconds(),
                    )
            finally:
                for w in waits:
                    w.cancel()
        if lost.is_set():
            # Another holder drives them now: finish the calls in flight, then wait.
            await self._stop_workflows()
            self.halt.clear()

    async def _stop_workflows(self) -> None:
        """Let the checkpoint calls in flight finish and be recorded; start nothing new."""
        self.halt.set()
        running = [t for t in self.workflows.values() if not t.done()]
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    async def _spawn_workflows(self) -> None:
        try:
            keys = await self.kv.keys()
        except NoKeysError:
            return
        for key in keys:
            if not key.startswith("node."):
                continue
            current = await self.states.get(key)
            if current is None or current.value.terminal:
                continue
            node = current.value.node
            task = self.workflows.get(node)
            if task is None or task.done():
                self.workflows[node] = asyncio.create_task(self._workflow(node))

    async def _workflow(self, node: str) -> None:
        key = state_key(node)
        with structlog.contextvars.bound_contextvars(node=node):
            while not self.halt.is_set():
                current = await self.states.get(key)
                if current is not None and current.value.phase == MaintenancePhase.CANCELLED:
                    # Cancelled while this step cordoned the node: the cordon comes off.
                    if await self.marks.holds(node):
                        await self.marks.release(node)
                    return
                if current is None or current.value.terminal:
                    return
                state = current.value
                with structlog.contextvars.bound_contextvars(
                    maintenance=state.maintenance_id, phase=state.phase.value
                ):
                    try:
                        advanced = await self._step(state)
                    except (RetryableError, KubeError) as exc:
                        self.log.warning("maintenance.step_failed", error=str(exc))
                        advanced = False
                    except Exception:
                        self.log.exception("maintenance.step_error")
                        advanced = False
                if not advanced:
                    await self._pause(state)

    async def _pause(self, state: MaintenanceState) -> None:
        wait = self.settings.tick.total_seconds()
        if state.phase == MaintenancePhase.NOTIFIED:
            wait = min(wait, max(0.05, (state.start_at - _now()).total_seconds()))
        with contextlib.suppress(TimeoutError):
            await within(self.halt.wait(), wait)

    async def _step(self, state: MaintenanceState) -> bool:
        """Do the work of the current phase; True if the phase moved on."""
        steps: dict[MaintenancePhase, Callable[[MaintenanceState], Awaitable[bool]]] = {
            MaintenancePhase.REQUESTED: self._announce,
            MaintenancePhase.NOTIFIED: self._start,
            MaintenancePhase.CHECKPOINTING: self._checkpoint_all,
            MaintenancePhase.CHECKPOINTED: self._to_draining,
            MaintenancePhase.DRAINING: self._drain,
        }
        return await steps[state.phase](state)

    # state and events -------------------------------------------------------------------
    async def _save(
        self, maintenance_id: str, node: str, change: Callable[[MaintenanceState], MaintenanceState]
    ) -> MaintenanceState:
        """Apply `change` to the stored state of this maintenance (revision-checked)."""

        def apply(current: MaintenanceState | None) -> MaintenanceState | None:
            if current is None or current.maintenance_id != maintenance_id:
                return None
            if current.phase == MaintenancePhase.CANCELLED:
                return None  # an operator cancelled it: the workflow changes it no more
            return change(current).model_copy(update={"updated_at": _now()})

        async with self._save_lock:
            stored = await self.states.update(state_key(node), apply)
        if stored is None or stored.value.maintenance_id != maintenance_id:
            raise RetryableError(f"maintenance {maintenance_id} of {node} is no longer stored")
        if stored.value.phase == MaintenancePhase.CANCELLED:
            raise RetryableError(f"maintenance {maintenance_id} of {node} was cancelled")
        return stored.value

    def _phase_event(
        self, state: MaintenanceState, phase: MaintenancePhase, *extra: str, **fields: Any
    ) -> Event[Maintenance]:
        data = Maintenance(
            node=state.node,
            phase=phase,
            maintenance_id=state.maintenance_id,
            reason=state.reason,
            requested_by=state.requested_by,
            start_at=state.start_at,
            deadline_s=state.deadline_s,
            **fields,
        )
        return make_event(
            data,
            source=ACTOR,
            id=stable_id(state.requested_at, state.maintenance_id, phase.value, *extra),
        )

    async def _advance(
        self,
        state: MaintenanceState,
        phase: MaintenancePhase,
        change: Callable[[MaintenanceState], MaintenanceState] | None = None,
        **fields: Any,
    ) -> MaintenanceState:
        """Publish the phase (an id derived from the maintenance: a repeat is dropped), then save."""
        await self.bus.publish(self._phase_event(state, phase, **fields))

        def moved(s: MaintenanceState) -> MaintenanceState:
            s = change(s) if change else s
            return s.model_copy(update={"phase": phase})

        saved = await self._save(state.maintenance_id, state.node, moved)
        if saved.terminal:
            # Kept for `nodeward maintenance restore` once a later maintenance replaces it.
            await self.states.put(history_key(saved.node, saved.maintenance_id), saved)
        if not saved.dry_run:
            with contextlib.suppress(KubeError):
                await self.cluster.nodes.set_annotations(
                    state.node, {MAINTENANCE_ANNOTATION: phase.value}
                )
        self.log.info("maintenance.phase", to=phase.value)
        return saved

    def _proposal(
        self,
        action: str,
        state: MaintenanceState,
        target: ObjectRef,
        reason: str,
        *,
        obj: Obj | None = None,
        protective: bool = False,
        **details: Any,
    ) -> Proposal:
        return Proposal(
            action=action,
            target=target,
            reason=reason,
            policy=f"maintenance/{state.maintenance_id}",
            trigger_id=state.trigger_id,
            trigger_time=state.requested_at,
            protective=protective,
            obj=obj,
            details={"node": state.node, "maintenance": state.maintenance_id, **details},
        )

    async def _fail(self, state: MaintenanceState, error: str) -> bool:
        """End the workflow `failed` (only ever before its cordon: nothing to take back)."""
        await self.runner.fail(self._proposal("fail", state, _node_ref(state.node), error))
        await self._advance(
            state,
            MaintenancePhase.FAILED,
            lambda s: s.model_copy(update={"error": error, "finished_at": _now()}),
            error=error,
            failures=state.failures,
            checkpoints=state.checkpoints(),
        )
        return True

    # requested -> notified --------------------------------------------------------------
    async def _announce(self, state: MaintenanceState) -> bool:
        try:
            node = await self.cluster.nodes.get(state.node)
        except NotFound:
            return await self._fail(state, f"node {state.node} no longer exists")
        exempt = await self.exemptions.exempt_reason(node)
        if exempt:
            await self.runner.skip(
                self._proposal("announce", state, _node_ref(state.node), exempt),
                guard="exempt",
                reason=f"skipped: {exempt}",
            )
            return await self._fail(state, f"not maintained: {exempt}")
        plans = state.pods
        if not plans:
            # Exempt pods stay (the drain keeps them too): not planned, not told.
            moving = [
                pod
                for pod in await self.cluster.pods.on_node(state.node)
                if await self.exemptions.exempt_reason(pod) is None
            ]
            plans = plan_pods(node, moving, self.settings.skip_namespaces)
        state = await self._save(
            state.maintenance_id,
            state.node,
            lambda s: s.model_copy(
                update={"pods": plans, "cuda_checkpoint": cuda_checkpoint(node)}
            ),
        )
        for plan in state.pods.values():
            if plan.status == "not_checkpointable":
                await self.runner.skip(
                    self._proposal(
                        "checkpoint",
                        state,
                        _pod_ref(plan),
                        f"{plan.key} not checkpointable: {plan.reason}",
                        obj=None,
                    ),
                    guard="no_cuda_checkpoint",
                    reason=f"{plan.key} will be evicted at the deadline without a checkpoint: "
                    f"{plan.reason}",
                )
        opted = sum(1 for p in state.pods.values() if p.opted_in)
        proposal = self._proposal(
            "announce",
            state,
            _node_ref(state.node),
            f"maintenance of {state.node} from {when(state.start_at)} "
            f"({state.reason or 'no reason given'}): {len(state.pods)} pod(s) to move, "
            f"{opted} opted into checkpoints",
            obj=node,
            pods=sorted(state.pods),
        )

        async def tell_owners() -> dict[str, Any]:
            for plan in state.pods.values():
                await self._notify_owner(state, plan, announcement(state, plan))
            return {"owners_told": len(state.pods)}

        await self.runner.run(proposal, tell_owners, [])
        await self._advance(state, MaintenancePhase.NOTIFIED)
        return True

    async def _notify_owner(self, state: MaintenanceState, plan: PodPlan, notice: Notice) -> None:
        notice_id = stable_id(
            state.requested_at, state.maintenance_id, notice.kind, plan.namespace, plan.name
        )
        await tell_owner(
            self.bus,
            OwnerNotice(
                notice.severity,
                notice.title,
                notice.body,
                notice.why,
                notice.steps,
                notice.deadline,
            ),
            actor=ACTOR,
            topic=TOPIC,
            namespace=plan.namespace,
            name=plan.name,
            targets=[_pod_ref(plan), _node_ref(state.node)],
            notice_id=notice_id,
            dedup_key=f"{TOPIC}/{state.maintenance_id}/{plan.key}/{notice.kind}",
        )

    # notified -> checkpointing ----------------------------------------------------------
    async def _start(self, state: MaintenanceState) -> bool:
        if _now() < state.start_at:
            return False
        try:
            node = await self.cluster.nodes.get(state.node)
        except NotFound:
            return await self._fail(state, f"node {state.node} no longer exists")
        if state.prior_unschedulable is None:
            # Ownership is decided once, from the node before any change.
            prior = bool((node.get("spec") or {}).get("unschedulable"))
            state = await self._save(
                state.maintenance_id,
                state.node,
                lambda s: s.model_copy(update={"prior_unschedulable": prior}),
            )
        prior = bool(state.prior_unschedulable)
        proposal = self._proposal(
            "cordon",
            state,
            _node_ref(state.node),
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
                "time": _now().isoformat().replace("+00:00", "Z"),
            }
            return {CORDON_ANNOTATION: json.dumps(note, separators=(",", ":"))}

        async def cordon() -> dict[str, Any]:
            done = await self.marks.apply(state.node, state.maintenance_id, spec, annotate=mark)
            return {
                "cordoned": done["cordoned"],
                "prior_unschedulable": done["prior_unschedulable"],
            }

        result = await self.runner.run(proposal, cordon, self.cordon_guards(state))
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
                update={"cordoned": cordoned, "prior_unschedulable": prior, "started_at": _now()}
            ),
        )
        self.marks.failpoints.hit("maintenance.cordon.advanced")
        return True

    def cordon_guards(self, state: MaintenanceState) -> list[Guard]:
        """Exemptions and the rate limit always; the shared circuit breaker only when a
        service asked (`requested_by` `service/...`, e.g. a GPU quarantine rule).

        An operator's explicit request (the CLI, the node annotation) is a human decision
        to take that node out of service: refusing it because automation removed other
        nodes would get in the operator's way exactly when they are handling an incident.
        A service's request is automation like any other and counts against the window.
        """
        guards: list[Guard] = [self.exemptions, self.limiter]
        if self.breaker is not None and (state.requested_by or "").startswith("service/"):
            guards.append(self.breaker)
        return guards

    # checkpointing -> checkpointed ------------------------------------------------------
    async def _checkpoint_all(self, state: MaintenanceState) -> bool:
        pending = [p for p in state.pods.values() if p.status == "pending"]
        gate = asyncio.Semaphore(self.settings.parallelism)

        async def one(plan: PodPlan) -> None:
            async with gate:
                if self.halt.is_set():
                    return
                await self._checkpoint_pod(state, plan)

        # Every pod's call ends before the step does (a failed step must not leave calls
        # running that a retry would repeat); then the first error, if any, is raised.
        results = await asyncio.gather(*(one(p) for p in pending), return_exceptions=True)
        for error in results:
            if isinstance(error, BaseException):
                raise error
        current = await self.states.get(state_key(state.node))
        if current is None:
            return False
        state = current.value
        if any(p.status == "pending" for p in state.pods.values()):
            return False  # stopped before every pod was done: the next holder goes on
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
        return True

    async def _update_pod(
        self, state: MaintenanceState, key: str, change: Callable[[PodPlan], PodPlan]
    ) -> PodPlan:
        saved = await self._save(
            state.maintenance_id,
            state.node,
            lambda s: s.model_copy(update={"pods": {**s.pods, key: change(s.pods[key])}}),
        )
        return saved.pods[key]

    async def _checkpoint_pod(self, state: MaintenanceState, plan: PodPlan) -> None:
        log = self.log.bind(pod=plan.key)
        try:
            pod: Obj | None = await self.cluster.pods.get(plan.namespace, plan.name)
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
        proposal = self._proposal(
            "checkpoint",
            state,
            _pod_ref(plan),
            f"checkpoint {plan.key} on {state.node} before maintenance {state.maintenance_id}",
            obj=pod,
            containers=sorted(str(n) for n in images),
        )
        timeout = int(self.settings.call_timeout.total_seconds())

        async def act() -> dict[str, Any]:
            current = plan
            for container, image in images.items():
                if any(c.pod.container == container and c.path for c in current.checkpoints):
                    continue  # recorded before a restart: never checkpointed twice
                try:
                    path = await within(
                        self.cluster.checkpoints.create(
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
                    at=_now(),
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
            await self.cluster.pods.set_annotations(
                plan.namespace, plan.name, {ARCHIVE_ANNOTATION: note}
            )
            return {"archives": [c.path for c in current.checkpoints]}

        try:
            result = await self.runner.run(proposal, act, [self.exemptions])
        except RetryableError as exc:
            reason = str(exc.__cause__ or exc)
            deadline = state.deadline_at()
            final = isinstance(exc.__cause__, FINAL_CHECKPOINT_ERRORS)
            if not final and (deadline is None or _now() < deadline):
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
        current = await self.states.get(state_key(state.node))
        recorded = current.value.pods[plan.key].checkpoints if current else []
        # The event first: a restart before the status is saved publishes it again under
        # the same id (dropped), without checkpointing again.
        await self.bus.publish(
            self._phase_event(state, MaintenancePhase.CHECKPOINTED, plan.key, checkpoints=recorded)
        )
        await self._update_pod(
            state,
            plan.key,
            lambda p: p.model_copy(update={"status": "checkpointed", "annotated": True}),
        )

    async def _checkpoint_failed(self, state: MaintenanceState, plan: PodPlan) -> None:
        deadline = state.deadline_at() or _now()
        await self._notify_owner(state, plan, checkpoint_failed(state, plan, deadline))

    # checkpointed -> draining -> done -----------------------------------------------------
    async def _to_draining(self, state: MaintenanceState) -> bool:
        await self._advance(state, MaintenancePhase.DRAINING)
        return True

    async def _drain(self, state: MaintenanceState) -> bool:
        deadline = state.deadline_at() or _now()
        first = state.drain is None
        if not first and _now() < deadline:
            return False  # held pods wait for the deadline
        remaining = max((deadline - _now()).total_seconds(), 1.0)
        wait = remaining if first else self.settings.evict_timeout.total_seconds()
        settings = DrainSettings(
            enabled=True,
            deadline=timedelta(seconds=wait),
            grace_period=self.settings.grace_period,
            skip_namespaces=self.settings.skip_namespaces,
        )
        hold_for = hold(state) if first else None
        action = "drain" if first else "evict-held"
        proposal = self._proposal(
            action,
            state,
            _node_ref(state.node),
            (
                f"drain {state.node} for maintenance {state.maintenance_id}: every pod but "
                f"DaemonSets, PDBs honoured, until {when(deadline)}"
                if first
                else f"deadline {when(deadline)} of maintenance {state.maintenance_id} reached: "
                f"evicting the pods held on {state.node}"
            ),
        )

        async def act() -> dict[str, Any]:
            stop = asyncio.Event()
            watch = asyncio.create_task(self._until_cancelled(state, stop))
            try:
                result = await drain(
                    self.cluster, state.node, settings, self.exemptions, hold=hold_for, stop=stop
                )
            finally:
                watch.cancel()
            return result.to_json() | ({"stopped": True} if stop.is_set() else {})

        outcome = await self.runner.run(proposal, act, [])
        if outcome.details.get("stopped"):
            return True  # cancelled by its requester mid-drain: the workflow ends it
        result = dict(outcome.details) if outcome.outcome == Outcome.APPLIED else {}
        merged = merge_drain(state.drain, result, outcome.outcome.value)
        # Pods a budget blocked until the deadline had their time; held pods have not.
        if first and merged.get("held"):
            await self._save(
                state.maintenance_id, state.node, lambda s: s.model_copy(update={"drain": merged})
            )
            return True
        return await self._finish(state, merged)

    async def _until_cancelled(self, state: MaintenanceState, stop: asyncio.Event) -> None:
        """Set `stop` once the maintenance is cancelled (read from KV each tick: any replica
        may have answered the cancellation)."""
        while True:
            try:
                current = await self.states.get(state_key(state.node))
            except Exception as exc:  # noqa: BLE001 - a bus hiccup: look again next tick
                self.log.warning("maintenance.cancel_watch_failed", error=str(exc))
                await asyncio.sleep(self.settings.tick.total_seconds())
                continue
            if (
                current is None
                or current.value.maintenance_id != state.maintenance_id
                or current.value.phase == MaintenancePhase.CANCELLED
            ):
                stop.set()
                return
            await asyncio.sleep(self.settings.tick.total_seconds())

    async def _finish(self, state: MaintenanceState, drained: dict[str, Any]) -> bool:
        current = await self.states.get(state_key(state.node))
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
        summary = (
            f"maintenance {state.maintenance_id} of {state.node} done: "
            f"{sum(1 for p in state.pods.values() if p.status == 'checkpointed')} pod(s) "
            f"checkpointed, {len(evicted)} evicted"
            + (f"; {len(failures)} failure(s): " + "; ".join(failures) if failures else "")
        )
        await self.runner.record(
            self._proposal("complete", state, _node_ref(state.node), summary, failures=failures),
            Outcome.APPLIED,
            summary,
        )
        await self._advance(
            state,
            MaintenancePhase.DONE,
            lambda s: s.model_copy(
                update={"drain": drained, "failures": failures, "finished_at": _now()}
            ),
            checkpoints=state.checkpoints(),
            failures=failures,
        )
        return True

    # operator controls ------------------------------------------------------------------
    async def _control_target(
        self, request: ControlRequest
    ) -> tuple[str, Obj | None, MaintenanceState | None] | ControlReply:
        node = request.target or ""
        try:
            dns_subdomain(node)
        except ValueError as exc:
            return ControlReply.error(f"{request.verb}: {exc}")
        try:
            obj: Obj | None = await self.cluster.nodes.get(node)
        except NotFound:
            obj = None
        current = await self.states.get(state_key(node))
        return node, obj, current.value if current else None

    def _control_proposal(
        self,
        request: ControlRequest,
        action: str,
        *,
        node: str,
        obj: Obj | None,
        state: MaintenanceState | None,
        what: str,
    ) -> Proposal:
        details: dict[str, Any] = {"node": node}
        if state is not None:
            details |= {"maintenance": state.maintenance_id, "phase": state.phase.value}
        return operator_proposal(
            request,
            action=action,
            target=_node_ref(node),
            what=what,
            obj=obj,
            policy=f"maintenance/{state.maintenance_id}" if state else None,
            details=details,
            resolves=True,
        )

    async def cancel_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward maintenance cancel NODE`: stop a maintenance before its drain (the
        cordon nodeward put on comes off); once the drain began, say what was done."""
        found = await self._control_target(request)
        if isinstance(found, ControlReply):
            return found
        node, obj, state = found
        what = (
            f"cancellation of maintenance {state.maintenance_id} of {node}"
            if state
            else f"cancellation of a maintenance of {node}"
        )
        proposal = self._control_proposal(
            request, "cancel", node=node, obj=obj, state=state, what=what
        )
        if state is None:
            why = f"refused: no maintenance of {node} by nodeward; nothing to cancel"
            return await refuse(self.runner, proposal, guard="not_ours", reason=why)
        if state.terminal:
            why = (
                f"refused: maintenance {state.maintenance_id} of {node} already ended "
                f"({state.phase.value}); done: {done_so_far(state)}"
            )
            return await refuse(self.runner, proposal, guard="ended", reason=why)
        # Its requester (recovery, for a quarantine an operator released) may stop a drain
        # under way: the evictions still waiting are given up, the cordon comes off.
        own = request.operator == state.requested_by
        if (state.phase == MaintenancePhase.DRAINING or state.drain is not None) and not own:
            why = (
                f"refused: the drain of {node} for maintenance {state.maintenance_id} has "
                f"begun; already done: {done_so_far(state)}; `nodeward maintenance finish "
                f"{node}` uncordons it once the maintenance is done"
            )
            return await refuse(self.runner, proposal, guard="draining", reason=why)
        before = state.phase

        def cancel(current: MaintenanceState | None) -> MaintenanceState | None:
            if (
                current is None
                or current.maintenance_id != state.maintenance_id
                or current.terminal
                or (current.phase == MaintenancePhase.DRAINING and not own)
            ):
                return None
            update = {
                "phase": MaintenancePhase.CANCELLED,
                "ended_by": request.operator,
                "finished_at": _now(),
                "updated_at": _now(),
            }
            return current.model_copy(update=update)

        async def act() -> dict[str, Any]:
            stored = await self.states.update(state_key(node), cancel)
            if stored is None or stored.value.phase != MaintenancePhase.CANCELLED:
                phase = stored.value.phase.value if stored else "gone"
                raise RuntimeError(f"maintenance {state.maintenance_id} moved on ({phase})")
            released = await self.marks.release(node, note=proposal.reason) or {}
            cancelled = stored.value
            if released:
                cancelled = cancelled.model_copy(update={"released_at": _now()})
                await self.states.put(state_key(node), cancelled)
            await self.states.put(history_key(node, cancelled.maintenance_id), cancelled)
            await self.bus.publish(
                self._phase_event(cancelled, MaintenancePhase.CANCELLED, error=proposal.reason)
            )
            if before != MaintenancePhase.REQUESTED:  # owners were warned: tell them it is off
                for plan in cancelled.pods.values():
                    notice = cancellation(cancelled, plan, request.operator)
                    await self._notify_owner(cancelled, plan, notice)
            with contextlib.suppress(KubeError):  # nothing of the maintenance left on the node
                await self.cluster.nodes.set_annotations(node, _ENDED)
            self.wake.set()
            return {"was": before.value, **released}

        decided = await self.runner.run(proposal, act, self.control_guards, retry=False)
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
        found = await self._control_target(request)
        if isinstance(found, ControlReply):
            return found
        node, obj, state = found
        what = (
            f"finish of maintenance {state.maintenance_id} of {node}"
            if state
            else f"finish of a maintenance of {node}"
        )
        proposal = self._control_proposal(
            request, "finish", node=node, obj=obj, state=state, what=what
        )
        cordoned = bool(obj and (obj.get("spec") or {}).get("unschedulable"))
        stays = " (it stays cordoned)" if cordoned else ""
        if state is None or not await self.marks.holds(node):
            ended = f" (maintenance {state.maintenance_id}: {state.phase.value})" if state else ""
            why = (
                f"refused: nodeward holds no maintenance cordon on {node}{ended}{stays}; "
                "nodeward undoes only what it did"
            )
            return await refuse(self.runner, proposal, guard="not_ours", reason=why)
        if state.phase != MaintenancePhase.DONE:
            why = (
                f"refused: maintenance {state.maintenance_id} of {node} is still "
                f"{state.phase.value}; wait for it to be done, or `nodeward maintenance cancel "
                f"{node}` before its drain"
            )
            return await refuse(self.runner, proposal, guard="not_done", reason=why)

        async def act() -> dict[str, Any]:
            released = await self.marks.release(node, note=proposal.reason) or {}

            def finished(current: MaintenanceState | None) -> MaintenanceState | None:
                if current is None or current.maintenance_id != state.maintenance_id:
                    return None
                return current.model_copy(
                    update={"ended_by": request.operator, "released_at": _now()}
                )

            stored = await self.states.update(state_key(node), finished)
            if stored is not None:
                await self.states.put(history_key(node, state.maintenance_id), stored.value)
            with contextlib.suppress(KubeError):  # nothing of the maintenance left on the node
                await self.cluster.nodes.set_annotations(node, _ENDED)
            return released

        decided = await self.runner.run(proposal, act, self.control_guards, retry=False)
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


async def build(settings: Settings) -> Daemon:
    """The checkpoint service's daemon: a consumer on `maintenance.requested.>` and the
    workflow loop. `settings.cluster` must authenticate as its ServiceAccount."""
    config: CheckpointSettings = section(settings, "services", NAME, CheckpointSettings)
    daemon, bus, cluster = await acting_daemon(NAME, settings, source=ACTOR, access=ACCESS)
    kv = await bus.kv(config.bucket, history=5)
    holder = f"{socket.gethostname()}-{os.getpid()}-{id(daemon):x}"

    breaker = await node_breaker(
        bus, cluster, config.breaker, registry=daemon.metrics.registry, daemon=daemon
    )
    service = CheckpointService(
        bus,
        cluster,
        states=TypedKV(kv, MaintenanceState),
        kv=kv,
        settings=config,
        holder=holder,
        breaker=breaker,
    )

    spec = service.consumer_spec()
    if settings.bus.partitions > 1:  # per node across replicas (leases in its bucket)
        spec = replace(spec, partitions=settings.bus.partitions, lease_ttl=config.lease_ttl)

    async def consume() -> None:
        await bus.consume(spec, service.handle, leases=kv)

    async def workflows() -> None:
        await service.run(daemon.stopping)

    async def annotations() -> None:
        await service.watch_annotations(daemon.stopping)

    daemon.add_task(consume, name="consume")
    daemon.add_task(workflows, name="workflows", graceful=True)
    daemon.add_task(annotations, name="annotations", graceful=True)
    await bus.control(NAME, "cancel", service.cancel_control)
    await bus.control(NAME, "finish", service.finish_control)
    return daemon


component, standalone = one_daemon(NAME, build)
