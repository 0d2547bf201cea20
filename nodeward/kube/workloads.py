"""StatefulSets (apps/v1): get, create, and delete leaving their pods behind (`Orphan`)."""

from __future__ import annotations

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, group_path
from nodeward.kube.errors import NotFound


class StatefulSets(Area):
    @operation("statefulsets.get")
    async def get(self, namespace: str, name: str) -> Obj:
        result: Obj = await self._client.request(
            "GET", group_path("apps", "v1", "statefulsets", name, namespace)
        )
        return result

    @operation("statefulsets.create")
    async def create(self, namespace: str, statefulset: Obj) -> Obj:
        """Create it (`AlreadyExists` when the name is taken)."""
        result: Obj = await self._client.request(
            "POST", group_path("apps", "v1", "statefulsets", namespace=namespace), body=statefulset
        )
        return result

    @operation("statefulsets.delete")
    async def orphan(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the set with `uid` but not its pods (`propagationPolicy: Orphan`: the
        garbage collector takes the set's reference off them); False if it was gone."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Orphan",
            "preconditions": {"uid": uid},
        }
        try:
            await self._client.request(
                "DELETE", group_path("apps", "v1", "statefulsets", name, namespace), body=body
            )
        except NotFound:
            return False
        return True
