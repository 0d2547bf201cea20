"""A simulated Kubeflow notebook controller (and the StatefulSet controller's part of it) for
`nodeward up`: what stopping a notebook does on a real Kubeflow cluster.

Kubeflow's notebook controller (`components/notebook-controller/controllers/
notebook_controller.go`, `generateStatefulSet`) runs each Notebook as a StatefulSet of the
same name with `replicas: 1`, or `replicas: 0` while the Notebook carries the annotation
`kubeflow-resource-stopped` (what the culler sets). The StatefulSet controller then deletes
the pod `<name>-0` (a graceful deletion, as any), which frees its GPUs; when the annotation
is removed (the user starts the notebook again) it creates the pod anew. Each pass here
does both: the StatefulSet's replicas follow the annotation, the pod follows the replicas,
and the Notebook's `status.readyReplicas` says which. A pod it deleted is created again,
on the node it ran on, when the notebook is started (the sim has no scheduler).
"""

from __future__ import annotations

from typing import Any

import structlog

from nodeward.kube.base import core, group_path
from nodeward.kube.client import MERGE_PATCH, KubeClient
from nodeward.kube.errors import NotFound
from sim.controllers import SimController

STOP_ANNOTATION = "kubeflow-resource-stopped"


def _fresh(pod: dict[str, Any]) -> dict[str, Any]:
    """A deleted pod as its StatefulSet would create it again: what the API server set
    (uid, resourceVersion, timestamps, status, managed fields) left out."""
    meta = {
        k: v
        for k, v in (pod.get("metadata") or {}).items()
        if k in ("name", "namespace", "labels", "annotations", "ownerReferences")
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod.get("spec") or {}}


class SimNotebookController(SimController):
    """Stops and starts notebooks as Kubeflow's controllers do; remembers the pods it
    stopped, to start them again."""

    def __init__(self, client: KubeClient, *, interval: float = 1.0) -> None:
        self.client = client
        self.interval = interval
        self.stopped: dict[tuple[str, str], dict[str, Any]] = {}  # (ns, pod) -> its manifest
        self.log = structlog.get_logger().bind(component="sim-notebooks")

    async def pass_once(self) -> list[str]:
        """Bring every notebook's StatefulSet and pod to what its annotation says; the
        `namespace/name` of each notebook stopped or started in this pass."""
        listing = await self.client.request("GET", group_path("kubeflow.org", "v1", "notebooks"))
        changed = []
        for notebook in listing.get("items") or []:
            if await self.reconcile(notebook):
                meta = notebook["metadata"]
                changed.append(f"{meta['namespace']}/{meta['name']}")
        return changed

    async def reconcile(self, notebook: dict[str, Any]) -> bool:
        meta = notebook["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        replicas = 0 if STOP_ANNOTATION in (meta.get("annotations") or {}) else 1
        sts_path = group_path("apps", "v1", "statefulsets", name, namespace)
        try:
            sts = await self.client.request("GET", sts_path)
        except NotFound:
            return False  # not run by a StatefulSet here: nothing of Kubeflow's to do
        if (sts.get("spec") or {}).get("replicas", 1) != replicas:
            await self.client.request(
                "PATCH", sts_path, body={"spec": {"replicas": replicas}}, content_type=MERGE_PATCH
            )
        changed = await self._pod(namespace, f"{name}-0", replicas)
        if ((notebook.get("status") or {}).get("readyReplicas")) != replicas:
            await self.client.request(
                "PATCH",
                group_path("kubeflow.org", "v1", "notebooks", name, namespace, sub="status"),
                body={"status": {"readyReplicas": replicas}},
                content_type=MERGE_PATCH,
            )
        return changed

    async def _pod(self, namespace: str, pod: str, replicas: int) -> bool:
        """The StatefulSet controller's part: the pod `<name>-0` exists iff replicas is 1."""
        path = core("pods", pod, namespace)
        try:
            found = await self.client.request("GET", path)
        except NotFound:
            found = None
        if replicas == 0 and found is not None:
            if (found.get("metadata") or {}).get("deletionTimestamp"):
                return False  # terminating already
            self.stopped[(namespace, pod)] = _fresh(found)
            await self.client.request("DELETE", path)
            self.log.info("sim_notebooks.stopped", namespace=namespace, pod=pod)
            return True
        if replicas == 1 and found is None and (namespace, pod) in self.stopped:
            manifest = self.stopped.pop((namespace, pod))
            await self.client.request("POST", core("pods", namespace=namespace), body=manifest)
            self.log.info("sim_notebooks.started", namespace=namespace, pod=pod)
            return True
        return False
