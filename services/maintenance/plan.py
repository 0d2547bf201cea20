"""What a maintenance does with each pod, what its owner is told, and which pods wait.

Pure functions of the node, its pods and the stored `MaintenanceState`: no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from nodeward.kube.base import Obj
from schemas.notify import Severity
from services.kernel.drain import keep_reason
from services.maintenance.state import (
    CUDA_CHECKPOINT_LABEL,
    MaintenanceState,
    MovePlan,
    PodPlan,
    PodStatus,
)

CHECKPOINT_LABEL = "nodeward.io/checkpoint"
MOVE_ANNOTATION = "nodeward.io/move"
"""`true` on a pod or its namespace: a maintenance with --move moves the pod (it must also
opt into checkpoints) instead of evicting it."""
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/gpu")


def gpus_of(pod: Obj) -> int:
    """GPUs (any NVIDIA or AMD device resource, MIG slices included) the pod's containers hold."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        resources = c.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in wanted.items():
            if name.startswith(GPU_RESOURCE_PREFIXES):
                with contextlib.suppress(TypeError, ValueError):
                    total += int(value)
    return total


def _label_true(obj: Obj, label: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get(label, "")).lower() == "true"


def opted_in(pod: Obj) -> bool:
    return _label_true(pod, CHECKPOINT_LABEL)


def cuda_checkpoint(node: Obj) -> bool:
    """The node advertises that its runtime checkpoints GPU processes (CRIU + cuda-checkpoint)."""
    return _label_true(node, CUDA_CHECKPOINT_LABEL)


def when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def wants_move(pod: Obj, moving_namespaces: frozenset[str]) -> bool:
    """The pod (annotation) or its namespace (in `moving_namespaces`) asked to be moved."""
    meta = pod.get("metadata") or {}
    said = str((meta.get("annotations") or {}).get(MOVE_ANNOTATION, "")).lower()
    return said == "true" or meta.get("namespace") in moving_namespaces


def move_plan(pod: Obj) -> MovePlan:
    """How the pod moves: a pod no controller owns is stopped and created again under its
    name; a StatefulSet's pod (a Kubeflow Notebook's too) moves through its owner
    (`services.maintenance.owners`); one another controller owns is not moved
    (checkpointed and evicted as without --move): that controller recreates it from its
    own template under a new name, so there is no session to take over."""
    owner = next(
        (o for o in (pod["metadata"].get("ownerReferences") or []) if o.get("controller")), None
    )
    if owner is None:
        return MovePlan()
    kind, name = str(owner.get("kind")), str(owner.get("name"))
    if kind == "StatefulSet" and str(owner.get("apiVersion", "")).startswith("apps/"):
        return MovePlan(owner=kind, owner_name=name)
    return MovePlan(
        stage="failed",
        owner=kind,
        owner_name=name,
        reason=f"owned by {kind} {name}, which recreates it from its own template under "
        "another name: only bare pods and StatefulSets' (Notebooks') pods move; "
        "checkpointed and evicted instead",
    )


def plan_pods(
    node: Obj,
    pods: list[Obj],
    skip_namespaces: list[str],
    *,
    move: bool = False,
    moving_namespaces: frozenset[str] = frozenset(),
) -> dict[str, PodPlan]:
    """A plan for every pod a drain would move: opted-in ones pending their checkpoint (or
    not checkpointable: GPUs on a node without CUDA checkpoint support), the others not.
    With `move`, an opted-in pod that also asked to move (`wants_move`) gets a move plan."""
    cuda = cuda_checkpoint(node)
    plans: dict[str, PodPlan] = {}
    for pod in pods:
        if keep_reason(pod, skip_namespaces):
            continue
        meta = pod["metadata"]
        gpus = gpus_of(pod)
        wants = opted_in(pod)
        status: PodStatus = "not_opted_in"
        reason = None
        if wants:
            status = "pending"
            if gpus and not cuda:
                status = "not_checkpointable"
                reason = (
                    f"it holds {gpus} GPU(s) and node {node['metadata']['name']} "
                    f"does not advertise CUDA checkpoint support ({CUDA_CHECKPOINT_LABEL}=true)"
                )
        plan = PodPlan(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid"),
            gpus=gpus,
            opted_in=wants,
            status=status,
            reason=reason,
            spec=dict(pod.get("spec") or {}) if wants else {},
            labels=dict(meta.get("labels") or {}) if wants else {},
            owners=list(meta.get("ownerReferences") or []) if wants else [],
        )
        if move and status == "pending" and wants_move(pod, moving_namespaces):
            plan = plan.model_copy(
                update={
                    "move": move_plan(pod),
                    "annotations": dict(meta.get("annotations") or {}),
                }
            )
        plans[plan.key] = plan
    return plans


