"""Secrets: get, replace and patch, each guarded by the resourceVersion it read; 409 re-reads.
Their metadata alone, listed and watched, for a reader that must never see a Secret's data."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable, Mapping

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Listing, Obj, copied, core
from nodeward.kube.client import MERGE_PATCH, METADATA_ONLY, METADATA_ONLY_LIST
from nodeward.kube.watch import WatchEvent, watch


def decode(secret: Obj) -> dict[str, str]:
    """The Secret's data, base64-decoded."""
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def encode(values: Mapping[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


class Secrets(Area):
    @operation("secrets.get")
    async def get(self, namespace: str, name: str) -> Obj:
        result: Obj = await self._client.request("GET", core("secrets", name, namespace))
        return result

    @operation("secrets.get_own")
    async def get_own(self, namespace: str, name: str) -> Obj:
        """A Secret of nodeward's own namespace (a role there, not cluster-wide)."""
        result: Obj = await self._client.request("GET", core("secrets", name, namespace))
        return result

    @operation("secrets.replace")
    async def replace(self, namespace: str, name: str, mutate: Callable[[Obj], Obj | None]) -> Obj:
        """Read, `mutate` (a copy), PUT with the read resourceVersion; on 409 read and mutate again.

        `mutate` returning None means no change is needed; the current Secret is returned.
        """

        async def attempt() -> Obj:
            current: Obj = await self._client.request("GET", core("secrets", name, namespace))
            desired = mutate(copied(current))
            if desired is None:
                return current
            desired.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
                "resourceVersion"
            ]
            result: Obj = await self._client.request(
                "PUT", core("secrets", name, namespace), body=desired
            )
            return result

        return await self._on_conflict_retry(attempt)

    @operation("secrets.patch")
    async def patch(
        self, namespace: str, name: str, make_patch: Callable[[Obj], Obj | None]
    ) -> Obj:
        """Read, build a merge patch from the current Secret, apply it guarded by the read
        resourceVersion; on 409 read and build again. A None patch changes nothing."""

        async def attempt() -> Obj:
            current: Obj = await self._client.request("GET", core("secrets", name, namespace))
            patch = make_patch(copied(current))
            if patch is None:
                return current
            patch = copied(patch)
            patch.setdefault("metadata", {})["resourceVersion"] = current["metadata"][
                "resourceVersion"
            ]
            result: Obj = await self._client.request(
                "PATCH", core("secrets", name, namespace), body=patch, content_type=MERGE_PATCH
            )
            return result

        return await self._on_conflict_retry(attempt)

    @operation("secrets.list")
    async def list(
        self, namespace: str | None = None, *, label_selector: str | None = None
    ) -> list[Obj]:
        """Secrets in `namespace` (all namespaces if None) matching `label_selector`."""
        query = {"labelSelector": label_selector}
        return await self._items(core("secrets", namespace=namespace or ""), query)

    @operation("secrets.replace")
    async def write(self, secret: Obj) -> Obj:
        """PUT `secret` guarded by the resourceVersion it carries: `Conflict` (409) if the
        Secret changed since it was read. The caller re-reads and decides again."""
        meta = secret["metadata"]
        if not meta.get("resourceVersion"):
            raise ValueError("secrets.write needs the resourceVersion the Secret was read at")
        result: Obj = await self._client.request(
            "PUT", core("secrets", meta["name"], meta["namespace"]), body=secret
        )
        return result

    @operation("secrets.watch")
    async def metadata_listing(self, *, label_selector: str | None = None) -> Listing:
        """Every matching Secret's metadata alone (a PartialObjectMetadataList: no data
        crosses) and the version to watch from."""
        reply = await self._client.request(
            "GET",
            core("secrets"),
            query={"labelSelector": label_selector},
            accept=METADATA_ONLY_LIST,
        )
        return Listing.of(reply)

    @operation("secrets.watch")
    async def watch_metadata(
        self, *, label_selector: str | None = None, resource_version: str | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Changes to matching Secrets, each object its metadata alone, from
        `resource_version` (or now) on; see `nodeward.kube.watch.watch`."""
        async for event in watch(
            self._client,
            core("secrets"),
            label_selector=label_selector,
            resource_version=resource_version,
            relist_on_gone=False,
            accept=METADATA_ONLY,
            list_accept=METADATA_ONLY_LIST,
        ):
            yield event
