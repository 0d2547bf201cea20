"""The kubelets of the sim cluster's nodes, as far as the API sees them start pods.

A pod the API server has just created is `Pending`; the kubelet of the node it is bound to
starts its containers and reports it `Running` (conditions, IPs, container states). Here that
report follows on the next turn of the event loop, for a pod bound to a node that exists and
that nobody has reported on since it was created. A pod bound to no node stays `Pending`: the
sim has no scheduler.
"""

from __future__ import annotations

import asyncio
import itertools

from sim.cluster import admission
from sim.cluster.resources import require
from sim.cluster.store import Change, Store, now

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")


class Kubelets:
    """Start every new pod bound to a node; `install` hooks them on the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ips = itertools.count(1)

    def install(self) -> None:
        self.store.hooks.append(self._hook)

    def _hook(self, change: Change) -> None:
        if change.key != PODS.key or change.type != "ADDED":
            return
        pod = change.obj
        if not (pod.get("spec") or {}).get("nodeName"):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no kubelet (a store used on its own)
        meta = pod["metadata"]
        loop.call_soon(self._start, meta["namespace"], meta["name"], meta["resourceVersion"])

    def _start(self, namespace: str, name: str, created_rv: str) -> None:
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["resourceVersion"] != created_rv:
            return  # gone, or reported on already (a seed's status, a test's)
        node = self.store.find(NODES, "", pod["spec"]["nodeName"])
        if node is None:
            return
        addresses = (node.get("status") or {}).get("addresses") or []
        host_ip = next(
            (a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.250"
        )
        n = next(self._ips)
        pod["status"] = admission.running_status(
            pod, host_ip, f"10.245.{n // 250}.{n % 250 + 1}", now()
        )
        self.store.update(PODS, namespace, name, pod, subresource="status", check_rv=False)
