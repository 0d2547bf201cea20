"""Maintenance of a node: checkpoint stateful pods, then drain."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from schemas.base import EventData, Model
from schemas.common import K8sName, NodeName, PodRef
from schemas.tokens import subject, token


class MaintenancePhase(StrEnum):
    REQUESTED = "requested"
    NOTIFIED = "notified"
    CHECKPOINTING = "checkpointing"
    CHECKPOINTED = "checkpointed"
    DRAINING = "draining"
    DONE = "done"
    FAILED = "failed"


class CheckpointRecord(Model):
    pod: PodRef
    path: str | None = Field(default=None, description="checkpoint archive on the node")
    error: str | None = None
    node: str | None = Field(default=None, description="the node holding the archive")
    image: str | None = Field(default=None, description="the container's image when checkpointed")
    at: datetime | None = Field(default=None, description="when the checkpoint was taken")


class Maintenance(EventData):
    """One phase of a node's maintenance."""

    TYPE: ClassVar[str] = "maintenance.v1"
    STREAM: ClassVar[str] = "MAINTENANCE"
    SUBJECT_PATTERN: ClassVar[str] = "maintenance.<phase>.<node>"
    EXAMPLE_SOURCE: ClassVar[str] = "service/checkpoint"

    node: K8sName
    phase: MaintenancePhase
    maintenance_id: str = Field(
        min_length=1, description="ties the phases of one maintenance together"
    )
    reason: str = ""
    requested_by: str | None = None
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    error: str | None = None
    start_at: datetime | None = Field(
        default=None, description="when the work (cordon, checkpoints, drain) starts; None: now"
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds after the start by which every pod must be gone (held pods are "
        "evicted then); None: the service's default",
    )
    failures: list[str] = Field(
        default_factory=list,
        description="pods not checkpointed (failed or not checkpointable) or not evicted, and why",
    )

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "node": "gpu-node-07",
                    "phase": "checkpointed",
                    "maintenance_id": "mnt-20260820-gpu-node-07",
                    "reason": "firmware update",
                    "requested_by": "operator/jdoe",
                    "checkpoints": [
                        {
                            "pod": {
                                "namespace": "user-alice",
                                "name": "jupyter-alice-0",
                                "container": "notebook",
                            },
                            "path": "/var/lib/kubelet/checkpoints/checkpoint-jupyter-alice-0_user-alice-notebook-2026-08-20T14:05:00Z.tar",
                        }
                    ],
                }
            ]
        }
    )

    def nats_subject(self) -> str:
        return subject(f"maintenance.{self.phase.value}", self.node)

    def about(self) -> str:
        return f"node/{self.node}"


TERMINAL = frozenset({MaintenancePhase.DONE, MaintenancePhase.FAILED})

PodStatus = Literal[
    "pending", "checkpointed", "failed", "not_checkpointable", "not_opted_in", "dry_run"
]


class PodPlan(Model):
    """What a maintenance does with one pod on the node, and what came of it."""

    namespace: str
    name: str
    uid: str | None = None
    gpus: int = 0
    opted_in: bool = False
    status: PodStatus = "not_opted_in"
    reason: str | None = Field(default=None, description="why not checkpointed")
    checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    spec: dict[str, Any] = Field(
        default_factory=dict, description="the pod's spec when planned (opted-in pods only)"
    )
    labels: dict[str, str] = Field(default_factory=dict)
    annotated: bool = False
    notified: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def held(self) -> bool:
        """Opted in but not checkpointed: kept on the node until the deadline."""
        return self.opted_in and self.status in ("failed", "not_checkpointable")


class MaintenanceState(Model):
    """A node's maintenance as the checkpoint service keeps it in KV (`node.<node>`).

    Read by `nodeward maintenance status|restore`; written only by the service, with
    revision checks.
    """

    maintenance_id: str
    node: NodeName
    phase: MaintenancePhase = MaintenancePhase.REQUESTED
    reason: str = ""
    requested_by: str | None = None
    requested_at: datetime
    trigger_id: str
    start_at: datetime
    deadline_s: float
    started_at: datetime | None = None
    dry_run: bool = False
    prior_unschedulable: bool | None = None
    cordoned: bool = False
    cuda_checkpoint: bool = False
    pods: dict[str, PodPlan] = Field(default_factory=dict)
    drain: dict[str, Any] | None = None
    failures: list[str] = Field(default_factory=list)
    error: str | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    def deadline_at(self) -> datetime | None:
        """When held pods are evicted: the work's start plus the deadline."""
        if self.started_at is None:
            return None
        return self.started_at + timedelta(seconds=self.deadline_s)

    def checkpoints(self) -> list[CheckpointRecord]:
        return [c for p in self.pods.values() for c in p.checkpoints]


def state_key(node: str) -> str:
    """The KV key of a node's maintenance (the latest one)."""
    return f"node.{token(node)}"


def history_key(node: str, maintenance_id: str) -> str:
    """The KV key a finished maintenance is kept under, after the next one replaces it."""
    return f"history.{token(node)}.{token(maintenance_id)}"
