"""services.cordon: quarantine nodes whose GPUs fail, release them when healthy again.

A durable consumer on `gpu.health.>` (changes only, in order per node) runs each event
through the policy (`services/cordon/policy.yaml` by default), then the shared guards (exemption,
rate limit, circuit breaker) and acts through the kube port: NoSchedule taint
`nodeward.io/gpu-unhealthy`, cordon, condition `GPUHealthy=False`, label
`nodeward.io/gpu-health=failed`, annotation `nodeward.io/quarantine` and an Event. What it
did is recorded in KV and in the annotation, and only that is undone on release, once
every GPU of the node has been healthy for `healthy_period`. A reconcile loop releases
due nodes and notices an operator's manual uncordon, which is then respected. Operators
release a quarantine and reset the breaker through controls it answers
(`control.cordon.release`, `control.cordon.reset-breaker`).

Heartbeats (`gpu.heartbeat.>`, one per node per interval) come on a durable consumer of
their own, so a change never waits behind them. They are settled from memory (or one KV
read) without a Kubernetes call; only a heartbeat that shows a failure left without a
quarantine (refused before: tried again through the guards) or a change never handled
within `heartbeat_grace` goes the change's way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from nats.js.kv import KeyValue
from pydantic import Field

from nodeward.aio import KeyedLocks
from nodeward.bus import Bus, ConsumerSpec, Delivery
from nodeward.bus.kv import TypedKV
from nodeward.bus.partitions import PartitionedConsumer
from nodeward.bus.snapshot import kv_entries
from nodeward.config import Settings, section
from nodeward.durations import Duration
from nodeward.handlers import Consuming, Runtime, Service, setting
from nodeward.kube import Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from schemas.base import Event, make_event
from schemas.common import ObjectRef, dns_subdomain
from schemas.control import ControlReply, ControlRequest
from schemas.gpu import GpuHealth, GpuHeartbeat, GpuState, GpuXid, HealthState
from schemas.ids import stable_id
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.remediation import Outcome, Remediation
from schemas.state.breaker import BREAKER_KEY, SHARED
from schemas.state.cordon import (
    NODES,
    TAINT_KEY,
    GpuRecord,
    NodeRecord,
    OperatorRelease,
    Quarantine,
    XidRepeats,
    first_of_gpu,
    node_key,
)
from schemas.state.marks import MarkEntry, MarkIntent
from schemas.tokens import token
from services.cordon.access import ACCESS
from services.cordon.devices import DeviceExclusions, DeviceSettings, joined_exclusion
from services.cordon.marks import (
    ACTOR,
    HEALTH_LABEL,
    OWNER,
    QUARANTINE_ANNOTATION,
    annotation,
    applied_details,
    spec_for,
    unschedulable,
    with_entry,
)
from services.cordon.policy import (
    Decision,
    Policy,
    PolicyAction,
    is_stale,
    load_policy,
    restates,
    speaks_for,
)
from services.cordon.proposals import ending
from services.cordon.xids import XidRepeatSettings, XidReports
from services.kernel import (
    BreakerSettings,
    CircuitBreaker,
    Cooldown,
    DrainSettings,
    Flapping,
    Guard,
    Proposal,
    RateLimiter,
    RateLimitSettings,
    ReleaseHold,
    TallySettings,
    acting,
    drain,
    node_ref,
    per_action,
)
from services.kernel.access import AUDIT_READ, PUBLISHES
from services.kernel.breaker import node_breaker
from services.kernel.control import (
    ControlSettings,
    operator_proposal,
    refuse,
    reply_for,
)
from services.kernel.holds import release_command
from services.kernel.marks import UNREAD, NodeMarks, Unread, still_holding
from services.kernel.severities import GOOD_NEWS, LOUD

NAME = "cordon"
TOPIC = "gpu-health"
# A release is good news: on-call hears of it, nobody is paged for it. One GPU out of
# service on its own (its node serving) is a warning, not a page; a failure to do it pages.
SEVERITIES = per_action(
    (GOOD_NEWS, ("release", "device_untaint", "gpu_include")),
    (LOUD, ("device_taint", "gpu_exclude")),
)


class CordonSettings(Consuming):
    """`services.cordon` in the config file. Its durables: `<consumer>` (changes),
    `<consumer>-heartbeats`, `<consumer>-xids`."""

    dry_run: bool = False
    subjects: list[str] = Field(default_factory=lambda: ["gpu.health.>"], min_length=1)
    bucket: str = NODES.name
    concurrency: int = Field(default=16, ge=1)
    policy_file: Path | None = None
    """None: the shipped default"""
    cordon: bool = True
    """also mark the node unschedulable"""
    no_execute: bool = False
    """also taint NoExecute (evicts pods)"""
    healthy_period: Duration = timedelta(minutes=10)
    """every GPU healthy this long before release"""
    cooldown: Duration = timedelta(minutes=5)
    """a quarantine is held at least this long"""
    max_event_age: Duration = timedelta(minutes=15)
    """older failures (a replay on cold start) are recorded, never acted on"""
    flap_window: Duration = timedelta(minutes=30)
    """turns to failed of one GPU counted this long (flap damping)"""
    flap_threshold: int = Field(default=3, ge=2)
    """this many turns to failed within flap_window: the GPU flaps, and its quarantine is one
    incident that nothing releases but an operator"""
    reconcile_interval: Duration = timedelta(seconds=15)
    heartbeat_subjects: list[str] = Field(default_factory=lambda: ["gpu.heartbeat.>"], min_length=1)
    heartbeat_grace: Duration = timedelta(minutes=2)
    """a change a heartbeat restates, not handled this long after it happened, is taken from the
    heartbeat (it was lost, or the change path is that far behind)"""
    ack_wait: Duration = timedelta(seconds=30)
    """an event held by a crashed replica is redelivered after this long"""
    node_count_ttl: Duration = timedelta(seconds=30)
    remembered_nodes: int = Field(default=10_000, ge=0)
    """node records kept in memory to start updates from; every write is still
    revision-checked (`TypedKV`)"""
    lease_ttl: Duration = timedelta(seconds=20)
    """with bus.partitions > 1: a replica's partitions are taken over this long after it dies; a
    replica that cannot renew for half of it stops its own, so keep it above twice nats-server's
    longest election (9 s) of the bucket's leader"""
    breaker: BreakerSettings = BreakerSettings()
    tally: TallySettings = TallySettings()
    xid_repeats: XidRepeatSettings = XidRepeatSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    drain: DrainSettings = DrainSettings()
    controls: ControlSettings = ControlSettings()
    devices: DeviceSettings = DeviceSettings()


