"""`isolate`: the one pod labelled into the namespace's deny-all NetworkPolicy.

Sibling replicas of the same workload are untouched (Falco Talon's policy selects them all).
The pod keeps running; the annotation `nodeward.io/isolation` says who isolated it, for which
alert, when nodeward acted (`at`) and when Falco saw it (`alert_time`). `lift` undoes it
(`nodeward falco release`), for a pod whose annotation says nodeward isolated it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import structlog

from nodeward.kube import AlreadyExists, Cluster, KubeError
from nodeward.kube.base import Obj
from nodeward.kube.client import MERGE_PATCH
from nodeward.kube.netpol import isolate_pod_policy
from schemas.falco import ISOLATE_LABEL
from services.falco.actions.base import ActionContext, Actionner
from services.falco.alerts import describe
from services.falco.rules import ActionKind
from services.falco.settings import ACTOR

ISOLATION_ANNOTATION = "nodeward.io/isolation"
ISOLATE_POLICY = "nodeward-isolate"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nodeward", "nodeward.io/purpose": "isolate"}


async def run(ctx: ActionContext) -> dict[str, Any]:
    """The namespace's deny-all policy (created once), then the one pod labelled into it."""
    namespace, name, pod = ctx.pod()
    policy = isolate_pod_policy(
        namespace, ISOLATE_POLICY, {ISOLATE_LABEL: "true"}, labels=dict(MANAGED_BY)
    )
    created = True
    try:
        await ctx.cluster.network_policies.create(policy)
    except AlreadyExists:
        created = False
    labels = pod["metadata"].get("labels") or {}
    already = labels.get(ISOLATE_LABEL) == "true"
    if not already:
        note = json.dumps(
            {
                "by": ACTOR,
                "falco_rule": ctx.alert.rule,
                "event_id": ctx.event.id,
                "at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "alert_time": ctx.alert.time.isoformat().replace("+00:00", "Z"),
                "policy": ISOLATE_POLICY,
            },
            separators=(",", ":"),
        )
        await ctx.cluster.pods.patch(
            namespace,
            name,
            {
                "metadata": {
                    "labels": {ISOLATE_LABEL: "true"},
                    "annotations": {ISOLATION_ANNOTATION: note},
                }
            },
            content_type=MERGE_PATCH,
        )
        await ctx.record_event(pod, "Isolated", f"isolated by nodeward: {describe(ctx.alert, 300)}")
    return {
        "network_policy": f"{namespace}/{ISOLATE_POLICY}",
        "policy_created": created,
        "selector": {ISOLATE_LABEL: "true"},
        "already_isolated": already,
        "pod_uid": pod["metadata"].get("uid"),
    }


ACTION = Actionner(
    ActionKind.ISOLATE,
    "cut the one pod off the network (in and out) with a deny-all NetworkPolicy",
    "pod",
    run,
    done_words="Your pod has been cut off from the network (in and out); its processes and "
    "files are untouched.",
)


def isolation_of(pod: Obj) -> dict[str, Any] | None:
    """nodeward's record of isolating `pod` (its annotation, written by `run`), or None
    when nodeward did not isolate it (no record, or a record someone else wrote)."""
    raw = (pod["metadata"].get("annotations") or {}).get(ISOLATION_ANNOTATION)
    try:
        note = json.loads(raw) if raw else None
    except ValueError:
        return None
    return note if isinstance(note, dict) and note.get("by") == ACTOR else None


def isolated(pod: Obj) -> bool:
    """The pod carries the label the deny-all policy selects (whoever put it there)."""
    return (pod["metadata"].get("labels") or {}).get(ISOLATE_LABEL) == "true"


async def lift(cluster: Cluster, pod: Obj, note: str) -> dict[str, Any]:
    """Take `pod` out of the deny-all policy: nodeward's label and annotation off (checked
    against the pod's resourceVersion), and an Event. The namespace's policy stays: it
    selects no pod without the label."""
    meta = pod["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    patch = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "labels": {ISOLATE_LABEL: None},
            "annotations": {ISOLATION_ANNOTATION: None},
        }
    }
    await cluster.pods.patch(namespace, name, patch, content_type=MERGE_PATCH)
    try:
        await cluster.events.create(
            pod, reason="IsolationLifted", action="IsolationLifted", note=note[:1000]
        )
    except KubeError as exc:
        structlog.get_logger().warning(
            "falco.event_failed", reason="IsolationLifted", error=str(exc)
        )
    return {"removed_label": ISOLATE_LABEL, "pod_uid": meta.get("uid")}
