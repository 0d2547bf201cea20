"""Dynamic Resource Allocation (resource.k8s.io): the ResourceSlices that publish a node's
devices, and DeviceTaintRules (KEP-5055) that taint one of them.

DeviceTaintRule is alpha in 1.33-1.35 (`v1alpha3`, behind the DRADeviceTaints feature gate)
and beta from 1.36 (`v1beta2`); which version a cluster serves is read from API discovery
(`served_version`). The fields written (`deviceSelector.driver/pool/device`, `taint.key/
value/effect`) exist in every version; `deviceClassName` and `selectors` were dropped in 1.35
and are never used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Listing, Obj, group_path
from nodeward.kube.errors import NotFound
from nodeward.kube.watch import WatchEvent, watch

GROUP = "resource.k8s.io"
TAINT_RULES = "devicetaintrules"
SLICES = "resourceslices"
# Versions that serve DeviceTaintRule with the fields nodeward writes, newest first: the
# preferred one the server lists wins, this order breaks ties.
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
SLICE_VERSIONS = ("v1", "v1beta2")  # v1beta1 nests attributes under `basic`: not read


def device_taint_rule(
    name: str,
    *,
    api_version: str,
    driver: str,
    pool: str,
    device: str,
    key: str,
    value: str,
    effect: str,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> Obj:
    """A DeviceTaintRule selecting one device (driver, pool, device name) with one taint."""
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": device},
            "taint": {"key": key, "value": value, "effect": effect},
        },
    }


def version_order(group: Obj, candidates: tuple[str, ...]) -> list[str]:
    """The versions of an `APIGroup` discovery document worth asking, in order: the
    server's preferred one if it is a candidate, then the candidates it serves."""
    served = {str(v.get("version")) for v in group.get("versions") or []}
    preferred = str((group.get("preferredVersion") or {}).get("version") or "")
    order = [v for v in [preferred, *candidates] if v in served and v in candidates]
    return list(dict.fromkeys(order))


class Devices(Area):
    """ResourceSlices (read) and DeviceTaintRules (create, read, delete)."""

    async def _versions(self, resource: str, candidates: tuple[str, ...]) -> str | None:
        try:
            group: Obj = await self._client.request("GET", f"/apis/{GROUP}")
        except NotFound:
            return None
        for version in version_order(group, candidates):
            try:
                listing: Obj = await self._client.request("GET", f"/apis/{GROUP}/{version}")
            except NotFound:
                continue
            if any(r.get("name") == resource for r in listing.get("resources") or []):
                return version
        return None

    async def served_version(self) -> str | None:
        """The version of resource.k8s.io serving DeviceTaintRules, or None (not served: an
        older cluster, or the feature gate off). Discovery needs no RBAC grant."""
        return await self._versions(TAINT_RULES, TAINT_RULE_VERSIONS)

    async def slice_version(self) -> str | None:
        """The version of resource.k8s.io serving ResourceSlices in the v1 shape, or None."""
        return await self._versions(SLICES, SLICE_VERSIONS)

    @operation("resourceslices.list")
    async def slices_on(self, version: str, node: str, driver: str | None = None) -> list[Obj]:
        """The ResourceSlices published for `node` (of `driver` if given)."""
        selector = f"spec.nodeName={node}"
        if driver:
            selector += f",spec.driver={driver}"
        return await self._items(group_path(GROUP, version, SLICES), {"fieldSelector": selector})

    @operation("resourceslices.watch")
    async def slice_listing(self, version: str) -> Listing:
        """Every ResourceSlice and the version to watch from."""
        return await self._listing(group_path(GROUP, version, SLICES))

    @operation("resourceslices.watch")
    async def slice_watch(
        self, version: str, *, resource_version: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Changes to ResourceSlices from `resource_version` on."""
        async for event in watch(
            self._client, group_path(GROUP, version, SLICES), resource_version=resource_version
        ):
            yield event

    @operation("devicetaintrules.create")
    async def create_taint_rule(self, version: str, rule: Obj) -> Obj:
        result: Obj = await self._client.request(
            "POST", group_path(GROUP, version, TAINT_RULES), body=rule
        )
        return result

    @operation("devicetaintrules.get")
    async def get_taint_rule(self, version: str, name: str) -> Obj | None:
        """The rule, or None if there is none of that name."""
        try:
            result: Obj = await self._client.request(
                "GET", group_path(GROUP, version, TAINT_RULES, name)
            )
        except NotFound:
            return None
        return result

    @operation("devicetaintrules.delete")
    async def delete_taint_rule(self, version: str, name: str, uid: str) -> bool:
        """Delete the rule if it is still the object `uid` (a precondition: never one that
        replaced it); False if it was not there."""
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": uid},
        }
        try:
            await self._client.request(
                "DELETE", group_path(GROUP, version, TAINT_RULES, name), body=body
            )
        except NotFound:
            return False
        return True
