"""Nodes: read, taint, cordon, label, annotate, set a condition, watch."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Listing, Obj, core
from nodeward.kube.client import MERGE_PATCH, METADATA_LIST, STRATEGIC_PATCH
from nodeward.kube.watch import WatchEvent, watch

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
ConditionStatus = Literal["True", "False", "Unknown"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taints_of(node: Obj) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def condition_of(node: Obj, type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == type_),
        None,
    )


class Nodes(Area):
    @operation("nodes.get")
    async def get(self, name: str) -> Obj:
        result: Obj = await self._client.request("GET", core("nodes", name))
        return result

    @operation("nodes.list")
    async def list(
        self, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[Obj]:
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        return await self._items(core("nodes"), query)

    @operation("nodes.list")
    async def count(self, *, label_selector: str | None = None) -> int:
        """How many nodes match, from a metadata-only list (PartialObjectMetadataList, as
        client-go's metadata client asks): a fraction of the full objects' bytes."""
        listing = await self._client.request(
            "GET",
            core("nodes"),
            query={"labelSelector": label_selector},
            accept=METADATA_LIST,
        )
        return len(listing.get("items") or [])

    @operation("nodes.watch")
    async def listing(self, *, label_selector: str | None = None) -> Listing:
        """Every node and the version to watch from (`watch(resource_version=...)`)."""
        return await self._listing(core("nodes"), {"labelSelector": label_selector})

    @operation("nodes.watch")
    async def watch(
        self,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Changes to nodes from `resource_version` (or now) on; see `nodeward.kube.watch.watch`."""
        async for event in watch(
            self._client,
            core("nodes"),
            label_selector=label_selector,
            field_selector=field_selector,
            resource_version=resource_version,
        ):
            yield event

    async def _get(self, name: str) -> Obj:
        result: Obj = await self._client.request("GET", core("nodes", name))
        return result

    async def _patch(
        self, name: str, patch: Obj, content_type: str = STRATEGIC_PATCH, sub: str = ""
    ) -> Obj:
        result: Obj = await self._client.request(
            "PATCH", core("nodes", name, sub=sub), body=patch, content_type=content_type
        )
        return result

    @operation("nodes.patch")
    async def add_taint(
        self, name: str, key: str, effect: TaintEffect = "NoSchedule", value: str | None = None
    ) -> bool:
        """Add the taint unless one with this key and effect (and value) is there. True if changed.

        Taints are an atomic list in the real API, so the whole list is written with the
        resourceVersion it was read at; a 409 re-reads and re-applies.
        """

        async def attempt() -> bool:
            node = await self._get(name)
            taints = taints_of(node)
            same = [t for t in taints if t.get("key") == key and t.get("effect") == effect]
            if same and all(t.get("value") == value for t in same):
                return False
            new: dict[str, Any] = {"key": key, "effect": effect}
            if value is not None:
                new["value"] = value
            if effect == "NoExecute":
                new["timeAdded"] = _now()
            kept = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
            await self._patch(
                name,
                {
                    "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                    "spec": {"taints": [*kept, new]},
                },
            )
            return True

        return await self._on_conflict_retry(attempt)

    @operation("nodes.patch")
    async def mark(
        self,
        name: str,
        *,
        add_taints: Sequence[tuple[str, TaintEffect]] = (),
        unschedulable: bool | None = None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Obj:
        """Several marks in one write: taints added where missing, cordon (True/False),
        labels and annotations (None removes). One GET and one PATCH carrying the
        resourceVersion read (taints are an atomic list); a 409 re-reads and re-applies.
        Returns the node as written (or as read, if nothing needed changing)."""

        async def attempt() -> Obj:
            node = await self._get(name)
            meta = node.get("metadata") or {}
            taints = taints_of(node)
            missing = [
                {"key": k, "effect": e, **({"timeAdded": _now()} if e == "NoExecute" else {})}
                for k, e in add_taints
                if not any(t.get("key") == k and t.get("effect") == e for t in taints)
            ]
            spec: dict[str, Any] = {}
            if missing:
                spec["taints"] = [*taints, *missing]
            if (
                unschedulable is not None
                and bool((node.get("spec") or {}).get("unschedulable")) != unschedulable
            ):
                spec["unschedulable"] = True if unschedulable else None
            metadata: dict[str, Any] = {}
            current_labels = meta.get("labels") or {}
            if labels and any(current_labels.get(k) != v for k, v in labels.items()):
                metadata["labels"] = dict(labels)
            current_notes = meta.get("annotations") or {}
            if annotations and any(current_notes.get(k) != v for k, v in annotations.items()):
                metadata["annotations"] = dict(annotations)
            if not spec and not metadata:
                return node
            metadata["resourceVersion"] = meta["resourceVersion"]
            patch: dict[str, Any] = {"metadata": metadata}
            if spec:
                patch["spec"] = spec
            return await self._patch(name, patch)

        return await self._on_conflict_retry(attempt)

    @operation("nodes.patch")
    async def patch_from(
        self, name: str, build: Callable[[Obj], Obj | None], *, current: Obj | None = None
    ) -> tuple[Obj, bool]:
        """One PATCH computed from the node as read: `build(node)` returns the patch (its
        `metadata.resourceVersion` is set to the one read) or None for no change. A 409
        re-reads and builds again. Returns the node as written (or read) and whether it changed.

        `current`: the node as the caller last read it, tried first instead of a GET (its
        resourceVersion makes a stale one a 409, which reads afresh).
        """
        given = [current] if current is not None else []

        async def attempt() -> tuple[Obj, bool]:
            node = given.pop() if given else await self._get(name)
            patch = build(node)
            if not patch:
                return node, False
            patch = dict(patch)
            metadata = dict(patch.get("metadata") or {})
            metadata["resourceVersion"] = (node.get("metadata") or {})["resourceVersion"]
            patch["metadata"] = metadata
            return await self._patch(name, patch), True

        return await self._on_conflict_retry(attempt)

    @operation("nodes.patch")
    async def remove_taint(self, name: str, key: str, effect: TaintEffect | None = None) -> bool:
        """Remove taints with `key` (and `effect`, if given). True if any was there."""

        async def attempt() -> bool:
            node = await self._get(name)
            taints = taints_of(node)
            kept = [
                t
                for t in taints
                if not (t.get("key") == key and (effect is None or t.get("effect") == effect))
            ]
            if len(kept) == len(taints):
                return False
            await self._patch(
                name,
                {
                    "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                    "spec": {"taints": kept or None},
                },
            )
            return True

        return await self._on_conflict_retry(attempt)

    @operation("nodes.patch")
    async def set_unschedulable(self, name: str, unschedulable: bool = True) -> bool:
        """Cordon (True) or uncordon (False). Returns the prior value."""
        node = await self._get(name)
        prior = bool((node.get("spec") or {}).get("unschedulable"))
        if prior != unschedulable:
            await self._patch(name, {"spec": {"unschedulable": True if unschedulable else None}})
        return prior

    @operation("nodes.patch")
    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> Obj:
        """Set labels; a None value removes the label."""
        return await self._patch(name, {"metadata": {"labels": dict(labels)}}, MERGE_PATCH)

    @operation("nodes.patch")
    async def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Obj:
        """Set annotations; a None value removes the annotation."""
        return await self._patch(
            name, {"metadata": {"annotations": dict(annotations)}}, MERGE_PATCH
        )

    @operation("nodes.set_condition")
    async def set_condition(
        self,
        name: str,
        type_: str,
        status: ConditionStatus,
        reason: str,
        message: str = "",
        *,
        current: Obj | None = None,
    ) -> Obj:
        """Set one node condition through the status subresource.

        Conditions merge by `type`, so other writers' conditions are kept. The transition
        time moves only when the status changes (read from `current`, the node as the
        caller last read or wrote it, else from a GET).
        """
        node = current if current is not None else await self._get(name)
        stamp = _now()
        prior = condition_of(node, type_)
        transition = (
            prior.get("lastTransitionTime") if prior and prior.get("status") == status else stamp
        )
        condition = {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": transition or stamp,
        }
        return await self._patch(name, {"status": {"conditions": [condition]}}, sub="status")