def hold(state: MaintenanceState) -> Callable[[Obj], str | None]:
    """For the drain: no pod is evicted before its checkpoint is recorded, and a pod that
    opted in but was not checkpointed waits for the deadline."""

    def reason(pod: Obj) -> str | None:
        meta = pod.get("metadata") or {}
        plan = state.pods.get(f"{meta.get('namespace')}/{meta.get('name')}")
        if plan is None or not plan.opted_in:
            return None
        if plan.status == "pending":
            return "its checkpoint is not recorded yet"
        if plan.held:
            return f"held until the deadline: not checkpointed ({plan.reason})"
        return None

    return reason


def merge_drain(
    before: dict[str, Any] | None, result: dict[str, Any], outcome: str
) -> dict[str, Any]:
    """The drains of one maintenance as one record (held and blocked: the latest's)."""
    prior = before or {}
    return {
        "evicted": [*prior.get("evicted", []), *result.get("evicted", [])],
        "gone": [*prior.get("gone", []), *result.get("gone", [])],
        "kept": {**prior.get("kept", {}), **result.get("kept", {})},
        "held": dict(result.get("held", {})),
        "blocked": dict(result.get("blocked", {})),
        "terminating": list(result.get("terminating", [])),
        "outcome": outcome,
    }


@dataclass(frozen=True)
class Notice:
    """What a pod's owner is told (a `notify.v1` with audience `user:<ns>/<pod>`)."""

    kind: str
    severity: Severity
    title: str
    body: str
    why: str
    deadline: datetime
    steps: list[str] = field(default_factory=list)


def _why(state: MaintenanceState) -> str:
    return f"Node {state.node} needs maintenance: {state.reason or 'no reason given'}."


def announcement(state: MaintenanceState, plan: PodPlan) -> Notice:
    """When the maintenance starts and what happens to this pod."""
    deadline = state.start_at + timedelta(seconds=state.deadline_s)
    start = when(state.start_at)
    steps = [
        "Save your work before then; files on persistent volumes are kept.",
        "Its controller (if any) starts a fresh pod on another node after it is evicted.",
    ]
    if plan.status == "pending" and plan.move is not None and plan.move.stage == "planned":
        what = (
            f"At {start} nodeward checkpoints every container of {plan.key} (memory and "
            "files, through the kubelet), stores the checkpoint as an image, stops the pod "
            "and restores it under the same name on another node: your session goes on "
            "there after a short pause. You are told where it went."
        )
        steps = ["Nothing to do; files on persistent volumes move with the pod."]
    elif plan.status == "pending":
        what = (
            f"At {start} nodeward checkpoints every container of {plan.key} (memory and "
            "files, through the kubelet), records the archive, then evicts the pod. "
            "An operator can run it again on another node from that checkpoint "
            f"(`nodeward maintenance restore {plan.key}`)."
        )
    elif plan.status == "not_checkpointable":
        what = (
            f"{plan.key} opted into checkpoints, but cannot be checkpointed: {plan.reason}. "
            f"It stays until the deadline ({when(deadline)}) and is then evicted; "
            "its running state is lost."
        )
    else:
        what = (
            f"At {start} {plan.key} is evicted (it did not opt into checkpoints: label "
            f"{CHECKPOINT_LABEL}=true opts a pod in); its running state is lost."
        )
        steps.append(
            f"To be checkpointed before maintenance next time: kubectl label pod "
            f"{plan.name} -n {plan.namespace} {CHECKPOINT_LABEL}=true"
        )
    return Notice(
        kind="announce",
        severity=Severity.WARNING,
        title=f"Node {state.node} goes into maintenance at {start}: your pod {plan.key} moves",
        body=what,
        why=_why(state),
        deadline=deadline,
        steps=steps,
    )


