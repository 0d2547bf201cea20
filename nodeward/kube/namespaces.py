"""Namespaces: read one (its labels decide exemptions)."""

from __future__ import annotations

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, core


class Namespaces(Area):
    @operation("namespaces.get")
    async def get(self, name: str) -> Obj:
        result: Obj = await self._client.request("GET", core("namespaces", name))
        return result

    async def labels(self, name: str) -> dict[str, str]:
        """The namespace's labels (`namespaces.get`)."""
        return dict(((await self.get(name)).get("metadata") or {}).get("labels") or {})
