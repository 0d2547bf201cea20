"""Container checkpoints through the node proxy to the kubelet's checkpoint API."""

from __future__ import annotations

from nodeward.kube.access import operation
from nodeward.kube.base import Area, core, seg
from nodeward.kube.errors import CheckpointFailed, ServerError


class Checkpoints(Area):
    @operation("nodes.checkpoint")
    async def create(
        self, node: str, namespace: str, pod: str, container: str, *, timeout_s: int = 60
    ) -> str:
        """Checkpoint one container; returns the archive path on the node.

        A runtime that cannot checkpoint (no CRIU) answers 500: `CheckpointFailed` with the
        kubelet's message. Not retried: a checkpoint is not idempotent.
        """
        path = core(
            "nodes", node, sub=f"proxy/checkpoint/{seg(namespace)}/{seg(pod)}/{seg(container)}"
        )
        try:
            result = await self._client.request(
                "POST",
                path,
                query={"timeout": timeout_s},
                request_timeout=timeout_s + self._client.timeout,
                retry_statuses=frozenset({502, 503}),
            )
        except ServerError as exc:
            raise CheckpointFailed(
                f"checkpoint of {namespace}/{pod}/{container} on {node} failed: {exc.message}",
                status=exc.status,
                reason=exc.reason,
            ) from None
        items = result.get("items") if isinstance(result, dict) else None
        if not items:
            raise CheckpointFailed(
                f"checkpoint of {namespace}/{pod}/{container} on {node}: no archive in "
                f"the kubelet's answer"
            )
        return str(items[0])
