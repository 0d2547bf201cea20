"""The kubelets of the sim cluster's nodes, as far as the API sees them start pods.

A pod the API server has just created is `Pending`; the kubelet of the node it is bound to
starts its containers and reports it `Running` (conditions, IPs, container states). Here that
report follows on the next turn of the event loop, for a pod bound to a node that exists and
that nobody has reported on since it was created or bound (by the scheduler,
`sim.cluster.controllers`).

A pod deleted with a grace period is `Terminating` (its `deletionTimestamp` set) until its
kubelet has stopped its containers: after its `sim.nodeward.io/exits-after` annotation's
seconds, or the kubelet's default, never later than the grace period; then the kubelet's
final delete removes it.
"""

from __future__ import annotations

import asyncio
import itertools

from sim.cluster import admission
from sim.cluster.resources import require
from sim.cluster.store import Change, Obj, Store, now

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")


EXITS_AFTER = "sim.nodeward.io/exits-after"
"""A pod's annotation: how many seconds its containers take to exit once told to stop
(`SIGTERM`); the kubelet kills them at the grace period's end in any case."""


class Kubelets:
    """Start every new pod bound to a node, and finish every one deleted gracefully;
    `install` hooks them on the store. `exits_after`: how long a pod's containers take to
    stop unless its annotation says otherwise (well-behaved ones: a moment)."""

    def __init__(self, store: Store, *, exits_after: float = 0.2) -> None:
        self.store = store
        self.exits_after = exits_after
        self._ips = itertools.count(1)

    def install(self) -> None:
        self.store.hooks.append(self._hook)

    def _hook(self, change: Change) -> None:
        if change.key != PODS.key or change.type == "DELETED":
            return
        pod = change.obj
        meta = pod["metadata"]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no kubelet (a store used on its own)
        node = (pod.get("spec") or {}).get("nodeName")
        if change.type == "ADDED" or (
            node and not ((change.old or {}).get("spec") or {}).get("nodeName")
        ):
            if node:  # created bound, or just bound by the scheduler
                loop.call_soon(
                    self._start, meta["namespace"], meta["name"], meta["resourceVersion"]
                )
            return
        was = (change.old or {}).get("metadata") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and grace != was.get("deletionGracePeriodSeconds"):
            loop.call_later(
                self._stopping_s(pod, float(grace or 0)),
                self._finish,
                meta["namespace"],
                meta["name"],
                meta["uid"],
            )

    def _stopping_s(self, pod: Obj, grace: float) -> float:
        said = ((pod["metadata"].get("annotations") or {}).get(EXITS_AFTER)) or ""
        try:
            exits = float(said) if said else self.exits_after
        except ValueError:
            exits = self.exits_after
        return max(0.0, min(exits, grace))

    def _finish(self, namespace: str, name: str, uid: str) -> None:
        """The containers are stopped: the kubelet's final delete (grace 0) removes the pod,
        unless a finalizer still holds it."""
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        self.store.delete(PODS, namespace, name, grace_period=0, precondition_uid=uid)

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
