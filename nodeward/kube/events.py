"""Events: `events.k8s.io/v1` Events with reportingController `nodeward`."""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime
from typing import Any, Literal

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, group_path

REPORTING_CONTROLLER = "nodeward"


def reference(obj: Obj) -> dict[str, Any]:
    """An ObjectReference to `obj`, as `regarding` or `related`."""
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
        "resourceVersion": meta.get("resourceVersion", ""),
    }
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    if ref["kind"] == "Node":
        # The kubelet's convention, which kubectl describe searches by: a node's events
        # carry the node name as its uid.
        ref["uid"] = ref["name"]
    return {k: v for k, v in ref.items() if v}


class Events(Area):
    @operation("events.create")
    async def create(
        self,
        regarding: Obj,
        *,
        reason: str,
        action: str,
        note: str = "",
        type_: Literal["Normal", "Warning"] = "Normal",
        related: Obj | None = None,
        reporting_instance: str | None = None,
    ) -> Obj:
        """Record an Event about `regarding` (an object or an ObjectReference).

        Cluster-scoped objects (nodes) get their events in `default`, as the kubelet's do.
        """
        ref = reference(regarding) if "metadata" in regarding else dict(regarding)
        namespace = ref.get("namespace") or "default"
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{ref.get('name', 'object')}.{time.time_ns():x}",
                "namespace": namespace,
            },
            "eventTime": stamp,
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": reporting_instance
            or f"{REPORTING_CONTROLLER}-{socket.gethostname()}-{os.getpid()}",
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": type_,
            "regarding": ref,
        }
        if related is not None:
            body["related"] = reference(related) if "metadata" in related else dict(related)
        result: Obj = await self._client.request(
            "POST", group_path("events.k8s.io", "v1", "events", namespace=namespace), body=body
        )
        return result
