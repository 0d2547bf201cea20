"""The marks a quarantine puts on a node (owner `quarantine` of the kernel's NodeMarks).

Taint `nodeward.io/gpu-unhealthy`, cordon, label `nodeward.io/gpu-health`, condition
`GPUHealthy`, an Event, and `nodeward.io/quarantine`: a readable summary of the incident.
What is put on, recorded and taken off again (only nodeward's own) is NodeMarks' work.
"""

from __future__ import annotations

import json
from typing import Any

from nodeward.kube.base import Obj
from nodeward.kube.nodes import taints_of
from schemas.state.cordon import TAINT_KEY, Quarantine
from schemas.state.marks import ConditionSpec, EventSpec, MarkEntry, MarkSpec

HEALTH_LABEL = "nodeward.io/gpu-health"
QUARANTINE_ANNOTATION = "nodeward.io/quarantine"
CONDITION = "GPUHealthy"
ACTOR = "service/cordon"
OWNER = "quarantine"


def applied_details(q: Quarantine) -> dict[str, Any]:
    """What an applied quarantine did, as the audit record's details."""
    return {
        "taints": [f"{TAINT_KEY}:{e}" for e in q.taints],
        "cordoned": q.cordoned,
        "prior_unschedulable": q.prior_unschedulable,
        "gpus": q.gpus,
    } | ({"flapping": q.flapping} if q.flapping else {})


def unschedulable(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def has_taint(node: Obj, effect: str) -> bool:
    return any(t.get("key") == TAINT_KEY and t.get("effect") == effect for t in taints_of(node))


def with_entry(q: Quarantine, entry: MarkEntry) -> Quarantine:
    """The quarantine as NodeMarks planned it: our taint effects, our cordon, the prior."""
    prefix = f"{TAINT_KEY}:"
    return q.model_copy(
        update={
            "taints": [t.removeprefix(prefix) for t in entry.taints if t.startswith(prefix)],
            "cordoned": entry.cordon and not entry.prior_unschedulable,
            "prior_unschedulable": entry.prior_unschedulable,
        }
    )


def annotation(q: Quarantine) -> str:
    return json.dumps(
        {
            "by": ACTOR,
            "reason": q.reason,
            "rule": q.rule,
            "gpus": q.gpus,
            "event_id": q.incident,
            "time": q.started_at.isoformat().replace("+00:00", "Z"),
            "prior_unschedulable": q.prior_unschedulable,
            "cordoned": q.cordoned,
            "taints": q.taints,
        },
        separators=(",", ":"),
    )


def quarantine_annotation(node: Obj) -> dict[str, Any] | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(QUARANTINE_ANNOTATION)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def spec_for(q: Quarantine, *, cordon: bool, no_execute: bool) -> MarkSpec:
    """What a quarantine puts on the node, and leaves when released."""
    effects = ["NoSchedule", "NoExecute"] if no_execute else ["NoSchedule"]
    return MarkSpec(
        taints=[f"{TAINT_KEY}:{e}" for e in effects],
        cordon=cordon,
        labels={HEALTH_LABEL: "failed"},
        release_labels={HEALTH_LABEL: "healthy"},
        condition=ConditionSpec(
            type=CONDITION, status="False", reason="GPUFailed", message=q.reason[:1024]
        ),
        release_condition=ConditionSpec(
            type=CONDITION, status="True", reason="GPUHealthy", message="all GPUs healthy"
        ),
        event=EventSpec(
            reason="GPUQuarantined", action="Quarantine", note=q.reason, type="Warning"
        ),
        release_event=EventSpec(
            reason="GPUQuarantineReleased",
            action="Release",
            note=f"GPUs healthy again; released quarantine {q.incident}",
        ),
    )
