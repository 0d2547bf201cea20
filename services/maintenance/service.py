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
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace

from nats.js.kv import KeyValue

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.config import Settings, section
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.platform import acting_daemon, one_daemon
from services.kernel import CircuitBreaker
from services.kernel.breaker import node_breaker
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
from services.maintenance.state import MaintenanceState
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
    "build",
    "component",
    "done_so_far",
    "standalone",
]


class CheckpointService:
    """The service's three parts over one kit: `intake`, `workflow`, `controls`."""

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
        self.kit = Kit(bus, cluster, states, kv, settings, holder, breaker)
        self.intake = Intake(self.kit)
        self.workflow = MaintenanceWorkflow(self.kit)
        self.controls = Controls(self.kit, self.workflow.flow)


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

    spec = service.intake.consumer_spec()
    if settings.bus.partitions > 1:  # per node across replicas (leases in its bucket)
        spec = replace(spec, partitions=settings.bus.partitions, lease_ttl=config.lease_ttl)

    async def consume() -> None:
        await bus.consume(spec, service.intake.handle, leases=kv)

    async def workflows() -> None:
        await service.workflow.run(daemon.stopping)

    async def annotations() -> None:
        await service.intake.watch_annotations(daemon.stopping)

    daemon.add_task(consume, name="consume")
    daemon.add_task(workflows, name="workflows", graceful=True)
    daemon.add_task(annotations, name="annotations", graceful=True)
    await bus.control(NAME, "cancel", service.controls.cancel_control)
    await bus.control(NAME, "finish", service.controls.finish_control)
    return daemon


component, standalone = one_daemon(NAME, build)
