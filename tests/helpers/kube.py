"""One builder for the Kubernetes objects the tests create."""

from __future__ import annotations

from typing import Any

from sim.cluster.seed import Owner, PodSeed


def manifest(api_version: str, kind: str, name: str, **fields: Any) -> dict[str, Any]:
    """An object of `kind` named `name` (`fields`: its spec, roleRef...)."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **fields}


def request_body(api_version: str, kind: str, **fields: Any) -> dict[str, Any]:
    """A request object of `kind` as a client sends it: no name, empty metadata."""
    return {"apiVersion": api_version, "kind": kind, "metadata": {}, **fields}


def daemonset_pod(name: str, namespace: str, node: str, daemonset: str) -> PodSeed:
    """A sim pod on `node` that DaemonSet `daemonset` owns (a drain leaves it be)."""
    owner = Owner(kind="DaemonSet", name=daemonset)
    return PodSeed(name=name, namespace=namespace, node=node, role="daemon", owner=owner)
