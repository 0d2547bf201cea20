"""Per-GPU exclusion: one failed GPU out of service, its node and siblings kept in service.

Where DRA serves the node's GPUs (a `resource.k8s.io` ResourceSlice of one of `drivers`
lists the GPU, matched by its `uuid` attribute, else `index`, else the device name
`gpu-<index>`), a failed GPU gets a DeviceTaintRule of nodeward's selecting that one device
(driver, pool, device; KEP-5055's external health monitoring). Where the device plugin
serves them, a GPU below its model's threshold (`Exclusion.threshold`) is recorded as
excluded; the node is quarantined only at the threshold (the node path, `service.py`).

Every step goes through the kernel (exemptions and the rate limit, never the breaker: no
node leaves service; audit on `remediation.>`, notice, dry-run). Crash-safe: the exclusion
is written `pending` in the node's KV record before the rule is created, so a restart finds
the rule by its name and adopts it, or deletes it on recovery. nodeward deletes only a rule
it created (its label, the incident's annotation, the uid it recorded).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from nodeward.bus.kv import TypedKV
from nodeward.durations import Duration
from nodeward.failpoints import Failpoints
from nodeward.kube import AlreadyExists, Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.devices import device_taint_rule
from schemas.base import Event
from schemas.gpu import GpuHealth, HealthState
from schemas.remediation import Outcome
from schemas.state.cordon import TAINT_KEY, DeviceExclusion, NodeRecord, node_key, physical_gpu
from services.cordon.policy import Decision, Exclusion, PolicyAction, Scope
from services.cordon.proposals import ending
from services.kernel import ActionRunner, Guard, Proposal, node_ref

MANAGED_BY = "app.kubernetes.io/managed-by"
OWNER_VALUE = "nodeward"
INCIDENT_ANNOTATION = "nodeward.io/incident"
GPU_ANNOTATION = "nodeward.io/gpu-uuid"
REASON_ANNOTATION = "nodeward.io/reason"
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


class DeviceSettings(BaseModel):
    """`services.cordon.devices`: where and how one DRA device is tainted."""

    model_config = ConfigDict(extra="forbid")

    drivers: list[str] = Field(
        default_factory=lambda: ["gpu.nvidia.com"],
        description="DRA drivers whose ResourceSlices publish GPUs nodeward watches over",
    )
    plugin_resources: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu", "amd.com/gpu"],
        description="device plugins' extended resources: a node that advertises one in its "
        "allocatable has its GPUs served by the plugin, and DRA is not looked up for it",
    )
    discovery_ttl: Duration = Field(
        default=timedelta(minutes=5),
        description="how long the served resource.k8s.io versions are remembered",
    )


@dataclass(frozen=True)
class Located:
    """A GPU's DRA device: which slice lists it."""

    driver: str
    pool: str
    device: str


def locate(slices: list[Obj], drivers: list[str], health: GpuHealth) -> Located | None:
    """The device of `health`'s GPU in `slices`: by `uuid` attribute (what every NVIDIA
    DRA driver release publishes), else the `index` attribute (older releases), else the
    canonical name `gpu-<index>`. MIG instances are never matched (the node path)."""
    if health.mig is not None:
        return None
    by_index: Located | None = None
    by_name: Located | None = None
    for item in slices:
        spec = item.get("spec") or {}
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        if driver not in drivers or not pool:
            continue
        for device in spec.get("devices") or []:
            name = str(device.get("name") or "")
            attrs = device.get("attributes") or {}
            uuid = (attrs.get("uuid") or {}).get("string")
            if uuid is not None and uuid == health.gpu_uuid:
                return Located(driver, pool, name)
            if uuid is None and (attrs.get("index") or {}).get("int") == health.gpu_index:
                by_index = by_index or Located(driver, pool, name)
            if uuid is None and name == f"gpu-{health.gpu_index}":
                by_name = by_name or Located(driver, pool, name)
    return by_index or by_name


