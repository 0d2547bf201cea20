"""What a review needs from the cluster, kept in memory from watches: no API call on the hot path.

Two feeds, each a list then a watch from the list's version:

- namespaces (all of them: a handful to thousands), keeping each one's labels and the
  annotations the owner is read from (`schemas.directory`), nothing else;
- credential Secrets (label `nodeward.io/credential`), **metadata only**: the list asks for
  a PartialObjectMetadataList and the watch for PartialObjectMetadata objects, so a Secret's
  data never reaches this process from an API server that serves them (every one since
  1.15); of each only its namespace, name and kind is kept.

`synced` is False until both first lists are in: the server answers 503 meanwhile (the API
server then applies the webhook's failurePolicy) and `/readyz` is 503. A watch that breaks
is resumed (410: listed again, the Secrets replaced whole); meanwhile the last state
serves. A namespace deleted while its watch was relisting after a 410 may stay in memory
(no pod can be created in it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import structlog

from nodeward.kube import Cluster, Gone, KubeError, WatchEvent
from nodeward.kube.base import Listing
from schemas import directory
from services.admission.policy import KINDS, CredentialRef, Kind, NamespaceView
from services.admission.settings import CREDENTIAL_LABEL

_KEPT_ANNOTATIONS = frozenset({directory.KUBEFLOW_OWNER, *directory.DIRECTORY_ANNOTATIONS})
Obj = dict[str, Any]


def namespace_view(obj: Mapping[str, Any]) -> NamespaceView:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return NamespaceView(
        str(meta.get("name", "")),
        dict(meta.get("labels") or {}),
        {k: v for k, v in annotations.items() if k in _KEPT_ANNOTATIONS},
    )


def credential_of(obj: Mapping[str, Any]) -> tuple[str, CredentialRef] | None:
    """(namespace, credential) of a Secret's metadata; None for a label value not a kind."""
    meta = obj.get("metadata") or {}
    kind = (meta.get("labels") or {}).get(CREDENTIAL_LABEL)
    if kind not in KINDS or not meta.get("name") or not meta.get("namespace"):
        return None
    found: Kind = kind
    return str(meta["namespace"]), CredentialRef(str(meta["name"]), found)


class ClusterCache:
    """Namespaces and credential Secrets by namespace, as the watches last told."""

    def __init__(self) -> None:
        self.namespaces: dict[str, NamespaceView] = {}
        self.credentials: dict[str, dict[str, CredentialRef]] = {}
        self.namespaces_listed = asyncio.Event()
        self.secrets_listed = asyncio.Event()
        self.log = structlog.get_logger().bind(component="admission-cache")

    @property
    def synced(self) -> bool:
        return self.namespaces_listed.is_set() and self.secrets_listed.is_set()

    async def wait_synced(self) -> None:
        await self.namespaces_listed.wait()
        await self.secrets_listed.wait()

    def namespace(self, name: str) -> NamespaceView | None:
        return self.namespaces.get(name)

    def credentials_in(self, namespace: str) -> list[CredentialRef]:
        return sorted((self.credentials.get(namespace) or {}).values())

    # --- feeding ------------------------------------------------------------------------

    def namespace_event(self, event: WatchEvent) -> None:
        view = namespace_view(event.object)
        if event.type == "DELETED":
            self.namespaces.pop(view.name, None)
        else:
            self.namespaces[view.name] = view

    def replace_namespaces(self, items: list[Obj]) -> None:
        self.namespaces = {v.name: v for v in map(namespace_view, items)}
        self.namespaces_listed.set()

    def secret_event(self, event: WatchEvent) -> None:
        meta = event.object.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        found = credential_of(event.object)
        held = self.credentials.setdefault(namespace, {})
        if event.type == "DELETED" or found is None:
            held.pop(name, None)
        else:
            held[name] = found[1]
        if not held:
            self.credentials.pop(namespace, None)

    def replace_secrets(self, items: list[Obj]) -> None:
        fresh: dict[str, dict[str, CredentialRef]] = {}
        for item in items:
            found = credential_of(item)
            if found is not None:
                fresh.setdefault(found[0], {})[found[1].name] = found[1]
        self.credentials = fresh
        self.secrets_listed.set()

    async def feed_namespaces(self, cluster: Cluster, retry_s: float = 5.0) -> None:
        """Keep the namespaces current, forever."""
        await _feed(
            "namespaces",
            listing=cluster.namespaces.listing,
            watch=lambda rv: cluster.namespaces.watch(resource_version=rv),
            replace=self.replace_namespaces,
            apply=self.namespace_event,
            log=self.log,
            retry_s=retry_s,
        )

    async def feed_secrets(self, cluster: Cluster, retry_s: float = 5.0) -> None:
        """Keep the credential Secrets' names and kinds current, forever (metadata only)."""
        await _feed(
            "secrets",
            listing=lambda: cluster.secrets.metadata_listing(label_selector=CREDENTIAL_LABEL),
            watch=lambda rv: cluster.secrets.watch_metadata(
                label_selector=CREDENTIAL_LABEL, resource_version=rv
            ),
            replace=self.replace_secrets,
            apply=self.secret_event,
            log=self.log,
            retry_s=retry_s,
        )


async def _feed(
    what: str,
    *,
    listing: Callable[[], Awaitable[Listing]],
    watch: Callable[[str], AsyncIterator[WatchEvent]],
    replace: Callable[[list[Obj]], None],
    apply: Callable[[WatchEvent], None],
    log: Any,
    retry_s: float,
) -> None:
    """List, replace, watch from the list's version; list again on 410 or a broken watch."""
    while True:
        try:
            listed = await listing()
            replace(listed.items)
            log.info("admission.cache_listed", what=what, items=len(listed.items))
            async for event in watch(listed.resource_version):
                apply(event)
        except Gone:
            log.info("admission.cache_relist", what=what)
            continue
        except KubeError as exc:
            log.warning("admission.cache_watch_failed", what=what, error=" ".join(str(exc).split()))
        await asyncio.sleep(retry_s)
