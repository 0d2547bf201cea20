"""Kubeflow Notebooks (kubeflow.org/v1): get, and patch annotations (custom resources take merge patches)."""

from __future__ import annotations

from collections.abc import Mapping

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, group_path
from nodeward.kube.client import MERGE_PATCH

STOP_ANNOTATION = "kubeflow-resource-stopped"


class Notebooks(Area):
    @operation("notebooks.get")
    async def get(self, namespace: str, name: str) -> Obj:
        result: Obj = await self._client.request(
            "GET", group_path("kubeflow.org", "v1", "notebooks", name, namespace)
        )
        return result

    @operation("notebooks.patch")
    async def set_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str | None = None,
    ) -> Obj:
        """Set annotations (None removes one), e.g. `kubeflow-resource-stopped` to stop a
        notebook; with `resource_version`, only if the Notebook is still at it (`Conflict`)."""
        path = group_path("kubeflow.org", "v1", "notebooks", name, namespace)
        if resource_version is None:
            return await self._merge_metadata(path, "annotations", annotations)
        body = {"metadata": {"annotations": dict(annotations), "resourceVersion": resource_version}}
        result: Obj = await self._client.request("PATCH", path, body=body, content_type=MERGE_PATCH)
        return result