def cancellation(state: MaintenanceState, plan: PodPlan, operator: str) -> Notice:
    """The maintenance this owner was warned of is off: the pod stays."""
    kept = (
        f" Its checkpoint taken meanwhile is kept: `nodeward maintenance restore {plan.key}`."
        if plan.status == "checkpointed"
        else ""
    )
    return Notice(
        kind="cancel",
        severity=Severity.INFO,
        title=f"Maintenance of node {state.node} cancelled: your pod {plan.key} stays",
        body=f"The maintenance of {state.node} you were told of ({when(state.start_at)}) was "
        f"cancelled by {operator}; {plan.key} is not evicted and keeps running.{kept}",
        why=_why(state),
        deadline=state.start_at,
        steps=["Nothing to do."],
    )


def checkpoint_failed(state: MaintenanceState, plan: PodPlan, deadline: datetime) -> Notice:
    """The pod's checkpoint failed: it is held until `deadline`, then evicted."""
    return Notice(
        kind="checkpoint-failed",
        severity=Severity.CRITICAL,
        title=f"Your pod {plan.key} could not be checkpointed before maintenance",
        body=(
            f"The checkpoint of {plan.key} on node {state.node} failed: {plan.reason}. "
            f"The pod stays until {when(deadline)} and is then evicted; its running "
            "state is lost unless you save it before then."
        ),
        why=_why(state),
        deadline=deadline,
        steps=[
            "Save your work now (write checkpoints or results to a persistent volume).",
            "Ask the platform team whether the node's runtime supports checkpoints "
            "(CRIU; for GPU pods, CUDA checkpoint).",
        ],
    )


def moved(state: MaintenanceState, plan: PodPlan, images: dict[str, str]) -> Notice:
    """The pod was restored on another node."""
    target = plan.move.target if plan.move else None
    return Notice(
        kind="moved",
        severity=Severity.INFO,
        title=f"Your pod {plan.key} moved from {state.node} to {target}",
        body=(
            f"Before the maintenance of {state.node}, {plan.key} was checkpointed, stopped "
            f"and restored on {target} from its checkpoint "
            f"({', '.join(sorted(images.values()))}). Its processes go on from the "
            "checkpoint; what changed in memory after it was taken is lost."
        ),
        why=_why(state),
        deadline=state.start_at,
        steps=[f"kubectl get pod {plan.name} -n {plan.namespace} -o wide"],
    )


def move_failed(
    state: MaintenanceState,
    plan: PodPlan,
    reason: str,
    *,
    stopped: bool,
    restarted_by: str | None = None,
    left_stopped: str | None = None,
) -> Notice:
    """The pod could not be moved: evicted with the drain, or (stopped already) waiting to
    be restored by hand from its images, or (a controller's) started afresh by its owner
    (`restarted_by`), or its Notebook stopped meanwhile and left so (`left_stopped`)."""
    if left_stopped:
        notebook = left_stopped
        body = (
            f"{plan.key} could not be moved off {state.node}: {reason}. Its Notebook "
            f"{notebook} was stopped meanwhile, and stays stopped."
        )
        steps = [f"Start Notebook {notebook} again when you need it."]
    elif stopped and restarted_by:
        body = (
            f"{plan.key} was stopped on {state.node} to move, but its restore failed: "
            f"{reason}. Its owner ({restarted_by}) starts it again from its template: the "
            "session's memory is lost; files on its volumes are kept."
        )
        steps = ["Check your work's last saved state when it is running again."]
    elif stopped:
        body = (
            f"{plan.key} was stopped on {state.node} to move, but its restore failed: "
            f"{reason}. Its checkpoint images are kept in the registry."
        )
        steps = [
            f"An operator can restore it: nodeward maintenance restore {plan.key} --to NODE",
        ]
    else:
        body = (
            f"{plan.key} could not be moved off {state.node}: {reason}. It is evicted with "
            "the drain; its checkpoint is kept."
        )
        steps = ["Save your work now (write results to a persistent volume)."]
    title = f"Your pod {plan.key} could not be moved before maintenance"
    deadline = state.deadline_at() or state.start_at
    return Notice("move-failed", Severity.CRITICAL, title, body, _why(state), deadline, steps)
