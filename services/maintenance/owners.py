"""How a pod a controller owns is moved through its owner, never raced with it.

A StatefulSet creates `<set>-<ordinal>` again from its template the moment the name is
free, so a replacement created by anyone else would lose that race and the session with it.
The owner must first stop wanting the pod; then the replacement takes the name; then the
owner takes the replacement back as its own. Pod names are unique in a namespace, so there
is never a second copy, whatever the order of events.

- **StatefulSet** (no controller above it): *released* by deleting the set with
  `propagationPolicy: Orphan` (what `kubectl delete --cascade=orphan` does), its manifest
  saved first in the move's record; the garbage collector takes the set's reference off its
  pods, which keep running. The replacement is created with no controller. *Given back* by
  creating the set again from the record: the StatefulSet controller adopts the pods named
  after it whose labels match its selector (`ClaimPods`), the replacement among them, with
  its `controller-revision-hash` label unchanged, so nothing rolls. A set created again by
  someone else (a GitOps tool) before the stop ends the move (the set keeps its running
  pod); after the replacement exists, it is left as it is: it adopts the same way.
- **Kubeflow Notebook** (the set's controller): the notebook controller would create a
  deleted set again at once, so the Notebook is *released* by stopping it
  (`kubeflow-resource-stopped`, as the culler and the UI do, with `nodeward.io/moving` saying
  which maintenance did it) and waiting until its set no longer wants the pod's ordinal.
  The replacement is created controlled by the Notebook, so the stopped set neither adopts
  nor deletes it. *Given back* by removing only the stop nodeward set and, once the set wants
  the ordinal again, handing the pod's controller reference to the set (until then the set's
  create of the name is refused; it retries).

A release or give-back waits for the controllers with a bound and raises `TimeoutError`
when they have not acted: the move tries again next tick from the stage it saved.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from nodeward.kube import Cluster, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.client import MERGE_PATCH
from nodeward.kube.errors import AlreadyExists
from nodeward.kube.notebooks import STOP_ANNOTATION
from services.maintenance.state import MoveVia, PodPlan

MOVING_ANNOTATION = "nodeward.io/moving"
"""On a Notebook nodeward stopped to move its pod: `<maintenance id>/<the stop's value>`.
Only a stop carrying it, with that value, is undone."""
_KEPT_METADATA = ("name", "namespace", "labels", "annotations", "ownerReferences")
_POLL = 0.1


class OwnerRefused(Exception):
    """The owner cannot let the pod go (gone, replaced, stopped by someone, controlled by
    something nodeward does not know): the move fails before the pod is touched."""


def ordinal(name: str) -> int:
    """The StatefulSet ordinal at the end of a pod's name."""
    return int(name.rpartition("-")[2])


def controller_ref(obj: Obj) -> Obj | None:
    """The owner reference marked `controller: true`, if any."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def reference(obj: Obj) -> Obj:
    """A controller reference to `obj` (no `blockOwnerDeletion`: setting it needs update on
    the owner's `finalizers`, which nodeward does not hold; the controller's own adoption
    sets it)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


def recorded(statefulset: Obj) -> Obj:
    """The set as it is created again: its metadata but what the API server sets, its spec;
    no status."""
    meta = statefulset["metadata"]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {k: copy.deepcopy(meta[k]) for k in _KEPT_METADATA if meta.get(k)},
        "spec": copy.deepcopy(statefulset.get("spec") or {}),
    }


def stop_of(annotations: dict[str, str], maintenance_id: str) -> str | None:
    """The value of the stop this maintenance set on a Notebook, if its mark is there."""
    mark = annotations.get(MOVING_ANNOTATION) or ""
    owner, _, stamp = mark.partition("/")
    return stamp if owner == maintenance_id and stamp else None


def _wants(statefulset: Obj, index: int) -> bool | None:
    """Whether the set, as its controller last saw it, keeps ordinal `index`; None while
    its controller has not observed its latest spec."""
    status = statefulset.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(
        statefulset["metadata"].get("generation") or 1
    ):
        return None
    return index < int((statefulset.get("spec") or {}).get("replicas", 1))


async def _until(what: str, within: float, check: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} after {within:g}s")
        await asyncio.sleep(_POLL)


async def _get(read: Callable[[str, str], Awaitable[Obj]], namespace: str, name: str) -> Obj | None:
    try:
        return await read(namespace, name)
    except NotFound:
        return None


