"""What every area of the port shares: the client, the guard, conflict retries, paths."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

from nodeward.kube.access import Guard
from nodeward.kube.client import MERGE_PATCH, KubeClient
from nodeward.kube.errors import Conflict

Obj = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Listing:
    """A list's items and the resourceVersion it was read at: a watch from that version
    misses no change made after the list."""

    items: list[Obj]
    resource_version: str

    @classmethod
    def of(cls, reply: Obj) -> Listing:
        version = str((reply.get("metadata") or {}).get("resourceVersion", ""))
        return cls(list(reply.get("items") or []), version)


class Area:
    """One group of port operations (nodes, pods, ...)."""

    def __init__(self, client: KubeClient, guard: Guard, *, conflict_retries: int = 8) -> None:
        self._client = client
        self._guard = guard
        self._conflict_retries = conflict_retries

    async def _items(self, path: str, query: Mapping[str, str | None]) -> list[Obj]:
        """The items of the list at `path` (a None query value is not sent)."""
        listing = await self._client.request("GET", path, query=query)
        return list(listing.get("items") or [])

    async def _listing(self, path: str, query: Mapping[str, str | None] | None = None) -> Listing:
        """The list at `path` and the version to watch it from."""
        return Listing.of(await self._client.request("GET", path, query=query))

    async def _merge_metadata(
        self, path: str, field: Literal["labels", "annotations"], values: Mapping[str, str | None]
    ) -> Obj:
        """Merge `values` into the labels or annotations of the object at `path` (a None
        value removes its key); the object as patched."""
        result: Obj = await self._client.request(
            "PATCH", path, body={"metadata": {field: dict(values)}}, content_type=MERGE_PATCH
        )
        return result

    async def _on_conflict_retry(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` (which re-reads and re-applies) again on each 409, a bounded number of times."""
        for _ in range(self._conflict_retries):
            try:
                return await attempt()
            except Conflict as exc:
                if exc.reason == "AlreadyExists":
                    raise
        return await attempt()


def seg(value: str) -> str:
    """One path segment, escaped."""
    return quote(value, safe="")


def core(resource: str, name: str = "", namespace: str = "", sub: str = "") -> str:
    return _path("/api/v1", resource, name, namespace, sub)


def group_path(
    group: str, version: str, resource: str, name: str = "", namespace: str = "", *, sub: str = ""
) -> str:
    return _path(f"/apis/{group}/{version}", resource, name, namespace, sub)


def _path(prefix: str, resource: str, name: str, namespace: str, sub: str) -> str:
    path = prefix
    if namespace:
        path += f"/namespaces/{seg(namespace)}"
    path += f"/{resource}"
    if name:
        path += f"/{seg(name)}"
    if sub:
        path += f"/{sub}"
    return path


def copied(obj: Obj) -> Obj:
    return copy.deepcopy(obj)
