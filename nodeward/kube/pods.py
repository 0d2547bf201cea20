"""Pods: list on a node, get, create, patch, delete, evict (PodDisruptionBudget-aware), watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Listing, Obj, core
from nodeward.kube.client import STRATEGIC_PATCH
from nodeward.kube.errors import (
    EvictionBlocked,
    MultipleBudgets,
    NotFound,
    ServerError,
    TooManyRequests,
)
from nodeward.kube.watch import WatchEvent, watch

_MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"


def disruption_cause(exc: TooManyRequests) -> str:
    """The budget message of a 429 eviction, or its message."""
    causes = exc.details.get("causes") or []
    return "; ".join(c.get("message", "") for c in causes if c.get("message")) or exc.message


class Pods(Area):
    @operation("pods.list")
    async def on_node(self, node: str, *, label_selector: str | None = None) -> list[Obj]:
        """Every pod bound to `node`, in all namespaces."""
        query = {"fieldSelector": f"spec.nodeName={node}", "labelSelector": label_selector}
        return await self._items(core("pods"), query)

    @operation("pods.list")
    async def list(
        self,
        namespace: str | None = None,
        *,
        node: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """Pods in `namespace` (all if None); `node` adds the `spec.nodeName` field selector."""
        fields = [f for f in (f"spec.nodeName={node}" if node else None, field_selector) if f]
        query = {"labelSelector": label_selector, "fieldSelector": ",".join(fields) or None}
        return await self._items(core("pods", namespace=namespace or ""), query)

    @operation("pods.watch")
    async def listing(self, *, field_selector: str | None = None) -> Listing:
        """Every pod in every namespace and the version to watch from."""
        return await self._listing(core("pods"), {"fieldSelector": field_selector})

    @operation("pods.watch")
    async def watch(
        self,
        namespace: str | None = None,
        *,
        node: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        async for event in watch(
            self._client,
            core("pods", namespace=namespace or ""),
            label_selector=label_selector,
            field_selector=f"spec.nodeName={node}" if node else None,
            resource_version=resource_version,
        ):
            yield event

    @operation("pods.get")
    async def get(self, namespace: str, name: str) -> Obj:
        result: Obj = await self._client.request("GET", core("pods", name, namespace))
        return result

    @operation("pods.get_own")
    async def get_own(self, namespace: str, name: str) -> Obj:
        """A pod of nodeward's own namespace (a role there, not cluster-wide)."""
        result: Obj = await self._client.request("GET", core("pods", name, namespace))
        return result

    @operation("pods.get")
    async def wait_gone(
        self,
        namespace: str,
        name: str,
        uid: str | None = None,
        *,
        within: float = 60.0,
        interval: float = 0.2,
    ) -> bool:
        """Poll until the pod (with `uid`, if given) no longer exists. False on timeout."""
        deadline = time.monotonic() + within
        while True:
            try:
                pod = await self._client.request("GET", core("pods", name, namespace))
            except NotFound:
                return True
            if uid is not None and pod["metadata"].get("uid") != uid:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    @operation("pods.create")
    async def create(self, namespace: str, pod: Obj) -> Obj:
        """Create `pod` in `namespace` (`AlreadyExists` when its name is taken)."""
        result: Obj = await self._client.request(
            "POST", core("pods", namespace=namespace), body=pod
        )
        return result

    @operation("pods.patch")
    async def patch(
        self, namespace: str, name: str, patch: Obj, *, content_type: str = STRATEGIC_PATCH
    ) -> Obj:
        result: Obj = await self._client.request(
            "PATCH", core("pods", name, namespace), body=patch, content_type=content_type
        )
        return result

    @operation("pods.patch")
    async def set_labels(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> Obj:
        return await self._merge_metadata(core("pods", name, namespace), "labels", labels)

    @operation("pods.patch")
    async def set_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Obj:
        """Set annotations; a None value removes the annotation."""
        return await self._merge_metadata(core("pods", name, namespace), "annotations", annotations)

    @operation("pods.delete")
    async def delete(
        self, namespace: str, name: str, *, grace_period: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete the pod; False if it was already gone. `uid` guards against a same-name successor."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self._client.request("DELETE", core("pods", name, namespace), body=body)
        except NotFound:
            return False
        return True

    @operation("pods.evict")
    async def evict(
        self,
        namespace: str,
        name: str,
        *,
        deadline: float = 60.0,
        grace_period: int | None = None,
        uid: str | None = None,
    ) -> bool:
        """Evict through the policy/v1 Eviction subresource; False if the pod was already gone.

        A 429 (a PodDisruptionBudget allows no disruption now) is retried with back-off
        until `deadline` seconds have passed, then raised as `EvictionBlocked`. A 500
        because several budgets select the pod is raised as `MultipleBudgets`.
        """
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: dict[str, Any] = {}
        if grace_period is not None:
            options["gracePeriodSeconds"] = grace_period
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        end = time.monotonic() + deadline
        attempt = 0
        while True:
            try:
                await self._client.request(
                    "POST",
                    core("pods", name, namespace, "eviction"),
                    body=body,
                    retry_statuses=frozenset({502, 503, 504}),
                )
                return True
            except NotFound:
                return False
            except TooManyRequests as exc:
                left = end - time.monotonic()
                if left <= 0:
                    raise EvictionBlocked(
                        f"eviction of {namespace}/{name} blocked until its deadline "
                        f"({deadline:g}s): {disruption_cause(exc)}",
                        status=429,
                        reason=exc.reason,
                        details=exc.details,
                    ) from None
                delay = (
                    exc.retry_after
                    if exc.retry_after is not None
                    else self._client.backoff.delay(attempt)
                )
                await asyncio.sleep(min(delay, left))
                attempt += 1
            except ServerError as exc:
                if _MULTIPLE_BUDGETS in exc.message:
                    raise MultipleBudgets(
                        f"cannot evict {namespace}/{name}: {exc.message}",
                        status=exc.status,
                        reason=exc.reason,
                        details=exc.details,
                    ) from None
                raise
