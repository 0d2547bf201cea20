"""A simulated Kubeflow notebook controller for `nodeward up`: what stopping a notebook does
on a real Kubeflow cluster.

Kubeflow's notebook controller (`components/notebook-controller/controllers/
notebook_controller.go`, `generateStatefulSet`) runs each Notebook as a StatefulSet of the
same name with `replicas: 1`, or `replicas: 0` while the Notebook carries the annotation
`kubeflow-resource-stopped` (what the culler sets), and reports the StatefulSet's ready
replicas in the Notebook's status. The sim cluster's StatefulSet controller
(`sim.cluster.controllers`) then deletes the pod `<name>-0` (a graceful deletion, which frees
its GPUs) or creates it again from the StatefulSet's template, and its scheduler places it.
"""

from __future__ import annotations

from typing import Any

import structlog

from nodeward.kube.base import group_path
from nodeward.kube.client import MERGE_PATCH, KubeClient
from nodeward.kube.errors import NotFound
from sim.controllers import SimController

STOP_ANNOTATION = "kubeflow-resource-stopped"


class SimNotebookController(SimController):
    """Stops and starts notebooks as Kubeflow's controllers do; remembers the pods it
    stopped, to start them again."""

    def __init__(self, client: KubeClient, *, interval: float = 1.0) -> None:
        self.client = client
        self.interval = interval
        self.log = structlog.get_logger().bind(component="sim-notebooks")

    async def pass_once(self) -> list[str]:
        """Bring every notebook's StatefulSet to what its annotation says; the
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
        changed = bool((sts.get("spec") or {}).get("replicas", 1) != replicas)
        if changed:
            await self.client.request(
                "PATCH", sts_path, body={"spec": {"replicas": replicas}}, content_type=MERGE_PATCH
            )
            event = "sim_notebooks.stopped" if replicas == 0 else "sim_notebooks.started"
            self.log.info(event, namespace=namespace, notebook=name)
        ready = int((sts.get("status") or {}).get("readyReplicas") or 0)
        if ((notebook.get("status") or {}).get("readyReplicas")) != ready:
            await self.client.request(
                "PATCH",
                group_path("kubeflow.org", "v1", "notebooks", name, namespace, sub="status"),
                body={"status": {"readyReplicas": ready}},
                content_type=MERGE_PATCH,
            )
        return changed
