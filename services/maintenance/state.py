"""What the checkpoint (maintenance) service keeps in KV: a node's maintenance, with its
pod plans and checkpoints, and the restore plan built from them.

Bucket `checkpoint`: `node.<node>` holds a node's latest maintenance (`MAINTENANCES`);
`history.<node>.<id>` a finished one, kept after the next replaced it (`HISTORY`);
`lease.workflow` the replica that runs the workflow (`LEASES`). Written
only by the service, with revision checks; read by `nodeward maintenance status|restore`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field

from schemas.base import Model
from schemas.common import NodeName, PodRef
from schemas.maintenance import CheckpointRecord, MaintenancePhase
from schemas.state import Bucket
from schemas.state.lease import LeaseRecord, lease_key
from schemas.state.workflow import FlowState
from schemas.tokens import token

BUCKET = "checkpoint"
CUDA_CHECKPOINT_LABEL = "nodeward.io/cuda-checkpoint"

TERMINAL = frozenset({MaintenancePhase.DONE, MaintenancePhase.FAILED, MaintenancePhase.CANCELLED})

PodStatus = Literal[
    "pending", "checkpointed", "failed", "not_checkpointable", "not_opted_in", "dry_run"
]


MoveStage = Literal[
    "planned", "imaged", "released", "stopped", "created", "restored", "running", "failed"
]
MoveVia = Literal["pod", "statefulset", "notebook"]


class MovePlan(Model):
    """Where a moved pod goes and how far its move got: `planned` (checkpointed) -> `imaged`
    (every container's image confirmed in the registry, its archive deleted) -> `released`
    (a pod a controller owns: its owner no longer keeps it, `services.maintenance.owners`)
    -> `stopped` (the pod deleted on the node, gone from the API) -> `created` (its
    replacement, same name, on `target`) -> `restored` (running; its owner not back yet) ->
    `running` (restored, and its owner keeps it again); `failed` keeps `reason`."""

    stage: MoveStage = "planned"
    owner: str = Field(default="pod", description="how it moves: its owner kind, or `pod`")
    owner_name: str | None = Field(default=None, description="its controller's name")
    via: MoveVia | None = Field(
        default=None,
        description="how its owner lets it go, once decided: `pod` (none), `statefulset` "
        "(the set deleted leaving its pods, created again after), `notebook` (the Kubeflow "
        "Notebook stopped, started again after)",
    )
    owner_record: dict[str, Any] | None = Field(
        default=None,
        description="via `statefulset`: the set as it was, saved before it was deleted, to "
        "create it again; via `notebook`: the Notebook's reference, the replacement's "
        "controller until the set takes it",
    )
    target: str | None = Field(default=None, description="the node chosen, once chosen")
    uid: str | None = Field(default=None, description="the replacement pod's uid")
    reason: str | None = None

    @property
    def through_owner(self) -> bool:
        return self.owner != "pod"


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
    annotations: dict[str, str] = Field(
        default_factory=dict, description="the pod's annotations (pods that move only)"
    )
    owners: list[dict[str, Any]] = Field(
        default_factory=list, description="the pod's owner references (opted-in pods)"
    )
    annotated: bool = False
    notified: bool = False
    move: MovePlan | None = Field(
        default=None, description="a maintenance with --move: this pod moves (opted in)"
    )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def shown(self) -> str:
        """Its status as `status` shows it: a move's outcome or stage where it moves."""
        if self.move is None or self.status != "checkpointed":
            return self.status
        stage = self.move.stage
        if stage == "running":
            return f"moved to {self.move.target}"
        return "not moved" if stage == "failed" else f"moving ({stage})"

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
    move: bool = Field(default=False, description="opted-in pods move instead of being evicted")
    scope: list[PodRef] | None = Field(
        default=None,
        description="only these pods are checkpointed, moved and evicted (e.g. a GPU reset's "
        "holders); None: every pod on the node",
    )
    pods: dict[str, PodPlan] = Field(default_factory=dict)
    drain: dict[str, Any] | None = None
    failures: list[str] = Field(default_factory=list)
    error: str | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    ended_by: str | None = Field(
        default=None, description="the operator who cancelled it, or finished it (uncordon)"
    )
    released_at: datetime | None = Field(
        default=None, description="when nodeward took its cordon off (finish or cancel)"
    )
    flow: FlowState = Field(
        default_factory=FlowState, description="the workflow engine's bookkeeping of `phase`"
    )

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

    def scope_keys(self) -> frozenset[str] | None:
        """The scope as `namespace/name` (the drain's `only`); None: the whole node."""
        if self.scope is None:
            return None
        return frozenset(f"{p.namespace}/{p.name}" for p in self.scope)


def state_key(node: str) -> str:
    """The KV key of a node's maintenance (the latest one)."""
    return f"node.{token(node)}"


def history_key(node: str, maintenance_id: str) -> str:
    """The KV key a finished maintenance is kept under, after the next one replaces it."""
    return f"history.{token(node)}.{token(maintenance_id)}"


MAINTENANCES: Bucket[MaintenanceState] = Bucket(
    BUCKET, MaintenanceState, prefix="node.", key=state_key, description="a node's last maintenance"
)
HISTORY: Bucket[MaintenanceState] = replace(
    MAINTENANCES, prefix="history.", key=history_key, description="a maintenance the next replaced"
)

LEASES: Bucket[LeaseRecord] = Bucket(
    BUCKET, LeaseRecord, prefix="lease.", key=lease_key, description="the workflow's lease"
)
