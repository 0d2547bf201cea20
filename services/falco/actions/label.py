"""`label`: labels on the alert's pod; values may use `{rule}`, `{priority}`, `{event_id}`..."""

from __future__ import annotations

from typing import Any

from services.falco.actions.base import ActionContext, Actionner
from services.falco.alerts import label_value, render
from services.falco.rules import ActionKind


async def run(ctx: ActionContext) -> dict[str, Any]:
    namespace, name, _ = ctx.pod()
    labels = {
        str(k): label_value(render(str(v), ctx.alert, ctx.event))
        for k, v in ctx.spec.params["labels"].items()
    }
    await ctx.cluster.pods.set_labels(namespace, name, labels)
    return {"labels": labels}


ACTION = Actionner(
    ActionKind.LABEL,
    "label the pod",
    "pod",
    run,
    done_words="Your pod has been labelled for the security team.",
)
