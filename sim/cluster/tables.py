"""Server-side printing: `meta.k8s.io/v1` Tables with the columns the real API server serves."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sim.cluster.resources import ResourceType

Column = tuple[str, str, str, str, int]  # name, type, format, description, priority


def _text(name: str, description: str, *, wide: bool = False) -> Column:
    """A string column; `wide` ones (priority 1) only `-o wide` shows."""
    return (name, "string", "", description, 1 if wide else 0)


_NAME: Column = ("Name", "string", "name", "Name must be unique within a namespace.", 0)
_AGE: Column = _text(
    "Age",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
)
NODE_COLUMNS: list[Column] = [
    _NAME,
    _text("Status", "The status of the node"),
    _text("Roles", "The roles of the node"),
    _AGE,
    _text("Version", "Kubelet Version reported by the node."),
    _text("Internal-IP", "List of addresses reachable to the node.", wide=True),
    _text("External-IP", "List of addresses reachable to the node.", wide=True),
    _text("OS-Image", "OS Image reported by the node from /etc/os-release.", wide=True),
    _text("Kernel-Version", "Kernel Version reported by the node from 'uname -r'.", wide=True),
    _text("Container-Runtime", "Container Runtime Version reported by the node.", wide=True),
]
POD_COLUMNS: list[Column] = [
    _NAME,
    _text("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _text("Status", "The aggregate status of the containers in this pod."),
    _text(
        "Restarts",
        "The number of times the containers in this pod have been restarted "
        "and when the last container in this pod has restarted.",
    ),
    _AGE,
    _text(
        "IP", "IP address allocated to the pod. Routable at least within the cluster.", wide=True
    ),
    _text("Node", "Name of the Node the pod is assigned to.", wide=True),
    _text("Nominated Node", "Nominated node name of the pod.", wide=True),
    _text("Readiness Gates", "Readiness gates of the pod.", wide=True),
]
EVENT_COLUMNS: list[Column] = [
    _text("Last Seen", "Time when last this event was seen."),
    _text("Type", "Type of this event (Normal, Warning)."),
    _text("Reason", "Why the action was taken."),
    _text("Object", "The object this Event is about."),
    _text("Subobject", "The field of the object this Event is about.", wide=True),
    _text("Source", "The component reporting this event.", wide=True),
    _text("Message", "A human-readable description of the status of this operation."),
    _text("First Seen", "The time at which the event was first recorded.", wide=True),
    _text("Count", "The number of times this event has occurred.", wide=True),
    ("Name", "string", "name", "Name must be unique within a namespace.", 1),
]
PDB_COLUMNS: list[Column] = [
    _NAME,
    _text("Min Available", "The minimum number of pods that must be available."),
    _text("Max Unavailable", "The maximum number of pods that may be unavailable."),
    (
        "Allowed Disruptions",
        "integer",
        "",
        "Number of pod disruptions that are currently allowed.",
        0,
    ),
    _AGE,
]
NAMESPACE_COLUMNS: list[Column] = [
    _NAME,
    _text("Status", "The status of the namespace"),
    _AGE,
]
DEFAULT_COLUMNS: list[Column] = [_NAME, _AGE]
# The API server's printer for webhook configurations (pkg/printers/internalversion).
WEBHOOK_CONFIGURATION_COLUMNS: list[Column] = [
    _NAME,
    (
        "Webhooks",
        "integer",
        "",
        "Webhooks indicates the number of webhooks registered in this configuration.",
        0,
    ),
    _AGE,
]
# The API server's printer for resource.k8s.io ResourceSlices (pkg/printers/internalversion).
RESOURCE_SLICE_COLUMNS: list[Column] = [
    _NAME,
    _text("Node", "NodeName identifies the node which provides the resources in this pool."),
    _text("Driver", "Driver identifies the DRA driver providing the capacity information."),
    _text("Pool", "Pool describes the pool that this ResourceSlice belongs to."),
    _AGE,
]


def human_duration(seconds: float) -> str:
    """kubectl's `HumanDuration`: 45s, 3m12s, 5h10m, 3d4h, 400d, 2y30d."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        days = (h // 24) % 365
        return f"{h // 24 // 365}y{days}d" if days else f"{h // 24 // 365}y"
    return f"{h // 24 // 365}y"


