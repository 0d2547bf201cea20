"""`checkpoint`: the kubelet checkpoint API (through the node proxy) for the alert's container.

Needs the `ContainerCheckpoint` feature gate and CRIU on the node; a runtime without them
fails the action, which is audited as failed.
"""

from __future__ import annotations

from typing import Any

from nodeward.kube import NotFound
from services.falco.actions.base import ActionContext, Actionner
from services.falco.rules import ActionKind


async def run(ctx: ActionContext) -> dict[str, Any]:
    namespace, name, pod = ctx.pod()
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        raise NotFound(f"pod {namespace}/{name} is not bound to a node: nothing to checkpoint")
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    alert = ctx.alert
    containers = [alert.container] if alert.container in names else [n for n in names if n]
    timeout = int(ctx.spec.params.get("timeout", ctx.settings.checkpoint_timeout.total_seconds()))
    archives: dict[str, str] = {}
    for container in containers:
        assert container is not None
        archives[container] = await ctx.cluster.checkpoints.create(
            node, namespace, name, container, timeout_s=timeout
        )
    await ctx.record_event(
        pod, "Checkpointed", f"checkpoint kept on {node}: {', '.join(archives.values())}"
    )
    return {"node": node, "archives": archives}


ACTION = Actionner(
    ActionKind.CHECKPOINT,
    "checkpoint the alert's container (else every container) for the investigation",
    "pod",
    run,
    done_words="A snapshot (checkpoint) of the container was kept for the investigation.",
)
