"""Maintenance of a node: checkpoint stateful pods, then drain. The checkpoint service's KV
records are in `services.maintenance.state`."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import EventData, Model
from schemas.common import K8sName, PodRef
from schemas.examples import example
from schemas.tokens import subject


class MaintenancePhase(StrEnum):
    REQUESTED = "requested"
    NOTIFIED = "notified"
    CHECKPOINTING = "checkpointing"
    CHECKPOINTED = "checkpointed"
    MOVING = "moving"  # `--move`: opted-in pods restored on another node from their images
    DRAINING = "draining"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # by an operator before the drain (`nodeward maintenance cancel`)


class CheckpointRecord(Model):
    pod: PodRef
    path: str | None = Field(default=None, description="checkpoint archive on the node")
    error: str | None = None
    node: str | None = Field(default=None, description="the node holding the archive")
    image: str | None = Field(default=None, description="the container's image when checkpointed")
    at: datetime | None = Field(default=None, description="when the checkpoint was taken")
    checkpoint_image: str | None = Field(
        default=None,
        description="the OCI checkpoint image built from the archive, `REPO@DIGEST`, once the "
        "registry confirmed it (a move)",
    )
    archive_deleted: bool = Field(
        default=False, description="the archive was deleted from the node after the push"
    )


class MovedPod(Model):
    """A pod a maintenance moved: stopped on the node, restored on another from its images."""

    pod: PodRef
    from_node: str
    to_node: str | None = Field(default=None, description="None: the move failed")
    images: dict[str, str] = Field(
        default_factory=dict, description="container -> checkpoint image `REPO@DIGEST`"
    )
    error: str | None = None


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
    move: bool = Field(
        default=False,
        description="move the opted-in pods (label nodeward.io/checkpoint=true and annotation "
        "nodeward.io/move=true on the pod or its namespace) to other nodes instead of "
        "evicting them",
    )
    pods: list[PodRef] | None = Field(
        default=None,
        description="the maintenance's scope: only these pods are checkpointed (moved, with "
        "`move`) and evicted, e.g. the pods holding a GPU that is to be reset; the node is "
        "cordoned all the same. None: every pod on the node",
    )
    drained: list[str] | None = Field(
        default=None,
        description="phase `done`: the pods (`namespace/name`) the drain evicted (gone, or "
        "still terminating at the deadline) or found gone; None in the other phases",
    )
    moved: list[MovedPod] = Field(
        default_factory=list, description="pods moved, or whose move failed (phase `moving`)"
    )
    failures: list[str] = Field(
        default_factory=list,
        description="pods not checkpointed (failed or not checkpointable) or not evicted, and why",
    )

    model_config = example(
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
    )

    def nats_subject(self) -> str:
        return subject(f"maintenance.{self.phase.value}", self.node)

    def about(self) -> str:
        return f"node/{self.node}"