class Owners:
    """Releases and gives back the owner of one maintenance's pods."""

    def __init__(self, cluster: Cluster, maintenance_id: str, *, within: float) -> None:
        self.cluster, self.maintenance_id, self.within = cluster, maintenance_id, within

    async def decide(self, plan: PodPlan) -> tuple[MoveVia, Obj]:
        """How the pod's owner lets it go, and what to keep for the give-back: the set's
        manifest, or the Notebook's reference. `OwnerRefused` when it cannot."""
        assert plan.move is not None and plan.move.owner_name
        name = plan.move.owner_name
        sts = await _get(self.cluster.statefulsets.get, plan.namespace, name)
        was = next((o for o in plan.owners if o.get("controller")), {})
        if sts is None:
            raise OwnerRefused(f"its StatefulSet {name} is gone")
        if was.get("uid") and sts["metadata"]["uid"] != was.get("uid"):
            raise OwnerRefused(f"its StatefulSet {name} was replaced")
        above = controller_ref(sts)
        if above is None:
            return "statefulset", recorded(sts)
        if above.get("kind") != "Notebook" or not str(above.get("apiVersion", "")).startswith(
            "kubeflow.org/"
        ):
            raise OwnerRefused(
                f"its StatefulSet {name} is controlled by {above.get('kind')} "
                f"{above.get('name')}, which would create it again"
            )
        notebook = await _get(self.cluster.notebooks.get, plan.namespace, str(above["name"]))
        if notebook is None:
            raise OwnerRefused(f"its Notebook {above['name']} is gone")
        annotations = notebook["metadata"].get("annotations") or {}
        if STOP_ANNOTATION in annotations and stop_of(annotations, self.maintenance_id) is None:
            raise OwnerRefused(f"its Notebook {above['name']} is being stopped")
        return "notebook", reference(notebook)

    # -- release --------------------------------------------------------------------------
    async def release(self, plan: PodPlan) -> dict[str, Any]:
        """The owner no longer keeps the pod (idempotent: a repeat after a restart finds it
        done)."""
        assert plan.move is not None and plan.move.owner_record is not None
        if plan.move.via == "statefulset":
            return await self._orphan(plan, plan.move.owner_record)
        return await self._stop_notebook(plan, plan.move.owner_record)

    async def _orphan(self, plan: PodPlan, record: Obj) -> dict[str, Any]:
        ns, name = plan.namespace, record["metadata"]["name"]
        was = next((o for o in plan.owners if o.get("controller")), {})
        uid = str(was.get("uid") or "")
        sts = await _get(self.cluster.statefulsets.get, ns, name)
        if sts is not None and sts["metadata"]["uid"] == uid:
            await self.cluster.statefulsets.orphan(ns, name, uid)

        async def orphaned() -> bool:
            left = await _get(self.cluster.statefulsets.get, ns, name)
            if left is not None and left["metadata"]["uid"] == uid:
                return False
            if left is not None:  # it would make the pod again the moment it stops
                raise OwnerRefused(f"StatefulSet {name} was created again by someone else")
            pod = await _get(self.cluster.pods.get, ns, plan.name)
            return pod is None or (controller_ref(pod) or {}).get("uid") != uid

        await _until(f"StatefulSet {name} not gone, or {plan.key} still its", self.within, orphaned)
        return {"statefulset": name, "deleted": "orphan"}

    async def _stop_notebook(self, plan: PodPlan, notebook_ref: Obj) -> dict[str, Any]:
        ns, name = plan.namespace, str(notebook_ref["name"])
        notebook = await _get(self.cluster.notebooks.get, ns, name)
        if notebook is None:
            raise OwnerRefused(f"its Notebook {name} is gone")
        annotations = notebook["metadata"].get("annotations") or {}
        if stop_of(annotations, self.maintenance_id) is None:
            if STOP_ANNOTATION in annotations:  # stopped by someone else: theirs to undo
                raise OwnerRefused(f"its Notebook {name} is being stopped")
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            # Revision-checked: a stop someone sets meanwhile makes this a conflict, tried
            # again next tick (and then refused above), never overwritten.
            await self.cluster.notebooks.set_annotations(
                ns,
                name,
                {STOP_ANNOTATION: stamp, MOVING_ANNOTATION: f"{self.maintenance_id}/{stamp}"},
                resource_version=notebook["metadata"]["resourceVersion"],
            )
        index = ordinal(plan.name)
        sts_name = str(plan.move.owner_name) if plan.move else name

        async def let_go() -> bool:
            sts = await _get(self.cluster.statefulsets.get, ns, sts_name)
            return sts is None or _wants(sts, index) is False

        await _until(f"Notebook {name}'s StatefulSet still wants {plan.key}", self.within, let_go)
        return {"notebook": name, "stopped": True}

    # -- give back ------------------------------------------------------------------------
    async def give_back(self, plan: PodPlan) -> dict[str, Any]:
        """The owner keeps the pod again: a replacement of nodeward's becomes its own, or
        (with none) it creates the pod from its template. Idempotent."""
        assert plan.move is not None and plan.move.owner_record is not None
        if plan.move.via == "statefulset":
            return await self._recreate(plan, plan.move.owner_record)
        return await self._start_notebook(plan, plan.move.owner_record)

    async def _recreate(self, plan: PodPlan, record: Obj) -> dict[str, Any]:
        ns, name = plan.namespace, record["metadata"]["name"]
        created = True
        try:
            await self.cluster.statefulsets.create(ns, copy.deepcopy(record))
        except AlreadyExists:
            created = False  # created again meanwhile (by GitOps): it adopts the same way
        replacement = plan.move.uid if plan.move else None

        async def adopted() -> bool:
            sts = await _get(self.cluster.statefulsets.get, ns, name)
            pod = await _get(self.cluster.pods.get, ns, plan.name)
            if sts is None:
                return False
            if pod is None or pod["metadata"].get("uid") != replacement:
                return True  # no replacement of nodeward's: the set creates the pod itself
            return bool((controller_ref(pod) or {}).get("uid") == sts["metadata"]["uid"])

        await _until(f"{plan.key} not adopted by StatefulSet {name}", self.within, adopted)
        return {"statefulset": name, "created": created}

    async def _start_notebook(self, plan: PodPlan, notebook_ref: Obj) -> dict[str, Any]:
        ns, name = plan.namespace, str(notebook_ref["name"])
        notebook = await _get(self.cluster.notebooks.get, ns, name)
        if notebook is None:
            return {"notebook": name, "gone": True}  # deleted: its pods go with it
        annotations = notebook["metadata"].get("annotations") or {}
        stamp = stop_of(annotations, self.maintenance_id)
        if stamp is not None:
            lift: dict[str, str | None] = {MOVING_ANNOTATION: None}
            if annotations.get(STOP_ANNOTATION) == stamp:
                lift[STOP_ANNOTATION] = None
                annotations = {k: v for k, v in annotations.items() if k != STOP_ANNOTATION}
            await self.cluster.notebooks.set_annotations(
                ns, name, lift, resource_version=notebook["metadata"]["resourceVersion"]
            )
        assert plan.move is not None
        if STOP_ANNOTATION in annotations:
            return await self._stopped_meanwhile(plan, notebook_ref)
        sts_name, index = str(plan.move.owner_name), ordinal(plan.name)
        sts: Obj | None = None

        async def wants() -> bool:
            nonlocal sts
            sts = await _get(self.cluster.statefulsets.get, ns, sts_name)
            return sts is not None and bool(_wants(sts, index))

        await _until(f"Notebook {name}'s StatefulSet does not want {plan.key}", self.within, wants)
        assert sts is not None
        pod = await _get(self.cluster.pods.get, ns, plan.name)
        handed = False
        if pod is not None and (controller_ref(pod) or {}).get("uid") == notebook_ref["uid"]:
            refs = [
                o for o in pod["metadata"].get("ownerReferences") or [] if not o.get("controller")
            ]
            patch = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "ownerReferences": [*refs, reference(sts)],
                }
            }
            await self.cluster.pods.patch(ns, plan.name, patch, content_type=MERGE_PATCH)
            handed = True
        return {"notebook": name, "started": True, "handed_to": sts_name if handed else None}

    async def _stopped_meanwhile(self, plan: PodPlan, notebook_ref: Obj) -> dict[str, Any]:
        """Someone stopped the Notebook during the move: their stop stays, and the
        replacement it still controls goes, as its set would have deleted its pod."""
        pod = await _get(self.cluster.pods.get, plan.namespace, plan.name)
        evicted = None
        if pod is not None and (controller_ref(pod) or {}).get("uid") == notebook_ref["uid"]:
            evicted = pod["metadata"]["uid"]
            await self.cluster.pods.evict(plan.namespace, plan.name, uid=evicted)
        return {"notebook": notebook_ref["name"], "stopped_by_someone": True, "evicted": evicted}