def _since(ts: str | None) -> str:
    if not ts:
        return "<unknown>"
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            then = datetime.strptime(ts, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
        return human_duration((datetime.now(UTC) - then).total_seconds())
    return "<unknown>"


def _age(obj: dict[str, Any]) -> str:
    return _since((obj.get("metadata") or {}).get("creationTimestamp"))


def _event_row(ev: dict[str, Any]) -> list[Any]:
    """Columns of a core v1 Event (the events.k8s.io view is converted before printing)."""
    ref = ev.get("involvedObject") or ev.get("regarding") or {}
    last = (
        ev.get("lastTimestamp")
        or ev.get("eventTime")
        or (ev.get("series") or {}).get("lastObservedTime")
    )
    first = ev.get("firstTimestamp") or ev.get("eventTime")
    source = (ev.get("source") or {}).get("component") or ev.get("reportingComponent") or ""
    return [
        _since(last),
        ev.get("type", ""),
        ev.get("reason", ""),
        f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}",
        ref.get("fieldPath", ""),
        source,
        ev.get("message", ev.get("note", "")),
        _since(first),
        str(ev.get("count") or 1),
        ev["metadata"]["name"],
    ]


def _pdb_row(pdb: dict[str, Any]) -> list[Any]:
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    return [
        pdb["metadata"]["name"],
        str(spec.get("minAvailable", "N/A")),
        str(spec.get("maxUnavailable", "N/A")),
        int(status.get("disruptionsAllowed", 0)),
        _age(pdb),
    ]


def node_status(node: dict[str, Any]) -> str:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    states = []
    if ready is None:
        states.append("Unknown")
    else:
        states.append("Ready" if ready.get("status") == "True" else "NotReady")
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    return ",".join(states)


def _node_row(node: dict[str, Any]) -> list[Any]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    roles = sorted(
        k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k
    )
    if labels.get("kubernetes.io/role"):
        roles.append(labels["kubernetes.io/role"])
    status = node.get("status") or {}
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a["address"] for a in addresses if a.get("type") == kind), "<none>")

    return [
        node["metadata"]["name"],
        node_status(node),
        ",".join(roles) or "<none>",
        _age(node),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage", "<unknown>"),
        info.get("kernelVersion", "<unknown>"),
        info.get("containerRuntimeVersion", "<unknown>"),
    ]


def pod_status(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            reason = state["terminated"].get("reason") or "Completed"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def _pod_row(pod: dict[str, Any]) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount", 0)) for cs in statuses)
    gates = spec.get("readinessGates") or []
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        pod_status(pod),
        str(restarts),
        _age(pod),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        f"{len(gates)}/{len(gates)}" if gates else "<none>",
    ]


def partial(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as a PartialObjectMetadata: its metadata alone."""
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    rt: ResourceType, objects: list[dict[str, Any]], resource_version: str, include: str
) -> dict[str, Any]:
    """A Table for `objects`; `include` is the `includeObject` policy: None, Metadata or Object."""
    row: Callable[[dict[str, Any]], list[Any]]
    if rt.kind == "Node" and rt.group == "":
        columns, row = NODE_COLUMNS, _node_row
    elif rt.kind == "Pod" and rt.group == "":
        columns, row = POD_COLUMNS, _pod_row
    elif rt.kind == "Event":
        columns, row = EVENT_COLUMNS, _event_row
    elif rt.kind == "PodDisruptionBudget":
        columns, row = PDB_COLUMNS, _pdb_row
    elif rt.kind == "ResourceSlice":
        columns, row = (
            RESOURCE_SLICE_COLUMNS,
            lambda o: [
                o["metadata"]["name"],
                (o.get("spec") or {}).get("nodeName") or "<none>",
                (o.get("spec") or {}).get("driver", ""),
                ((o.get("spec") or {}).get("pool") or {}).get("name", ""),
                _age(o),
            ],
        )
    elif rt.kind == "Namespace":
        columns, row = (
            NAMESPACE_COLUMNS,
            lambda o: [
                o["metadata"]["name"],
                (o.get("status") or {}).get("phase", "Active"),
                _age(o),
            ],
        )
    elif rt.group == "admissionregistration.k8s.io" and rt.kind.endswith("WebhookConfiguration"):
        columns, row = (
            WEBHOOK_CONFIGURATION_COLUMNS,
            lambda o: [o["metadata"]["name"], len(o.get("webhooks") or []), _age(o)],
        )
    else:
        columns, row = DEFAULT_COLUMNS, lambda o: [o["metadata"]["name"], _age(o)]
    rows = []
    for obj in objects:
        entry: dict[str, Any] = {"cells": row(obj)}
        if include == "Object":
            entry["object"] = obj
        elif include != "None":
            entry["object"] = partial(obj)
        rows.append(entry)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": n, "type": t, "format": f, "description": d, "priority": p}
            for n, t, f, d, p in columns
        ],
        "rows": rows,
    }
