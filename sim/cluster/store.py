"""The sim cluster's storage: objects, resourceVersion and generation bookkeeping, watch history.

Everything runs on one event loop, so each operation is atomic. `resourceVersion` is one
global counter, as etcd's revision is. The history is kept per resource, as kube-apiserver's
watch cache is (one `cacher` per resource, `staging/src/k8s.io/apiserver/pkg/storage/cacher`):
a watch of nodes resumes from any version its resource's history still reaches, however
busy other resources (the kubelets' node leases) are, and gets `410 Expired` for older ones.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import copy
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from sim.cluster import admission, resources, validation, webhooks
from sim.cluster.errors import (
    ApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from sim.cluster.resources import ResourceType

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, resource) of the storage
_PODS: Key = ("", "pods")
_ACCOUNTS: Key = ("", "serviceaccounts")
_NAMESPACES: Key = ("", "namespaces")
_SERVICES: Key = ("", "services")
_STATUS_KEPT = frozenset({("", "nodes")})
"""Kinds whose status a create may set: a node registers with its status (the kubelet's)."""
FOREGROUND = "foregroundDeletion"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
Stored = tuple[Key, tuple[str, str], Obj]  # (storage key, (namespace, name), object)
Fields = Callable[[Obj | None, Obj], "builtins.list[Obj]"]
"""(old object or None, new object) -> the new object's managedFields."""


_SCALARS = frozenset({str, int, float, bool, type(None)})
_T = TypeVar("_T")


def clone(obj: _T) -> _T:
    """A deep copy of JSON-shaped data (dicts, lists, scalars), as `copy.deepcopy` makes it
    but several times faster (every read and write of the store copies); anything else is
    deep-copied."""
    return cast(_T, _clone(obj))


def _clone(obj: Any) -> Any:
    kind = type(obj)
    if kind is dict:
        return {k: _clone(v) for k, v in obj.items()}
    if kind is list:
        return [_clone(v) for v in obj]
    if kind in _SCALARS:
        return obj
    return copy.deepcopy(obj)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Change:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None


@dataclass
class Prepared:
    """An update checked and ready to store (`Store.prepare_update`): the new object, the
    stored one it replaces, and whether it changes nothing."""

    new: Obj
    old: Obj
    noop: bool = False


@dataclass(eq=False)
class Watcher:
    key: Key
    namespace: str | None
    queue: asyncio.Queue[Change] = field(default_factory=asyncio.Queue)


class Store:
    """Objects by (group, resource), then (namespace, name)."""

    def __init__(self, history: int = 10000) -> None:
        self._objects: dict[Key, dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        self._history_size = history
        self._history: dict[Key, deque[Change]] = {}
        self._floor: dict[Key, int] = {}  # per resource: the newest version its history lost
        self._compacted = 0
        self._watchers: set[Watcher] = set()
        self.hooks: list[Callable[[Change], None]] = []
        self._service_ips = 0

    # --- versions and history ------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def oldest_resumable(self) -> int:
        """The oldest resourceVersion a watch of any resource may resume from."""
        return max([self._compacted, *self._floor.values()])

    def resumable_from(self, key: Key) -> int:
        """The oldest resourceVersion a watch of resource `key` may resume from."""
        return max(self._compacted, self._floor.get(key, 0))

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: older watches get 410."""
        self._history.clear()
        self._floor.clear()
        self._compacted = self._rv

    def history_since(self, rv: int, key: Key) -> list[Change]:
        return [c for c in self._history.get(key, ()) if c.rv > rv]

    def subscribe(self, key: Key, namespace: str | None) -> Watcher:
        w = Watcher(key, namespace)
        self._watchers.add(w)
        return w

    def unsubscribe(self, w: Watcher) -> None:
        self._watchers.discard(w)

    def _emit(self, change: Change) -> None:
        history = self._history.get(change.key)
        if history is None:
            history = self._history[change.key] = deque(maxlen=self._history_size)
        if len(history) == history.maxlen:
            self._floor[change.key] = history[0].rv
        history.append(change)
        for w in list(self._watchers):
            if w.key == change.key:
                w.queue.put_nowait(change)
        for hook in self.hooks:
            hook(change)

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    # --- reads ----------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._objects.get(rt.key, {}).get((namespace if rt.namespaced else "", name))
        if obj is None:
            raise not_found(rt.resource, name, rt.group)
        return clone(obj)

    def snapshot(self, rt: ResourceType, rv: int, namespace: str | None = None) -> list[Obj] | None:
        """The objects as they were at `rv` (etcd's range read at a revision), by key; None
        when the history no longer reaches back that far (compacted)."""
        if rv > self._rv:
            return None
        if rv < self._rv and rv < self.resumable_from(rt.key):
            return None
        items = {k: clone(o) for k, o in self._objects.get(rt.key, {}).items()}
        for change in reversed(self._history.get(rt.key, ())):
            if change.rv <= rv:
                break
            meta = change.obj["metadata"]
            key = (meta.get("namespace", "") if rt.namespaced else "", meta["name"])
            if change.type == "ADDED":
                items.pop(key, None)
            elif change.old is not None:
                items[key] = clone(change.old)
        return [o for (ns, _), o in sorted(items.items()) if namespace is None or ns == namespace]

    def peek(self, rt: ResourceType, namespace: str | None = None) -> builtins.list[Obj]:
        """The stored objects themselves, not copies, for the sim's own controllers: read
        them, never change them."""
        items = self._objects.get(rt.key, {})
        return [o for (ns, _), o in items.items() if namespace is None or ns == namespace]

    def bind(self, namespace: str, name: str, node: str, at: str) -> Obj:
        """The `pods/binding` subresource (`pkg/registry/core/pod/storage` `assignPod`): set a
        pending pod's `spec.nodeName` and its `PodScheduled` condition; 409 when it is bound
        already or being deleted."""
        table = self._objects.get(_PODS, {})
        old = table.get((namespace, name))
        if old is None:
            raise not_found("pods", name, "")
        if old["metadata"].get("deletionTimestamp"):
            raise conflict("pods", name, "")
        bound = (old.get("spec") or {}).get("nodeName")
        if bound:
            raise ApiError(409, "Conflict", f"pod {name} is already assigned to node {bound!r}")
        new = clone(old)
        new["spec"]["nodeName"] = node
        conditions = [
            c
            for c in (new.get("status") or {}).get("conditions") or []
            if c.get("type") != "PodScheduled"
        ]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": at,
            }
        )
        new.setdefault("status", {})["conditions"] = conditions
        new["metadata"]["resourceVersion"] = self._bump()
        table[(namespace, name)] = new
        self._emit(Change(self._rv, _PODS, "MODIFIED", clone(new), clone(old)))
        return clone(new)

    def peek_one(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        """The stored object itself, not a copy (see `peek`), or None."""
        return self._objects.get(rt.key, {}).get((namespace if rt.namespaced else "", name))

    def find(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        obj = self._objects.get(rt.key, {}).get((namespace if rt.namespaced else "", name))
        return clone(obj) if obj is not None else None

    def list(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        items = self._objects.get(rt.key, {})
        out = [
            clone(o) for (ns, _), o in sorted(items.items()) if namespace is None or ns == namespace
        ]
        return out

    # --- writes ---------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str,
        obj: Obj,
        *,
        dry_run: bool = False,
        fields: Fields | None = None,
    ) -> Obj:
        """Store a new object; `fields` gives its managedFields (the writer's ownership).
        `admit_create`, `prepare_create` and `commit_create` in one, with no webhooks between
        them (the sim's own writes)."""
        prepared = self.prepare_create(rt, namespace, self.admit_create(rt, namespace, obj), fields)
        if dry_run:
            return prepared
        return self.commit_create(rt, namespace, prepared)

    def admit_create(self, rt: ResourceType, namespace: str, obj: Obj) -> Obj:
        """What the API server does to a new object before its admission webhooks: the
        request's namespace set, `NamespaceLifecycle` (404 for a missing namespace), the
        scheme's defaults and the built-in mutating plugins (`sim.cluster.admission`). Run
        again, on the object the webhooks changed, when they are reinvoked."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match "
                    "the namespace sent on the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if rt.namespaced and rt.resource != "namespaces" and namespace not in ("",):
            ns_table = self._objects.get(("", "namespaces"), {})
            if ("", namespace) not in ns_table:  # admission's NamespaceLifecycle
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    details={"name": namespace, "kind": "namespaces"},
                )
        if rt.kind in admission.WORKLOADS and rt.group in ("apps", "batch"):
            admission.workload(rt.kind, obj)
        elif rt.key == _SERVICES:
            self._service_ips += 1
            n = self._service_ips
            admission.service(obj, f"10.96.{n // 250}.{n % 250 + 1}")
        elif rt.group == webhooks.GROUP:
            webhooks.default_configuration(obj)
        elif rt.key == _NAMESPACES:
            _namespace_name_label(obj)
        if rt.key == _PODS:
            accounts = {
                n: o for (ns, n), o in self._objects.get(_ACCOUNTS, {}).items() if ns == namespace
            }
            admission.pod(obj, namespace, accounts)
        return obj

    def prepare_create(
        self, rt: ResourceType, namespace: str, obj: Obj, fields: Fields | None = None
    ) -> Obj:
        """The registry's part of a create before storage (`rest.BeforeCreate`: the name
        generated, the strategy's `PrepareForCreate`, uid, validation), on an admitted object:
        the object as it would be stored, or 422/409. Nothing is stored."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name") or ""
        if meta.get("resourceVersion"):
            raise invalid(
                rt.kind,
                name,
                rt.group,
                [
                    (
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: must be empty on create",
                    )
                ],
            )
        table = self._objects.setdefault(rt.key, {})
        if (
            rt.kind == "Job"
            and rt.group == "batch"
            and not (obj["spec"].get("manualSelector"))
            and obj["spec"].get("selector")
        ):
            raise invalid(
                rt.kind,
                name,
                rt.group,
                [
                    (
                        "spec.selector",
                        "FieldValueInvalid",
                        "Invalid value: `selector` will be auto-generated",
                    )
                ],
            )
        if rt.key == _PODS:
            admission.pod_prepare(obj)
        elif rt.key == _NAMESPACES:  # namespaceStrategy.PrepareForCreate
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
        elif "status" in rt.subresources and rt.key not in _STATUS_KEPT:
            # the strategies' PrepareForCreate: status is written through /status only
            obj.pop("status", None)
        meta["uid"] = str(uuid.uuid4())
        if rt.kind == "Job" and rt.group == "batch":
            admission.job_selector(obj)
        _normalize(rt, obj)
        validation.validate(rt, obj, None)
        if (namespace if rt.namespaced else "", name) in table:
            raise already_exists(rt.resource, name, rt.group)
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        obj["apiVersion"], obj["kind"] = rt.api_version(), rt.kind
        meta.pop("managedFields", None)
        if fields is not None:
            meta["managedFields"] = fields(None, obj)
        return obj

    def commit_create(self, rt: ResourceType, namespace: str, obj: Obj) -> Obj:
        """Store a prepared object (`prepare_create`); 409 if its name was taken meanwhile."""
        obj = clone(obj)
        name = obj["metadata"]["name"]
        table = self._objects.setdefault(rt.key, {})
        if (namespace if rt.namespaced else "", name) in table:
            raise already_exists(rt.resource, name, rt.group)
        obj["metadata"]["resourceVersion"] = self._bump()
        table[(namespace if rt.namespaced else "", name)] = obj
        self._emit(Change(self._rv, rt.key, "ADDED", clone(obj), None))
        if rt.key == _NAMESPACES:
            self._controllers_on_namespace(name)
        return clone(obj)

    def _controllers_on_namespace(self, namespace: str) -> None:
        """What the ServiceAccount controller does for a new namespace: its `default`
        ServiceAccount."""
        if (namespace, admission.DEFAULT_ACCOUNT) not in self._objects.get(_ACCOUNTS, {}):
            accounts = resources.require("", "v1", "serviceaccounts")
            self.create(accounts, namespace, admission.default_account(namespace))

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        new: Obj,
        *,
        subresource: str = "",
        check_rv: bool = True,
        dry_run: bool = False,
        fields: Fields | None = None,
    ) -> Obj:
        """Replace an object. A stale `resourceVersion` in `new` is a 409. `fields` gives its
        managedFields after the write (else they stay as they were).

        On the main resource, status is kept when the type has a status subresource; on
        `/status`, only status changes. Generation moves when anything but metadata and
        status changes. `prepare_update` and `commit_update` in one.
        """
        prepared = self.prepare_update(
            rt, namespace, name, new, subresource=subresource, check_rv=check_rv, fields=fields
        )
        if prepared.noop:
            return clone(prepared.old)
        if dry_run:
            return prepared.new
        return self.commit_update(rt, namespace, name, prepared)

    def prepare_update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        new: Obj,
        *,
        subresource: str = "",
        check_rv: bool = True,
        fields: Fields | None = None,
    ) -> Prepared:
        """An update up to storage (`rest.BeforeUpdate`, validation): the object as it would
        be stored and the one it replaces, or 404/409/422. Nothing is stored."""
        key = (namespace if rt.namespaced else "", name)
        table = self._objects.get(rt.key, {})
        old = table.get(key)
        if old is None:
            raise not_found(rt.resource, name, rt.group)
        old = clone(old)
        new = clone(new)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        want_rv = meta.get("resourceVersion")
        if check_rv and want_rv and want_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt.resource, name, rt.group)
        if subresource == "status":
            merged = clone(old)
            merged["status"] = new.get("status")
            if merged["status"] is None:
                merged.pop("status")
            new = merged
        else:
            if "status" in rt.subresources:
                if "status" in old:
                    new["status"] = clone(old["status"])
                else:
                    new.pop("status", None)
            for k in (
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
            ):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = namespace
            if rt.group == webhooks.GROUP:
                webhooks.default_configuration(new)
            elif rt.key == _NAMESPACES:
                _namespace_name_label(new)
        new["apiVersion"], new["kind"] = rt.api_version(), rt.kind
        _normalize(rt, new)
        validation.validate(rt, new, old)
        if _spec_of(new) != _spec_of(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        managed = fields(old, new) if fields is not None else None
        owners_same = managed is None or _untimed(managed) == _untimed(
            old["metadata"].get("managedFields") or []
        )
        if new == old and owners_same:
            return Prepared(new, old, noop=True)  # a no-op write does not move resourceVersion
        if managed is not None:
            new["metadata"]["managedFields"] = managed
        return Prepared(new, old)

    def commit_update(self, rt: ResourceType, namespace: str, name: str, prepared: Prepared) -> Obj:
        """Store a prepared update (`prepare_update`); 409 Conflict if the object was written
        since it was prepared (etcd's compare-and-swap)."""
        key = (namespace if rt.namespaced else "", name)
        table = self._objects.get(rt.key, {})
        current = table.get(key)
        if current is None:
            raise not_found(rt.resource, name, rt.group)
        old, new = prepared.old, clone(prepared.new)
        if current["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise conflict(rt.resource, name, rt.group)
        if prepared.noop:
            return clone(current)
        new["metadata"]["resourceVersion"] = self._bump()
        table[key] = new
        self._emit(Change(self._rv, rt.key, "MODIFIED", clone(new), clone(current)))
        meta = new["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        ):
            # `shouldDeleteDuringUpdate`: the last finalizer of a deleted object is gone
            return self._remove(rt, key)
        return clone(new)

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        precondition_rv: str | None = None,
        precondition_uid: str | None = None,
        dry_run: bool = False,
        grace_period: int | None = None,
        propagation: str | None = None,
    ) -> Obj:
        """Delete as the API server's registry does (`pkg/registry/generic/registry/store.go`
        `Delete`, `rest.BeforeDelete`): the object as it stands after the request.

        A pod bound to a node and not finished is deleted gracefully: it gets its
        `deletionTimestamp` (now plus `grace_period`, else its own
        `terminationGracePeriodSeconds`) and stays until its kubelet removes it; a
        shorter grace period may shorten a deletion under way, 0 removes it at once. An object
        with finalizers stays, marked, until the last is removed. Dependents are then
        collected by their ownerReferences, per `propagation` (`Background`, the default;
        `Foreground`: the owner stays, with the `foregroundDeletion` finalizer, until they are
        gone; `Orphan`: they lose the reference and stay).
        """
        key = (namespace if rt.namespaced else "", name)
        table = self._objects.get(rt.key, {})
        old = table.get(key)
        if old is None:
            raise not_found(rt.resource, name, rt.group)
        if precondition_uid and precondition_uid != old["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {precondition_uid}, "
                f"UID in object meta: {old['metadata']['uid']}",
            )
        if precondition_rv and precondition_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                "Precondition failed: ResourceVersion in precondition: "
                f"{precondition_rv}, ResourceVersion in object meta: {old['metadata']['resourceVersion']}",
            )
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise bad_request(
                f'Unsupported value: "{propagation}": supported values: "Foreground", '
                '"Background", "Orphan"'
            )
        if dry_run:
            return clone(old)
        meta = old["metadata"]
        grace = self._grace(rt, old, grace_period)
        finalizers = list(meta.get("finalizers") or [])
        if propagation == "Foreground" and self._dependents(meta["uid"]):
            finalizers = list(dict.fromkeys([*finalizers, FOREGROUND]))
        elif propagation == "Orphan":
            self._orphan(meta["uid"])
        if grace == 0 and not finalizers:
            return self._remove(rt, key)
        marked = self._mark_deleted(rt, key, old, grace, finalizers)
        if FOREGROUND in finalizers:
            self._collect(meta["uid"])  # the dependents first
        return marked

    def _grace(self, rt: ResourceType, obj: Obj, asked: int | None) -> int:
        """The grace period a deletion gets: only a pod bound to a node and not finished
        has one (`podStrategy.CheckGracefulDelete`); a deletion under way may only shorten."""
        if rt.key != _PODS:
            return 0
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        grace = asked if asked is not None else spec.get("terminationGracePeriodSeconds", 30)
        grace = max(0, int(grace))
        current = obj["metadata"].get("deletionGracePeriodSeconds")
        return min(grace, int(current)) if current is not None else grace

    def _mark_deleted(
        self,
        rt: ResourceType,
        key: tuple[str, str],
        old: Obj,
        grace: int,
        finalizers: builtins.list[str],
    ) -> Obj:
        new = clone(old)
        meta = new["metadata"]
        if "deletionTimestamp" not in meta or grace < (meta.get("deletionGracePeriodSeconds") or 0):
            at = datetime.now(UTC) + timedelta(seconds=grace)
            meta["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["deletionGracePeriodSeconds"] = grace
        if finalizers:
            meta["finalizers"] = finalizers
        if new == old:
            return clone(old)
        meta["resourceVersion"] = self._bump()
        self._objects[rt.key][key] = new
        self._emit(Change(self._rv, rt.key, "MODIFIED", clone(new), clone(old)))
        return clone(new)

    def _remove(self, rt: ResourceType, key: tuple[str, str]) -> Obj:
        """Take the object out of storage, then collect what it owned (background)."""
        old = self._objects[rt.key].pop(key)
        gone = clone(old)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._emit(Change(self._rv, rt.key, "DELETED", clone(gone), clone(old)))
        self._collect(old["metadata"]["uid"])
        self._owners_waiting(old)
        return gone

    def _dependents(self, uid: str) -> builtins.list[Stored]:
        return [
            (k, key, obj)
            for k, table in self._objects.items()
            for key, obj in table.items()
            if any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])
        ]

    def _collect(self, uid: str) -> None:
        """The garbage collector's part: delete what `uid` owned (each as its own deletion
        goes: a pod gracefully). A dependent with another owner still there is kept."""
        for k, (ns, name), obj in self._dependents(uid):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r.get("uid") != uid and self._by_uid(r.get("uid")) for r in refs):
                continue
            if obj["metadata"].get("deletionTimestamp"):
                continue
            dependent = resources.by_key(k)
            if dependent is not None:
                self.delete(dependent, ns, name)

    def _orphan(self, uid: str) -> None:
        for k, (ns, name), obj in self._dependents(uid):
            kept = clone(obj)
            refs = kept["metadata"]["ownerReferences"]
            kept["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
            dependent = resources.by_key(k)
            if dependent is not None:
                self.update(dependent, ns, name, kept, check_rv=False)

    def _owners_waiting(self, gone: Obj) -> None:
        """A dependent is gone: an owner deleted in the foreground whose dependents are all
        gone loses its `foregroundDeletion` finalizer (and, if it was the last, goes)."""
        for ref in gone["metadata"].get("ownerReferences") or []:
            owner = self._by_uid(ref.get("uid"))
            if owner is None:
                continue
            k, key, obj = owner
            if FOREGROUND not in (obj["metadata"].get("finalizers") or []):
                continue
            if self._dependents(obj["metadata"]["uid"]):
                continue
            rt = resources.by_key(k)
            if rt is not None:
                new = clone(obj)
                new["metadata"]["finalizers"] = [
                    f for f in obj["metadata"]["finalizers"] if f != FOREGROUND
                ]
                self.update(rt, key[0], key[1], new, check_rv=False)

    def _by_uid(self, uid: Any) -> Stored | None:
        for k, table in self._objects.items():
            for key, obj in table.items():
                if obj["metadata"].get("uid") == uid:
                    return k, key, obj
        return None

    def put_raw(self, rt: ResourceType, obj: Obj) -> Obj:
        """Create or replace an object with its status (seeding: what its controllers would
        have reported written through `/status`, as they would write it)."""
        meta = obj.get("metadata", {})
        ns, name = meta.get("namespace", ""), meta["name"]
        if self.find(rt, ns, name) is None:
            stored = self.create(rt, ns, obj)
        else:
            stored = self.update(rt, ns, name, obj, check_rv=False)
        if "status" in obj and "status" in rt.subresources:
            stored["status"] = {**(stored.get("status") or {}), **obj["status"]}
            stored = self.update(rt, ns, name, stored, subresource="status", check_rv=False)
        return stored


def _normalize(rt: ResourceType, obj: Obj) -> None:
    """What the API server does to an object before storing it: a Secret's write-only
    `stringData` is merged into `data`, base64-encoded; a DeviceTaintRule's taint gets its
    `timeAdded`."""
    if rt.kind == "Secret" and rt.group == "" and obj.get("stringData"):
        data = dict(obj.get("data") or {})
        for key, value in obj.pop("stringData").items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data
    elif rt.kind == "Secret":
        obj.pop("stringData", None)
    elif rt.kind == "DeviceTaintRule":
        # "Added automatically during create or update if not set."
        taint = (obj.get("spec") or {}).get("taint")
        if isinstance(taint, dict) and not taint.get("timeAdded"):
            taint["timeAdded"] = now()


def _namespace_name_label(obj: Obj) -> None:
    """`SetDefaults_Namespace` and the namespace strategy's `Canonicalize`: every named
    namespace carries `kubernetes.io/metadata.name` with its name (what webhooks'
    namespaceSelectors and NetworkPolicies select on)."""
    meta = obj.setdefault("metadata", {})
    if meta.get("name"):
        meta["labels"] = {**(meta.get("labels") or {}), NAMESPACE_NAME_LABEL: meta["name"]}


def _untimed(entries: builtins.list[Obj]) -> builtins.list[Obj]:
    return [{k: v for k, v in e.items() if k != "time"} for e in entries]


def _spec_of(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


__all__ = ["Change", "Key", "Obj", "Prepared", "Store", "Watcher", "now"]