def joined_exclusion(record: NodeRecord, gpu: str) -> DeviceExclusion | None:
    """The exclusion that GPU key `gpu` joins: one recorded (`excluded`, below the threshold)
    under another key of the same physical GPU (the GPU of a MIG instance, or an instance
    of the GPU), held (applied or dry-run). One incident per physical GPU: the failure of its
    other keys is the same one. A DeviceTaintRule is not joined: it selects the GPU's DRA
    device alone, so a MIG instance of it takes the node path."""
    for key, ex in record.devices.items():
        if key == gpu or physical_gpu(key) != physical_gpu(gpu):
            continue
        if ex.kind == "excluded" and (ex.phase == "applied" or ex.dry_run):
            return ex
    return None


def plugin_served(node: Obj, resources: list[str]) -> bool:
    """True if a device plugin serves `node`'s GPUs: it advertises one of `resources` (the
    plugins' extended resources) in its allocatable. Such a GPU has no DRA device."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return any(str(allocatable.get(r, "0")) not in ("0", "") for r in resources)


def rule_name(node: str, device: str) -> str:
    """nodeward's DeviceTaintRule for `device` of `node`: one per device, so a redelivery
    or a restart finds the one it created."""
    name = f"nodeward-{node}-{device}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node}/{device}".encode()).hexdigest()[:10]
    return f"nodeward-{node[:200]}-{digest}-{device}"[:253].rstrip("-.")


def label_value(text: str) -> str:
    """`text` as a label value (a taint value follows the same rule)."""
    value = _LABEL_VALUE.sub("-", text)[:63].strip("-_.")
    return value


def is_ours(rule: Obj | None, ex: DeviceExclusion) -> bool:
    """True if `rule` is the one nodeward created for exclusion `ex`."""
    if rule is None:
        return False
    meta = rule.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    if labels.get(MANAGED_BY) != OWNER_VALUE or notes.get(GPU_ANNOTATION) != ex.gpu_uuid:
        return False
    return ex.uid is None or meta.get("uid") == ex.uid


@dataclass(eq=False)
class DeviceExclusions:
    """Exclude and release single GPUs for the cordon service (its KV records, its runner)."""

    cluster: Cluster
    records: TypedKV[NodeRecord]
    runner: ActionRunner
    guards: list[Guard]
    _: KW_ONLY
    exclusion: Exclusion
    settings: DeviceSettings
    no_execute: bool
    healthy_period: timedelta
    max_event_age: timedelta
    describe: Callable[[GpuHealth], str]
    failpoints: Failpoints
    _versions: tuple[float, str | None, str | None] | None = field(default=None, init=False)
    log: Any = field(
        default_factory=lambda: structlog.get_logger().bind(service="cordon", part="devices"),
        init=False,
    )

    # discovery --------------------------------------------------------------------------
    async def versions(self) -> tuple[str | None, str | None]:
        """(ResourceSlice version, DeviceTaintRule version) the cluster serves, remembered
        `discovery_ttl`; None for what it does not serve."""
        now = time.monotonic()
        ttl = self.settings.discovery_ttl.total_seconds()
        if self._versions is not None and now - self._versions[0] < ttl:
            return self._versions[1], self._versions[2]
        slices = await self.cluster.devices.slice_version()
        rules = await self.cluster.devices.served_version() if slices else None
        self._versions = (now, slices, rules)
        return slices, rules

    async def find(self, health: GpuHealth, node: Obj | None = None) -> tuple[Located, str] | None:
        """The GPU's DRA device and the DeviceTaintRule version to taint it with, or None
        (no DRA, the GPU not published, or DeviceTaintRules not served). A `node` whose
        GPUs a device plugin serves is not looked up (`plugin_served`)."""
        if not self.exclusion.device_taints or health.mig is not None:
            return None
        if node is not None and plugin_served(node, self.settings.plugin_resources):
            return None
        try:
            slice_version, rule_version = await self.versions()
            if slice_version is None or rule_version is None:
                return None
            slices = await self.cluster.devices.slices_on(slice_version, health.node)
        except KubeError as exc:
            # Not allowed (an older role) or not answering: the node path, today's safe
            # default, rather than no quarantine at all.
            self.log.warning("cordon.dra_unreadable", error=str(exc))
            return None
        found = locate(slices, self.settings.drivers, health)
        return (found, rule_version) if found else None

    # one event --------------------------------------------------------------------------
    async def handle(
        self,
        event: Event[Any],
        health: GpuHealth,
        decision: Decision,
        record: NodeRecord,
        *,
        node: Obj | None = None,
    ) -> bool:
        """Take the event if it concerns one GPU on its own: exclude it (the policy
        quarantines, the node holds no quarantine, and the scope is the device or the GPU)
        or release it (healthy again). True when the node path has nothing left to do.
        `node`: the node as the caller read it (else read here when needed)."""
        gpu = health.gpu_key()
        if decision.action != PolicyAction.QUARANTINE:
            if gpu in record.devices and health.state == HealthState.HEALTHY:
                await self.maybe_release(health.node, record)
            return record.quarantine is None
        if record.quarantine is not None:
            return False  # the node is out of service already: its quarantine takes the GPU
        age = (datetime.now(UTC) - health.observed_at).total_seconds()
        if age > self.max_event_age.total_seconds():
            return False  # the node path audits it as too old
        held = record.devices.get(gpu)
        if held is not None and (held.phase == "applied" or held.dry_run):
            proposal = self._proposal(
                health,
                decision=decision,
                event=event,
                kind=held.kind,
                incident=held.incident,
                node=None,
            )
            if held.phase == "applied" and held.incident == event.id:
                # This very event excluded it: redelivered after a restart between the act
                # and its audit. Re-publish the audit (same id: stored at most once).
                outcome = Outcome.DRY_RUN if held.dry_run else Outcome.APPLIED
                reason = (
                    f"dry run: would {proposal.action}: {proposal.reason}" if held.dry_run else None
                )
                await self.runner.record(proposal, outcome, reason, details=_applied(held))
            elif not health.heartbeat:
                await self.runner.skip(
                    proposal,
                    guard="manual_untaint" if held.operator_released else "already_excluded",
                    reason=(
                        f"not re-tainted: an operator removed {held.taint_rule} in incident "
                        f"{held.incident}"
                        if held.operator_released
                        else f"already excluded ({held.kind}): {self.describe(health)}"
                    ),
                )
            return True
        joined = joined_exclusion(record, gpu) if held is None else None
        if joined is not None:
            # Another key of a GPU excluded already (its MIG instance): the same incident,
            # not decided again (the exclusion's release follows that key's health).
            self.log.info("cordon.joined_exclusion", gpu=gpu, incident=joined.incident)
            return True
        # The threshold counts physical GPUs: a MIG GPU's instances are one failed GPU.
        failed = len(record.failed_gpus())
        found = await self.find(health, node)
        scope = self.exclusion.scope(
            decision, model=health.model, failed=max(failed, 1), dra=found is not None
        )
        self.log.info("cordon.scope", gpu=gpu, scope=scope.value, failed=failed)
        if scope == Scope.NODE:
            return False
        if node is None:
            try:
                node = await self.cluster.nodes.get(health.node)
            except NotFound:
                self.log.warning("cordon.node_unknown")
                return True
        kind = "device_taint" if scope == Scope.DEVICE else "excluded"
        incident = held.incident if held is not None else event.id
        proposal = self._proposal(
            health, decision=decision, event=event, kind=kind, incident=incident, node=node
        )
        ex = held or DeviceExclusion(
            gpu=gpu,
            gpu_uuid=health.gpu_uuid,
            model=health.model,
            kind=kind,
            incident=incident,
            rule=decision.rule,
            reason=proposal.reason,
            started_at=event.time,
            pods=[f"{p.namespace}/{p.name}" for p in health.pods],
        )
        if found is not None and kind == "device_taint":
            located, version = found
            effect = "NoExecute" if decision.no_execute or self.no_execute else "NoSchedule"
            ex = ex.model_copy(
                update={
                    "taint_rule": ex.taint_rule or rule_name(health.node, located.device),
                    "api_version": ex.api_version or version,
                    "driver": located.driver,
                    "pool": located.pool,
                    "device": located.device,
                    "effect": ex.effect or effect,
                }
            )

        async def act() -> dict[str, Any]:
            return await self._apply(health.node, ex)

        result = await self.runner.run(proposal, act, self.guards)
        if result.outcome == Outcome.DRY_RUN:
            dry = ex.model_copy(
                update={"phase": "applied", "dry_run": True, "applied_at": time.time()}
            )
            await self._put(health.node, dry)
        return True

    def _proposal(
        self,
        health: GpuHealth,
        *,
        decision: Decision,
        event: Event[Any],
        kind: str,
        incident: str,
        node: Obj | None,
    ) -> Proposal:
        what = "taint its DRA device" if kind == "device_taint" else "exclude the GPU"
        return Proposal(
            action="device_taint" if kind == "device_taint" else "gpu_exclude",
            target=node_ref(health.node),
            reason=f"{health.node}: {self.describe(health)}; {what}, the node stays in service",
            policy=decision.rule,
            trigger_id=incident,
            trigger_time=event.time,
            obj=node,
            details={
                "gpu": health.gpu_key(),
                "gpu_uuid": health.gpu_uuid,
                "model": health.model,
                "pods": [f"{p.namespace}/{p.name}" for p in health.pods],
            },
        )

    async def _put(self, node: str, ex: DeviceExclusion) -> None:
        def put(current: NodeRecord | None) -> NodeRecord | None:
            record = current or NodeRecord()
            return record.model_copy(update={"devices": {**record.devices, ex.gpu: ex}})

        await self.records.update(node_key(node), put)

    async def _apply(self, node: str, ex: DeviceExclusion) -> dict[str, Any]:
        """Write the intent, create the rule (or adopt ours), record it applied."""
        await self._put(node, ex)  # write-ahead: a restart finds the rule by this name
        self.failpoints.hit("cordon.device.pending")
        if ex.kind == "device_taint":
            ex = await self._create_rule(node, ex)
            self.failpoints.hit("cordon.device.created")
        done = ex.model_copy(update={"phase": "applied", "applied_at": time.time()})
        await self._put(node, done)
        self.failpoints.hit("cordon.device.applied")
        return _applied(ex)

    async def _create_rule(self, node: str, ex: DeviceExclusion) -> DeviceExclusion:
        assert ex.taint_rule and ex.api_version and ex.driver and ex.pool and ex.device
        body = device_taint_rule(
            ex.taint_rule,
            api_version=ex.api_version,
            driver=ex.driver,
            pool=ex.pool,
            device=ex.device,
            key=TAINT_KEY,
            value=label_value(ex.rule),
            effect=ex.effect or "NoSchedule",
            labels={MANAGED_BY: OWNER_VALUE, "nodeward.io/node": label_value(node)},
            annotations={
                INCIDENT_ANNOTATION: ex.incident,
                GPU_ANNOTATION: ex.gpu_uuid,
                REASON_ANNOTATION: ex.reason[:1024],
            },
        )
        try:
            created: Obj | None = await self.cluster.devices.create_taint_rule(ex.api_version, body)
        except AlreadyExists:
            created = await self.cluster.devices.get_taint_rule(ex.api_version, ex.taint_rule)
            if created is None or not is_ours(created, ex.model_copy(update={"uid": None})):
                raise KubeError(
                    f"DeviceTaintRule {ex.taint_rule} exists and is not nodeward's: left as it is"
                ) from None
            self.log.info("cordon.device_taint_adopted", rule=ex.taint_rule)
        uid = str(((created or {}).get("metadata") or {}).get("uid") or "") or None
        return ex.model_copy(update={"uid": uid})

    # reconcile --------------------------------------------------------------------------
    async def reconcile(self, node: str, record: NodeRecord) -> None:
        """Notice an operator's deletion of a rule of nodeward's, then release what is due."""
        changed = False
        for ex in list(record.devices.values()):
            if ex.kind != "device_taint" or ex.phase != "applied" or ex.dry_run:
                continue
            if ex.operator_released or not (ex.taint_rule and ex.api_version):
                continue
            rule = await self.cluster.devices.get_taint_rule(ex.api_version, ex.taint_rule)
            if not is_ours(rule, ex):
                await self._operator_released(node, ex)
                changed = True
        if changed:
            entry = await self.records.get(node_key(node))
            record = entry.value if entry else NodeRecord()
        await self.maybe_release(node, record)

    async def _operator_released(self, node: str, ex: DeviceExclusion) -> None:
        """The rule is gone (or replaced): an operator's act, audited and respected."""
        self.log.warning("cordon.device_taint_removed", rule=ex.taint_rule, gpu=ex.gpu)
        proposal = ending(
            "device_taint",
            node,
            ex,
            f"an operator removed DeviceTaintRule {ex.taint_rule} (GPU {ex.gpu} of "
            f"{node}); nodeward respects it and will not re-create it for incident {ex.incident}",
            {"by": "operator", "incident": ex.incident, "gpu": ex.gpu},
            resolves=False,
        )
        # Audit first: a restart before the record says so detects it again (same audit id).
        await self.runner.record(proposal, Outcome.UNDONE, guard="manual_untaint")
        released = ex.model_copy(update={"operator_released": True})

        def respect(current: NodeRecord | None) -> NodeRecord | None:
            record = current or NodeRecord()
            held = record.devices.get(ex.gpu)
            if held is None or held.incident != ex.incident:
                return None
            return record.model_copy(update={"devices": {**record.devices, ex.gpu: released}})

        await self.records.update(node_key(node), respect)

    # release ----------------------------------------------------------------------------
    async def maybe_release(self, node: str, record: NodeRecord) -> None:
        """Release each excluded GPU healthy for `healthy_period` (pending ones too: a
        restart between intent and rule)."""
        now = datetime.now(UTC)
        due = []
        for gpu, ex in sorted(record.devices.items()):
            healthy = record.gpu_healthy_for(gpu, now)
            if healthy is not None and healthy >= self.healthy_period.total_seconds():
                due.append((ex, f"GPU {gpu} of {node} healthy for {healthy:.0f}s"))
        for n, (ex, why) in enumerate(due):
            # The node's incident ends with its last exclusion, and never under a quarantine.
            last = record.quarantine is None and n == len(due) - 1 == len(record.devices) - 1
            await self.release(node, ex, why, resolves=last)

    async def release(
        self, node: str, ex: DeviceExclusion, why: str, *, resolves: bool = True
    ) -> None:
        what = (
            f"removing DeviceTaintRule {ex.taint_rule}"
            if ex.kind == "device_taint"
            else "ending its exclusion"
        )
        proposal = ending(
            "device_untaint" if ex.kind == "device_taint" else "gpu_include",
            node,
            ex,
            f"{why}; {what} (incident {ex.incident})",
            {"gpu": ex.gpu, "gpu_uuid": ex.gpu_uuid, "incident": ex.incident},
            resolves=resolves,
        )

        async def act() -> dict[str, Any]:
            details: dict[str, Any] = {"gpu": ex.gpu, "incident": ex.incident}
            if ex.kind == "device_taint" and ex.taint_rule and ex.api_version:
                details["device_taint_rule"] = ex.taint_rule
                details["removed"] = await self._delete_rule(ex)
            return details

        runner = self.runner.with_dry_run() if ex.dry_run else self.runner
        decided = await runner.run(proposal, act, ())
        if decided.outcome not in (Outcome.APPLIED, Outcome.DRY_RUN):
            return

        def cleared(current: NodeRecord | None) -> NodeRecord | None:
            record = current or NodeRecord()
            held = record.devices.get(ex.gpu)
            if held is None or held.incident != ex.incident:
                return None
            rest = {k: v for k, v in record.devices.items() if k != ex.gpu}
            return record.model_copy(update={"devices": rest})

        self.failpoints.hit("cordon.device.released")
        await self.records.update(node_key(node), cleared)

    async def _delete_rule(self, ex: DeviceExclusion) -> bool:
        """Delete nodeward's rule for `ex`; False if it is gone or not ours (left alone)."""
        assert ex.taint_rule and ex.api_version
        rule = await self.cluster.devices.get_taint_rule(ex.api_version, ex.taint_rule)
        if rule is None:
            return False
        if not is_ours(rule, ex):
            self.log.warning("cordon.device_taint_not_ours", rule=ex.taint_rule)
            return False
        uid = str(rule["metadata"].get("uid") or "")
        return await self.cluster.devices.delete_taint_rule(ex.api_version, ex.taint_rule, uid)


def _applied(ex: DeviceExclusion) -> dict[str, Any]:
    """What the audit of an applied exclusion details."""
    details: dict[str, Any] = {"incident": ex.incident, "kind": ex.kind, "pods": ex.pods}
    if ex.kind == "device_taint":
        details |= {
            "device_taint_rule": ex.taint_rule,
            "api_version": f"resource.k8s.io/{ex.api_version}",
            "driver": ex.driver,
            "pool": ex.pool,
            "device": ex.device,
            "effect": ex.effect,
        }
    return details
