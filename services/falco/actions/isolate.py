"""`isolate`: the one pod labelled into the namespace's deny-all NetworkPolicy.

Sibling replicas of the same workload are untouched (Falco Talon's policy selects them all).
The pod keeps running; the annotation `nodeward.io/isolation` says who isolated it, for which
alert, when nodeward acted (`at`) and when Falco saw it (`alert_time`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from nodeward.kube import AlreadyExists
from nodeward.kube.client import MERGE_PATCH
from nodeward.kube.netpol import isolate_pod_policy
from services.falco.actions.base import ActionContext, Actionner
from services.falco.alerts import describe
from services.falco.rules import ActionKind
from services.falco.settings import ACTOR

ISOLATE_LABEL = "nodeward.io/isolated"
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
