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

The service is three parts over one `Kit` (`common`): the intake (`intake`: requests and the
node annotation), the workflow's steps (`steps`, on the kernel's durable workflow engine) and
the operator controls (`controls`). The workflow lives in KV (`node.<node>`,
`services.maintenance.state.MaintenanceState`), moved on by one revision-checked write per
phase and saved after each container's checkpoint, so a restart resumes from the last
phase: a container whose archive is recorded is never checkpointed again, and nothing is
evicted before every opted-in pod's checkpoint is recorded. A stopping service finishes
the checkpoint calls in flight and starts no new ones. Phase events have ids derived from
the maintenance, so a phase re-published after a restart is dropped by JetStream.
Every action (announce, cordon, checkpoint, drain) goes through the shared path
(exemptions, rate limit on starts, dry-run, audit, on-call notice). Operators end a
maintenance through controls it answers: `finish` (after done: nodeward's cordon comes
off) and `cancel` (before the drain: it ends `cancelled`), on `control.checkpoint.<verb>`.

Declared once (`nodeward.handlers`): the request consumer (`checkpoint`, per node across
replicas with `bus.partitions` > 1, its leases in its bucket), the workflow and annotation
loops (graceful: the calls in flight finish on shutdown) and the two controls; its NATS
grants derive from these.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from nats.js.kv import KeyValue

from nodeward.bus import ConsumerSpec, Delivery
from nodeward.bus.kv import TypedKV
from nodeward.handlers import Runtime, Service, setting
from schemas.base import Event
from schemas.control import ControlReply, ControlRequest
from schemas.maintenance import Maintenance
from schemas.state.breaker import SHARED
from services.kernel import acting_controlled, breaker_for
from services.kernel.access import PUBLISHES
from services.maintenance.access import ACCESS
from services.maintenance.common import (
    ACTOR,
    ARCHIVE_ANNOTATION,
    CORDON_ANNOTATION,
    MAINTENANCE_ANNOTATION,
    NAME,
    OWNER,
    REASON_ANNOTATION,
    SEVERITIES,
    TOPIC,
    CheckpointSettings,
    Kit,
)
from services.maintenance.controls import Controls, done_so_far
from services.maintenance.intake import Intake
from services.maintenance.state import MAINTENANCES, MaintenanceState
from services.maintenance.steps import MaintenanceWorkflow

__all__ = [
    "ACTOR",
    "ARCHIVE_ANNOTATION",
    "CORDON_ANNOTATION",
    "MAINTENANCE_ANNOTATION",
    "NAME",
    "OWNER",
    "REASON_ANNOTATION",
    "SEVERITIES",
    "TOPIC",
    "CheckpointService",
    "CheckpointSettings",
    "app",
    "build",
    "component",
    "done_so_far",
    "standalone",
]

app = Service(
    NAME,
    settings=CheckpointSettings,
    access=ACCESS,
    buckets=(MAINTENANCES.name, SHARED.name),
    publishes=("maintenance.>", *PUBLISHES),
)


class CheckpointService:
    """The service's three parts over one kit: `intake`, `workflow`, `controls`."""

    def __init__(
        self,
        kit: Kit,
        stopping: asyncio.Event,
    ) -> None:
        self.kit = kit
        self.stopping = stopping
        self.intake = Intake(kit)
        self.workflow = MaintenanceWorkflow(kit)
        self.controls = Controls(kit, self.workflow.flow)

    @property
    def kv(self) -> KeyValue:
        return self.kit.kv


@app.consumes(
    "MAINTENANCE",
    subjects=setting("subjects"),
    types=(Maintenance,),
    concurrency=4,
    order_key=lambda e: str(e.data.node),
    retry_delays=(1.0, 5.0, 15.0, 30.0),
    max_deliver=6,
    # maintenance.<phase>.<node>: the request is about the node in its subject.
    identity=(ConsumerSpec.bind(Maintenance, "node"),),
    # Per node across replicas with bus.partitions > 1 (leases in its bucket).
    leases=lambda service: service.kv,
    lease_ttl=setting("lease_ttl"),
)
async def on_request(service: CheckpointService, event: Event[Any], delivery: Delivery) -> None:
    """`maintenance.requested`: a workflow stored in KV (`Intake.handle`)."""
    await service.intake.handle(event, delivery)


@app.task("workflows", graceful=True)
async def workflows(service: CheckpointService) -> None:
    """Drive every maintenance in KV while this replica holds the workflow lease."""
    await service.workflow.run(service.stopping)


@app.task("annotations", graceful=True)
async def annotated_nodes(service: CheckpointService) -> None:
    """Nodes annotated `nodeward.io/maintenance=requested` turned into requests."""
    await service.intake.watch_annotations(service.stopping)


@app.control("cancel")
async def cancel(service: CheckpointService, request: ControlRequest) -> ControlReply:
    """`nodeward maintenance cancel NODE`."""
    return await service.controls.cancel_control(request)


@app.control("restore")
async def restore(service: CheckpointService, request: ControlRequest) -> ControlReply:
    """`nodeward maintenance restore NS/POD [--to NODE]`."""
    return await service.controls.restore_control(request)


@app.control("finish")
async def finish(service: CheckpointService, request: ControlRequest) -> ControlReply:
    """`nodeward maintenance finish NODE`."""
    return await service.controls.finish_control(request)


@app.setup
async def setup(rt: Runtime[CheckpointSettings]) -> CheckpointService:
    """The service over its bucket and the shared breaker. `settings.cluster` must
    authenticate as its ServiceAccount."""
    kv = await rt.kv(rt.config.bucket, history=5)
    holder = f"{socket.gethostname()}-{os.getpid()}-{id(rt.daemon):x}"
    acting = acting_controlled(rt, topic=TOPIC, severities=SEVERITIES)
    states = TypedKV(kv, MaintenanceState)
    kit = Kit(rt.bus, rt.acting, states, kv, rt.config, holder, acting, await breaker_for(rt))
    return CheckpointService(kit, rt.daemon.stopping)


build = app.build
component, standalone = app.daemon()
