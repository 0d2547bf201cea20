"""Where a moved pod goes, and the pod that replaces it there. Pure: no I/O.

The target is filtered as kube-scheduler's default plugins would (`NodeUnschedulable`,
`TaintToleration`, `NodeAffinity` for the node selector and required node affinity,
`NodeResourcesFit` for CPU, memory and every extended resource such as
`nvidia.com/gpu` and `nvidia.com/mig-1g.10gb`), then two rules of the move: a pod holding
GPUs only goes to a node with CUDA checkpoint support (`nodeward.io/cuda-checkpoint=true`)
and GPUs of the same model (`nvidia.com/gpu.product`) as the node it leaves. Among the
nodes left, the one with the most of the pod's scarcest resource free wins (ties: by
name), as the scheduler's `LeastAllocated` score would spread them. The replacement keeps
its name, namespace, labels, annotations, owner references, volumes and claims; its images
are the checkpoint images and a required node affinity pins it to the chosen node, so the
scheduler and the kubelet still check it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from nodeward.kube.base import Obj
from services.maintenance.plan import gpus_of
from services.maintenance.state import CUDA_CHECKPOINT_LABEL, PodPlan

HOSTNAME_LABEL = "kubernetes.io/hostname"
PRODUCT_LABEL = "nvidia.com/gpu.product"
RESTORED_ANNOTATION = "nodeward.io/restored-from"
"""On a replacement: JSON {node, pod uid, maintenance, checkpoint time, images}."""
_SET_BY_THE_SERVER = ("nodeName", "priority", "ephemeralContainers")
_DROPPED_ANNOTATIONS = ("nodeward.io/checkpoint-archive", RESTORED_ANNOTATION)
_UNITS = {
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1024.0,
    "Mi": 1024.0**2,
    "Gi": 1024.0**3,
    "Ti": 1024.0**4,
}


def quantity(text: Any) -> float:
    """A Kubernetes quantity (`500m`, `16Gi`, `2`) as a number."""
    raw = str(text).strip()
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if raw.endswith(suffix):
            return float(raw[: -len(suffix)]) * _UNITS[suffix]
    return float(raw)


def requests_of(spec: Obj) -> dict[str, float]:
    """What the pod's containers request (a limit stands for a missing request, as the API
    server defaults it)."""
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        resources = c.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in wanted.items():
            total[name] = total.get(name, 0.0) + quantity(value)
    return total


def _tolerated(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_holds(expr: Obj, labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _affinity_holds(spec: Obj, labels: dict[str, str]) -> bool:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions") or [])
        for term in terms
    )


def unfit(
    plan: PodPlan, node: Obj, used: dict[str, float], *, source: Obj | None = None
) -> str | None:
    """Why `node` cannot take the moved pod, or None. `used`: what the pods bound to it
    request."""
    spec = plan.spec
    meta = node.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    name = meta.get("name", "")
    if (node.get("spec") or {}).get("unschedulable"):
        return f"{name} is cordoned"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            spec.get("tolerations") or [], taint
        ):
            return f"{name} has taint {taint.get('key')}={taint.get('value', '')}:{taint['effect']}"
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"{name} does not match node selector {key}={value}"
    if not _affinity_holds(spec, labels):
        return f"{name} does not match the pod's required node affinity"
    if gpus_of({"spec": spec}):
        if str(labels.get(CUDA_CHECKPOINT_LABEL, "")).lower() != "true":
            return f"{name} does not advertise CUDA checkpoint support ({CUDA_CHECKPOINT_LABEL})"
        product = ((source or {}).get("metadata") or {}).get("labels", {}).get(PRODUCT_LABEL)
        if product and labels.get(PRODUCT_LABEL) != product:
            return f"{name} has no {product} GPUs"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for resource, want in requests_of(spec).items():
        if resource not in allocatable:
            if want > 0 and "/" in resource:
                return f"{name} has no {resource}"
            continue
        free = quantity(allocatable[resource]) - used.get(resource, 0.0)
        if want > free + 1e-9:
            return f"{name} has {free:g} {resource} free, the pod requests {want:g}"
    return None


def _requests_by_node(pods: Iterable[Obj]) -> dict[str, dict[str, float]]:
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        bound = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not bound or phase in ("Succeeded", "Failed"):
            continue
        into = used.setdefault(bound, {})
        for resource, value in requests_of(spec).items():
            into[resource] = into.get(resource, 0.0) + value
    return used


def requests_on(pods: Iterable[Obj], node: str) -> dict[str, float]:
    """What the live pods bound to `node` request."""
    return _requests_by_node(pods).get(node, {})


def choose_target(
    plan: PodPlan,
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    *,
    source: str,
) -> tuple[str | None, list[str]]:
    """The node the pod moves to (None if none fits) and why each other node did not."""
    nodes = list(nodes)
    used = _requests_by_node(pods)
    by_name = {n["metadata"]["name"]: n for n in nodes}
    wants = requests_of(plan.spec)
    fits: list[tuple[float, str]] = []
    why: list[str] = []
    for name, node in sorted(by_name.items()):
        if name == source:
            continue
        reason = unfit(plan, node, used.get(name, {}), source=by_name.get(source))
        if reason:
            why.append(reason)
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        share = min(
            (
                1.0 - (used.get(name, {}).get(r, 0.0) + w) / quantity(allocatable[r])
                for r, w in wants.items()
                if r in allocatable and quantity(allocatable[r]) > 0
            ),
            default=1.0,
        )
        fits.append((-share, name))
    return (min(fits)[1] if fits else None), why


def replacement(
    plan: PodPlan,
    images: dict[str, str],
    target: str,
    *,
    node: str,
    maintenance_id: str,
    checkpointed_at: str | None,
    controller: Obj | None = None,
) -> Obj:
    """The pod that replaces `plan`'s on `target`: the same pod, its containers' images the
    checkpoint images (`images`: container -> `REPO@DIGEST`), pinned to `target`. Its
    owner references are the pod's, but for its controller: `controller` (or none, for
    the controller to adopt it)."""
    spec = copy.deepcopy(plan.spec)
    # What the API server sets or refuses at create: the binding, the priority the Priority
    # admission computes from the class (a stale value is Forbidden), ephemeral containers
    # (only through their subresource).
    for key in _SET_BY_THE_SERVER:
        spec.pop(key, None)
    for c in spec.get("containers") or []:
        if c.get("name") in images:
            c["image"] = images[c["name"]]
    pin = {"key": HOSTNAME_LABEL, "operator": "In", "values": [target]}
    node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), pin]} for term in terms
    ]
    annotations = {k: v for k, v in plan.annotations.items() if k not in _DROPPED_ANNOTATIONS}
    annotations[RESTORED_ANNOTATION] = json.dumps(
        {
            "node": node,
            "uid": plan.uid,
            "maintenance": maintenance_id,
            "checkpointed_at": checkpointed_at,
            "images": images,
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    metadata: dict[str, Any] = {
        "name": plan.name,
        "namespace": plan.namespace,
        "labels": dict(plan.labels),
        "annotations": annotations,
    }
    owners = [copy.deepcopy(o) for o in plan.owners if not o.get("controller")]
    if controller is not None:
        owners.append(copy.deepcopy(controller))
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def restored_by(pod: Obj, maintenance_id: str) -> bool:
    """`pod` is the replacement this maintenance created."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESTORED_ANNOTATION)
    try:
        return isinstance(raw, str) and json.loads(raw).get("maintenance") == maintenance_id
    except (ValueError, AttributeError):
        return False
