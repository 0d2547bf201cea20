"""GPU health and telemetry, published by the node GPU agent from NVML."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field

from schemas.base import EventData, Model
from schemas.common import K8sName, NonNegFloat, PodRef
from schemas.examples import example, gpu_3
from schemas.tokens import subject


class HealthState(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"
    UNKNOWN = "unknown"


class RecommendedAction(StrEnum):
    """NVIDIA's immediate-action buckets, as `shared/data/xid-catalog.csv` maps them."""

    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    DRAIN_AND_RESET = "drain_and_reset"  # move the work off, then reset (XID 48 with 63/64)
    REBOOT_NODE = "reboot_node"
    DRAIN_AND_RMA = "drain_and_rma"
    CHECK_NVLINK = "check_nvlink"


class HealthReason(Model):
    """One finding behind a classification, e.g. `xid` 79 or `ecc_uncorrected`."""

    code: str = Field(min_length=1, description="machine-readable reason, e.g. xid, gpu_lost")
    message: str
    xid: int | None = Field(default=None, ge=0)
    evidence: dict[str, Any] = Field(default_factory=dict)
    action: RecommendedAction = RecommendedAction.NONE
    detectors: list[str] = Field(
        default_factory=list,
        description="for an XID: the detectors that saw it (`nvml`, `kmsg`), the first first; "
        "empty from agents that predate the kernel-log detector",
    )


class MigInstance(Model):
    gpu_instance_id: int = Field(ge=0)
    compute_instance_id: int = Field(ge=0)
    profile: str | None = None
    uuid: str | None = None


class _GpuAgentEvent(EventData):
    """What the GPU agent publishes about its node."""

    EXAMPLE_SOURCE: ClassVar[str] = "agent/gpu/gpu-node-07"

    node: K8sName


class _GpuEvent(_GpuAgentEvent):
    """What the GPU agent says of one GPU on stream GPU: which GPU, and when it saw it."""

    STREAM: ClassVar[str] = "GPU"
    OBSERVED: ClassVar[tuple[str, ...]] = ("observed_at",)

    gpu_index: int = Field(ge=0)
    gpu_uuid: str = Field(min_length=1)


class GpuHealth(_GpuEvent):
    """The health state of one GPU (or MIG instance) on a node: a change, or a heartbeat."""

    TYPE: ClassVar[str] = "gpu.health.v1"
    SUBJECT_PATTERN: ClassVar[str] = "gpu.health.<node>.<gpu>"

    mig: MigInstance | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    state: HealthState
    previous_state: HealthState | None = None
    reasons: list[HealthReason] = Field(default_factory=list)
    recommended_action: RecommendedAction = RecommendedAction.NONE
    pods: list[PodRef] = Field(default_factory=list, description="pods holding this GPU")
    holders: list[PodRef] | None = Field(
        default=None,
        description="every pod holding any part of the physical GPU: the GPU whole, one of "
        "its MIG instances, or a share of it (time-slicing: several pods on one device ID), "
        "from the kubelet's pod-resources; None: not known (pod-resources did not answer, or "
        "named claims it does not tie to a device, or an agent older than this field)",
    )
    heartbeat: bool = Field(default=False, description="periodic restatement, not a change")
    observed_at: datetime
    agent_boot_id: str | None = Field(default=None, description="changes when the agent restarts")
    sequence: int = Field(default=0, ge=0, description="per-GPU counter within one agent boot")

    model_config = example(
        {
            **gpu_3(),
            "model": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:4E:00.0",
            "state": "failed",
            "previous_state": "healthy",
            "reasons": [
                {
                    "code": "xid",
                    "xid": 79,
                    "message": "GPU has fallen off the bus",
                    "evidence": {"pid": 0, "event_data": 0},
                    "action": "reboot_node",
                }
            ],
            "recommended_action": "reboot_node",
            "pods": [{"namespace": "user-alice", "name": "jupyter-alice-0"}],
            "holders": [{"namespace": "user-alice", "name": "jupyter-alice-0"}],
            "observed_at": "2026-08-20T14:02:11.318Z",
            "agent_boot_id": "b6a1",
            "sequence": 42,
        }
    )

    def gpu_key(self) -> str:
        if self.mig is None:
            return str(self.gpu_index)
        return f"{self.gpu_index}-mig{self.mig.gpu_instance_id}-{self.mig.compute_instance_id}"

    def nats_subject(self) -> str:
        return subject("gpu.health", self.node, self.gpu_key())

    def about(self) -> str:
        return f"node/{self.node}/gpu/{self.gpu_key()}"

    def concern(self) -> str:
        return {"failed": "critical", "degraded": "warning"}.get(self.state.value, "info")