app: Service[CordonSettings] = Service(
    NAME,
    settings=CordonSettings,
    access=ACCESS,
    # `breaker`: the one circuit breaker every service that removes nodes shares.
    buckets=(NODES.name, SHARED.name),
    # A rule with `maintenance: true` asks the checkpoint service for the node's maintenance;
    # AUDIT_READ: a quarantine resumed after a restart is audited once (`Auditor.stored`).
    publishes=("maintenance.requested.*", *PUBLISHES, AUDIT_READ),
    source=ACTOR,
    # With bus.partitions > 1, partition i of changes, heartbeats and XIDs is one lease: one
    # replica acts on a node.
    one_lease=True,
)


def _leases(service: CordonService) -> KeyValue:
    return service.records.kv


def _per_node(kind: type[Any]) -> dict[str, Any]:
    """What the consumers of changes and heartbeats share: in order per node, a node
    speaking only of itself (`gpu.health.<node>.<gpu>`: checked by the runtime), one lease
    group with the XIDs' across replicas."""
    return {
        "concurrency": setting("concurrency"),
        "order_key": lambda e: str(e.data.node),
        "identity": (ConsumerSpec.bind(kind, "node"),),
        "ack_wait": setting("ack_wait"),
        "leases": _leases,
        "lease_ttl": setting("lease_ttl"),
    }


@dataclass(frozen=True)
class Opened:
    """The incident a quarantine acts under, and the kernel's intent as read to learn it."""

    incident: str
    at: datetime
    intent: MarkIntent | Unread | None = UNREAD


Fold = Callable[[NodeRecord | None], NodeRecord | None]
"""A change of a node's record (None: nothing to write), as `TypedKV.update` takes it."""


def folded(fold: Fold | None, change: Fold) -> Fold:
    """`change` made on the record with `fold`'s change in it: both in one write, and
    nothing to write only if neither changes anything."""
    if fold is None:
        return change

    def both(current: NodeRecord | None) -> NodeRecord | None:
        base = fold(current)
        merged = change(base if base is not None else current)
        return merged if merged is not None else base

    return both


def fault_details(health: GpuHealth) -> dict[str, Any]:
    """The fault of a quarantine's audit record: its recommended actions and XIDs."""
    actions = {health.recommended_action.value, *(r.action.value for r in health.reasons)}
    return {
        "recommended_actions": sorted(actions - {"none"}),
        "xids": sorted({r.xid for r in health.reasons if r.xid is not None}),
    }


def holder_details(health: GpuHealth) -> dict[str, Any]:
    """Which pods hold the failed physical GPU (its index -> `namespace/name`, as its agent
    read pod-resources), for services.recovery's partial drain; nothing when not known."""
    if health.holders is None:
        return {}
    return {"holders": {str(health.gpu_index): [f"{p.namespace}/{p.name}" for p in health.holders]}}


def fault_key(node: str, gpu: str, fault: dict[str, Any]) -> str:
    """What a restated fault of one physical GPU is tallied under: node, GPU, the fault."""
    actions = ",".join(fault.get("recommended_actions") or [])
    xids = ",".join(str(x) for x in fault.get("xids") or [])
    return f"{node}/{gpu.split('-mig', 1)[0]}/{actions}/{xids}"


def describe(health: GpuHealth) -> str:
    parts = [f"GPU {health.gpu_key()} ({health.gpu_uuid}) {health.state.value}"]
    for r in health.reasons:
        parts.append(f"XID {r.xid}: {r.message}" if r.xid is not None else f"{r.code}: {r.message}")
    if health.recommended_action.value != "none":
        parts.append(f"recommended: {health.recommended_action.value}")
    return "; ".join(parts)


