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

The service is three parts over one `Kit` (`common`): the intake (`intake`: the two
consumers), the workflow's steps (`steps`, on the kernel's durable workflow engine) and the
operator control (`controls`: `force-drain`).

Every step is a kernel proposal (audited on `remediation.>`, notified, dry-run
respected); starting one passes the exemptions, a per-node retry limit and the circuit
breaker.
"""

from __future__ import annotations

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.config import Settings, section
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.platform import acting_daemon, one_daemon
from schemas.xid import XidCatalog, load_catalog
from services.kernel import CircuitBreaker
from services.kernel.breaker import node_breaker
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
from services.recovery.intake import Intake
from services.recovery.state import RecoveryCounts, RecoveryRecord
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
    "build",
    "component",
    "standalone",
]


class RecoveryService:
    """The service's three parts over one kit: `intake`, `steps`, `controls`."""

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
        self.kit = Kit(
            bus, cluster, records, counts, marks, breaker, settings, catalog or load_catalog()
        )
        self.steps = RecoverySteps(self.kit)
        self.intake = Intake(self.kit, self.steps)
        self.controls = Controls(self.kit)


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
        await bus.consume(service.intake.consumer_spec(), service.intake.handle_quarantine)

    async def consume_maintenance() -> None:
        await bus.consume(service.intake.maintenance_spec(), service.intake.handle_maintenance)

    async def loop() -> None:
        await service.steps.run(daemon.stopping)

    await bus.control(NAME, "force-drain", service.controls.force_drain_control)
    daemon.add_task(consume, name="consume")
    daemon.add_task(consume_maintenance, name="consume-maintenance")
    daemon.add_task(loop, name="recoveries", graceful=True)
    return daemon


component, standalone = one_daemon(NAME, build)
