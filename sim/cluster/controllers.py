"""The control plane behind the sim cluster's API: kube-scheduler and the kube-controller-manager
controllers whose results nodeward can see.

- **Scheduler** (`pkg/scheduler`, its default filters): a pending pod for `default-scheduler`
  bound to no node is bound (`pods/binding`) to a node that is Ready and schedulable
  (`NodeUnschedulable`), whose `NoSchedule`/`NoExecute` taints it tolerates (`TaintToleration`),
  whose labels its `nodeSelector` and required node affinity match (`NodeAffinity`) and whose
  allocatable still fits its requests (`NodeResourcesFit`); of those, the one with the fewest
  pods, then by name. When none fits, the pod gets `PodScheduled=False` (`Unschedulable`,
  "0/N nodes are available: ...") and is tried again when a node or a pod changes.
- **ReplicaSet** (`pkg/controller/replicaset`): keeps `replicas` active pods (not terminating,
  not finished) owned by it, creating `<name>-xxxxx` from its template at once when one
  starts terminating, deleting the surplus (unscheduled, then not ready, then newest first).
- **Deployment** (`pkg/controller/deployment`): owns one ReplicaSet per pod template
  (`<name>-<pod-template-hash>`), scaled to `replicas`; the others to 0 (the `Recreate`
  outcome; a rolling update's intermediate steps are not simulated).
- **StatefulSet** (`pkg/controller/statefulset`, `OrderedReady`): pods `<name>-0` ..
  `<name>-(replicas-1)`, each created only when the ones before it are Running and Ready, and
  created again under the same name only once the old one is gone (so a drained session
  comes back elsewhere after its pod has terminated); surplus ordinals deleted from the top.
  Its pods are claimed as `ClaimPods` claims them (`getPodsForStatefulSet`): an orphan named
  `<set>-<ordinal>` whose labels match the selector, not being deleted, is adopted (so a
  StatefulSet deleted with `propagationPolicy: Orphan` and created again takes its running
  pods back); one it owns whose labels no longer match is released; a pod another controller
  owns is left alone, and its name stays taken (the set's create of it is refused).
- **Job** (`pkg/controller/job`): keeps `parallelism` pods running until `completions` have
  succeeded; a terminating pod is replaced at once (`podReplacementPolicy:
  TerminatingOrFailed`); more failed pods than `backoffLimit` fail the Job.
- **Pod GC** (`pkg/controller/podgc/gc_controller.go`): the pods of a deleted node are marked
  `Failed` with `DisruptionTarget` (`DeletionByPodGC`, `PodGC: node no longer exists`) and
  force-deleted (`gcOrphaned`); a terminating pod on a node that is not Ready and carries the
  `node.kubernetes.io/out-of-service` taint (any effect) is marked `Failed` and force-deleted
  (`gcTerminating`, the non-graceful node shutdown). Both at once, where the real controller
  looks every 20 s (and waits 40 s for a node to stay gone).
- **Taint eviction** (`pkg/controller/tainteviction/taint_eviction.go`): a pod on a node with
  a `NoExecute` taint it does not tolerate gets `DisruptionTarget` (`DeletionByTaintManager`,
  `Taint manager: deleting due to NoExecute taint`) and is deleted, at once, or after the
  least `tolerationSeconds` of the tolerations it uses (`processPodOnNode`: an eviction
  scheduled stays as it is; it is cancelled when the node loses its `NoExecute` taints or the
  pod goes).
- The node lifecycle controller is `sim.cluster.nodelifecycle`.

Each works on the store directly, in the event loop, after the change that concerns it.
Their writes are the controllers' own (owner references with `controller: true`, status
through `/status`), so a watch sees what a real cluster's would.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from nodeward.logs import get_logger
from sim.cluster import convert
from sim.cluster.errors import ApiError
from sim.cluster.resources import ResourceType, require
from sim.cluster.selectors import match_label_selector_object
from sim.cluster.store import Change, Obj, Store, now

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")
REPLICASETS = require("apps", "v1", "replicasets")
DEPLOYMENTS = require("apps", "v1", "deployments")
STATEFULSETS = require("apps", "v1", "statefulsets")
JOBS = require("batch", "v1", "jobs")
EVENTS = require("events.k8s.io", "v1", "events")
SCHEDULER = "default-scheduler"
TEMPLATE_HASH = "pod-template-hash"
_KINDS = {"ReplicaSet": "rs", "StatefulSet": "sts", "Job": "job", "Deployment": "deploy"}
_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"

Item = tuple[str, str, str]  # (what, namespace, name)


def controller_of(obj: Obj) -> dict[str, Any] | None:
    """The ownerReference marked `controller: true`, if any."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def active(pod: Obj) -> bool:
    """Not terminating and not finished (`controller.FilterActivePods`)."""
    phase = (pod.get("status") or {}).get("phase")
    return not pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


def ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    """`v1.Toleration.ToleratesTaint`: effect (empty: any), key (empty with Exists: any),
    operator Equal (the default) or Exists."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("key") and t.get("key") != taint.get("key"):
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def quantity(text: Any) -> float:
    """A resource quantity as a number (cpu in cores, memory in bytes)."""
    s = str(text)
    if s.endswith("m"):
        return float(s[:-1]) / 1000
    for suffix, factor in _UNITS.items():
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * factor
    return float(s)


def requests_of(pod: Obj) -> dict[str, float]:
    """What a pod asks of its node: the sum over its containers, at least each init
    container's (`resourcehelper.PodRequests`)."""
    total: dict[str, float] = {}
    spec = pod.get("spec") or {}
    for c in spec.get("containers") or []:
        for name, value in ((c.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, 0.0) + quantity(value)
    for c in spec.get("initContainers") or []:
        for name, value in ((c.get("resources") or {}).get("requests") or {}).items():
            total[name] = max(total.get(name, 0.0), quantity(value))
    return total


def _affinity_matches(pod: Obj, node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    spec = pod.get("spec") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if not required:
        return True
    return any(
        match_label_selector_object({"matchExpressions": t.get("matchExpressions") or []}, labels)
        for t in required
    )


def _waits_for_scheduler(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and spec.get("schedulerName", SCHEDULER) == SCHEDULER
        and not spec.get("schedulingGates")
        and active(pod)
    )


def _no_execute(node: Obj) -> list[Obj]:
    return [
        t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"
    ]


def _out_of_service(node: Obj) -> bool:
    return any(t.get("key") == OUT_OF_SERVICE for t in (node.get("spec") or {}).get("taints") or [])


def _node_ready(node: Obj) -> bool:
    """`nodeutil.IsNodeReady`."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def _with_condition(status: Obj, cond: Obj, at: str) -> bool:
    """`UpdatePodCondition`: set `cond` in `status` (its `lastTransitionTime` kept unless its
    status changes); whether anything changed."""
    conditions = status.setdefault("conditions", [])
    old = next((c for c in conditions if c.get("type") == cond["type"]), None)
    new = {**cond, "lastProbeTime": None, "lastTransitionTime": at}
    if old is None:
        conditions.append(new)
        return True
    if old.get("status") == new["status"]:
        new["lastTransitionTime"] = old.get("lastTransitionTime")
    if all(old.get(k) == new.get(k) for k in ("status", "reason", "message", "lastTransitionTime")):
        return False
    conditions[conditions.index(old)] = new
    return True


def template_hash(template: Obj) -> str:
    """A stable short hash of a pod template (the `pod-template-hash` label's role)."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:10]


@dataclass(frozen=True)
class ControllerAdmission:
    """How a controller's pod create reaches the admission webhooks, as every controller's
    write reaches kube-apiserver's: `matches(namespace, pod, controller)` says whether any
    webhook is called on it (if none, the pod is stored at once, as before); `create(...)`
    runs the API server's create with them (an ApiError when refused)."""

    matches: Callable[[str, Obj, str], bool]
    create: Callable[[str, Obj, str], Awaitable[Obj]]


_CONTROLLER_ACCOUNTS = MappingProxyType(
    {"ReplicaSet": "replicaset-controller", "StatefulSet": "statefulset-controller",
     "Job": "job-controller"}
)  # fmt: skip
"""The ServiceAccount each controller writes as (`--use-service-account-credentials`)."""
CREATE_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""How long a controller waits before it tries again a pod create that was refused."""


class ControlPlane:
    """The scheduler and the controllers; `install` hooks them on the store.

    A controller's pod create that an admission webhook would see is made as the API
    server makes any create (`ControllerAdmission`), asynchronously: until it is answered the
    pod counts as expected (`ControllerExpectations`), so no second one is made; a refusal
    is a Warning Event `FailedCreate` on the owner, in the controller's words
    (`replica_set.go`, `job_controller.go`: `Error creating: ERR`; `stateful_pod_control.go`:
    `create Pod P in StatefulSet S failed error: ERR`), and the owner is synced again after a
    growing back-off."""

    def __init__(self, store: Store, *, admission: ControllerAdmission | None = None) -> None:
        self.store = store
        self.admission = admission
        self._expected: dict[str, set[str]] = {}
        """owner uid -> the names (or generateName tokens) of its creates in flight"""
        self._refusals: dict[str, int] = {}
        """owner uid -> its creates refused in a row"""
        self._tasks: set[asyncio.Task[None]] = set()
        self._queue: dict[Item, None] = {}
        self._pending: set[tuple[str, str]] = set()  # pods waiting for the scheduler
        self._scheduled = False
        self._log = get_logger(component="sim-control-plane")
        self._handlers: dict[str, Callable[[str, str], None]] = {
            "rs": self._replicaset,
            "deploy": self._deployment,
            "sts": self._statefulset,
            "job": self._job,
            "schedule": self._schedule_pending,
            "gc": self._pod_gc,
            "gcterm": self._gc_terminating,
            "noexecute": self._taint_eviction,
        }
        # pod -> (uid, its eviction's timer) for the evictions the taint controller schedules
        self._evictions: dict[tuple[str, str], tuple[str, asyncio.TimerHandle]] = {}

    def install(self) -> None:
        self.store.hooks.append(self._hook)

    # --- what a change concerns ---------------------------------------------------------

    def _hook(self, change: Change) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no control plane (a store used on its own)
        meta = change.obj["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        if change.key == PODS.key:
            ref = controller_of(change.obj)
            if ref and ref.get("kind") in _KINDS:
                self._enqueue((_KINDS[ref["kind"]], ns, ref["name"]))
            old_ref = controller_of(change.old or {})
            if old_ref and old_ref.get("kind") in _KINDS and old_ref != ref:
                self._enqueue((_KINDS[old_ref["kind"]], ns, old_ref["name"]))
            parent, _, ordinal = name.rpartition("-")
            if ref is None and parent and ordinal.isdigit():
                self._enqueue(("sts", ns, parent))  # an orphan its set may adopt
            if change.type != "DELETED" and _waits_for_scheduler(change.obj):
                self._pending.add((ns, name))
            else:
                self._pending.discard((ns, name))
            if change.type == "DELETED":
                self._cancel_eviction(ns, name, meta.get("uid"))
            node_name = (change.obj.get("spec") or {}).get("nodeName")
            if (
                node_name
                and meta.get("deletionTimestamp")
                and not ((change.old or {}).get("metadata") or {}).get("deletionTimestamp")
            ):
                self._enqueue(("gcterm", "", node_name))
            self._enqueue(("schedule", "", ""))
            if change.type == "ADDED" or (change.obj.get("spec") or {}).get("nodeName") != (
                (change.old or {}).get("spec") or {}
            ).get("nodeName"):
                node = (change.obj.get("spec") or {}).get("nodeName")
                if node:
                    self._enqueue(("noexecute", "", node))
        elif change.key == NODES.key:
            if change.type == "DELETED":
                self._enqueue(("gc", "", name))
                self._enqueue(("noexecute", "", name))  # its scheduled evictions cancelled
            else:
                self._enqueue(("schedule", "", ""))
                if _no_execute(change.obj) != _no_execute(change.old or {}):
                    self._enqueue(("noexecute", "", name))
                if _out_of_service(change.obj):
                    self._enqueue(("gcterm", "", name))
        elif change.key in (REPLICASETS.key, STATEFULSETS.key, JOBS.key, DEPLOYMENTS.key):
            kind = {
                REPLICASETS.key: "rs",
                STATEFULSETS.key: "sts",
                JOBS.key: "job",
                DEPLOYMENTS.key: "deploy",
            }[change.key]
            if change.type != "DELETED":
                self._enqueue((kind, ns, name))
            ref = controller_of(change.obj)
            if ref and ref.get("kind") == "Deployment":
                self._enqueue(("deploy", ns, ref["name"]))

    def _enqueue(self, item: Item) -> None:
        self._queue[item] = None
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Work off what is queued, in order; what that work changes queues more, for the
        next turn of the loop."""
        self._scheduled = False
        items, self._queue = list(self._queue), {}
        for what, ns, name in items:
            try:
                self._handlers[what](ns, name)
            except ApiError as exc:  # a controller's write refused: it tries on the next change
                self._log.info(
                    "sim_control_plane.refused", item=f"{what}/{ns}/{name}", error=exc.message
                )

    # --- scheduler ----------------------------------------------------------------------

    def _schedule_pending(self, _ns: str, _name: str) -> None:
        if not self._pending:
            return
        pending = [
            p
            for ns, name in list(self._pending)
            if (p := self.store.find(PODS, ns, name)) is not None and _waits_for_scheduler(p)
        ]
        if not pending:
            return
        nodes = self.store.peek(NODES)
        load: dict[str, int] = {}
        used: dict[str, dict[str, float]] = {}
        for p in self.store.peek(PODS):
            node = (p.get("spec") or {}).get("nodeName")
            if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                load[node] = load.get(node, 0) + 1
                for k, v in requests_of(p).items():
                    used.setdefault(node, {})[k] = used.get(node, {}).get(k, 0.0) + v
        for pod in sorted(pending, key=lambda p: p["metadata"]["creationTimestamp"]):
            self._schedule_one(pod, nodes, load, used)

    def _schedule_one(
        self,
        pod: Obj,
        nodes: list[Obj],
        load: dict[str, int],
        used: dict[str, dict[str, float]],
    ) -> None:
        meta = pod["metadata"]
        wants = requests_of(pod)
        reasons: dict[str, int] = {}
        fits: list[Obj] = []
        for node in nodes:
            why = self._filter(pod, node, wants, used.get(node["metadata"]["name"], {}))
            if why:
                reasons[why] = reasons.get(why, 0) + 1
            else:
                fits.append(node)
        if not fits:
            summary = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            message = f"0/{len(nodes)} nodes are available: {summary}."
            self._unschedulable(meta["namespace"], meta["name"], message)
            return
        chosen = min(
            fits, key=lambda n: (load.get(n["metadata"]["name"], 0), n["metadata"]["name"])
        )
        name = chosen["metadata"]["name"]
        self.store.bind(meta["namespace"], meta["name"], name, now())
        load[name] = load.get(name, 0) + 1
        for k, v in wants.items():
            used.setdefault(name, {})[k] = used.get(name, {}).get(k, 0.0) + v

    def _filter(self, pod: Obj, node: Obj, wants: dict[str, float], used: dict[str, float]) -> str:
        """Why `node` cannot take `pod`, in the scheduler's words; "" if it can."""
        spec = node.get("spec") or {}
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        conditions = (node.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return "node(s) were not ready"
        unschedulable = {"key": _UNSCHEDULABLE, "effect": "NoSchedule"}
        if spec.get("unschedulable") and not tolerates(tolerations, unschedulable):
            return "node(s) were unschedulable"
        for taint in spec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                tolerations, taint
            ):
                return "node(s) had untolerated taint(s)"
        if not _affinity_matches(pod, node):
            return "node(s) didn't match Pod's node affinity/selector"
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for resource, amount in wants.items():
            if amount <= 0:
                continue
            have = quantity(allocatable.get(resource, 0))
            if used.get(resource, 0.0) + amount > have:
                return f"Insufficient {resource}"
        return ""

    def _unschedulable(self, namespace: str, name: str, message: str) -> None:
        pod = self.store.find(PODS, namespace, name)
        if pod is None:
            return
        status = pod.setdefault("status", {})
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": now(),
            "reason": "Unschedulable",
            "message": message,
        }
        others = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        current = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None
        )
        if current and current.get("message") == message:
            return
        status["conditions"] = [*others, condition]
        self.store.update(PODS, namespace, name, pod, subresource="status", check_rv=False)

    # --- pods of a workload ---------------------------------------------------------------

    def _live(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        """The object, unless there is none or it is being deleted."""
        obj = self.store.find(rt, namespace, name)
        return None if obj is None or obj["metadata"].get("deletionTimestamp") else obj

    def _owned(self, namespace: str, uid: str) -> list[Obj]:
        return [
            p
            for p in self.store.peek(PODS, namespace)
            if (controller_of(p) or {}).get("uid") == uid
        ]

    def _in_flight(self, owner: Obj) -> set[str]:
        return self._expected.get(owner["metadata"]["uid"], set())

    def _create_pod(self, owner: Obj, kind: str, template: Obj, name: str = "") -> None:
        meta = copy.deepcopy(template.get("metadata") or {})
        meta["namespace"] = owner["metadata"]["namespace"]
        if name:
            meta["name"] = name
        else:
            meta["generateName"] = f"{owner['metadata']['name']}-"
        meta["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": kind,
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        spec = copy.deepcopy(template.get("spec") or {})
        spec.pop("nodeName", None)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        controller = _CONTROLLER_ACCOUNTS.get(kind, "generic-controller")
        if self.admission is None or not self.admission.matches(meta["namespace"], pod, controller):
            self.store.create(PODS, meta["namespace"], pod)
            return
        uid = owner["metadata"]["uid"]
        token = name or f"pending-{uuid.uuid4().hex[:8]}"
        self._expected.setdefault(uid, set()).add(token)
        task = asyncio.get_running_loop().create_task(
            self._admitted_create(owner, kind, pod, controller, token)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _admitted_create(
        self, owner: Obj, kind: str, pod: Obj, controller: str, token: str
    ) -> None:
        """One create through admission; then the owner is synced again (at once, or after
        the back-off when refused)."""
        assert self.admission is not None
        meta = owner["metadata"]
        uid, namespace = meta["uid"], meta["namespace"]
        item: Item = (_KINDS[kind], namespace, meta["name"])
        delay = 0.0
        try:
            await self.admission.create(namespace, pod, controller)
            self._refusals.pop(uid, None)
        except ApiError as exc:
            refused = self._refusals.get(uid, 0)
            self._refusals[uid] = refused + 1
            delay = CREATE_BACKOFF_S[min(refused, len(CREATE_BACKOFF_S) - 1)]
            if kind == "StatefulSet":
                message = (
                    f"create Pod {pod['metadata'].get('name')} in StatefulSet {meta['name']} "
                    f"failed error: {exc.message}"
                )
            else:
                message = f"Error creating: {exc.message}"
            self._failed_create(owner, kind, message)
            self._log.info("sim_control_plane.create_refused", owner=f"{namespace}/{meta['name']}",
                           error=exc.message)  # fmt: skip
        finally:
            tokens = self._expected.get(uid, set())
            tokens.discard(token)
            if not tokens:
                self._expected.pop(uid, None)
        if delay:
            asyncio.get_running_loop().call_later(delay, self._enqueue, item)
        else:
            self._enqueue(item)

    def _failed_create(self, owner: Obj, kind: str, message: str) -> None:
        """The controller's Warning Event `FailedCreate` on `owner`."""
        meta = owner["metadata"]
        at = now()
        event = {
            "metadata": {
                "name": f"{meta['name']}.{time.time_ns():x}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": owner.get("apiVersion", ""),
                "kind": kind,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": "FailedCreate",
            "message": message,
            "type": "Warning",
            "source": {"component": _CONTROLLER_ACCOUNTS.get(kind, "controller-manager")},
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
            "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "action": "Create",
            "reportingComponent": "kube-controller-manager",
            "reportingInstance": "kube-controller-manager-sim",
        }
        try:
            self.store.create(EVENTS, meta["namespace"], convert.from_core_event(event))
        except ApiError as exc:
            self._log.info("sim_control_plane.event_refused", error=exc.message)

    def _set_status(self, rt: Any, obj: Obj, status: Obj) -> None:
        current = obj.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        new = copy.deepcopy(obj)
        new["status"] = {**current, **status}
        meta = obj["metadata"]
        self.store.update(
            rt, meta.get("namespace", ""), meta["name"], new, subresource="status", check_rv=False
        )

    @staticmethod
    def _counts(pods: list[Obj], generation: int) -> Obj:
        live = [p for p in pods if active(p)]
        n_ready = sum(1 for p in live if ready(p))
        return {
            "replicas": len(live),
            "readyReplicas": n_ready,
            "availableReplicas": n_ready,
            "observedGeneration": generation,
        }

    def _replicaset(self, namespace: str, name: str) -> None:
        rs = self._live(REPLICASETS, namespace, name)
        if rs is None:
            return
        spec = rs.get("spec") or {}
        want = int(spec.get("replicas", 1))
        pods = self._owned(namespace, rs["metadata"]["uid"])
        live = [p for p in pods if active(p)]
        for _ in range(want - len(live) - len(self._in_flight(rs))):
            self._create_pod(rs, "ReplicaSet", spec.get("template") or {})
        if len(live) > want:
            ranked = sorted(
                live,
                key=lambda p: (
                    bool((p.get("spec") or {}).get("nodeName")),
                    ready(p),
                    p["metadata"]["creationTimestamp"],
                ),
            )
            surplus = ranked[: len(live) - want]
            for p in surplus:
                self.store.delete(PODS, namespace, p["metadata"]["name"])
        pods = self._owned(namespace, rs["metadata"]["uid"])
        status = self._counts(pods, rs["metadata"].get("generation", 1))
        status["fullyLabeledReplicas"] = status["replicas"]
        self._set_status(REPLICASETS, rs, status)

    def _deployment(self, namespace: str, name: str) -> None:
        deploy = self._live(DEPLOYMENTS, namespace, name)
        if deploy is None:
            return
        spec = deploy.get("spec") or {}
        template = copy.deepcopy(spec.get("template") or {})
        digest = template_hash(template)
        uid = deploy["metadata"]["uid"]
        owned = [
            rs
            for rs in self.store.peek(REPLICASETS, namespace)
            if (controller_of(rs) or {}).get("uid") == uid
        ]
        current = next(
            (
                rs
                for rs in owned
                if (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH) == digest
            ),
            None,
        )
        want = int(spec.get("replicas", 1))
        if current is None:
            template.setdefault("metadata", {}).setdefault("labels", {})[TEMPLATE_HASH] = digest
            selector = copy.deepcopy(spec.get("selector") or {})
            selector.setdefault("matchLabels", {})[TEMPLATE_HASH] = digest
            made: Obj = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{name}-{digest}",
                    "namespace": namespace,
                    "labels": {**(template["metadata"].get("labels") or {})},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": name,
                            "uid": uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {"replicas": want, "selector": selector, "template": template},
            }
            self.store.create(REPLICASETS, namespace, made)
        for rs in owned:
            target = want if rs is current else 0
            if int((rs.get("spec") or {}).get("replicas", 1)) != target:
                scaled = copy.deepcopy(rs)
                scaled["spec"]["replicas"] = target
                self.store.update(
                    REPLICASETS, namespace, rs["metadata"]["name"], scaled, check_rv=False
                )
        pods = [p for rs in owned for p in self._owned(namespace, rs["metadata"]["uid"])]
        status = self._counts(pods, deploy["metadata"].get("generation", 1))
        status["updatedReplicas"] = sum(
            1
            for p in pods
            if active(p) and (p["metadata"].get("labels") or {}).get(TEMPLATE_HASH) == digest
        )
        status["unavailableReplicas"] = max(0, want - status["availableReplicas"])
        self._set_status(DEPLOYMENTS, deploy, status)

    def _statefulset(self, namespace: str, name: str) -> None:
        sts = self._live(STATEFULSETS, namespace, name)
        if sts is None:
            return
        spec = sts.get("spec") or {}
        want = int(spec.get("replicas", 1))
        parallel = spec.get("podManagementPolicy") == "Parallel"
        uid = sts["metadata"]["uid"]
        self._claim(sts)
        by_name = {p["metadata"]["name"]: p for p in self.store.peek(PODS, namespace)}
        for ordinal in range(want):
            pod_name = f"{name}-{ordinal}"
            pod = by_name.get(pod_name)
            if pod is None and pod_name in self._in_flight(sts):
                if not parallel:
                    break  # its create is still being admitted
                continue
            if pod is None:
                template = copy.deepcopy(spec.get("template") or {})
                labels = template.setdefault("metadata", {}).setdefault("labels", {})
                labels["statefulset.kubernetes.io/pod-name"] = pod_name
                labels["apps.kubernetes.io/pod-index"] = str(ordinal)
                template.setdefault("spec", {})["hostname"] = pod_name
                if spec.get("serviceName"):
                    template["spec"]["subdomain"] = spec["serviceName"]
                self._create_pod(sts, "StatefulSet", template, pod_name)
                if not parallel:
                    break  # the next ordinal waits until this one is Running and Ready
                continue
            if (controller_of(pod) or {}).get("uid") != uid:
                continue  # not ours: the controller leaves it alone
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                self.store.delete(PODS, namespace, pod_name)
                break
            if not parallel and not ready(pod):
                break  # OrderedReady: one at a time, in order
        surplus = sorted(
            (
                p
                for p in self._owned(namespace, uid)
                if p["metadata"]["name"].rpartition("-")[2].isdigit()
                and int(p["metadata"]["name"].rpartition("-")[2]) >= want
            ),
            key=lambda p: -int(p["metadata"]["name"].rpartition("-")[2]),
        )
        for p in surplus[: None if parallel else 1]:
            if not p["metadata"].get("deletionTimestamp"):
                self.store.delete(PODS, namespace, p["metadata"]["name"])
        pods = self._owned(namespace, uid)
        status = self._counts(pods, sts["metadata"].get("generation", 1))
        status["currentReplicas"] = status["updatedReplicas"] = status["replicas"]
        self._set_status(STATEFULSETS, sts, status)

    def _claim(self, sts: Obj) -> None:
        """`ClaimPods` with `isMemberOf`: adopt the set's orphans, release what no longer
        matches its selector."""
        meta = sts["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        selector = (sts.get("spec") or {}).get("selector")
        for pod in self.store.peek(PODS, namespace):
            pmeta = pod["metadata"]
            parent, _, ordinal = pmeta["name"].rpartition("-")
            member = parent == meta["name"] and ordinal.isdigit()
            matches = member and match_label_selector_object(selector, pmeta.get("labels"))
            ref = controller_of(pod)
            refs = list(pmeta.get("ownerReferences") or [])
            if ref is None and matches and not pmeta.get("deletionTimestamp"):
                refs.append(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": meta["name"],
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                )
            elif ref is not None and ref.get("uid") == uid and not matches:
                refs = [r for r in refs if r.get("uid") != uid]
            else:
                continue
            new = copy.deepcopy(pod)
            new["metadata"]["ownerReferences"] = refs
            self.store.update(PODS, namespace, pmeta["name"], new, check_rv=False)

    def _job(self, namespace: str, name: str) -> None:
        job = self._live(JOBS, namespace, name)
        if job is None:
            return
        spec, status = job.get("spec") or {}, job.get("status") or {}
        if any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            return
        pods = self._owned(namespace, job["metadata"]["uid"])
        succeeded = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
        failed = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
        live = [p for p in pods if active(p)]
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1))
        at = now()
        if completions is not None and succeeded >= int(completions):
            self._set_status(
                JOBS,
                job,
                {
                    "active": 0,
                    "succeeded": succeeded,
                    "failed": failed,
                    "completionTime": at,
                    "conditions": [
                        {"type": t, "status": "True", "lastProbeTime": at, "lastTransitionTime": at}
                        for t in ("SuccessCriteriaMet", "Complete")
                    ],
                },
            )
            return
        if failed > int(spec.get("backoffLimit", 6)):
            for p in live:
                self.store.delete(PODS, namespace, p["metadata"]["name"])
            self._set_status(
                JOBS,
                job,
                {
                    "active": 0,
                    "failed": failed,
                    "conditions": [
                        {
                            "type": t,
                            "status": "True",
                            "reason": "BackoffLimitExceeded",
                            "message": "Job has reached the specified backoff limit",
                            "lastProbeTime": at,
                            "lastTransitionTime": at,
                        }
                        for t in ("FailureTarget", "Failed")
                    ],
                },
            )
            return
        want = parallelism
        if completions is not None:
            want = min(parallelism, int(completions) - succeeded)
        if not spec.get("suspend"):
            for _ in range(want - len(live) - len(self._in_flight(job))):
                self._create_pod(job, "Job", spec.get("template") or {})
        live = [p for p in self._owned(namespace, job["metadata"]["uid"]) if active(p)]
        terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")]
        counts: Obj = {
            "active": len(live),
            "ready": sum(1 for p in live if ready(p)),
            "succeeded": succeeded,
            "failed": failed,
            "terminating": len(terminating),
        }
        counts.setdefault("startTime", status.get("startTime") or at)
        self._set_status(JOBS, job, counts)

    # --- node lifecycle -----------------------------------------------------------------

    def _pod_gc(self, _ns: str, node: str) -> None:
        """`gcOrphaned`: the pods of a deleted node go."""
        if self.store.find(NODES, "", node) is not None:
            return
        for p in list(self.store.peek(PODS)):
            if (p.get("spec") or {}).get("nodeName") == node:
                disrupted = {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByPodGC",
                    "message": "PodGC: node no longer exists",
                }
                self._fail_and_force_delete(p, disrupted)

    def _gc_terminating(self, _ns: str, node_name: str) -> None:
        """`gcTerminating`: the terminating pods of a node that is not Ready and carries the
        out-of-service taint are force-deleted (the non-graceful node shutdown)."""
        node = self.store.peek_one(NODES, "", node_name)
        if node is None or _node_ready(node) or not _out_of_service(node):
            return
        terminating = [
            p
            for p in self.store.peek(PODS)
            if (p.get("spec") or {}).get("nodeName") == node_name
            and p["metadata"].get("deletionTimestamp")
        ]
        for p in sorted(
            terminating, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"])
        ):
            self._log.info("pod gc force-deletes", pod=p["metadata"]["name"], node=node_name)
            self._fail_and_force_delete(p, None)

    def _fail_and_force_delete(self, pod: Obj, cond: Obj | None) -> None:
        """`markFailedAndDeletePodWithCondition`: `Failed` (with `cond`) unless finished,
        then deleted with grace 0."""
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            new = copy.deepcopy(pod)
            status = new.setdefault("status", {})
            status["phase"] = "Failed"
            if cond is not None:
                _with_condition(status, cond, now())
            self.store.update(PODS, namespace, name, new, subresource="status", check_rv=False)
        self.store.delete(PODS, namespace, name, grace_period=0, precondition_uid=meta["uid"])

    def _taint_eviction(self, _ns: str, node_name: str) -> None:
        """`handleNodeUpdate`: each pod on the node, by its tolerations of the node's
        `NoExecute` taints (none: its scheduled eviction cancelled)."""
        node = self.store.peek_one(NODES, "", node_name)
        taints = _no_execute(node) if node is not None else []
        if not taints:  # only the evictions scheduled for its pods to cancel
            for (namespace, name), (uid, _) in list(self._evictions.items()):
                pod = self.store.peek_one(PODS, namespace, name)
                if pod is None or (pod.get("spec") or {}).get("nodeName") == node_name:
                    self._cancel_eviction(namespace, name, uid)
            return
        for p in list(self.store.peek(PODS)):
            if (p.get("spec") or {}).get("nodeName") != node_name:
                continue
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            self._process_pod(p, taints)

    def _process_pod(self, pod: Obj, taints: list[Obj]) -> None:
        """`processPodOnNode`."""
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if not taints:
            self._cancel_eviction(namespace, name, uid)
            return
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        used = []  # `GetMatchingTolerations`: the first toleration of each taint
        for taint in taints:
            match = next((t for t in tolerations if tolerates([t], taint)), None)
            if match is None:
                self._cancel_eviction(namespace, name, uid)
                self._evict(namespace, name, uid)
                return
            used.append(match)
        seconds = [t.get("tolerationSeconds") for t in used]
        bounded = [max(0, int(s)) for s in seconds if s is not None]
        if not bounded:  # `getMinTolerationTime` < 0: tolerated forever
            self._cancel_eviction(namespace, name, uid)
            return
        scheduled = self._evictions.get((namespace, name))
        if scheduled is not None and scheduled[0] == uid:
            return  # the eviction already scheduled stands
        delay = 0.0 if any(s <= 0 for s in bounded) else float(min(bounded))
        handle = asyncio.get_running_loop().call_later(
            delay, self._evict_scheduled, namespace, name, uid
        )
        self._evictions[(namespace, name)] = (uid, handle)

    def _cancel_eviction(self, namespace: str, name: str, uid: Any) -> None:
        scheduled = self._evictions.get((namespace, name))
        if scheduled is not None and scheduled[0] == uid:
            scheduled[1].cancel()
            del self._evictions[(namespace, name)]

    def _evict_scheduled(self, namespace: str, name: str, uid: str) -> None:
        scheduled = self._evictions.get((namespace, name))
        if scheduled is not None and scheduled[0] == uid:
            del self._evictions[(namespace, name)]
        try:
            self._evict(namespace, name, uid)
        except ApiError as exc:
            self._log.info(
                "sim_control_plane.refused", item=f"evict/{namespace}/{name}", error=exc.message
            )

    def _evict(self, namespace: str, name: str, uid: str) -> None:
        """`addConditionAndDeletePod`: `DisruptionTarget`, then a graceful delete."""
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        cond = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
        }
        if _with_condition(pod.setdefault("status", {}), cond, now()):
            self.store.update(PODS, namespace, name, pod, subresource="status", check_rv=False)
        self.store.delete(PODS, namespace, name)
