"""Counting GPUs: from a node, its pods and what the bus said, each GPU's state. No I/O.

Per node and profile (`gpu`, or a MIG profile): the allocatable, less what bound pods that
have not finished request (`used`); of the rest, GPUs (or MIG slices) reported failed are
`unhealthy`, and the remainder is `free` unless the node is held back, in which case it
counts as `maintenance`, `quarantined`, `cordoned` or (node not Ready) `unhealthy`. A DRA
node's GPUs are the devices its ResourceSlices publish; one GPU tainted on its own (a
DeviceTaintRule) is `unhealthy` by the bus while the node's other GPUs stay `free`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.capacity import AMD_PRODUCT_LABEL, GpuCounts, profile_for
from schemas.maintenance import MaintenancePhase
from schemas.state.capacity import NodeCapacity
from schemas.state.cordon import TAINT_KEY

Obj = Mapping[str, Any]

PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
# The maintenance service's cordon (services.maintenance: `nodeward.io/maintenance-cordon`
# is on the node while the maintenance holds it, `done` included, until finish or cancel).
MAINTENANCE_CORDON = "nodeward.io/maintenance-cordon"
# Taints GPU pods tolerate (the GPU operator's): they hold nothing back.
TOLERATED_TAINTS = frozenset({"nvidia.com/gpu", "amd.com/gpu"})
ACTIVE_PHASES = frozenset(
    {MaintenancePhase.CHECKPOINTING, MaintenancePhase.CHECKPOINTED, MaintenancePhase.DRAINING}
)
"""Maintenance phases on the bus that hold a node back (besides its cordon annotation)."""
FINISHED_PODS = frozenset({"Succeeded", "Failed"})
BLOCKED_STATE = {
    "maintenance": "maintenance",
    "quarantined": "quarantined",
    "cordoned": "cordoned",
    "not-ready": "unhealthy",
}


@dataclass(frozen=True)
class NodeView:
    """What the node watch says of one GPU node."""

    name: str
    model: str
    allocatable: dict[str, int]
    gpus: int
    blocked: str | None = None
    dra: bool = False


@dataclass
class BusView:
    """What the bus said of one node: failed GPUs (key -> MIG profile) and its maintenance."""

    failed: dict[str, str | None] = field(default_factory=dict)
    maintenance: str | None = None


def quantity(value: Any) -> int:
    """An extended resource's count (`"4"`); anything else counts as 0."""
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


def node_view(node: Obj, dra_gpus: int = 0) -> NodeView | None:
    """The GPU side of a Node object, or None for a node that allocates no GPU. `dra_gpus`:
    the GPUs its ResourceSlices publish (DRA: no extended resource), counted as `gpu`."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    allocatable: dict[str, int] = {}
    for resource, value in (status.get("allocatable") or {}).items():
        profile = profile_for(str(resource))
        if profile is not None and quantity(value) > 0:
            allocatable[profile] = quantity(value)
    dra = not allocatable and dra_gpus > 0
    if dra:
        allocatable = {"gpu": dra_gpus}
    if not allocatable:
        return None
    labels = meta.get("labels") or {}
    gpus = quantity(labels.get(COUNT_LABEL)) or allocatable.get("gpu", 0)
    return NodeView(
        name=str(meta.get("name", "")),
        model=str(labels.get(PRODUCT_LABEL) or labels.get(AMD_PRODUCT_LABEL) or "unknown"),
        allocatable=allocatable,
        gpus=gpus,
        blocked=held_back(node),
        dra=dra,
    )


def held_back(node: Obj) -> str | None:
    """Why no new pod lands on the node, most specific first, or None."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    taints = [
        t
        for t in spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in TOLERATED_TAINTS
    ]
    if MAINTENANCE_CORDON in (meta.get("annotations") or {}):
        return "maintenance"
    if any(t.get("key") == TAINT_KEY for t in taints):
        return "quarantined"
    if spec.get("unschedulable") or taints:
        return "cordoned"
    ready = [
        c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"
    ]
    if ready and ready[0].get("status") != "True":
        return "not-ready"
    return None


def slice_gpus(item: Obj, drivers: Iterable[str]) -> tuple[str | None, int]:
    """The node a ResourceSlice publishes devices of and how many GPUs (devices of one of
    `drivers` whose `type` attribute, where set, is `gpu`); (None, 0) for any other slice."""
    spec = item.get("spec") or {}
    node = spec.get("nodeName")
    if not node or spec.get("driver") not in set(drivers):
        return None, 0
    gpus = 0
    for device in spec.get("devices") or []:
        kind = ((device.get("attributes") or {}).get("type") or {}).get("string", "gpu")
        gpus += kind == "gpu"
    return str(node), gpus


def pod_gpus(pod: Obj) -> tuple[str | None, dict[str, int]]:
    """The node a pod is bound to and the GPUs it holds there, by profile; no node or no
    GPUs when it is unbound or finished. Like the scheduler: the containers' sum, or the
    largest init container's if more."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in FINISHED_PODS:
        return None, {}
    total = _sum(_requests(c) for c in spec.get("containers") or [])
    for c in spec.get("initContainers") or []:
        for profile, n in _requests(c).items():
            total[profile] = max(total.get(profile, 0), n)
    return str(node), {p: n for p, n in total.items() if n > 0}


def _requests(container: Obj) -> dict[str, int]:
    resources = container.get("resources") or {}
    # Extended resources: requests equal limits, and default to them.
    asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    out: dict[str, int] = {}
    for resource, value in asked.items():
        profile = profile_for(str(resource))
        if profile is not None:
            out[profile] = quantity(value)
    return out


def _sum(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for profile, n in part.items():
            out[profile] = out.get(profile, 0) + n
    return out


def failed_slices(view: NodeView, failed: Mapping[str, str | None], profile: str) -> int:
    """How many of `profile` the failed GPUs take: a failed MIG instance its one slice; a
    failed whole GPU one GPU, or on a MIG node its share of each profile's slices."""
    whole = sum(1 for p in failed.values() if p is None)
    if profile == "gpu":
        return whole
    instances = sum(1 for p in failed.values() if p == profile)
    per_gpu = math.ceil(view.allocatable.get(profile, 0) / view.gpus) if view.gpus else 0
    return instances + whole * per_gpu


def count(view: NodeView, used: Mapping[str, int], bus: BusView | None = None) -> NodeCapacity:
    """One node's GPUs by profile and state."""
    bus = bus or BusView()
    blocked = view.blocked
    if bus.maintenance in ACTIVE_PHASES:
        blocked = "maintenance"
    profiles = {}
    for profile, allocatable in sorted(view.allocatable.items()):
        taken = min(used.get(profile, 0), allocatable)
        rest = allocatable - taken
        unhealthy = min(failed_slices(view, bus.failed, profile), rest)
        rest -= unhealthy
        states = {"used": taken, "unhealthy": unhealthy}
        held = BLOCKED_STATE[blocked] if blocked else "free"
        states[held] = states.get(held, 0) + rest
        profiles[profile] = GpuCounts(**states)
    return NodeCapacity(
        node=view.name,
        model=view.model,
        profiles=profiles,
        blocked=blocked,
        failed_gpus=dict(sorted(bus.failed.items())),
        dra=view.dra,
        maintenance_phase=bus.maintenance,
    )
