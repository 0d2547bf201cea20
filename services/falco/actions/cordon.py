"""`cordon`: taints (and by default cordons) the alert's node, for node-level compromise.

Through the kernel's NodeMarks (owner `falco`, intent in KV `falco-marks`): the node's prior
state is recorded before any change, so the cordon can be undone (`release`) without
lifting an operator's or another owner's cordon, and a crash mid-way is finished by the
redelivered alert. It takes the node out of service: the shared circuit breaker guards it.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.state.marks import MarkEntry, MarkSpec
from services.falco.actions.base import ActionContext, Actionner
from services.falco.rules import ActionKind
from services.falco.settings import ACTOR
from services.kernel.marks import NodeMarks

NODE_ANNOTATION = "nodeward.io/falco"
DEFAULT_TAINT = "nodeward.io/falco-compromised"
OWNER = "falco"


async def marks(ctx: ActionContext) -> NodeMarks:
    """The Falco service's NodeMarks (its intents live in `marks_bucket`, without a TTL)."""
    return NodeMarks(ctx.cluster, await ctx.bus.kv(ctx.settings.marks_bucket, history=5), OWNER)


async def run(ctx: ActionContext) -> dict[str, Any]:
    node = ctx.target.node or "unknown"
    spec = ctx.spec
    taint = str(spec.params.get("taint", DEFAULT_TAINT))
    effect = spec.params.get("effect", "NoSchedule")
    cordon = bool(spec.params.get("cordon", True))

    def note(entry: MarkEntry) -> dict[str, str]:
        summary = {
            "by": ACTOR,
            "falco_rule": ctx.alert.rule,
            "event_id": ctx.event.id,
            "taint": taint,
            "prior_unschedulable": entry.prior_unschedulable,
        }
        return {NODE_ANNOTATION: json.dumps(summary, separators=(",", ":"))}

    done = await (await marks(ctx)).apply(
        node,
        ctx.event.id,
        MarkSpec(taints=[f"{taint}:{effect}"], cordon=cordon),
        annotate=note,
    )
    return {
        "node": node,
        "taint": f"{taint}:{effect}",
        "cordoned": done["cordoned"],
        "prior_unschedulable": done["prior_unschedulable"],
    }


ACTION = Actionner(
    ActionKind.CORDON,
    "taint (and by default cordon) the node",
    "node",
    run,
    done_words="No new work is scheduled on the node your pod ran on.",
    removes_node=True,
)
