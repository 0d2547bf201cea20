"""`annotate`: annotations on the alert's pod; values may use `{rule}`, `{priority}`..."""

from __future__ import annotations

from typing import Any

from nodeward.kube.client import MERGE_PATCH
from services.falco.actions.base import ActionContext, Actionner
from services.falco.alerts import render
from services.falco.rules import ActionKind


async def run(ctx: ActionContext) -> dict[str, Any]:
    namespace, name, _ = ctx.pod()
    notes = {
        str(k): render(str(v), ctx.alert, ctx.event)
        for k, v in ctx.spec.params["annotations"].items()
    }
    await ctx.cluster.pods.patch(
        namespace, name, {"metadata": {"annotations": notes}}, content_type=MERGE_PATCH
    )
    return {"annotations": notes}


ACTION = Actionner(
    ActionKind.ANNOTATE,
    "annotate the pod",
    "pod",
    run,
    done_words="Your pod has been annotated for the security team.",
)
