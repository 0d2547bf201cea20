"""Namespaces: read one (its labels decide exemptions), list and watch them, and merge
labels and annotations into one (the directory's owner labels)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Listing, Obj, core
from nodeward.kube.client import MERGE_PATCH
from nodeward.kube.watch import WatchEvent, watch


class Namespaces(Area):
    @operation("namespaces.get")
    async def get(self, name: str) -> Obj:
        result: Obj = await self._client.request("GET", core("namespaces", name))
        return result

    async def labels(self, name: str) -> dict[str, str]:
        """The namespace's labels (`namespaces.get`)."""
        return dict(((await self.get(name)).get("metadata") or {}).get("labels") or {})

    @operation("namespaces.list")
    async def list(self, *, label_selector: str | None = None) -> list[Obj]:
        return await self._items(core("namespaces"), {"labelSelector": label_selector})

    @operation("namespaces.watch")
    async def listing(self, *, label_selector: str | None = None) -> Listing:
        """Every namespace and the version to watch from (`watch(resource_version=...)`)."""
        return await self._listing(core("namespaces"), {"labelSelector": label_selector})

    @operation("namespaces.watch")
    async def watch(
        self, *, label_selector: str | None = None, resource_version: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Changes to namespaces from `resource_version` (or now) on; see
        `nodeward.kube.watch.watch`."""
        async for event in watch(
            self._client,
            core("namespaces"),
            label_selector=label_selector,
            resource_version=resource_version,
        ):
            yield event

    @operation("namespaces.patch")
    async def merge_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """One JSON merge patch of the namespace's labels and annotations: only the keys
        given change (None removes one), every other key stays. With `resource_version`
        the patch applies only to that version (`Conflict` otherwise)."""
        meta: dict[str, object] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        result: Obj = await self._client.request(
            "PATCH", core("namespaces", name), body={"metadata": meta}, content_type=MERGE_PATCH
        )
        return result
