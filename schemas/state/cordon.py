"""What the cordon service keeps in KV: per node (`NODES`: bucket `cordon`, key
`node.<name>`) and its circuit breaker's state (`BREAKER`: key `breaker`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from schemas.gpu import GpuHealth, HealthState
from schemas.state import Bucket
from schemas.state.breaker import BREAKER_KEY, BreakerState

BUCKET = "cordon"
TAINT_KEY = "nodeward.io/gpu-unhealthy"
"""The quarantine taint; `Quarantine.taints` lists the effects of it that nodeward added."""


class GpuRecord(BaseModel):
    """The latest accepted health event of one GPU: the ordering anchor for later ones."""

    state: HealthState
    observed_at: datetime
    boot_id: str | None = None
    sequence: int = 0
    event_id: str
    healthy_since: datetime | None = None
    failures: list[float] = Field(
        default_factory=list,
        description="when (unix, observed) this GPU turned failed, within the flap window",
    )

    @classmethod
    def after(
        cls, prior: GpuRecord | None, health: GpuHealth, event_id: str, *, flap_window_s: float = 0
    ) -> GpuRecord:
        """The record once `health` is accepted; a turn to failed is counted in `failures`
        (those older than `flap_window_s` before it forgotten)."""
        at = health.observed_at.timestamp()
        failures = [t for t in (prior.failures if prior else []) if at - t < flap_window_s]
        turned = health.state == HealthState.FAILED and (
            prior is None or prior.state != HealthState.FAILED
        )
        if turned and flap_window_s > 0:
            failures.append(at)
        healthy_since: datetime | None = None
        if health.state == HealthState.HEALTHY:
            was_healthy = prior is not None and prior.state == HealthState.HEALTHY
            healthy_since = (
                prior.healthy_since if was_healthy and prior and prior.healthy_since else None
            ) or health.observed_at
        return cls(
            state=health.state,
            observed_at=health.observed_at,
            boot_id=health.agent_boot_id,
            sequence=health.sequence,
            event_id=event_id,
            healthy_since=healthy_since,
            failures=failures,
        )


def physical_gpu(key: str) -> str:
    """The physical GPU a GPU key names: `3` for GPU 3 and for each of its MIG instances
    (`3-mig1-0`). One incident, one decision per physical GPU."""
    return key.split("-mig", 1)[0]


def first_of_gpu(key: str, keys: Iterable[str]) -> str | None:
    """The first of `keys` on `key`'s physical GPU (`key` itself or another key of it: its
    GPU, one of its MIG instances), or None."""
    gpu = physical_gpu(key)
    return next((k for k in keys if physical_gpu(k) == gpu), None)


class Quarantine(BaseModel):
    """One incident the cordon service holds a node under: what it decides from (its GPUs,
    rule, flapping, when it was applied) and what it did, so it undoes only that.

    Written once the quarantine is applied and audited (or dry-run): the action's progress
    (applying, applied, releasing) is the kernel's write-ahead intent alone (`MarkIntent`,
    key `marks.<node>`), never restated here."""

    incident: str = Field(description="id of the event that opened it")
    rule: str
    reason: str
    gpus: list[str]
    started_at: datetime
    dry_run: bool = False
    prior_unschedulable: bool = False
    cordoned: bool = False
    taints: list[str] = Field(default_factory=list, description="effects of our taint we added")
    applied_at: float | None = None
    operator_released: bool = False
    flapping: str | None = Field(
        default=None,
        description="why the incident is one of a flapping GPU: never released automatically",
    )

    def holds(self, gpu: str) -> bool:
        """True if the incident holds GPU key `gpu`'s physical GPU (under `gpu` or another
        key of it: a MIG instance joins its GPU's incident, and the GPU its instance's)."""
        return first_of_gpu(gpu, self.gpus) is not None


class OperatorRelease(BaseModel):
    """An operator released the node from a quarantine (`nodeward quarantine release`): its
    GPUs are not quarantined again until they have been healthy in between."""

    incident: str
    gpus: list[str]
    operator: str
    reason: str = ""
    at: float


class DeviceExclusion(BaseModel):
    """One failed GPU taken out of service on its own, its node staying in service: a
    DeviceTaintRule of nodeward's (`kind: device_taint`, where DRA serves the GPU), or only
    recorded (`kind: excluded`, a device-plugin node below its model's threshold). Written
    `pending` before the rule is created (write-ahead), `applied` once it exists."""

    gpu: str
    gpu_uuid: str
    model: str | None = None
    kind: Literal["device_taint", "excluded"]
    incident: str = Field(description="id of the event that excluded it")
    rule: str = Field(description="the policy rule")
    reason: str
    started_at: datetime
    phase: Literal["pending", "applied"] = "pending"
    dry_run: bool = False
    applied_at: float | None = None
    taint_rule: str | None = Field(default=None, description="the DeviceTaintRule's name")
    api_version: str | None = Field(default=None, description="resource.k8s.io version used")
    uid: str | None = Field(default=None, description="the rule's uid, once created")
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    effect: str | None = None
    pods: list[str] = Field(default_factory=list, description="namespace/name on the GPU")
    operator_released: bool = Field(
        default=False, description="an operator deleted the rule: respected, not re-created"
    )


class NodeRecord(BaseModel):
    gpus: dict[str, GpuRecord] = Field(default_factory=dict)
    quarantine: Quarantine | None = None
    devices: dict[str, DeviceExclusion] = Field(
        default_factory=dict, description="GPUs excluded on their own, by GPU key"
    )
    operator_release: OperatorRelease | None = None
    last_release_at: float | None = None
    last_decision: str | None = Field(
        default=None, description="`outcome/guard` of the last audited non-quarantine decision"
    )

    @field_validator("quarantine", mode="before")
    @classmethod
    def _not_pending(cls, value: Any) -> Any:
        """A quarantine an old version recorded `pending` (cut short) is not one held: the
        kernel's intent, if the marks were started, finishes it under its incident."""
        if isinstance(value, dict) and value.get("phase") == "pending":
            return None
        return value

    def failed_gpus(self) -> set[str]:
        """The physical GPUs (`physical_gpu`) with a key in state failed."""
        return {physical_gpu(key) for key, r in self.gpus.items() if r.state == HealthState.FAILED}

    def sibling_failed(self, gpu: str) -> bool:
        """True if another key of GPU key `gpu`'s physical GPU (its GPU, one of its MIG
        instances) is in state failed: a failure of the same GPU, already decided."""
        return any(
            key != gpu and physical_gpu(key) == physical_gpu(gpu) and r.state == HealthState.FAILED
            for key, r in self.gpus.items()
        )

    def gpu_healthy_for(self, gpu: str, now: datetime) -> float | None:
        """Seconds GPU `gpu` has been healthy, or None if it is not."""
        record = self.gpus.get(gpu)
        if record is None or record.state != HealthState.HEALTHY or record.healthy_since is None:
            return None
        return (now - record.healthy_since).total_seconds()

    def healthy_for(self, now: datetime) -> float | None:
        """Seconds every known GPU has been healthy, or None if one is not healthy."""
        if not self.gpus:
            return None
        spans = []
        for gpu in self.gpus.values():
            if gpu.state != HealthState.HEALTHY or gpu.healthy_since is None:
                return None
            spans.append((now - gpu.healthy_since).total_seconds())
        return min(spans)


def node_key(node: str) -> str:
    return f"node.{node}"


NODES: Bucket[NodeRecord] = Bucket(
    BUCKET, NodeRecord, prefix="node.", key=node_key, description="per node: GPUs, quarantine"
)
BREAKER: Bucket[BreakerState] = Bucket.one(BUCKET, BreakerState, BREAKER_KEY, "the circuit breaker")


class XidRepeats(BaseModel):
    """When one XID was seen on one GPU within the repeat window, and when that was reported
    (key `xid.<node>.<gpu>.<xid>`): the report goes out once per window, whichever replica."""

    seen: list[float] = Field(default_factory=list, description="unix times, oldest first")
    event_ids: list[str] = Field(default_factory=list, description="the XID events counted")
    reported_at: float | None = None
    reported_by: str | None = Field(
        default=None, description="the event that made the report (its redelivery reports again)"
    )


def xid_key(node: str, gpu: int, xid: int) -> str:
    return f"xid.{node}.{gpu}.{xid}"


XIDS: Bucket[XidRepeats] = Bucket(
    BUCKET,
    XidRepeats,
    prefix="xid.",
    key=xid_key,
    description="repeated XIDs per GPU, key xid.<node>.<gpu>.<xid>",
)
