"""`terminate`: deletes the pod (uid precondition). A rule may only terminate after a checkpoint."""

from __future__ import annotations

from typing import Any

from services.falco.actions.base import ActionContext, Actionner
from services.falco.rules import ActionKind


async def run(ctx: ActionContext) -> dict[str, Any]:
    namespace, name, pod = ctx.pod()
    grace = int(ctx.spec.params.get("grace_period_seconds", 30))
    deleted = await ctx.cluster.pods.delete(
        namespace, name, grace_period=grace, uid=pod["metadata"].get("uid")
    )
    return {"deleted": deleted, "grace_period_seconds": grace}


ACTION = Actionner(
    ActionKind.TERMINATE,
    "delete the pod",
    "pod",
    run,
    done_words="Your pod has been stopped.",
)
