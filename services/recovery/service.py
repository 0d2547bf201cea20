"""services.recovery: bring a quarantined node back into service without a human when the
XID catalog says a GPU reset or a node reboot cures its fault.

A durable consumer on cordon's audit records (`remediation.quarantine.>`, applied) decides
from the fault (`policy.decide`): a reset or a reboot starts a recovery, an RMA fault goes
to on-call at once. A recovery is one record in KV (`schemas.state.recovery`) that a loop
drives step by step, saving before each, so a restart resumes it where it stood:

draining (maintenance requested as cordon's `maintenance: true` does: checkpoints first,
then the drain; `maintenance.done.<node>` ends it) -> remediating (the plan's remediator,
`remediators.REMEDIATORS`: a GPU reset by the node's agent, a reboot through a node label
and annotation a reboot operator acts on, or a webhook) -> rebooting (until the node's
`status.nodeInfo.bootID` changes) -> validating (the node's GPU agent checks its GPUs:
NVML, DCGM diagnostics where `dcgmi` exists) -> releasing (the owners' release paths:
`control.checkpoint.finish`, then `control.cordon.release`, as `service/recovery`) ->
released. A validation that fails remediates again; the second failure escalates to
on-call (critical, "RMA suggested") and leaves the node quarantined.

Every step is a kernel proposal (audited on `remediation.>`, notified, dry-run
respected); starting one passes the exemptions, a per-node retry limit and the circuit
breaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.js.errors import NoKeysError
from pydantic import Field, ValidationError

from nodeward.aio import KeyedLocks, within
from nodeward.bus import Bus, ConsumerSpec, Delivery
from nodeward.bus.control import ControlTimeout, request
from nodeward.bus.kv import TypedKV
from nodeward.config import Section, Settings, section
from nodeward.daemon import Daemon
from nodeward.durations import Duration
from nodeward.kube import Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.platform import acting_daemon, one_daemon
from schemas.base import Event, make_event
from schemas.common import ObjectRef, dns_subdomain
from schemas.control import ControlReply, ControlRequest, ControlStatus
from schemas.ids import stable_id
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.notify import Severity
from schemas.recovery import VALIDATE, ValidateRequest, ValidationReport, agent_subject
from schemas.remediation import Outcome, Remediation
from schemas.state.cordon import TAINT_KEY
from schemas.state.recovery import (
    BUCKET,
    Plan,
    RecoveryCounts,
    RecoveryRecord,
    Step,
    count_key,
    node_key,
)
from schemas.xid import XidCatalog, load_catalog
from services.kernel import (
    HOLD_ANNOTATION,
    BreakerSettings,
    CircuitBreaker,
    DrainSettings,
    Guard,
    Proposal,
    Stage,
    Verdict,
    Workflow,
    acting,
    blockers,
    drain,
    hold_note,
    hold_of,
    per_action,
    table,
)
from services.kernel.breaker import node_breaker
from services.kernel.control import (
    ControlSettings,
    operator_proposal,
    refuse,
    reply_for,
)
from services.kernel.drain import EVIDENCE
from services.kernel.holds import release_command
from services.kernel.marks import NodeMarks
from services.kernel.severities import FAILURE_WARNS, GOOD_NEWS
from services.kernel.workflow import Gone, Retry
from services.kernel.workflow import Step as FlowStep
from services.recovery.access import ACCESS
from services.recovery.policy import (
    AfterFailure,
    Kind,
    after_validation_failure,
    decide,
    gpu_indices,
    within_limit,
)
from services.recovery.remediators import (
    REMEDIATORS,
    RemediatorError,
    Tools,
    boot_id,
)

NAME = "recovery"
ACTOR = "service/recovery"
OWNER = "recovery"  # of its marks on the node (the reboot request)
TOPIC = "recovery"
CORDON_ACTOR = "service/cordon"
GPU_RESOURCE = "nvidia.com/gpu"
# Steps that go well are news, not pages; a failed step that recovery tries again is a
# warning; the escalation (critical, set on its proposal) pages.
SEVERITIES = per_action(
    (
        table(GOOD_NEWS, FAILURE_WARNS),
        ("recover", "drain", "reset", "reboot", "validate", "release"),
    )
)
BACKOFF_CAP_S = 600.0


class RecoverySettings(Section):
    """`services.recovery` in the config file."""

    dry_run: bool = False
    bucket: str = BUCKET
    consumer: str = "recovery-quarantines"
    subjects: list[str] = Field(default_factory=lambda: ["remediation.quarantine.>"], min_length=1)
    maintenance_consumer: str = "recovery-maintenance"
    maintenance_subjects: list[str] = Field(
        default_factory=lambda: [
            "maintenance.done.>",
            "maintenance.failed.>",
            "maintenance.cancelled.>",
        ],
        min_length=1,
    )
    remediators: dict[Plan, str] = Field(
        default_factory=lambda: {Plan.RESET: "gpu-reset", Plan.REBOOT: "reboot-annotation"},
        description="the remediator per plan: gpu-reset, reboot-annotation, webhook",
    )
    webhook_url: str | None = Field(default=None, description="for the `webhook` remediator")
    max_trigger_age: Duration = Field(
        default=timedelta(minutes=15),
        description="an older quarantine (a replay on a new consumer) starts no recovery",
    )
    drain_deadline: Duration = Field(
        default=timedelta(minutes=10), description="the maintenance's deadline for every pod"
    )
    drain_timeout: Duration = Field(
        default=timedelta(minutes=30),
        description="the node not drained (no `maintenance.done`, or pods left) by then: escalate",
    )
    evict_retry: Duration = Field(
        default=timedelta(seconds=30),
        description="how often the pods a drain left are evicted again (budgets honoured)",
    )
    retry_backoff: Duration = Field(
        default=timedelta(seconds=30),
        description="the wait before the next reset or reboot after a failed one (doubling)",
    )
    skip_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system", "nodeward"],
        description="namespaces whose pods may stay on a node that is reset or rebooted",
    )
    reboot_timeout: Duration = Field(
        default=timedelta(minutes=20), description="no new bootID by then: a failed attempt"
    )
    validate_timeout: Duration = Field(
        default=timedelta(minutes=5),
        description="the GPU agent does not answer (still booting) this long: a failed attempt",
    )
    request_timeout: Duration = Field(
        default=timedelta(seconds=30), description="one request to an agent or a service"
    )
    dcgm_level: int = Field(default=1, ge=1, le=4, description="`dcgmi diag -r LEVEL`")
    burn_in: Duration = Field(default=timedelta(0), description="0: no GPU burn-in")
    max_validation_failures: int = Field(default=2, ge=1)
    max_attempts: int = Field(
        default=3, ge=1, description="reset/reboot requests per recovery before escalating"
    )
    retry_limit: int = Field(default=3, ge=1, description="recoveries per node per window")
    retry_window: Duration = timedelta(hours=24)
    interval: Duration = Field(default=timedelta(seconds=2), description="the loop's pass")
    breaker: BreakerSettings = BreakerSettings()
    controls: ControlSettings = ControlSettings()


def _target(node: str) -> ObjectRef:
    return ObjectRef(kind="Node", name=node, api_version="v1")


def _has_quarantine(node: Obj) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == TAINT_KEY for t in taints)


def _expected_gpus(node: Obj) -> int | None:
    raw = ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


class RetryLimit:
    """A guard: at most `limit` recoveries of one node per `window` (KV `count.<node>`)."""

    name = "retry_limit"
    stage = Stage.RATE_LIMIT

    def __init__(self, counts: TypedKV[RecoveryCounts], settings: RecoverySettings) -> None:
        self.counts = counts
        self.limit = settings.retry_limit
        self.window = settings.retry_window.total_seconds()

    async def check(self, proposal: Proposal) -> Verdict | None:
        if proposal.action != "recover":
            return None
        entry = await self.counts.get(count_key(proposal.target.name))
        started = entry.value.started if entry else []
        if within_limit(started, time.time(), limit=self.limit, window_s=self.window):
            return None
        return Verdict(
            self.name,
            f"refused: {self.why(proposal.target.name)}; it stays quarantined for on-call",
        )

    def why(self, node: str) -> str:
        return f"{node} started {self.limit} recoveries within {self.window / 3600:g}h"

    async def count(self, node: str, incident_time: float) -> None:
        def add(current: RecoveryCounts | None) -> RecoveryCounts | None:
            started = [
                t for t in (current.started if current else []) if time.time() - t < self.window
            ]
            if incident_time in started:
                return None
            return RecoveryCounts(started=[*started, incident_time])

        await self.counts.update(count_key(node), add)


class RecoveryService:
    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        *,
        records: TypedKV[RecoveryRecord],
        counts: TypedKV[RecoveryCounts],
        marks: NodeMarks,
        breaker: CircuitBreaker,
        settings: RecoverySettings,
        catalog: XidCatalog | None = None,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.records = records
        self.settings = settings
        self.catalog = catalog or load_catalog()
        self.marks = marks
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
        self.retry_limit = RetryLimit(counts, settings)
        self.start_guards: list[Guard] = [self.exemptions, self.retry_limit, breaker]
        self.tools = Tools(
            nc=bus.nc,
            cluster=cluster,
            marks=marks,
            timeout_s=settings.request_timeout.total_seconds(),
            webhook_url=settings.webhook_url,
        )
        self.wake = asyncio.Event()
        self.node_lock = KeyedLocks()
        """One node's recovery stepped one at a time."""
        self.log = structlog.get_logger().bind(service=NAME)
        self.flow = self._workflow(records)

    def _workflow(self, records: TypedKV[RecoveryRecord]) -> Workflow[RecoveryRecord]:
        """The recovery's steps on the kernel's workflow engine. A step that raised is tried
        again on a later pass (doubling from `interval`); the drain and the reboot wait up
        to their timeouts (`drain_timeout` from the start, `reboot_timeout` from the ask),
        then escalate or count a failed attempt."""
        interval = self.settings.interval.total_seconds()
        retry = Retry(first_s=interval, cap_s=max(interval * 8, interval))

        def step(fn: Callable[[RecoveryRecord, Obj], Awaitable[None]], **more: Any) -> Any:
            return FlowStep(self._on_node(fn), retry=retry, **more)

        return Workflow(
            NAME,
            records,
            {
                Step.DRAINING: step(
                    self._draining, deadline=self._drain_deadline, expired=self._undrained
                ),
                Step.BLOCKED: step(
                    self._blocked, deadline=self._drain_deadline, expired=self._still_blocked
                ),
                Step.REMEDIATING: step(self._remediate),
                Step.REBOOTING: step(
                    self._rebooting, deadline=self._reboot_deadline, expired=self._no_reboot
                ),
                Step.VALIDATING: step(self._validate),
                Step.RELEASING: step(self._release),
            },
            prefix="node.",
            key_of=lambda r: node_key(r.node),
            identity=lambda r: r.incident,
            step_of=lambda r: r.step.value,
            with_step=lambda r, to: r.model_copy(update={"step": Step(to)}),
            terminal=lambda r: r.terminal,
            errors=(KubeError, NatsError, TimeoutError),
            failpoints=self.marks.failpoints,
        )

    # consumers --------------------------------------------------------------------------
    def consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            name=self.settings.consumer,
            stream="AUDIT",
            subjects=tuple(self.settings.subjects),
            types=frozenset({Remediation.TYPE}),
            concurrency=4,
            order_key=lambda e: e.data.target.name,
            max_deliver=6,
        )

    def maintenance_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            name=self.settings.maintenance_consumer,
            stream="MAINTENANCE",
            subjects=tuple(self.settings.maintenance_subjects),
            types=frozenset({Maintenance.TYPE}),
            concurrency=4,
            order_key=lambda e: str(e.data.node),
            max_deliver=6,
        )

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
        if age > self.settings.max_trigger_age.total_seconds():
            return  # a replay: the quarantine's recovery, if any, was decided then
        node = audit.target.name
        decision = decide(
            audit.details.get("recommended_actions") or [],
            audit.details.get("xids") or [],
            self.catalog,
        )
        if decision.kind == Kind.NONE:
            return
        with structlog.contextvars.bound_contextvars(node=node, incident=audit.trigger_event_id):
            async with self.node_lock(node):
                if grew or (joined and await self._engaged(node, audit.details["incident"])):
                    await self._fault_grew(audit, decision.kind, decision.plan, decision.why)
                else:
                    await self._start(event, audit, decision.kind, decision.plan, decision.why)

    async def _engaged(self, node: str, incident: str) -> bool:
        """True while a recovery of `node` is under way, or quarantine `incident`'s was
        handed to a human (escalated): a later failure of its quarantine is that recovery's,
        never one of its own (which would reboot and release a node on-call was told needs
        them). An escalation of an earlier quarantine, long over, engages nothing."""
        current = await self.records.get(node_key(node))
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
        current = await self.records.get(node_key(audit.target.name))
        record = current.value if current else None
        if record is None or record.terminal:
            return
        flap = audit.details.get("flapping")
        if flap:  # a reset or reboot more would only be the next flap's
            await self._escalate(record, f"{flap} (flapping)", rma=False)
        elif kind == Kind.ESCALATE:
            await self._escalate(record, f"the fault grew: {audit.reason}; {why}")
        elif (
            plan == Plan.REBOOT
            and record.plan == Plan.RESET
            and record.step in (Step.DRAINING, Step.BLOCKED, Step.REMEDIATING)
            and record.asked_at is None
        ):
            remediator = self.settings.remediators[Plan.REBOOT]
            record = await self._update(record, plan=Plan.REBOOT, remediator=remediator)
            await self._save(record, record.step, f"plan now reboot: {why}", note_only=True)

    async def _start(
        self, event: Event[Any], audit: Remediation, kind: Kind, plan: Plan | None, why: str
    ) -> None:
        node, incident = audit.target.name, str(audit.trigger_event_id)
        current = await self.records.get(node_key(node))
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
            obj = await self.cluster.nodes.get(node)
        except NotFound:
            return
        proposal = Proposal(
            action="recover" if kind == Kind.RECOVER else "escalate",
            target=_target(node),
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
                done = {"plan": current.value.plan.value, "remediator": current.value.remediator}
                await self.runner.record(proposal, Outcome.APPLIED, details=done)
            return
        if kind == Kind.ESCALATE:
            record = self._new(node, incident, Plan.REBOOT, gpus, xids, reason)
            await self._escalate(record, why, rma=not flap)
            return
        assert plan is not None
        remediator = self.settings.remediators[plan]
        record = self._new(node, incident, plan, gpus, xids, reason, remediator=remediator)

        async def act() -> dict[str, Any]:
            await self.retry_limit.count(node, event.time.timestamp())
            await self.records.put(node_key(node), record)
            return {"plan": plan.value, "remediator": remediator}

        decided = await self.runner.run(proposal, act, self.start_guards, retry=False)
        if decided.outcome == Outcome.APPLIED:
            self.wake.set()
        elif decided.guard == RetryLimit.name and decided.outcome == Outcome.REFUSED:
            # A node that keeps failing is a human's: held, so that no automatic release
            # (cordon's healthy period) puts it back in service behind on-call's back.
            await self._escalate(record, self.retry_limit.why(node), rma=False)

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
        async with self.node_lock(data.node):
            current = await self.records.get(node_key(data.node))
            record = current.value if current else None
            if record is None or record.step != Step.DRAINING:
                return
            if event.time.timestamp() < record.started_at - 5:
                return  # a maintenance that ended before this recovery began
            ours = data.maintenance_id == record.maintenance_id
            if data.phase == MaintenancePhase.DONE:
                # Ours, or one already under way when ours was asked. Done is not drained:
                # the node is drained only when no pod a reset or reboot would harm is left.
                await self._drained(record, f"maintenance {data.maintenance_id}", data.failures)
            elif ours and "already in maintenance" not in (data.error or ""):
                await self._escalate(
                    record,
                    f"maintenance {data.maintenance_id} {data.phase.value}: {data.error or ''}",
                    rma=False,
                )

    async def _drained(
        self, record: RecoveryRecord, by: str, failures: list[str] | None = None
    ) -> bool:
        """Move on to the reset or reboot if no pod it would harm is left on the node; else
        the recovery is blocked (on-call paged once). True when drained."""
        left = await blockers(
            self.cluster, record.node, self.exemptions, self.settings.skip_namespaces
        )
        if left:
            for line in failures or []:  # the maintenance's words (the budget) where it has any
                pod, _, why = line.partition(": ")
                if pod in left and why:
                    left[pod] = why
            await self._block(record, left)
            return False
        await self._record(
            record,
            "drain",
            f"{record.node} drained by {by}: no pod left that the {record.plan.value} would harm",
            what="drained",
        )
        await self._save(record, Step.REMEDIATING, f"drained ({by})")
        self.wake.set()
        return True

    async def _block(self, record: RecoveryRecord, left: dict[str, str]) -> RecoveryRecord:
        """The drain left pods: no reset or reboot; evictions retried every `evict_retry`;
        on-call paged (critical) the first time, with the pods and what keeps each."""
        now = time.time()
        first = record.blocked_since is None
        # A pod still there keeps the most telling reason seen (an eviction's budget).
        left = {
            pod: record.blocked.get(pod, why) if why.startswith("still running") else why
            for pod, why in left.items()
        }
        record = await self._update(
            record,
            blocked=left,
            blocked_since=record.blocked_since or now,
            next_evict_at=(
                now + self.settings.evict_retry.total_seconds() if first else record.next_evict_at
            ),
            step=Step.BLOCKED,
        )
        if not first:
            return record
        listed = "; ".join(f"{pod}: {why}" for pod, why in sorted(left.items()))
        proposal = dataclasses.replace(
            self._proposal(
                record,
                "drain",
                f"{record.node} is not drained: {len(left)} pod(s) left ({listed}). No "
                f"{record.plan.value} while they are there; the node stays quarantined. "
                "nodeward never forces past a PodDisruptionBudget, an exemption or Falco's "
                "evidence: free the budget, move the pods, lift the isolation, or release "
                f"the quarantine ({release_command(record.node)}). Evictions "
                f"are tried again every {self.settings.evict_retry.total_seconds():g}s until "
                f"drain_timeout ({self.settings.drain_timeout.total_seconds():g}s after the "
                "start), then on-call is paged again",
            ),
            trigger_id=record.attempt_id("drain-blocked"),
            severity=Severity.CRITICAL,
            title=f"{record.node}: drain blocked",
        )
        await self.runner.fail(proposal, guard="drain_blocked", details={"pods": left})
        await self._save(record, Step.BLOCKED, f"{len(left)} pod(s) left: {listed}"[:400])
        return record

    async def _blocked(self, record: RecoveryRecord, obj: Obj) -> None:
        """Wait for the pods the drain left to go (evicting them again, budgets honoured),
        until `drain_timeout`; then on-call, the node quarantined."""
        if await self._drained(record, "the evictions retried after the drain"):
            return
        stored = await self.records.get(node_key(record.node))
        record = stored.value if stored else record
        if time.time() >= self._drain_deadline(record):
            return  # past drain_timeout: the engine escalates it
        if time.time() < (record.next_evict_at or 0) or self.runner.dry_run:
            return  # not yet; or a service turned dry-running since: it evicts nothing
        # One attempt per pod, no waiting on a budget: the pass drives every node in turn.
        wait = min(self.settings.evict_retry.total_seconds(), 0.5)
        result = await drain(
            self.cluster,
            record.node,
            DrainSettings(
                enabled=True,
                deadline=timedelta(seconds=wait),
                skip_namespaces=self.settings.skip_namespaces,
            ),
            self.exemptions,
        )
        # evicted: gone, or terminating (a blocker until it is gone, not a budget's refusal)
        moved = [*result.evicted, *result.gone, *result.terminating]
        if moved:
            await self._record(
                record,
                "drain",
                f"evicted {len(moved)} pod(s) the drain had left on {record.node}: "
                f"{', '.join(moved)}",
                what=f"evicted-{len(record.history)}",
            )
        left = dict(record.blocked)
        for pod in moved:
            left.pop(pod, None)
        left.update({pod: f"not evicted: {why}" for pod, why in result.blocked.items()})
        left.update(dict.fromkeys(result.terminating, "terminating"))
        await self._update(
            record,
            blocked=left,
            next_evict_at=time.time() + self.settings.evict_retry.total_seconds(),
        )
        if moved:
            self.wake.set()

    # operator controls ------------------------------------------------------------------
    async def force_drain_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward recovery force-drain NODE`: the operator's word to delete the pods a
        PodDisruptionBudget keeps on a node whose recovery is blocked (nodeward never does
        on its own). Exempt pods and Falco's evidence stay: each needs its own act."""
        node = request.target or ""
        try:
            dns_subdomain(node)
        except ValueError as exc:
            return ControlReply.error(f"force-drain: {exc}")
        with structlog.contextvars.bound_contextvars(node=node):
            async with self.node_lock(node):
                return await self._force_drain(request, node)

    async def _force_drain(self, request: ControlRequest, node: str) -> ControlReply:
        current = await self.records.get(node_key(node))
        record = current.value if current else None
        try:
            obj: Obj | None = await self.cluster.nodes.get(node)
        except NotFound:
            obj = None
        proposal = operator_proposal(
            request,
            action="force-drain",
            target=_target(node),
            what=f"forced drain of {node} past its pods' disruption budgets",
            obj=obj,
            policy=record.plan.value if record else None,
            details={"incident": record.incident} if record else None,
        )
        if record is None or record.step != Step.BLOCKED:
            where = f" (its recovery is {record.step.value})" if record else ""
            why = f"refused: no recovery of {node} is blocked on its drain{where}"
            return await refuse(self.runner, proposal, guard="not_blocked", reason=why)
        left = await blockers(self.cluster, node, self.exemptions, self.settings.skip_namespaces)
        kept = {p: w for p, w in left.items() if w.startswith("exempt") or w == EVIDENCE}
        forced = [p for p in left if p not in kept]
        still = "; ".join(f"{p}: {w}" for p, w in sorted(kept.items()))
        if not forced:
            why = f"refused: nothing a budget keeps on {node}; what is left needs its own act: {still}"
            return await refuse(self.runner, proposal, guard="nothing_to_force", reason=why)

        async def act() -> dict[str, Any]:
            deleted = []
            for pod in await self.cluster.pods.on_node(node):
                meta = pod["metadata"]
                ref = f"{meta['namespace']}/{meta['name']}"
                if ref in forced and await self.cluster.pods.delete(
                    meta["namespace"], meta["name"], uid=meta.get("uid")
                ):
                    deleted.append(ref)
            return {"deleted": deleted, "kept": kept}

        decided = await self.runner.run(proposal, act, self.control_guards, retry=False)
        self.wake.set()
        deleted = decided.details.get("deleted") or []
        rest = f"; still there: {still}" if still else "; the recovery goes on once they are gone"
        return reply_for(
            decided, done=f"deleted {len(deleted)} pod(s) on {node}: {', '.join(deleted)}{rest}"
        )

    # the loop ---------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event) -> None:
        """Drive every recovery under way, a pass each `interval` (or when woken)."""
        interval = self.settings.interval.total_seconds()
        while not stopping.is_set():
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not stop the loop
                self.log.exception("recovery.pass_failed")
            with contextlib.suppress(TimeoutError):
                await within(self.wake.wait(), interval)
            self.wake.clear()

    async def pass_once(self) -> None:
        try:
            keys = await self.records.kv.keys()
        except NoKeysError:
            return
        for key in keys:
            if not key.startswith("node."):
                continue
            node = key.removeprefix("node.")
            with structlog.contextvars.bound_contextvars(node=node):
                async with self.node_lock(node):
                    current = await self.records.get(key)
                    if current is None:
                        continue
                    if current.value.terminal:
                        if current.value.held:
                            await self._lift_hold(current.value)
                        continue
                    await self.step(current.value)

    async def step(self, record: RecoveryRecord) -> None:
        """One step of one recovery (the kernel's workflow engine runs it)."""
        await self.flow.step(record)

    def _on_node(
        self, fn: Callable[[RecoveryRecord, Obj], Awaitable[None]]
    ) -> Callable[[RecoveryRecord], Awaitable[float | None]]:
        """A step of a node still quarantined: one that left the cluster, or whose
        quarantine ended some other way (but while releasing), ends the recovery instead."""

        async def run(record: RecoveryRecord) -> float | None:
            try:
                obj = await self.cluster.nodes.get(record.node)
            except NotFound:
                await self._save(record, Step.GONE, "the node left the cluster")
                return None
            if record.step != Step.RELEASING and not _has_quarantine(obj):
                await self._ended_elsewhere(record)
                return None
            await fn(record, obj)
            return None

        return run

    def _drain_deadline(self, record: RecoveryRecord) -> float:
        return record.started_at + self.settings.drain_timeout.total_seconds()

    def _reboot_deadline(self, record: RecoveryRecord) -> float:
        return (record.asked_at or record.updated_at) + self.settings.reboot_timeout.total_seconds()

    async def _undrained(self, record: RecoveryRecord, why: str) -> None:
        since = time.time() - record.started_at
        await self._escalate(record, f"no maintenance done within {since:.0f}s", rma=False)

    async def _still_blocked(self, record: RecoveryRecord, why: str) -> None:
        since = time.time() - record.started_at
        listed = "; ".join(f"{pod}: {why}" for pod, why in sorted(record.blocked.items()))
        await self._escalate(
            record,
            f"the drain left {len(record.blocked)} pod(s) for {since:.0f}s, past "
            f"drain_timeout: {listed}",
            rma=False,
        )

    async def _no_reboot(self, record: RecoveryRecord, why: str) -> None:
        waited = time.time() - (record.asked_at or record.updated_at)
        await self._failed_attempt(record, f"no reboot within {waited:.0f}s")

    async def _draining(self, record: RecoveryRecord, obj: Obj) -> None:
        """Ask for the maintenance (its id is the recovery's: asking again is a no-op);
        `handle_maintenance` moves on when it is done."""
        if time.time() >= self._drain_deadline(record) or "draining: requested" in record.history:
            return  # past drain_timeout: the engine escalates it
        mid = record.maintenance_id or f"mnt-recovery-{record.incident}"
        proposal = self._proposal(record, "drain", f"maintenance {mid} of {record.node}: "
                                  "checkpoints first, then the drain, before the "
                                  f"{record.plan.value}")  # fmt: skip

        async def act() -> dict[str, Any]:
            request = Maintenance(
                node=record.node,
                phase=MaintenancePhase.REQUESTED,
                maintenance_id=mid,
                reason=f"GPU recovery ({record.plan.value}): {record.reason}"[:1024],
                requested_by=ACTOR,
                deadline_s=self.settings.drain_deadline.total_seconds(),
            )
            at = datetime.fromtimestamp(record.started_at, UTC)
            await self.bus.publish(
                make_event(request, source=ACTOR, id=stable_id(at, mid, "requested"))
            )
            return {"maintenance": mid}

        decided = await self.runner.run(proposal, act, [self.exemptions], retry=False)
        if decided.outcome == Outcome.APPLIED:
            await self._save(record, Step.DRAINING, "requested", note_only=True)

    async def _remediate(self, record: RecoveryRecord, obj: Obj) -> None:
        """Ask the remediator (boot id and attempt saved first: a restart asks again under
        the same attempt and waits for a boot after the recorded one)."""
        if record.attempts >= self.settings.max_attempts and record.asked_at is None:
            await self._escalate(record, f"{record.attempts} {record.plan.value} attempts")
            return
        remediator = REMEDIATORS.get(record.remediator)
        if remediator is None:
            await self._escalate(record, f"no remediator named {record.remediator!r}", rma=False)
            return
        if record.asked_at is None and time.time() < (record.next_try_at or 0):
            return  # the back-off after a failed attempt
        if record.asked_at is None:
            # Drained means empty, checked again right before asking (after a restart, a pod
            # bound to the node by hand): a reset or reboot never meets a pod it would harm.
            left = await blockers(
                self.cluster, record.node, self.exemptions, self.settings.skip_namespaces
            )
            if left:
                await self._block(record, left)
                return
        if record.asked_at is None:
            # From the cure on, only validation judges the GPUs: no automatic release.
            if not self.runner.dry_run:
                await self._hold(
                    record, f"{record.plan.value} of incident {record.incident} under way"
                )
            record = await self._update(
                record,
                attempts=record.attempts + 1,
                boot_id=boot_id(obj),
                asked_at=time.time(),
            )
        action = record.plan.value
        proposal = self._proposal(
            record,
            action,
            f"{action} of {record.node} (GPU {', '.join(map(str, record.gpus)) or '?'}) "
            f"through {remediator.name}, attempt {record.attempts}",
        )

        async def act() -> dict[str, Any]:
            try:
                asked = await remediator.ask(record, self.tools)
            except RemediatorError as exc:
                raise _Failed(str(exc)) from exc
            self.marks.failpoints.hit("recovery.asked")  # asked, not yet audited nor saved
            return asked

        try:
            decided = await self.runner.run(proposal, act, [self.exemptions], retry=False)
        except _Failed as exc:
            await self.runner.fail(proposal, reason=f"{proposal.reason}; failed: {exc}")
            await self._update(record, asked_at=None, last_failure=str(exc))
            return
        if decided.outcome != Outcome.APPLIED:
            return
        if remediator.waits_for_reboot(record.plan):
            await self._save(record, Step.REBOOTING, f"asked ({remediator.name})")
        else:
            await self._save(record, Step.VALIDATING, f"reset ({remediator.name})")
        self.wake.set()

    async def _rebooting(self, record: RecoveryRecord, obj: Obj) -> None:
        now_boot = boot_id(obj)
        if now_boot is not None and now_boot != record.boot_id:
            remediator = REMEDIATORS[record.remediator]
            await remediator.finish(record, self.tools)
            await self._record(
                record, "reboot", f"{record.node} rebooted: bootID {record.boot_id} -> {now_boot}",
                what="rebooted", boot_id=now_boot,
            )  # fmt: skip
            await self._save(record, Step.VALIDATING, f"rebooted ({now_boot})")
            self.wake.set()

    async def _validate(self, record: RecoveryRecord, obj: Obj) -> None:
        ask = ValidateRequest(
            node=record.node,
            request_id=record.attempt_id("validate"),
            expected_gpus=_expected_gpus(obj),
            dcgm_level=self.settings.dcgm_level,
            burn_in_s=self.settings.burn_in.total_seconds(),
        )
        try:
            msg = await self.bus.nc.request(
                agent_subject(VALIDATE, record.node),
                ask.model_dump_json().encode(),
                timeout=self.settings.request_timeout.total_seconds() + ask.burn_in_s,
            )
            report = ValidationReport.model_validate_json(msg.data)
        except ValidationError as exc:
            await self._failed_attempt(record, f"the GPU agent's report is not understood: {exc}")
            return
        except (NatsError, TimeoutError) as exc:  # no responders (still starting), timeout
            waited = time.time() - record.updated_at
            if waited > self.settings.validate_timeout.total_seconds():
                await self._failed_attempt(record, f"no validation from the GPU agent: {exc}")
            return
        summary = f"{report.gpus_found} GPU(s), {len(report.checks)} check(s), DCGM {report.dcgm}"
        proposal = self._proposal(record, "validate", f"validation of {record.node}: {summary}")
        details = {
            "agent_boot_id": report.agent_boot_id,
            "dcgm": report.dcgm,
            "failures": report.failures(),
        }
        if report.passed:
            await self.runner.record(
                proposal, Outcome.APPLIED, f"{record.node} validated: {summary}", details=details
            )
            await self._save(record, Step.RELEASING, f"validated ({summary})")
            self.wake.set()
            return
        await self._failed_attempt(record, "; ".join(report.failures()), details=details)

    async def _failed_attempt(
        self, record: RecoveryRecord, why: str, *, details: dict[str, Any] | None = None
    ) -> None:
        """A validation failed (or the cure never came): remediate again, or escalate. The
        count and the next step are saved in one write (a restart never counts it twice)."""
        failures = record.validation_failures + 1
        proposal = self._proposal(record, "validate", f"validation of {record.node} failed: {why}")
        await self.runner.fail(proposal, details={**(details or {}), "failures_so_far": failures})
        nxt = after_validation_failure(failures, max_failures=self.settings.max_validation_failures)
        again = nxt == AfterFailure.RETRY
        backoff = min(
            self.settings.retry_backoff.total_seconds() * 2 ** (failures - 1), BACKOFF_CAP_S
        )
        record = await self._update(
            record,
            validation_failures=failures,
            last_failure=why,
            asked_at=None,
            next_try_at=time.time() + backoff,
            step=Step.REMEDIATING if again else record.step,
            history=[*record.history, f"failed: {why}"][-40:],
        )
        self.marks.failpoints.hit("recovery.failed")
        if not again:
            await self._escalate(record, f"validation failed {failures} times; last: {why}")
            return
        self.wake.set()

    async def _release(self, record: RecoveryRecord, obj: Obj) -> None:
        """Through the owners' release paths: the maintenance's cordon, then the quarantine."""
        reason = f"validated after the {record.plan.value} of incident {record.incident}"
        replies: dict[str, str] = {}
        for service, verb in (("checkpoint", "finish"), ("cordon", "release")):
            reply = await self._ask(service, verb, record.node, reason)
            if reply is None:
                return  # tried again on the next pass
            refused = reply.status == ControlStatus.REFUSED
            if reply.status == ControlStatus.ERROR or (
                # cordon: nothing of nodeward's left to release is done; anything else (still
                # being applied, an operator rate limit) is tried again on the next pass
                service == "cordon" and refused and reply.details.get("guard") != "not_ours"
            ):
                self.log.warning("recovery.release_failed", service=service, reply=reply.message)
                return
            replies[f"{service}.{verb}"] = _reply_line(reply)
        proposal = self._proposal(
            record, "release", f"{record.node} back in service: {reason}", resolves=True
        )
        await self.runner.record(proposal, Outcome.APPLIED, details={"replies": replies})
        await self._lift_hold(record)  # first: a terminal record holds nothing on the node
        await self._save(record, Step.RELEASED, "released")

    async def _ended_elsewhere(self, record: RecoveryRecord) -> None:
        """The quarantine ended before recovery released it (an operator, or cordon once the
        GPUs read healthy): stop, taking back what recovery asked for: the reboot request,
        and the maintenance (cancelled before its drain, else finished once done)."""
        if "draining: requested" in record.history and not await self._take_back_maintenance(
            record
        ):
            return  # the drain is under way: finished on a later pass
        with contextlib.suppress(Exception):
            await self.marks.release(record.node)
        proposal = self._proposal(record, "recover", f"recovery of {record.node} stopped")
        await self.runner.skip(
            proposal,
            guard="quarantine_ended",
            reason=f"recovery of {record.node} stopped at {record.step.value}: its quarantine "
            "ended without it (released by an operator?)",
        )
        await self._lift_hold(record)
        await self._save(record, Step.GONE, "quarantine ended elsewhere")

    async def _take_back_maintenance(self, record: RecoveryRecord) -> bool:
        """Cancel the node's maintenance, or finish it once done; True when nothing of it is
        left to take back."""
        reason = f"the quarantine of incident {record.incident} ended without recovery"
        for verb in ("cancel", "finish"):
            reply = await self._ask("checkpoint", verb, record.node, reason)
            if reply is None or reply.status == ControlStatus.ERROR:
                return False
            guard = reply.details.get("guard")
            if reply.status == ControlStatus.OK or guard == "not_ours":
                return True
            if guard in ("draining", "not_done"):
                return False  # the drain runs on: finished when it is done
        return False

    async def _ask(self, service: str, verb: str, node: str, reason: str) -> ControlReply | None:
        """An owner's operator control, asked as `service/recovery`; None if unanswered."""
        ask = ControlRequest(service=service, verb=verb, operator=ACTOR, reason=reason, target=node)
        try:
            return await request(
                self.bus.nc, ask, timeout=self.settings.request_timeout.total_seconds()
            )
        except ControlTimeout as exc:
            self.log.warning("recovery.control_unanswered", service=service, error=str(exc))
            return None

    async def _escalate(self, record: RecoveryRecord, why: str, *, rma: bool = True) -> None:
        """On-call: critical (RMA suggested, or the drain that never emptied the node). The
        node stays quarantined under recovery's release hold: no automatic release (cordon's
        healthy period included) until an operator releases the quarantine."""
        with contextlib.suppress(Exception):
            await self.marks.release(record.node)  # no reboot asked of a node left as it is
        gpus = ", ".join(map(str, record.gpus)) or "?"
        xids = ", ".join(map(str, record.xids)) or "-"
        cure = f"RMA suggested for GPU {gpus} (XID {xids})" if rma else f"GPU {gpus} (XID {xids})"
        proposal = Proposal(
            action="escalate",
            target=_target(record.node),
            reason=f"{record.node} needs a human: {why}. {cure}; the node stays quarantined "
            f"until an operator releases it ({release_command(record.node)})",
            policy=record.plan.value,
            trigger_id=f"{record.incident}/escalate",
            trigger_time=datetime.fromtimestamp(record.started_at, UTC),
            severity=Severity.CRITICAL,
            title=f"{record.node}: RMA suggested" if rma else f"{record.node}: needs a human",
            details={"incident": record.incident, "history": record.history, "rma": rma},
        )
        await self.runner.record(proposal, Outcome.APPLIED)
        stored = await self.records.get(node_key(record.node))
        if stored is None or stored.value.incident != record.incident:
            await self.records.put(node_key(record.node), record)
        if not self.settings.dry_run:
            await self._hold(record, f"needs a human: {why}")
        await self._save(record, Step.ESCALATED, f"{why}. {cure}")

    async def _hold(self, record: RecoveryRecord, why: str) -> None:
        """The hold on the node (`services.kernel.holds`): no automatic release of its
        quarantine (cordon's healthy period) once a reset or reboot was asked (only the
        validation judges it) or a human must decide. Recorded first: a restart takes back
        a hold it may have placed."""
        if not record.held:
            record = await self._update(record, held=True)
        note = hold_note(ACTOR, record.incident, why)
        try:
            await self.cluster.nodes.set_annotations(record.node, {HOLD_ANNOTATION: note})
        except KubeError as exc:  # the guard is a second line; the record is the truth
            self.log.warning("recovery.hold_failed", error=str(exc))

    async def _lift_hold(self, record: RecoveryRecord) -> None:
        """A recovery over (released, gone) or an escalated node whose quarantine an operator
        released: the hold comes off; nothing of recovery's is left on the node."""
        try:
            obj: Obj | None = await self.cluster.nodes.get(record.node)
        except NotFound:
            obj = None
        if record.step == Step.ESCALATED:
            if obj is not None and _has_quarantine(obj):
                return  # still the human's to release
            if "draining: requested" in record.history and not await self._take_back_maintenance(
                record
            ):
                return  # its maintenance's cordon first (on a later pass if still draining)
        if obj is not None and (hold_of(obj) or {}).get("incident") == record.incident:
            await self.cluster.nodes.set_annotations(record.node, {HOLD_ANNOTATION: None})
        record = await self._update(record, held=False)
        await self._save(record, record.step, "hold lifted", note_only=True)

    # helpers ----------------------------------------------------------------------------
    def _proposal(
        self, record: RecoveryRecord, action: str, reason: str, *, resolves: bool = False
    ) -> Proposal:
        return Proposal(
            action=action,
            target=_target(record.node),
            reason=reason,
            policy=record.plan.value,
            trigger_id=record.attempt_id(action),
            trigger_time=datetime.fromtimestamp(record.started_at, UTC),
            protective=False,
            resolves=resolves,
            details={"incident": record.incident, "step": record.step.value},
        )

    async def _record(
        self, record: RecoveryRecord, action: str, reason: str, *, what: str = "", **details: Any
    ) -> None:
        proposal = self._proposal(record, action, reason)
        if what:
            proposal = dataclasses.replace(proposal, trigger_id=record.attempt_id(what))
        await self.runner.record(proposal, Outcome.APPLIED, details=details)

    async def _update(self, record: RecoveryRecord, **changes: Any) -> RecoveryRecord:
        """Change this recovery's record (revision-checked); a new `step` is a move of the
        workflow (its bookkeeping starts afresh)."""

        def apply(current: RecoveryRecord) -> RecoveryRecord:
            return current.model_copy(update={**changes, "updated_at": time.time()})

        to = changes.pop("step", None)
        try:
            if to is not None:
                return await self.flow.advance(record, Step(to).value, apply)
            return await self.flow.save(record, apply)
        except Gone:
            return record.model_copy(update=changes)

    async def _save(
        self, record: RecoveryRecord, step: Step, what: str, *, note_only: bool = False
    ) -> RecoveryRecord:
        def note(current: RecoveryRecord) -> RecoveryRecord:
            history = [*current.history, f"{step.value}: {what}"][-40:]
            return current.model_copy(update={"history": history, "updated_at": time.time()})

        try:
            if note_only:
                stored = await self.flow.save(record, note)
                self.marks.failpoints.hit(f"recovery.{step.value}")  # as the engine's moves
            else:  # the engine's failpoint `recovery.<step>`: crash tests, after the write
                stored = await self.flow.advance(record, step.value, note)
        except Gone:
            stored = record
        self.log.info("recovery.step", step=step.value, what=what)
        return stored


class _Failed(Exception):
    """A remediator's refusal, carried out of the runner's act."""


def _reply_line(reply: ControlReply) -> str:
    return f"{reply.status.value}: {reply.message}"


async def build(settings: Settings) -> Daemon:
    """The recovery service's daemon: consumers on cordon's quarantines and on maintenance
    ends, and the loop. `settings.cluster` must authenticate as its ServiceAccount."""
    config: RecoverySettings = section(settings, "services", NAME, RecoverySettings)
    daemon, bus, cluster = await acting_daemon(
        NAME, settings, source=ACTOR, access=ACCESS, consumers=2
    )
    kv = await bus.kv(config.bucket, history=5)
    breaker = await node_breaker(
        bus, cluster, config.breaker, registry=daemon.metrics.registry, daemon=daemon
    )
    service = RecoveryService(
        bus,
        cluster,
        records=TypedKV(kv, RecoveryRecord),
        counts=TypedKV(kv, RecoveryCounts),
        marks=NodeMarks(cluster, kv, OWNER),
        breaker=breaker,
        settings=config,
    )

    async def consume() -> None:
        await bus.consume(service.consumer_spec(), service.handle_quarantine)

    async def consume_maintenance() -> None:
        await bus.consume(service.maintenance_spec(), service.handle_maintenance)

    async def loop() -> None:
        await service.run(daemon.stopping)

    await bus.control(NAME, "force-drain", service.force_drain_control)
    daemon.add_task(consume, name="consume")
    daemon.add_task(consume_maintenance, name="consume-maintenance")
    daemon.add_task(loop, name="recoveries", graceful=True)
    return daemon


component, standalone = one_daemon(NAME, build)