class CordonService:
    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        *,
        records: TypedKV[NodeRecord],
        breaker: CircuitBreaker,
        settings: CordonSettings,
        policy: Policy,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.records = records
        self.settings = settings
        self.policy = policy
        self.breaker = breaker
        self.marks = NodeMarks(cluster, records.kv, OWNER)
        # Every decision, acted on or not, is audited through the runner (the kernel). An
        # operator's release or reset passes the exemptions and the operator's rate limit (a
        # release never passes the breaker; the runner's dry-run applies as to every action).
        kernel = acting(
            bus,
            actor=ACTOR,
            topic=TOPIC,
            severities=SEVERITIES,
            tally=settings.tally,
            dry_run=settings.dry_run,
            namespace_labels=cluster.namespaces.labels,
            controls=settings.controls,
        )
        self.runner, self.exemptions = kernel.runner, kernel.exemptions
        self.control_guards = kernel.control_guards
        self.rate_limit = RateLimiter(settings.rate_limit)
        self.guards: list[Guard] = [self.exemptions, self.rate_limit, breaker]
        # A quarantine is held at least `cooldown`: a release before then waits (quietly).
        self.cooldown = Cooldown(
            settings.cooldown,
            last=_applied_at,
            applies=lambda p: p.action == "release",
            retry=False,
        )
        # A node recovery drives or handed to a human (its release hold) is released by
        # recovery or an operator only, never by the healthy period.
        self.release_hold = ReleaseHold(cluster.nodes.get)
        # A flapping GPU's quarantine: one incident, released by an operator only.
        self.flapping = Flapping()
        # One GPU out of service on its own (DRA device taint, or excluded below the
        # threshold): exemptions and the rate limit, never the breaker (no node leaves).
        self.devices = DeviceExclusions(
            cluster,
            records,
            self.runner,
            [self.exemptions, self.rate_limit],
            exclusion=policy.exclusion,
            settings=settings.devices,
            no_execute=settings.no_execute,
            healthy_period=settings.healthy_period,
            max_event_age=settings.max_event_age,
            describe=describe,
            failpoints=self.marks.failpoints,
        )
        self.node_lock = KeyedLocks()
        """One node's decisions one at a time (a change, a heartbeat, the reconcile pass)."""
        # Each node's record as last read for a heartbeat; dropped when a change is handled.
        self._known: dict[str, NodeRecord | None] = {}
        # With partitions: whether this replica holds a node's partition (it alone acts on
        # the node: its changes, heartbeats, XIDs and reconcile); None: one replica.
        self.owns: Callable[[str], bool] | None = None
        # Repeated XIDs (`gpu.xid.>`), reported to on-call and the pods' owners.
        self.xids = (
            XidReports(
                bus,
                TypedKV(records.kv, XidRepeats),
                self.runner,
                settings.xid_repeats,
                actor=ACTOR,
                topic=TOPIC,
            )
            if settings.xid_repeats.enabled
            else None
        )
        self.log = structlog.get_logger().bind(service=NAME)

    # consumers --------------------------------------------------------------------------
    @app.consumes(
        "GPU",
        subjects=setting("subjects"),
        types=[GpuHealth],
        retry_delays=(0.5, 2.0, 10.0, 30.0),
        max_deliver=8,
        **_per_node(GpuHealth),
    )
    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        health: GpuHealth = event.data
        with structlog.contextvars.bound_contextvars(node=health.node, gpu=health.gpu_key()):
            async with self.node_lock(health.node):
                self._known.pop(health.node, None)
                await self._handle(event, health)

    @app.consumes(
        "GPU",
        suffix="xids",
        subjects=setting("xid_repeats.subjects"),
        types=[GpuXid],
        when=setting("xid_repeats.enabled"),
        order_key=lambda e: f"{e.data.node}/{e.data.gpu_index}",
        identity=(ConsumerSpec.bind(GpuXid, "node"),),
        retry_delays=(0.5, 2.0, 10.0),
        max_deliver=6,
        leases=_leases,
        lease_ttl=setting("lease_ttl"),
    )
    async def handle_xid(self, event: Event[Any], delivery: Delivery) -> None:
        """A repeated XID is reported (`services/cordon/xids.py`)."""
        assert self.xids is not None  # declared `when` xid_repeats are enabled
        await self.xids.handle(event, delivery)

    # heartbeats ---------------------------------------------------------------------------
    def _unsettled(self, record: NodeRecord | None, beat: GpuHeartbeat) -> list[GpuState]:
        """The GPUs of `beat` that `record` does not account for: a change not handled
        within `heartbeat_grace`, or a failure the policy quarantines that holds none."""
        grace = self.settings.heartbeat_grace.total_seconds()
        out = []
        for gpu in beat.gpus:
            key = gpu.gpu_key()
            prior = record.gpus.get(key) if record else None
            handled = (
                prior is not None
                and prior.boot_id == beat.agent_boot_id
                and prior.sequence >= gpu.sequence
            )
            if not handled:
                # Queued on the change path (it comes), unless it is that late: lost.
                if (beat.observed_at - gpu.changed_at).total_seconds() > grace:
                    out.append(gpu)
                continue
            if gpu.state == HealthState.HEALTHY or record is None:
                continue
            q, released = record.quarantine, record.operator_release
            # Its physical GPU held under any of its keys (a MIG instance joins its GPU's).
            held = q is not None and q.holds(key)
            ex = record.devices.get(key) or joined_exclusion(record, key)
            held = held or (ex is not None and (ex.phase == "applied" or ex.dry_run))
            if held or (released and first_of_gpu(key, released.gpus) is not None):
                continue
            # A quarantine cut short is not recorded yet: its change is redelivered and
            # finished from the kernel's intent.
            if self.policy.decide(beat.health(gpu)).action == PolicyAction.QUARANTINE:
                out.append(gpu)  # refused or skipped before: the guards are asked again
        return out

    @app.consumes(
        "HEARTBEATS",
        # Heartbeats on their own durable consumer: never in front of a change.
        suffix="heartbeats",
        subjects=setting("heartbeat_subjects"),
        types=[GpuHeartbeat],
        retry_delays=(0.5, 2.0, 10.0),
        max_deliver=4,
        **_per_node(GpuHeartbeat),
    )
    async def handle_heartbeat(self, event: Event[Any], delivery: Delivery) -> None:
        """Settle a node's heartbeat from memory, else from its KV record; only what the
        record does not account for goes the change's way (`_unsettled`)."""
        beat: GpuHeartbeat = event.data
        node = beat.node
        if node in self._known and not self._unsettled(self._known[node], beat):
            return
        with structlog.contextvars.bound_contextvars(node=node):
            async with self.node_lock(node):
                entry = await self.records.get(node_key(node))
                record = self._known[node] = entry.value if entry else None
                for gpu in self._unsettled(record, beat):
                    health = beat.health(gpu)
                    restated = make_event(
                        health,
                        source=event.source,
                        id=stable_id(event.time, "heartbeat", event.id, gpu.gpu_key()),
                        time=event.time,
                    )
                    self.log.info(
                        "cordon.heartbeat_unsettled",
                        gpu=gpu.gpu_key(),
                        state=gpu.state.value,
                        sequence=gpu.sequence,
                    )
                    self._known.pop(node, None)
                    with structlog.contextvars.bound_contextvars(gpu=gpu.gpu_key()):
                        await self._handle(restated, health)

    # one event --------------------------------------------------------------------------
    async def _handle(self, event: Event[Any], health: GpuHealth) -> None:
        key = node_key(health.node)
        gpu = health.gpu_key()
        prior_gpu: GpuRecord | None = None
        stale = False
        skew = self.bus.settings.max_clock_skew.total_seconds()

        def accept(current: NodeRecord | None) -> NodeRecord | None:
            nonlocal stale, prior_gpu
            record = current or NodeRecord()
            previous = prior_gpu = record.gpus.get(gpu)
            stale = is_stale(previous, health, event.id, skew_s=skew)
            if stale or (previous is not None and previous.event_id == event.id):
                return None  # stale (audited below), or a redelivery (decided again)
            if restates(previous, health):
                return None  # said again: the record stands, decided as a redelivery is
            window = self.settings.flap_window.total_seconds()
            after = GpuRecord.after(previous, health, event.id, flap_window_s=window)
            gpus = {**record.gpus, gpu: after}
            return record.model_copy(update={"gpus": gpus})

        read = await self.records.get(key)
        accepted = accept(read.value if read else None)
        if stale:
            await self._stale(event, health, prior_gpu)
            return
        record = accepted or (read.value if read else NodeRecord())
        decision = self.policy.decide(health)
        self.log.debug("cordon.decided", rule=decision.rule, policy_action=decision.action.value)
        if accepted is None:
            await self._decide(event, health, decision, record, prior_gpu, fold=None)
            return
        if decision.action == PolicyAction.QUARANTINE and record.quarantine is None:
            # A new quarantine records this GPU's state in the same write as its own outcome
            # (`fold`): one KV write, not two. Whatever path the event took, the write below
            # adds the state if none carried it (else `accept` finds it there: no write).
            await self._decide(event, health, decision, record, prior_gpu, fold=accept)
        else:
            await self.records.update(key, accept)
            await self._decide(event, health, decision, record, prior_gpu, fold=None)
            return
        mine = self.records.remembered(key)  # as this replica wrote it, if the decision did
        if mine is None or accept(mine.value) is not None:
            await self.records.update(key, accept)

    async def _decide(
        self,
        event: Event[Any],
        health: GpuHealth,
        decision: Decision,
        record: NodeRecord,
        prior_gpu: GpuRecord | None,
        *,
        fold: Fold | None,
    ) -> None:
        """What the event's decision does to the node, from `record` (its GPU accepted).
        `fold`: the GPU state not yet written, for the decision's own write to carry."""
        if decision.action != PolicyAction.QUARANTINE and record.quarantine is None:
            if record.devices:
                await self.devices.handle(event, health, decision, record)
            return  # recorded; nothing to quarantine or release: no Kubernetes call
        intent: MarkIntent | Unread | None = UNREAD
        try:  # the one read of the node this event makes
            if decision.action == PolicyAction.QUARANTINE and record.quarantine is None:
                # A quarantine to open (or one a crash cut short): the node and the kernel's
                # intent read together, one round trip.
                node, intent = await asyncio.gather(
                    self.cluster.nodes.get(health.node), self.marks.intent(health.node)
                )
            else:
                node = await self.cluster.nodes.get(health.node)
        except NotFound:
            self.log.warning("cordon.node_unknown")
            return
        if (
            record.devices or decision.action == PolicyAction.QUARANTINE
        ) and await self.devices.handle(event, health, decision, record, node=node):
            return  # one GPU excluded or released on its own (services/cordon/devices.py)
        record = await self._check_operator(health.node, record, node)
        age = (datetime.now(UTC) - health.observed_at).total_seconds()
        if (
            decision.action == PolicyAction.QUARANTINE
            and age > self.settings.max_event_age.total_seconds()
        ):
            await self._too_old(event, health, age)
        elif decision.action == PolicyAction.QUARANTINE:
            await self._quarantine(
                event,
                health,
                decision=decision,
                record=record,
                prior_gpu=prior_gpu,
                node=node,
                fold=fold,
                intent=intent,
            )
        elif health.state == HealthState.HEALTHY and record.quarantine is not None:
            await self._maybe_release(health.node, record)

    async def _too_old(self, event: Event[Any], health: GpuHealth, age: float) -> None:
        """A failure observed longer ago than `max_event_age` (a replay after a cold start,
        #1347-style): its state is recorded, but it never quarantines by itself."""
        self.log.info("cordon.old_event", age_s=round(age, 1))
        reason = (
            f"ignored as stale: {describe(health)} was observed {age:.0f}s ago, "
            f"more than max_event_age {self.settings.max_event_age}"
        )
        await self._ignore(event, health, reason, "too_old", age_s=round(age, 1))

    async def _stale(self, event: Event[Any], health: GpuHealth, prior: GpuRecord | None) -> None:
        self.log.info("cordon.stale_event", sequence=health.sequence)
        newer = (
            f"sequence {prior.sequence} at {prior.observed_at.isoformat()}"
            if prior
            else "a newer event"
        )
        reason = (
            f"ignored as stale: {describe(health)} (sequence {health.sequence}, observed "
            f"{health.observed_at.isoformat()}) is older than {newer}"
        )
        await self._ignore(event, health, reason, "stale", sequence=health.sequence)

    async def _ignore(
        self, event: Event[Any], health: GpuHealth, reason: str, guard: str, **details: Any
    ) -> None:
        """Audit an event that is not acted on (heartbeats restate state: not audited)."""
        if health.heartbeat:
            return
        proposal = Proposal(
            action="ignore",
            target=node_ref(health.node),
            reason=reason,
            trigger_id=event.id,
            trigger_time=event.time,
            protective=False,
            details={"gpu": health.gpu_key(), **details},
        )
        await self.runner.skip(proposal, guard=guard)

    async def _skip_once(
        self, health: GpuHealth, gpus: Iterable[str], proposal: Proposal, guard: str, reason: str
    ) -> None:
        """Audit `proposal` skipped, by the one key of `gpus` that speaks for the health's
        physical GPU, and never for a heartbeat (it restates state)."""
        if not health.heartbeat and speaks_for(health.gpu_key(), gpus):
            await self.runner.skip(proposal, guard=guard, reason=reason)

    # quarantine -------------------------------------------------------------------------
    async def _quarantine(
        self,
        event: Event[Any],
        health: GpuHealth,
        *,
        decision: Decision,
        record: NodeRecord,
        prior_gpu: GpuRecord | None,
        node: Obj,
        fold: Fold | None,
        intent: MarkIntent | Unread | None = UNREAD,
    ) -> None:
        name, gpu = health.node, health.gpu_key()
        q = record.quarantine
        # A quarantine cut short is finished under its own incident, so its audit id is the
        # same whichever event finishes it: one `applied` per incident. The kernel's intent
        # is its one book; the record holds a quarantine only once it was applied.
        opened = await self._cut_short(name, q, event, intent)
        proposal = Proposal(
            action="quarantine",
            target=node_ref(name),
            reason=f"{name}: {describe(health)}",
            policy=decision.rule,
            trigger_id=opened.incident,
            trigger_time=opened.at,
            obj=node,
            # The fault, for services.recovery (it decides on reset or reboot from these, and
            # drains only the failed GPU's holders for a reset when they are known).
            details={
                "gpu": gpu,
                "gpu_uuid": health.gpu_uuid,
                **fault_details(health),
                **holder_details(health),
            },
        )
        if q is not None and await self._releasing(name, q):
            # A release cut short by a restart: finish it before this failure is judged,
            # else "already quarantined" would leave the node released with the record held.
            await self._release(
                name, q, f"finishing the release of quarantine {q.incident} after a restart"
            )
            q = None
        if q is not None and not q.operator_released:
            if q.incident == event.id:
                # This very event opened the quarantine: a redelivery after a restart between
                # the act and its audit. Re-publish the audit (same id: stored at most once).
                outcome = Outcome.DRY_RUN if q.dry_run else Outcome.APPLIED
                reason = (
                    f"dry run: would quarantine: {proposal.reason}"
                    if q.dry_run
                    else proposal.reason
                )
                await self.runner.record(
                    proposal, outcome, reason, details=applied_details(q), once=True
                )
                return
            if gpu in q.gpus:
                flap = self._flapping(record, gpu)
                if flap is not None and q.flapping is None and not q.dry_run:
                    await self._damp(name, q, proposal, flap)
                    return
                # Said once per physical GPU: its other keys (its MIG instances) are quiet.
                # services.recovery reads it for the fault: the same fault is counted,
                # another one is audited in full.
                await self._skip_once(
                    health,
                    q.gpus,
                    replace(proposal, tally=fault_key(name, gpu, proposal.details)),
                    "already_quarantined",
                    f"already quarantined: {proposal.reason}",
                )
                return
            if q.holds(gpu):
                # Another key of a GPU the incident holds (a MIG instance of it, or the GPU
                # of one): the same incident, recorded in its GPUs, not decided again.
                await self._join(name, gpu, q.incident)
                return
            await self._add_gpu(name, gpu, proposal)
            return
        recovered = prior_gpu is not None and prior_gpu.state == HealthState.HEALTHY
        if q is not None and q.operator_released and q.holds(gpu) and not recovered:
            why = f"an operator released {name} from incident {q.incident}"
            await self._skip_once(
                health, q.gpus, proposal, "manual_uncordon", f"not re-quarantined: {why}"
            )
            return
        released = record.operator_release
        if (
            q is None
            and released is not None
            and first_of_gpu(gpu, released.gpus) is not None
            and not recovered
        ):
            why = (
                f"operator {released.operator} released {name} from incident "
                f"{released.incident}; only a failure after the GPU has recovered quarantines "
                "it again"
            )
            await self._skip_once(
                health, released.gpus, proposal, "operator_released", f"not re-quarantined: {why}"
            )
            return

        done: list[tuple[Quarantine, MarkIntent]] = []

        async def act() -> dict[str, Any]:
            details, applied, intent = await self._apply(
                name,
                gpu,
                opened,
                decision=decision,
                reason=proposal.reason,
                node=node,
                record=record,
            )
            done.append((applied, intent))
            return details

        # A failure of a physical GPU whose other key (its GPU, a MIG instance of it)
        # failed before: the same incident, whose decision is already audited.
        sibling = record.sibling_failed(gpu)

        def repeat(outcome: Outcome, guard: str | None) -> bool:
            # A heartbeat restating a failure that was already refused or skipped the same
            # way is not audited again (it still runs the guards: a reset breaker lets it
            # through); nor is another key of the same physical GPU refused that way.
            return (health.heartbeat or sibling) and record.last_decision == (
                f"{outcome.value}/{guard or ''}"
            )

        # Resumed: an earlier run's intent holds the node under this incident (cut short
        # before or after its audit: audited once either way).
        resumed = (
            isinstance(opened.intent, MarkIntent) and opened.intent.incident == opened.incident
        )
        result = await self.runner.run(proposal, act, self.guards, repeat=repeat, resumed=resumed)
        if result.outcome == Outcome.APPLIED and done:
            await self._record_applied(name, *done[-1], fold=fold)
        elif result.outcome == Outcome.DRY_RUN:
            await self._remember(name, event, decision, gpu, proposal.reason, fold=fold)
        elif result.outcome != Outcome.APPLIED:
            last = f"{result.outcome.value}/{result.guard or ''}"
            await self.records.update(
                node_key(name),
                folded(
                    fold,
                    lambda r: (
                        None
                        if r is not None and r.last_decision == last
                        else (r or NodeRecord()).model_copy(update={"last_decision": last})
                    ),
                ),
            )

    async def _cut_short(
        self,
        name: str,
        q: Quarantine | None,
        event: Event[Any],
        read: MarkIntent | Unread | None = UNREAD,
    ) -> Opened:
        """The incident a quarantine decision acts under: the one a restart cut short (the
        kernel's intent holds the node under it, not yet recorded here), else a new one
        opened by `event`. `read`: the intent as the caller read it (else read here)."""
        if q is not None:
            return Opened(event.id, event.time)
        intent = await self.marks.intent(name) if isinstance(read, Unread) else read
        if (
            intent is not None
            and intent.phase in ("applying", "applied")
            and not intent.operator_released
        ):
            return Opened(intent.incident, intent.started_at or event.time, intent)
        return Opened(event.id, event.time, intent)

    def _flapping(self, record: NodeRecord, gpu: str) -> str | None:
        """Why GPU key `gpu` flaps (`flap_threshold` turns to failed within `flap_window`,
        counted up to its latest event), or None."""
        prior = record.gpus.get(gpu)
        count = len(prior.failures) if prior else 0
        if count < self.settings.flap_threshold:
            return None
        return f"GPU {gpu} turned failed {count} times within {self.settings.flap_window}"

    async def _damp(self, name: str, q: Quarantine, proposal: Proposal, flap: str) -> None:
        """A GPU of quarantine `q` flaps: the incident is one, held for an operator (no
        automatic release; recovery, told by the audit, hands it to on-call). Audited
        before it is marked: a restart in between damps again under the same audit id."""
        damped = replace(
            proposal, details={**proposal.details, "flapping": flap, "incident": q.incident}
        )
        await self.runner.skip(
            damped,
            guard="flapping",
            reason=f"damped: {flap}; one incident ({q.incident}): {name} stays quarantined "
            f"until an operator releases it ({release_command(name)})",
        )

        def mark(current: NodeRecord | None) -> NodeRecord | None:
            if current is None or current.quarantine is None:
                return None
            held = current.quarantine
            if held.incident != q.incident or held.flapping is not None:
                return None
            return current.model_copy(
                update={"quarantine": held.model_copy(update={"flapping": flap})}
            )

        await self.records.update(node_key(name), mark)

    def _new_quarantine(
        self, incident: Opened, decision: Decision, gpu: str, reason: str
    ) -> Quarantine:
        return Quarantine(
            incident=incident.incident,
            rule=decision.rule,
            reason=reason,
            gpus=[gpu],
            started_at=incident.at,
        )

    async def _remember(
        self,
        name: str,
        event: Event[Any],
        decision: Decision,
        gpu: str,
        reason: str,
        *,
        fold: Fold | None,
    ) -> None:
        """A dry run's quarantine: recorded (with no marks) as if applied."""
        q = self._new_quarantine(Opened(event.id, event.time), decision, gpu, reason).model_copy(
            update={"applied_at": time.time(), "dry_run": True}
        )
        await self.records.update(
            node_key(name),
            folded(fold, lambda r: (r or NodeRecord()).model_copy(update={"quarantine": q})),
        )

    async def _apply(
        self,
        name: str,
        gpu: str,
        incident: Opened,
        *,
        decision: Decision,
        reason: str,
        node: Obj,
        record: NodeRecord,
    ) -> tuple[dict[str, Any], Quarantine, MarkIntent]:
        """Put the quarantine's marks on through the kernel, whose write-ahead intent is
        the action's one book (left `applying`: `_record_applied` settles it after the
        audit). The audit's details, the quarantine to record, the intent."""
        planned = self._new_quarantine(incident, decision, gpu, reason).model_copy(
            update={"flapping": self._flapping(record, gpu)}
        )
        spec = spec_for(
            planned,
            cordon=self.settings.cordon,
            no_execute=decision.no_execute or self.settings.no_execute,
        )
        self.marks.failpoints.hit("cordon.quarantine.admitted")

        def summary(entry: MarkEntry) -> dict[str, str]:
            return {QUARANTINE_ANNOTATION: annotation(with_entry(planned, entry))}

        intent = await self.marks.put_on(
            name,
            incident.incident,
            spec,
            annotate=summary,
            obj=node,
            started_at=incident.at,
            read=incident.intent,
            settle=False,
        )
        q = with_entry(planned, intent.entry) if intent.incident == incident.incident else planned
        details = applied_details(q)
        if decision.drain or self.settings.drain.enabled:
            # Before the audit: a restart mid-drain drains again.
            result = await drain(self.cluster, name, self.settings.drain, self.exemptions)
            details["drain"] = result.to_json()
            if not result.complete:
                blocked = Proposal(
                    action="drain",
                    target=node_ref(name),
                    reason=f"drain of {name} incomplete at its deadline: "
                    + "; ".join(f"{p}: {why}" for p, why in result.incomplete().items()),
                    policy=decision.rule,
                    trigger_id=incident.incident,
                    trigger_time=incident.at,
                    details=result.to_json(),
                )
                await self.runner.fail(blocked)
        if decision.maintenance:
            details["maintenance"] = await self._request_maintenance(name, q)
        return details, q.model_copy(update={"applied_at": time.time()}), intent

    async def _record_applied(
        self, name: str, applied: Quarantine, intent: MarkIntent, *, fold: Fold | None
    ) -> None:
        """After the audit: the kernel's intent `applied` (an operator's change is noticed
        from now on), then the incident in the node's record, in one write with the
        event's GPU state (`fold`). A restart before either finds the intent `applying`
        or `applied`, finishes the marks (nothing to send: they are on) and audits again
        under the same id, which the audit stream stores once."""
        self.marks.failpoints.hit("cordon.quarantine.audited")
        await self.marks.settle(intent)

        def done(current: NodeRecord | None) -> NodeRecord | None:
            record = current or NodeRecord()
            now = record.quarantine
            if now is not None and now.incident == applied.incident:
                return None
            return record.model_copy(update={"quarantine": applied, "operator_release": None})

        await self.records.update(node_key(name), folded(fold, done))
        self.marks.failpoints.hit("cordon.quarantine.applied")

    async def _request_maintenance(self, name: str, q: Quarantine) -> str:
        """Ask services.checkpoint to checkpoint and drain the quarantined node (its id is
        the incident's, so a redelivered event asks once)."""
        mid = f"mnt-quarantine-{q.incident}"
        request = Maintenance(
            node=name,
            phase=MaintenancePhase.REQUESTED,
            maintenance_id=mid,
            reason=f"GPU quarantine ({q.rule}): {q.reason}"[:1024],
            requested_by=ACTOR,
        )
        await self.bus.publish(
            make_event(request, source=ACTOR, id=stable_id(q.started_at, mid, "requested"))
        )
        return mid

    async def _join(self, name: str, gpu: str, incident: str) -> None:
        """Another key of a physical GPU the quarantine holds failed (a MIG instance of the
        GPU, or the GPU of an instance): recorded in the incident's GPUs, quietly. One
        incident per physical GPU: its decision was audited when it opened."""

        def add(current: NodeRecord | None) -> NodeRecord | None:
            record = current or NodeRecord()
            q = record.quarantine
            if q is None or q.incident != incident or gpu in q.gpus:
                return None
            return record.model_copy(
                update={"quarantine": q.model_copy(update={"gpus": [*q.gpus, gpu]})}
            )

        await self.records.update(node_key(name), add)
        self.log.info("cordon.joined_incident", incident=incident)

    async def _add_gpu(self, name: str, gpu: str, proposal: Proposal) -> None:
        """Another GPU of a quarantined node failed: record it in the same incident."""

        def add(current: NodeRecord | None) -> NodeRecord | None:
            record = current or NodeRecord()
            q = record.quarantine
            if q is None or gpu in q.gpus:
                return None
            return record.model_copy(
                update={"quarantine": q.model_copy(update={"gpus": [*q.gpus, gpu]})}
            )

        written = await self.records.update(node_key(name), add)
        q = written.value.quarantine if written else None
        if q is None:
            return

        async def act() -> dict[str, Any]:
            if not q.dry_run:
                await self.marks.set_annotations(name, {QUARANTINE_ANNOTATION: annotation(q)})
            return {"gpus": q.gpus, "incident": q.incident}

        # Already quarantined: no new target for the breaker or the rate limit.
        await self.runner.run(proposal, act, [self.exemptions])

    # operator ---------------------------------------------------------------------------
    async def _check_operator(self, name: str, record: NodeRecord, node: Obj) -> NodeRecord:
        """Notice an operator's manual uncordon (or removal of our taint) and respect it."""
        q = record.quarantine
        if q is None or q.dry_run or q.operator_released:
            return record
        if await self._adopt_legacy(name, q):
            node = await self.cluster.nodes.get(name)
        # Only NodeMarks' `applied` intent can show an operator's act: a mark missing while
        # nodeward itself is releasing is its own half-done step, finished by the release.
        found = await self.marks.operator_act(name, node)
        intent = await self.marks.intent(name)
        respected = (
            intent is not None
            and intent.incident == q.incident
            and intent.phase == "applied"
            and intent.operator_released
        )
        if found is None and not respected:
            return record
        what = found[1] if found else "took back"
        self.log.warning("cordon.manual_release", what=what)

        def released(current: NodeRecord | None) -> NodeRecord | None:
            rec = current or NodeRecord()
            if rec.quarantine is None or rec.quarantine.incident != q.incident:
                return None
            return rec.model_copy(
                update={"quarantine": rec.quarantine.model_copy(update={"operator_released": True})}
            )

        proposal = ending(
            "quarantine",
            name,
            q,
            f"an operator {what} {name}; nodeward respects it and will not re-quarantine "
            f"it for incident {q.incident}",
            {"by": "operator", "incident": q.incident},
        )
        # Audit first: a restart before NodeMarks records it detects it again and
        # re-publishes the same audit id, which JetStream stores once.
        if found is not None:
            await self.runner.record(proposal, Outcome.UNDONE, guard="manual_uncordon")
        await self.marks.respect(name)
        written = await self.records.update(node_key(name), released)
        return written.value if written else record

    # release ----------------------------------------------------------------------------
    async def _maybe_release(self, name: str, record: NodeRecord) -> None:
        q = record.quarantine
        if q is None:
            return
        healthy = record.healthy_for(datetime.now(UTC))
        if healthy is None or healthy < self.settings.healthy_period.total_seconds():
            return
        await self._release(
            name,
            q,
            f"every GPU of {name} healthy for {healthy:.0f}s; undoing quarantine {q.incident}",
            guards=(self.cooldown, self.release_hold, self.flapping),
        )

    async def _adopt_legacy(self, name: str, q: Quarantine) -> bool:
        """A quarantine applied before NodeMarks (no intent in KV): hand its marks over.
        True if it did (the node changed: read it again)."""
        if q.dry_run or await self.marks.intent(name) is not None:
            return False
        spec = spec_for(q, cordon=q.cordoned, no_execute="NoExecute" in q.taints)
        entry = MarkEntry(
            incident=q.incident,
            taints=[f"{TAINT_KEY}:{e}" for e in q.taints],
            cordon=q.cordoned,
            prior_unschedulable=q.prior_unschedulable,
            labels={HEALTH_LABEL: None},
            annotations=[QUARANTINE_ANNOTATION],
        )
        self.log.info("cordon.adopt_legacy_quarantine", incident=q.incident)
        await self.marks.adopt(name, q.incident, spec, entry, operator_released=q.operator_released)
        return True

    async def _releasing(self, name: str, q: Quarantine) -> bool:
        """True if NodeMarks has started (or finished) the release of this quarantine."""
        if q.dry_run:
            return False
        intent = await self.marks.intent(name)
        return (
            intent is not None
            and intent.incident == q.incident
            and intent.phase in ("releasing", "released")
        )

    async def _release(
        self,
        name: str,
        q: Quarantine,
        reason: str,
        *,
        guards: Sequence[Guard] = (),
        by: ControlRequest | None = None,
        obj: Obj | None = None,
    ) -> Remediation:
        """Undo quarantine `q` (or finish undoing it), audit it, clear the record. `guards`:
        the cooldown for a release the reconcile loop proposes; finishing one never waits.
        `by`: an operator's request (`nodeward quarantine release`), audited as theirs."""
        await self._adopt_legacy(name, q)
        details = {
            "incident": q.incident,
            "operator_released": q.operator_released,
            "applied_at": q.applied_at,
        } | ({"flapping": q.flapping} if q.flapping else {})
        if by is None:
            proposal = ending("release", name, q, reason, details)
        else:
            proposal = operator_proposal(
                by,
                action="release",
                target=node_ref(name),
                what=reason,
                obj=obj,
                policy=q.rule,
                details=details,
                resolves=True,
            )

        async def act() -> dict[str, Any]:
            details = await self.marks.release(name, note=proposal.reason if by else None)
            # None: already released (a restart after the release, before the record cleared).
            return details or {"incident": q.incident}

        runner = self.runner.with_dry_run() if q.dry_run else self.runner
        # Only the cooldown may hold a release back (quietly: it is tried every reconcile);
        # releasing is never refused by a limit or the breaker. An operator's release passes
        # the exemptions and the operator's rate limit.
        decided = await runner.run(
            proposal, act, guards, repeat=lambda _, g: g == "cooldown", retry=by is None
        )
        if decided.outcome not in (Outcome.APPLIED, Outcome.DRY_RUN):
            return decided
        if by is not None and decided.outcome == Outcome.DRY_RUN and not q.dry_run:
            return decided  # a dry-running service leaves a real quarantine as it is
        self.marks.failpoints.hit("cordon.release.audited")
        operator = (
            None
            if by is None
            else OperatorRelease(
                incident=q.incident,
                gpus=q.gpus,
                operator=by.operator,
                reason=by.reason,
                at=time.time(),
            )
        )

        def cleared(current: NodeRecord | None) -> NodeRecord | None:
            rec = current or NodeRecord()
            if rec.quarantine is None or rec.quarantine.incident != q.incident:
                return None
            return rec.model_copy(
                update={
                    "quarantine": None,
                    "last_release_at": time.time(),
                    "last_decision": None,
                    "operator_release": operator,
                }
            )

        await self.records.update(node_key(name), cleared)
        self.marks.failpoints.hit("cordon.release.cleared")
        return decided

    # operator controls ------------------------------------------------------------------
    @app.control("release")
    async def release_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward quarantine release NODE`: undo nodeward's quarantine of the node, and
        nothing else (a node cordoned by hand, with no quarantine of ours, stays cordoned)."""
        name = request.target or ""
        try:
            dns_subdomain(name)
        except ValueError as exc:
            return ControlReply.error(f"release: {exc}")
        with structlog.contextvars.bound_contextvars(node=name):
            async with self.node_lock(name):
                try:
                    node = await self.cluster.nodes.get(name)
                except NotFound:
                    return ControlReply.refused(f"no node named {name} in the cluster")
                current = await self.records.get(node_key(name))
                q = current.value.quarantine if current else None
                if q is not None:
                    what = f"release of {name} from quarantine {q.incident} ({q.rule})"
                    decided = await self._release(
                        name, q, what, guards=self.control_guards, by=request, obj=node
                    )
                    line = _released_line(name, q, decided.details)
                    with contextlib.suppress(KubeError):
                        holding = still_holding(await self.cluster.nodes.get(name), OWNER)
                        if holding:
                            line += f"; still held by {'; '.join(holding)}"
                    return reply_for(decided, done=line)
                proposal = operator_proposal(
                    request,
                    action="release",
                    target=node_ref(name),
                    what=f"release of {name}",
                    obj=node,
                )
                intent = await self.marks.intent(name)
                if intent is not None and intent.phase == "applying":
                    why = (
                        f"refused: the quarantine of {name} ({intent.incident}) is still being "
                        "applied; try again in a moment"
                    )
                    return await refuse(self.runner, proposal, guard="pending", reason=why)
                held = " and stays cordoned" if unschedulable(node) else ""
                why = (
                    f"refused: {name} has no quarantine by nodeward{held}; nodeward undoes "
                    "only what it did"
                )
                return await refuse(self.runner, proposal, guard="not_ours", reason=why)

    @app.control("reset-breaker")
    async def reset_breaker_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward breaker reset`: close a tripped circuit breaker (shared by every service
        that removes nodes from service) and forget its window."""
        state = await self.breaker.state()
        target = ObjectRef(kind="CircuitBreaker", name=BREAKER_KEY)
        detail = {
            "tripped_at": state.tripped_at,
            "trip_reason": state.trip_reason,
            "admitted": sorted(state.admitted),
        }
        proposal = operator_proposal(
            request,
            action="breaker_reset",
            target=target,
            what="reset of the circuit breaker",
            details=detail,
        )
        if state.tripped_at is None:
            why = (
                f"refused: the circuit breaker is not tripped ({len(state.admitted)} node(s) "
                "admitted in its window); nothing to reset"
            )
            return await refuse(self.runner, proposal, guard="not_tripped", reason=why)

        async def act() -> dict[str, Any]:
            await self.breaker.reset()
            return detail

        decided = await self.runner.run(proposal, act, self.control_guards, retry=False)
        return reply_for(
            decided, done=f"circuit breaker reset (it tripped: {state.trip_reason or 'tripped'})"
        )

    async def reconcile_once(self) -> None:
        """Release due nodes and notice manual uncordons, for every node with a quarantine
        or an excluded GPU: every node record read in one pass (not a read per node: at
        5,000 nodes that kept the pass running and the KV busy), then each of those afresh
        under its node's lock."""
        entries = await kv_entries(self.bus.nc, self.records.kv._name, [NODES.prefix])
        for i, (key, raw) in enumerate((entries or {}).items()):
            if i % 500 == 499:
                await asyncio.sleep(0)  # decoding a large fleet: let events in between
            name = key.removeprefix(NODES.prefix)
            if self.owns is not None and not self.owns(name):
                continue  # another replica's partition
            try:
                seen = NODES.load(raw)
            except (ValueError, OSError):  # not a record (a bad write): said, skipped
                self.log.warning("cordon.record_unreadable", node=name)
                continue
            if seen.quarantine is None and not seen.devices:
                continue
            with structlog.contextvars.bound_contextvars(node=name, action="reconcile"):
                async with self.node_lock(name):
                    current = await self.records.get(key)
                    if current is not None and current.value.devices:
                        await self.devices.reconcile(name, current.value)
                        current = await self.records.get(key)
                    if current is None or current.value.quarantine is None:
                        continue
                    record = current.value
                    try:
                        node = await self.cluster.nodes.get(name)
                    except NotFound:
                        continue
                    record = await self._check_operator(name, record, node)
                    await self._maybe_release(name, record)

    @app.task("reconcile")
    async def reconcile_loop(self) -> None:
        interval = self.settings.reconcile_interval.total_seconds()
        while True:
            await asyncio.sleep(interval)
            self.marks.failpoints.hit("cordon.reconcile")  # outside the try: the task fails
            try:
                await self.reconcile_once()
            except Exception:  # one bad pass must not stop the loop
                self.log.exception("cordon.reconcile_failed")


