"""`cordon`: taints (and by default cordons) the alert's node, for node-level compromise."""

from __future__ import annotations

import json
from typing import Any

from services.falco.actions.base import ActionContext, Actionner
from services.falco.rules import ActionKind
from services.falco.settings import ACTOR

NODE_ANNOTATION = "nodeward.io/falco"
DEFAULT_TAINT = "nodeward.io/falco-compromised"


async def run(ctx: ActionContext) -> dict[str, Any]:
    node = ctx.target.node or "unknown"
    spec = ctx.spec
    taint = str(spec.params.get("taint", DEFAULT_TAINT))
    effect = spec.params.get("effect", "NoSchedule")
    cordon = bool(spec.params.get("cordon", True))
    note = json.dumps(
        {"by": ACTOR, "falco_rule": ctx.alert.rule, "event_id": ctx.event.id, "taint": taint},
        separators=(",", ":"),
    )
    await ctx.cluster.nodes.mark(
        node,
        add_taints=[(taint, effect)],
        unschedulable=True if cordon else None,
        annotations={NODE_ANNOTATION: note},
    )
    return {"node": node, "taint": f"{taint}:{effect}", "cordoned": cordon}


ACTION = Actionner(
    ActionKind.CORDON,
    "taint (and by default cordon) the node",
    "node",
    run,
    done_words="No new work is scheduled on the node your pod ran on.",
)