class GpuState(Model):
    """One GPU (or MIG instance) as a heartbeat restates it: its state since its last change."""

    gpu_index: int = Field(ge=0)
    gpu_uuid: str = Field(min_length=1)
    mig: MigInstance | None = None
    state: HealthState
    reasons: list[HealthReason] = Field(default_factory=list)
    recommended_action: RecommendedAction = RecommendedAction.NONE
    sequence: int = Field(default=0, ge=0, description="the `sequence` of its last change")
    changed_at: datetime = Field(description="`observed_at` of its last change")

    def gpu_key(self) -> str:
        if self.mig is None:
            return str(self.gpu_index)
        return f"{self.gpu_index}-mig{self.mig.gpu_instance_id}-{self.mig.compute_instance_id}"


class GpuHeartbeat(_GpuAgentEvent):
    """Every GPU of a node restated, once per heartbeat interval: routine, never a change.

    Changes travel as `gpu.health.v1` on their own subjects and stream, so a fault never
    waits behind heartbeats; a heartbeat only confirms what the last changes said (or shows
    that one was missed).
    """

    TYPE: ClassVar[str] = "gpu.heartbeat.v1"
    STREAM: ClassVar[str] = "HEARTBEATS"
    OBSERVED: ClassVar[tuple[str, ...]] = ("observed_at",)
    SUBJECT_PATTERN: ClassVar[str] = "gpu.heartbeat.<node>"

    gpus: list[GpuState]
    interval_s: float = Field(gt=0, description="the next heartbeat is due this much later")
    observed_at: datetime
    agent_boot_id: str | None = Field(default=None, description="changes when the agent restarts")

    model_config = example(
        {
            "node": "gpu-node-07",
            "gpus": [
                {
                    "gpu_index": 0,
                    "gpu_uuid": "GPU-1a2b3c4d-0000-4a7b-9c6d-0e1f2a3b4c5d",
                    "state": "healthy",
                    "sequence": 1,
                    "changed_at": "2026-08-20T14:00:02Z",
                }
            ],
            "interval_s": 30,
            "observed_at": "2026-08-20T14:02:32Z",
            "agent_boot_id": "b6a1",
        }
    )

    def health(self, gpu: GpuState) -> GpuHealth:
        """`gpu` as the `gpu.health.v1` heartbeat that restates it (`heartbeat: true`)."""
        return GpuHealth(
            **gpu.model_dump(exclude={"changed_at"}),
            node=self.node,
            heartbeat=True,
            observed_at=self.observed_at,
            agent_boot_id=self.agent_boot_id,
        )

    def nats_subject(self) -> str:
        return subject("gpu.heartbeat", self.node)

    def about(self) -> str:
        return f"node/{self.node}"


class GpuProcess(Model):
    """A compute process on the GPU when an XID was reported (NVML names the pid only)."""

    pid: int = Field(ge=0)
    used_memory_bytes: int | None = Field(default=None, ge=0)
    gpu_instance_id: int | None = Field(default=None, ge=0)


