"""Which pods hold a simulated node's GPUs, as the kubelet's pod-resources API would say.

The seed hands each node's GPUs to its pods (`sim_pod_devices`); on a real node the kubelet
then lists only the pods that still run there, so a pod evicted, deleted or stopped (a
culled notebook) holds nothing and is billed nothing. `LivePods` is that view: the seed's
assignment, less the pods the API server no longer has on the node. It reads the node's
pods as the node agents' `agent` account (which may list pods); while the API does not
answer, the last answer stands.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from nodeward.kube import Cluster, KubeError
from nodeward.kube.access import Access
from schemas.common import PodRef

KUBELET_VIEW = Access("agent", frozenset({"pods.list"}))
"""What the simulated kubelet view reads, as the node agents' account."""


class LivePods:
    """A simulated node's device -> pods map that follows the API (a `PodSource`)."""

    def __init__(self, by_device: Mapping[str, list[PodRef]], cluster: Cluster, node: str) -> None:
        self.by_device = {k: list(v) for k, v in by_device.items()}
        self.cluster = cluster
        self.node = node
        self.last: Mapping[str, list[PodRef]] = self.by_device
        self.log = structlog.get_logger().bind(component="sim-pod-resources", node=node)

    async def pods_by_device(self) -> Mapping[str, list[PodRef]]:
        try:
            items = await self.cluster.pods.on_node(self.node)
        except KubeError as exc:
            self.log.debug("sim_pods.unknown", error=str(exc))
            return self.last
        here = {
            ((i.get("metadata") or {}).get("namespace"), (i.get("metadata") or {}).get("name"))
            for i in items
        }
        self.last = {
            device: held
            for device, refs in self.by_device.items()
            if (held := [r for r in refs if (r.namespace, r.name) in here])
        }
        return self.last