def _released_line(name: str, q: Quarantine, details: dict[str, Any]) -> str:
    """One line on what an operator's release undid."""
    done = [f"released {name} from quarantine {q.incident}"]
    removed = details.get("removed_taints") or []
    if removed:
        done.append(f"removed taint {', '.join(removed)}")
    if details.get("uncordoned"):
        done.append("uncordoned")
    elif details.get("kept_cordon"):
        done.append("kept cordoned (not by nodeward, or held by another of its owners)")
    return "; ".join(done)


async def _applied_at(proposal: Proposal) -> float | None:
    """When the quarantine a release proposal undoes was applied (its details say)."""
    at = proposal.details.get("applied_at")
    return float(at) if isinstance(at, int | float) else None


async def reset_breaker(bus: Bus, config: CordonSettings) -> None:
    """Close the circuit breaker (what `nodeward service cordon --reset-breaker` calls,
    unaudited; `nodeward breaker reset` is the audited operator control).

    Operators without the CLI can delete the key: `nats kv del breaker breaker`. The
    breaker is shared by every service that removes nodes from service.
    """

    async def no_population() -> int:
        return 0

    kv = await bus.kv(config.breaker.bucket, history=5)
    await CircuitBreaker(kv, config.breaker, no_population).reset()


@app.prepare
async def prepare(config: CordonSettings) -> Policy:
    """The policy, loaded before anything is connected."""
    return load_policy(config.policy_file)


