"""services.recovery: bring a quarantined node back into service without a human when the
XID catalog says a GPU reset or a node reboot cures its fault.

A durable consumer on cordon's audit records (`remediation.quarantine.>`, applied) decides
from the fault (`policy.decide`): a reset or a reboot starts a recovery, an RMA fault goes
to on-call at once. A recovery is one record in KV (`services.recovery.state`) that a loop
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

A hung node (`hang`: `Ready` not `True`, a listed condition, or its agents silent, each
past its duration) is found by the detector (`detector`), published as `node.health.<node>`
and, from the recovery's durable on it (`hung_intake`), recovered through its node group's
escalation ladder (`fencing`): a reboot request, then BMC power off and on, fenced with the
out-of-service taint only once the BMC says it is off, then validated and released.

The service's parts share one `Kit` (`common`): the intakes (`intake`, `hung_intake`), the
workflow's steps (`steps`, `fencing`, on the kernel's durable workflow engine), the detector
and the operator controls (`controls`: `force-drain`, `pause`, `resume`). They are declared
once here (`nodeward.handlers`): the durables `recovery-quarantines`,
`recovery-maintenance` and `recovery-nodes` (the section's `consumer`, else `recovery`, and
a suffix), the controls, the recoveries loop (graceful: a step in flight finishes on
shutdown) and the detector; its NATS grants derive from these.

Every step is a kernel proposal (audited on `remediation.>`, notified, dry-run
respected); starting one passes the exemptions, the operators' pause, a per-node retry
limit and the circuit breaker (a hung node's, its group's `min_healthy` floor too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from nodeward.bus import Delivery
from nodeward.bus.kv import TypedKV
from nodeward.handlers import Runtime, Service, setting
from schemas.base import Event
from schemas.control import ControlReply, ControlRequest, control_subject
from schemas.maintenance import Maintenance
from schemas.node import NodeHealth
from schemas.remediation import Remediation
from schemas.state.breaker import SHARED
from schemas.xid import load_catalog
from services.kernel import acting_controlled, breaker_for
from services.kernel.access import PUBLISHES
from services.kernel.marks import NodeMarks
from services.recovery.access import ACCESS
from services.recovery.common import (
    ACTOR,
    NAME,
    OWNER,
    SEVERITIES,
    TOPIC,
    Kit,
    RecoverySettings,
    RetryLimit,
)
from services.recovery.controls import Controls
from services.recovery.detector import HEARTBEAT_STREAM, Detector
from services.recovery.hung_intake import HungIntake
from services.recovery.intake import Intake
from services.recovery.state import BUCKET, RecoveryCounts, RecoveryRecord
from services.recovery.steps import RecoverySteps

__all__ = [
    "ACTOR",
    "NAME",
    "OWNER",
    "SEVERITIES",
    "TOPIC",
    "RecoveryService",
    "RecoverySettings",
    "RetryLimit",
    "app",
    "build",
    "component",
    "standalone",
]

app = Service(
    NAME,
    settings=RecoverySettings,
    access=ACCESS,
    buckets=(BUCKET, SHARED.name),
    publishes=(
        "maintenance.requested.*",  # the drain before a reset or reboot
        "agent.gpu.reset.*",  # request/reply to a node's GPU agent
        "agent.gpu.validate.*",
        # The owners' release paths, asked as `service/recovery` (audited by them); `cancel`:
        # its own maintenance taken back when the quarantine ended without recovery.
        control_subject("checkpoint", "finish"),
        control_subject("checkpoint", "cancel"),
        control_subject("cordon", "release"),
        NodeHealth.SUBJECT_PATTERN.replace("<node>", "*"),  # the detector's findings
        *PUBLISHES,
    ),
    reads=(HEARTBEAT_STREAM,),  # the detector: each node's newest GPU heartbeat
)


class RecoveryService:
    """The service's three parts over one kit: `intake`, `steps`, `controls`."""

    def __init__(self, kit: Kit, stopping: asyncio.Event) -> None:
        self.kit = kit
        self.stopping = stopping
        self.steps = RecoverySteps(kit)
        self.intake = Intake(kit, self.steps)
        self.hung = HungIntake(kit, self.steps)
        self.detector = Detector(kit)
        self.controls = Controls(kit)


DELIVERY: Final[Mapping[str, Any]] = MappingProxyType({"concurrency": 4, "max_deliver": 6})
"""Both consumers: four nodes' events at a time, in order per node; six deliveries, then
the DLQ."""


@app.consumes(
    "AUDIT",
    suffix="quarantines",
    subjects=setting("subjects"),
    types=(Remediation,),
    order_key=lambda e: e.data.target.name,
    **DELIVERY,
)
async def on_quarantine(service: RecoveryService, event: Event[Any], delivery: Delivery) -> None:
    """A quarantine cordon applied or grew (`Intake.handle_quarantine`)."""
    await service.intake.handle_quarantine(event, delivery)


@app.consumes(
    "MAINTENANCE",
    suffix="maintenance",
    subjects=setting("maintenance_subjects"),
    types=(Maintenance,),
    order_key=lambda e: str(e.data.node),
    **DELIVERY,
)
async def on_maintenance(service: RecoveryService, event: Event[Any], delivery: Delivery) -> None:
    """A maintenance ended: a draining recovery moves on (`Intake.handle_maintenance`)."""
    await service.intake.handle_maintenance(event, delivery)


@app.consumes(
    "NODES",
    suffix="nodes",
    subjects=setting("node_subjects"),
    types=(NodeHealth,),
    order_key=lambda e: str(e.data.node),
    **DELIVERY,
)
async def on_node_health(service: RecoveryService, event: Event[Any], delivery: Delivery) -> None:
    """A node turned unresponsive: its ladder (`HungIntake.handle`)."""
    await service.hung.handle(event, delivery)


@app.control("pause")
async def pause(service: RecoveryService, request: ControlRequest) -> ControlReply:
    """`nodeward recovery pause`."""
    return await service.controls.pause_control(request)


@app.control("resume")
async def resume(service: RecoveryService, request: ControlRequest) -> ControlReply:
    """`nodeward recovery resume`."""
    return await service.controls.resume_control(request)


@app.task("detector")
async def detector(service: RecoveryService) -> None:
    """Judge every node each `hang.check_interval` until the daemon stops (when enabled)."""
    if service.kit.settings.hang.enabled:
        await service.detector.run(service.stopping)


@app.control("force-drain")
async def force_drain(service: RecoveryService, request: ControlRequest) -> ControlReply:
    """`nodeward recovery force-drain NODE`."""
    return await service.controls.force_drain_control(request)


@app.task("recoveries", graceful=True)
async def recoveries(service: RecoveryService) -> None:
    """Drive every recovery under way until the daemon stops."""
    await service.steps.run(service.stopping)


@app.setup
async def setup(rt: Runtime[RecoverySettings]) -> RecoveryService:
    """The service over its bucket and the shared breaker. `settings.cluster` must
    authenticate as its ServiceAccount."""
    kv = await rt.kv(rt.config.bucket, history=5)
    kit = Kit(
        rt.bus,
        rt.acting,
        TypedKV(kv, RecoveryRecord),
        TypedKV(kv, RecoveryCounts),
        NodeMarks(rt.acting, kv, OWNER),
        await breaker_for(rt),
        rt.config,
        acting_controlled(rt, topic=TOPIC, severities=SEVERITIES),
        load_catalog(),
    )
    return RecoveryService(kit, rt.daemon.stopping)


build = app.build
component, standalone = app.daemon()
