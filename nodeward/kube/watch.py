"""Watches with resourceVersion resume: reconnect where the last event or bookmark left off,
and relist when the server says the version is too old (410)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nodeward.kube.client import KubeClient
from nodeward.kube.errors import Gone, Unavailable, from_status
from nodeward.logs import get_logger

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class WatchEvent:
    """One change. `relisted` marks the ADDED events replayed after a 410 relist."""

    type: EventType
    object: dict[str, Any]
    relisted: bool = False

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


async def watch(
    client: KubeClient,
    path: str,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    resource_version: str | None = None,
    server_timeout: int = 300,
    relist_on_gone: bool = True,
    bookmarks: list[str] | None = None,
    accept: str = "application/json",
    list_accept: str = "application/json",
) -> AsyncIterator[WatchEvent]:
    """Yield changes to the collection at `path` from `resource_version` on, forever.

    Without a `resource_version` it lists first (yielding nothing for existing objects) and
    watches from the list's version. Each server-side timeout reconnects from the last
    version seen; bookmarks move that version on (and are appended to `bookmarks` if given).
    A dropped connection is resumed with back-off (`Unavailable` after the client's
    retries in a row). On 410 it relists and yields ADDED (relisted) for every object, unless
    `relist_on_gone` is False, in which case it raises `Gone`. `accept` and `list_accept`:
    the form of the watch's objects and of its lists (`client.METADATA_ONLY`, `..._LIST`).
    """
    log = get_logger(component="kube-watch", path=path)
    selectors: dict[str, str | None] = {
        "labelSelector": label_selector,
        "fieldSelector": field_selector,
    }
    rv = resource_version
    if rv is None:
        rv = await _list_version(client, path, selectors, list_accept)
    failures = 0
    while True:
        query: Mapping[str, str | int | bool | None] = {
            **selectors,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": rv,
            "timeoutSeconds": server_timeout,
        }
        try:
            async for raw in client.stream(
                path, query=query, read_timeout=server_timeout + 30, accept=accept
            ):
                kind = raw.get("type")
                obj = raw.get("object") or {}
                if kind == "ERROR":
                    raise from_status(int(obj.get("code") or 500), obj)
                rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    if bookmarks is not None:
                        bookmarks.append(rv)
                    continue
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield WatchEvent(kind, obj)
                failures = 0
        except Unavailable as exc:
            if failures >= client.retries:
                raise
            log.info("watch interrupted; resuming", resource_version=rv, error=exc.message)
            await asyncio.sleep(client.backoff.delay(failures))
            failures += 1
        except Gone:
            if not relist_on_gone:
                raise
            log.info("watch expired; relisting", resource_version=rv)
            listing = await client.request("GET", path, query=selectors, accept=list_accept)
            rv = str(listing.get("metadata", {}).get("resourceVersion", ""))
            for item in listing.get("items") or []:
                yield WatchEvent("ADDED", item, relisted=True)


async def _list_version(
    client: KubeClient, path: str, selectors: Mapping[str, str | None], accept: str
) -> str:
    listing = await client.request("GET", path, query={**selectors, "limit": 1}, accept=accept)
    return str(listing.get("metadata", {}).get("resourceVersion", ""))
