"""What the checkpoint (maintenance) service's parts share: its names, settings, and the
`Kit` (its bus, cluster, KV, kernel runner and guards) each part acts with."""

from __future__ import annotations

import asyncio
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import structlog
from nats.js.kv import KeyValue
from pydantic import Field

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.durations import Duration
from nodeward.handlers import Consuming
from nodeward.kube import Cluster, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.errors import CheckpointFailed, Forbidden
from schemas.base import Event, make_event
from schemas.common import ObjectRef
from schemas.ids import stable_id
from schemas.maintenance import Maintenance, MaintenancePhase
from services.kernel import (
    Acting,
    ActingSettings,
    ActionRunner,
    BreakerSettings,
    CircuitBreaker,
    Exemptions,
    Guard,
    OwnerNotice,
    Proposal,
    RateLimiter,
    RateLimitSettings,
    node_ref,
    per_action,
    table,
    tell_owner,
)
from services.kernel.control import ControlSettings
from services.kernel.marks import NodeMarks
from services.kernel.severities import LOUD, QUIET, SKIP_WARNS
from services.maintenance.image import ImageSettings
from services.maintenance.plan import Notice
from services.maintenance.state import MAINTENANCES, MaintenanceState, PodPlan

NAME = "checkpoint"
ACTOR = "service/checkpoint"
OWNER = "maintenance"  # of its marks on the node (services.kernel.marks)
TOPIC = "maintenance"
MAINTENANCE_ANNOTATION = "nodeward.io/maintenance"
"""`requested` on a node starts a maintenance; the service then writes the phase there."""
REASON_ANNOTATION = "nodeward.io/maintenance-reason"
CORDON_ANNOTATION = "nodeward.io/maintenance-cordon"
ARCHIVE_ANNOTATION = "nodeward.io/checkpoint-archive"
ENDED = MappingProxyType({MAINTENANCE_ANNOTATION: None, REASON_ANNOTATION: None})
"""A finished or cancelled maintenance takes its phase and reason off the node."""
# A checkpoint that failed with these is not tried again (the runtime cannot, the kubelet's
# API is off or the container is gone, or the role is not allowed); others are retried
# until the deadline.
FINAL_CHECKPOINT_ERRORS = (CheckpointFailed, NotFound, Forbidden)
# Each step is news on-call hears of; a skip or a refusal (a maintenance left undone) warns,
# and so does taking the node out of service (cordon, drain); a failure pages.
_QUIET = table(QUIET, SKIP_WARNS)
SEVERITIES = per_action(
    (_QUIET, ("announce", "checkpoint", "push-image", "complete", "fail")),
    (
        table(_QUIET, LOUD),
        ("cordon", "drain", "evict-held", "take-over", "stop", "restore", "give-back"),
    ),
)


class CheckpointSettings(ActingSettings, Consuming):
    """`services.checkpoint` in the config file."""

    subjects: list[str] = Field(default_factory=lambda: ["maintenance.requested.>"], min_length=1)
    bucket: str = MAINTENANCES.name
    parallelism: int = Field(default=4, ge=1, description="checkpoint calls at once")
    call_timeout: Duration = timedelta(minutes=2)
    """per checkpoint call (the kubelet's default)"""
    deadline: Duration = timedelta(minutes=30)
    """a request without --deadline gets this"""
    evict_timeout: Duration = timedelta(minutes=2)
    """how long the evictions at the deadline wait on PodDisruptionBudgets"""
    grace_period: int | None = Field(default=None, ge=0, description="None: each pod's own")
    skip_namespaces: list[str] = Field(default_factory=lambda: ["kube-system", "nodeward"])
    tick: Duration = timedelta(seconds=1)
    """how often a waiting workflow looks again"""
    rescan: Duration = timedelta(seconds=15)
    """how often KV is read for workflows to resume (a new request wakes it)"""
    annotation_interval: Duration | None = timedelta(seconds=10)
    """how often nodes are read for nodeward.io/maintenance=requested (None: off)"""
    max_request_age: Duration = timedelta(minutes=10)
    """older requests (a replay of the stream) are logged, never acted on"""
    rate_limit: RateLimitSettings = RateLimitSettings(per_minute=6, burst=3)
    breaker: BreakerSettings = Field(
        default_factory=BreakerSettings,
        description="the shared breaker; guards only service-requested maintenance cordons",
    )
    # The workflow's lease and, with bus.partitions > 1, the partitions': above twice
    # nats-server's longest election (9 s) of the bucket's leader, as cordon's.
    lease_ttl: Duration = timedelta(seconds=20)
    controls: ControlSettings = ControlSettings()
    images: ImageSettings = ImageSettings()
    """where the checkpoint images of moved pods go (a maintenance with --move)"""
    stop_timeout: Duration = timedelta(minutes=5)
    """how long a pod that moves may take to terminate on its node"""
    restore_timeout: Duration = timedelta(minutes=10)
    """how long its replacement may take to run (pull, restore) on the target"""


def pod_ref(plan: PodPlan) -> ObjectRef:
    return ObjectRef(kind="Pod", name=plan.name, namespace=plan.namespace, api_version="v1")


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Kit:
    """What the intake, the workflow and the controls act with (one per service)."""

    bus: Bus
    cluster: Cluster
    states: TypedKV[MaintenanceState]
    kv: KeyValue
    settings: CheckpointSettings
    holder: str
    acting: InitVar[Acting]
    """Its runner, exemptions and controls' guards (`acting_controlled`)."""
    breaker: CircuitBreaker | None = None
    runner: ActionRunner = field(init=False)
    exemptions: Exemptions = field(init=False)
    control_guards: tuple[Guard, ...] = field(init=False)
    limiter: RateLimiter = field(init=False)
    marks: NodeMarks = field(init=False)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a workflow is stored or changed: the workflow loop looks now."""
    log: Any = field(init=False)
    leading: bool = False
    """True while this replica holds the workflow lease: it alone drives workflows and
    turns node annotations into requests."""

    def __post_init__(self, acting: Acting) -> None:
        # Every decision, acted on or not, is audited through the runner (the kernel).
        # An operator's finish or cancel: exemptions and the operator's rate limit.
        self.runner, self.exemptions = acting.runner, acting.exemptions
        self.control_guards = acting.control_guards
        self.limiter = RateLimiter(self.settings.rate_limit)
        self.marks = NodeMarks(self.cluster, self.kv, OWNER)
        self.log = structlog.get_logger().bind(service=NAME)

    def phase_event(
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
            pods=state.scope,
            **fields,
        )
        return make_event(
            data,
            source=ACTOR,
            id=stable_id(state.requested_at, state.maintenance_id, phase.value, *extra),
        )

    def proposal(
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

    async def notify_owner(self, state: MaintenanceState, plan: PodPlan, notice: Notice) -> None:
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
            targets=[pod_ref(plan), node_ref(state.node)],
            notice_id=notice_id,
            dedup_key=f"{TOPIC}/{state.maintenance_id}/{plan.key}/{notice.kind}",
        )