class GpuXid(_GpuEvent):
    """One XID the driver reported on a GPU, whatever its class: the record of it happening.

    Health changes (`gpu.health.v1`) say what an XID means for the GPU; this says that it
    happened, with the catalog's classification and what ran on the GPU, so repeated
    application XIDs (which never fail a GPU) are seen and acted on.
    """

    TYPE: ClassVar[str] = "gpu.xid.v1"
    SUBJECT_PATTERN: ClassVar[str] = "gpu.xid.<node>.<gpu>"

    xid: int = Field(ge=0)
    name: str = Field(description="the catalog's name of the XID")
    category: str = Field(description="the catalog's class: application, hardware, driver, ...")
    catalog_action: RecommendedAction = Field(description="NVIDIA's immediate action for it")
    application: bool = Field(description="an application's fault, not the GPU's")
    gpu_instance_id: int | None = Field(default=None, ge=0, description="the MIG instance")
    pods: list[PodRef] = Field(
        default_factory=list, description="the pods holding the GPU (pod-resources)"
    )
    processes: list[GpuProcess] = Field(
        default_factory=list, description="compute processes on the GPU, where NVML lists them"
    )
    detectors: list[str] = Field(
        default_factory=list,
        description="the detectors that saw this XID (`nvml`: NVML's event, `kmsg`: the "
        "driver's kernel-log line), the first first; one event per incident whichever saw it "
        "first. Empty from agents that predate the kernel-log detector (read as `nvml`)",
    )
    driver_message: str | None = Field(
        default=None, description="the driver's kernel-log line, where the kernel log saw it"
    )
    observed_at: datetime
    agent_boot_id: str | None = None

    model_config = example(
        {
            **gpu_3(),
            "xid": 13,
            "name": "ROBUST_CHANNEL_GR_EXCEPTION (Graphics Engine Exception)",
            "category": "application",
            "catalog_action": "restart_app",
            "application": True,
            "pods": [{"namespace": "user-alice", "name": "jupyter-alice-0"}],
            "processes": [{"pid": 41233, "used_memory_bytes": 8589934592}],
            "detectors": ["nvml", "kmsg"],
            "driver_message": "NVRM: Xid (PCI:0000:3b:00): 13, pid=41233, "
            "name=python3, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): "
            "Out Of Range Address",
            "observed_at": "2026-08-20T14:02:11Z",
        }
    )

    def nats_subject(self) -> str:
        return subject("gpu.xid", self.node, str(self.gpu_index))

    def about(self) -> str:
        return f"node/{self.node}/gpu/{self.gpu_index}"


class GpuSample(Model):
    gpu_index: int = Field(ge=0)
    gpu_uuid: str
    utilization_gpu_pct: float = Field(ge=0, le=100)
    utilization_memory_pct: float = Field(ge=0, le=100)
    memory_used_bytes: int = Field(ge=0)
    memory_total_bytes: int = Field(ge=0)
    temperature_c: float | None = None
    power_w: NonNegFloat | None = None
    energy_mj: int | None = Field(default=None, ge=0, description="NVML total energy counter")
    sm_clock_mhz: int | None = Field(default=None, ge=0)
    memory_clock_mhz: int | None = Field(default=None, ge=0)


class GpuTelemetry(_GpuAgentEvent):
    """Sampled utilisation, memory, temperature, power and clocks of every GPU on a node."""

    TYPE: ClassVar[str] = "gpu.telemetry.v1"
    STREAM: ClassVar[str] = "TELEMETRY"
    SUBJECT_PATTERN: ClassVar[str] = "gpu.telemetry.<node>"

    interval_s: float = Field(gt=0)
    samples: list[GpuSample]

    model_config = example(
        {
            "node": "gpu-node-07",
            "interval_s": 15,
            "samples": [
                {
                    "gpu_index": 0,
                    "gpu_uuid": "GPU-1a2b3c4d-0000-4a7b-9c6d-0e1f2a3b4c5d",
                    "utilization_gpu_pct": 87.0,
                    "utilization_memory_pct": 41.0,
                    "memory_used_bytes": 61203283968,
                    "memory_total_bytes": 85520809984,
                    "temperature_c": 64,
                    "power_w": 612.4,
                    "energy_mj": 918273645,
                    "sm_clock_mhz": 1980,
                    "memory_clock_mhz": 2619,
                }
            ],
        }
    )

    def nats_subject(self) -> str:
        return subject("gpu.telemetry", self.node)

    def about(self) -> str:
        return f"node/{self.node}"
