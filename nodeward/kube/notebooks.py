"""Kubeflow Notebooks (kubeflow.org/v1): get, and patch annotations (custom resources take merge patches)."""

from __future__ import annotations

from collections.abc import Mapping

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, group_path

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
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Obj:
        """Set annotations (None removes one), e.g. `kubeflow-resource-stopped` to stop a notebook."""
        path = group_path("kubeflow.org", "v1", "notebooks", name, namespace)
        return await self._merge_metadata(path, "annotations", annotations)
