"""What a simulated node's kubelet and cgroups would say about its pods.

The seed hands each node's GPUs to its pods (`sim_pod_devices`); on a real node the kubelet
then lists only the pods that still run there, so a pod evicted, deleted or stopped (a
culled notebook) holds nothing and is billed nothing. `LivePods` is that view of
pod-resources: the seed's assignment, less the pods the API server no longer has on the
node. `SimCgroups` is the node's cgroup v2 CPU counters: each pod running on the node, as
the API lists it, uses its cores (its `sim.nodeward.io/cpu` annotation, else its seed
role's), and the node the pods' time plus its own processes'; a pod gone from the node has
no cgroup, so no CPU time. Both read the node's pods as the node agents' `agent` account
(which may list pods); while the API does not answer, the last answer stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from nodeward.kube import Cluster, KubeError
from nodeward.kube.access import Access
from schemas.common import PodRef

KUBELET_VIEW = Access("agent", frozenset({"pods.list"}))
"""What the simulated kubelet view reads, as the node agents' account."""
CPU_ANNOTATION = "sim.nodeward.io/cpu"
"""A pod's CPU use in cores, e.g. '2' (`kubectl annotate pod NAME sim.nodeward.io/cpu=2`)."""
IDLE_CORES = 0.02  # an idle session's background (the Jupyter server, sshd)
ROLE_CORES: Mapping[str, float] = {"training": 4.0, "daemon": 0.2, "system": 0.2}
"""A pod's cores by its seed role without the annotation (else `IDLE_CORES`): a training
job's data loaders, a DaemonSet's agent; sessions at rest."""
SYSTEM_CORES = 1.0
"""The node's own processes outside the pods' cgroups: kubelet, the container runtime."""


def pod_cores(annotations: Mapping[str, str], role: str | None) -> float:
    """A simulated pod's CPU use (cores): its annotation, else its role's."""
    default = ROLE_CORES.get(role or "", IDLE_CORES)
    try:
        return max(float(annotations.get(CPU_ANNOTATION, default)), 0.0)
    except ValueError:
        return default


class LivePods:
    """A simulated node's device -> pods map that follows the API (a `PodSource`)."""

    answered: bool = True  # the seed's assignment names every GPU's pods

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


class SimCgroups:
    """A simulated node's cgroup CPU counters (the energy agent's `CpuTime`).

    Each call lists the node's pods and counts CPU time at the cores each running pod used
    since the last call; `roles` (namespace, name) -> seed role gives a pod without the
    annotation its default. Without a `cluster` the node has no pods.
    """

    def __init__(
        self,
        cluster: Cluster | None,
        node: str,
        roles: Mapping[tuple[str, str], str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.roles = dict(roles)
        self.clock = clock
        self._at: float | None = None
        self._rates: dict[str, float] = {}  # pod UID -> cores, as last listed
        self._pods: dict[str, float] = {}  # pod UID -> CPU µs so far
        self._node = 0.0
        self.log = structlog.get_logger().bind(component="sim-cgroups", node=node)

    async def cpu_usec(self) -> tuple[int | None, Mapping[str, int]]:
        now = self.clock()
        if self._at is not None and now > self._at:
            elapsed_us = (now - self._at) * 1e6
            for uid, cores in self._rates.items():
                self._pods[uid] = self._pods.get(uid, 0.0) + cores * elapsed_us
            self._node += (sum(self._rates.values()) + SYSTEM_CORES) * elapsed_us
        self._at = now
        try:
            items = await self.cluster.pods.on_node(self.node) if self.cluster else []
        except KubeError as exc:
            self.log.debug("sim_cgroups.unknown", error=str(exc))
        else:
            self._rates = dict(self._running(items))
            self._pods = {uid: self._pods.get(uid, 0.0) for uid in self._rates}
        return int(self._node), {uid: int(us) for uid, us in self._pods.items()}

    def _running(self, items: list[Any]) -> list[tuple[str, float]]:
        """(UID, cores) of each pod running on the node: the ones with a cgroup."""
        out = []
        for item in items:
            meta = item.get("metadata") or {}
            uid = meta.get("uid")
            if not uid or (item.get("status") or {}).get("phase") != "Running":
                continue
            role = self.roles.get((str(meta.get("namespace")), str(meta.get("name"))))
            out.append((str(uid), pod_cores(meta.get("annotations") or {}, role)))
        return out
