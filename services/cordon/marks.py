"""The marks a quarantine puts on a node, and taking them off again: only nodeward's own.

Every step looks at the node first, so applying twice (a redelivered event, a restart
mid-action) changes nothing the second time.
"""

from __future__ import annotations

import json
from typing import Any, cast

from nodeward.kube import Cluster
from nodeward.kube.base import Obj
from nodeward.kube.nodes import TaintEffect, taints_of
from schemas.state.cordon import Quarantine

TAINT_KEY = "nodeward.io/gpu-unhealthy"
HEALTH_LABEL = "nodeward.io/gpu-health"
QUARANTINE_ANNOTATION = "nodeward.io/quarantine"
CONDITION = "GPUHealthy"
ACTOR = "service/cordon"


def applied_details(q: Quarantine) -> dict[str, Any]:
    """What an applied quarantine did, as the audit record's details."""
    return {
        "taints": [f"{TAINT_KEY}:{e}" for e in q.taints],
        "cordoned": q.cordoned,
        "prior_unschedulable": q.prior_unschedulable,
        "gpus": q.gpus,
    }


def unschedulable(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def has_taint(node: Obj, effect: str) -> bool:
    return any(t.get("key") == TAINT_KEY and t.get("effect") == effect for t in taints_of(node))


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


class QuarantineMarks:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def plan(self, node: Obj, q: Quarantine, *, cordon: bool, no_execute: bool) -> Quarantine:
        """Which marks this quarantine owns: decided once, from the node before any change."""
        effects: list[TaintEffect] = ["NoSchedule", "NoExecute"] if no_execute else ["NoSchedule"]
        return q.model_copy(
            update={
                "taints": [e for e in effects if not has_taint(node, e)],
                "cordoned": cordon and not q.prior_unschedulable,
            }
        )

    async def apply(self, name: str, q: Quarantine) -> dict[str, Any]:
        nodes = self.cluster.nodes
        effects = cast(list[TaintEffect], q.taints)
        # Taint, cordon, label and annotation in one write, so they appear together.
        node = await nodes.mark(
            name,
            add_taints=[(TAINT_KEY, e) for e in effects],
            unschedulable=True if q.cordoned else None,
            labels={HEALTH_LABEL: "failed"},
            annotations={QUARANTINE_ANNOTATION: annotation(q)},
        )
        await nodes.set_condition(name, CONDITION, "False", "GPUFailed", q.reason[:1024])
        if not q.event_recorded:
            await self.cluster.events.create(
                node,
                reason="GPUQuarantined",
                action="Quarantine",
                note=q.reason,
                type_="Warning",
            )
        return applied_details(q)

    async def update_annotation(self, name: str, q: Quarantine) -> None:
        await self.cluster.nodes.set_annotations(name, {QUARANTINE_ANNOTATION: annotation(q)})

    async def respect_operator(self, name: str, q: Quarantine) -> dict[str, Any]:
        """An operator took the node back: drop our taint and annotation, leave the cordon
        as the operator left it."""
        removed = await self.cluster.nodes.remove_taint(name, TAINT_KEY)
        await self.cluster.nodes.set_annotations(name, {QUARANTINE_ANNOTATION: None})
        return {"removed_taint": removed}

    async def undo(self, name: str, q: Quarantine) -> dict[str, Any]:
        """Take off what this quarantine put on; a node cordoned before us stays cordoned."""
        nodes = self.cluster.nodes
        removed = await nodes.remove_taint(name, TAINT_KEY)
        uncordoned = False
        if q.cordoned and not q.operator_released and not q.prior_unschedulable:
            uncordoned = await nodes.set_unschedulable(name, False)
        await nodes.set_condition(name, CONDITION, "True", "GPUHealthy", "all GPUs healthy")
        await nodes.set_labels(name, {HEALTH_LABEL: "healthy"})
        node = await nodes.set_annotations(name, {QUARANTINE_ANNOTATION: None})
        await self.cluster.events.create(
            node,
            reason="GPUQuarantineReleased",
            action="Release",
            note=f"GPUs healthy again; released quarantine {q.incident}",
        )
        return {
            "removed_taint": removed,
            "uncordoned": uncordoned,
            "kept_cordon": q.prior_unschedulable,
        }