@app.setup
async def setup(rt: Runtime[CordonSettings]) -> CordonService:
    """The service over its node records and the shared breaker.

    `settings.cluster` must authenticate as the cordon ServiceAccount (context
    `nodeward-cordon` of the `nodeward up` kubeconfig).
    """
    config, cluster = rt.config, rt.acting
    kv = await rt.kv(config.bucket, history=5)
    records: TypedKV[NodeRecord] = TypedKV(kv, NodeRecord, remember=config.remembered_nodes)
    breaker = await node_breaker(
        rt.bus,
        cluster,
        config.breaker,
        registry=rt.daemon.metrics.registry,
        ttl=config.node_count_ttl.total_seconds(),
        daemon=rt.daemon,
    )
    service = CordonService(
        rt.bus, cluster, records=records, breaker=breaker, settings=config, policy=rt.prepared
    )
    if rt.settings.bus.partitions > 1:
        service.owns = lambda _: False  # until the partitions are claimed
    return service


@app.claimed
def claimed(service: CordonService, group: PartitionedConsumer) -> None:
    """This replica acts on the nodes whose partitions it holds."""
    service.owns = lambda node: group.owns(token(node))


build = app.build
"""What `nodeward service cordon` runs: the consumers on `gpu.health.>` (changes),
`gpu.heartbeat.>` and `gpu.xid.>`, the reconcile loop and the controls."""


async def _reset_breaker_command(settings: Settings) -> str:
    config: CordonSettings = section(settings, "services", NAME, CordonSettings)
    settings.bus.provision = False
    bus = await Bus.connect(settings.bus, source=ACTOR, wait=False)
    try:
        await reset_breaker(bus, config)
    finally:
        await bus.close(grace=1)
    return f"cordon: circuit breaker reset (KV {config.breaker.bucket}/breaker)"


component, standalone = app.daemon(admin={"reset-breaker": _reset_breaker_command})
