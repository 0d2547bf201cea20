"""The kubelets of the sim cluster's nodes, as far as the API sees them start pods.

A pod the API server has just created is `Pending`; the kubelet of the node it is bound to
starts its containers and reports it `Running` (conditions, IPs, container states). Here that
report follows on the next turn of the event loop, for a pod bound to a node that exists and
that nobody has reported on since it was created or bound (by the scheduler,
`sim.cluster.controllers`).

A pod deleted with a grace period is `Terminating` (its `deletionTimestamp` set) until its
kubelet has stopped its containers: after its `sim.nodeward.io/exits-after` annotation's
seconds, or the kubelet's default, never later than the grace period; then the kubelet's
final delete removes it.

A pod with a container whose image is on one of the kubelets' `registries` starts only once
its images are pulled (asynchronously; other pods start as before). A missing image leaves
it `Pending`, the container waiting `ErrImagePull` then `ImagePullBackOff`, pulled again
after a doubling back-off. An OCI checkpoint image (manifest annotation
`io.kubernetes.cri-o.annotations.checkpoint.name`) is restored, as CRI-O does, rather than
started: CRI-O's `CreateContainer` (`server/container_create.go`, `server/container_restore.go`
`CRImportCheckpoint`) reads the image's `spec.dump`/`config.dump` and refuses a checkpoint
whose bind mounts the new container lacks (`CreateContainerError`: `restoring "IMAGE" expects
following bind mounts defined (/a,/b)`); CRI-O does not compare the checkpointed container's
name with the new one. `StartContainer` (`server/container_start.go`, `internal/lib/restore.go`,
`internal/oci/runtime_oci.go` `RestoreContainer`) then restores it, failing (`RunContainerError`,
`failed to restore container ID: ...`) where the node's runtime cannot restore (node
annotation `sim.nodeward.io/runtime-restore: "false"`: `configured runtime does not support
checkpoint/restore`), where the image has no `checkpoint/inventory.img`, or for a GPU pod on a
node without `nodeward.io/cuda-checkpoint=true` (CRIU's CUDA plugin; that message is the
sim's). A restored pod is `Running` and carries the sim's `sim.nodeward.io/restored`
annotation (a real kubelet writes none; the sim does so that clients can see the restore
through the API) and the restore is listed in `Kubelets.restores`.

Before it starts a pod's containers the kubelet sets up its Secrets (`sim.cluster.volumes`;
`pkg/volume/secret`, `pkg/volume/util/atomic_writer.go`, `kubelet_pods.go`): with
`archive_root`, each `secret` volume (and `projected` secret source) is written on the node
in the AtomicWriter's layout, each `subPath` mount copied as its bind takes it, each
container's env (`secretKeyRef`, `envFrom`) resolved and recorded. A Secret that is missing and
not optional keeps the pod `Pending` (`ContainerCreating` and a `FailedMount` event for a
volume, `CreateContainerConfigError` for env) until it is made. When a Secret changes, the
volumes that mount it are written again at once (a real kubelet: at the pod's next sync,
within its 1 min sync period); subPath copies and env keep what they had. A deleted pod's
directory is removed once the pod is gone.

Heartbeats (`pkg/kubelet/nodelease`, `staging/src/k8s.io/component-helpers/apimachinery/lease/
controller.go`; `pkg/kubelet/kubelet_node_status.go` `tryUpdateNodeStatus`): every
`lease_renew_s` (the kubelet's 10 s, a quarter of its `nodeLeaseDurationSeconds` 40) each
node's kubelet renews its Lease `kube-node-lease/<node>` (`spec.renewTime`; created if missing,
`holderIdentity` the node, owned by the Node), and posts its node status when a condition it
owns (`Ready`, `MemoryPressure`, `DiskPressure`, `PIDPressure`) is missing or `Unknown`, else
only every `status_report_s` (the kubelet's `nodeStatusReportFrequency`, 5 min, the first time
within ±50 %, as `delayAfterNodeStatusChange` jitters it), to keep `lastHeartbeatTime`. The
sim's kubelet has no runtime to judge by: it keeps the `True`/`False` a condition holds (a
seed's or a test's `Ready=False` stands for a kubelet reporting its runtime down), and posts its
healthy default (`Ready=True` `KubeletReady`, no pressure) only for one missing or `Unknown`.

A node annotated `sim.nodeward.io/kubelet: external` has its kubelet outside the sim (a process
that renews the Lease and posts the status through the API): the sim renews and posts nothing
for it, and that kubelet counts as down while the node's Lease was last renewed more than
`grace_s` ago, or its `Ready` condition is missing or `Unknown`. While a node's kubelet is down
nothing happens on the node: its new pods are not started and its deleted pods are not
finished (they stay `Terminating`, as on a real cluster until the node is back or
force-deleted). When it is back (Lease fresh, `Ready` posted) it does what was pending: the
pods deleted meanwhile are removed, the pending ones started, and the running ones reported
again: ready again (the node lifecycle controller marked them not ready) if the node kept its
`bootID`, else restarted as after a reboot (`restartCount` + 1, `lastState` terminated with
exit code 255, reason `Unknown`, as containerd reports containers a reboot killed; a pod with
`restartPolicy: Never` is `Failed` instead, as `computePodActions` creates no sandbox for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import itertools
import json
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from nodeward.logs import get_logger
from sim.cluster import admission, checkpoints, convert, volumes
from sim.cluster.errors import ApiError
from sim.cluster.images import ImageRef, Pulled, PullError, pull
from sim.cluster.resources import require
from sim.cluster.store import Change, Obj, Store, now

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")
LEASES = require("coordination.k8s.io", "v1", "leases")
SECRETS = require("", "v1", "secrets")
EVENTS = require("events.k8s.io", "v1", "events")
NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
"""The kubelet's `nodeLeaseDurationSeconds` default, written in the Leases it creates."""

KUBELET = "sim.nodeward.io/kubelet"
"""A node's annotation: `external` when its kubelet is a process outside the sim (the sim then
neither renews its Lease nor posts its status; see `Kubelets`)."""
EXTERNAL = "external"
KUBELET_CONDITIONS: dict[str, tuple[str, str, str]] = {
    "MemoryPressure": (
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    "DiskPressure": ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    "PIDPressure": ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    "Ready": ("True", "KubeletReady", "kubelet is posting ready status"),
}
"""The conditions a kubelet owns, with its healthy status, reason and message
(`pkg/kubelet/nodestatus/setters.go`)."""
_BATCH = 200  # nodes heartbeaten per turn of the event loop


EXITS_AFTER = "sim.nodeward.io/exits-after"
"""A pod's annotation: how many seconds its containers take to exit once told to stop
(`SIGTERM`); the kubelet kills them at the grace period's end in any case."""

RESTORED = "sim.nodeward.io/restored"
"""A restored pod's annotation, written by the sim's kubelet: a JSON list with one object per
restored container, `{"container", "image", "digest", "checkpoint", "from"}`: the checkpoint
image's manifest digest, the checkpointed container's name (its annotation), and the session
marker read from the image's `checkpoint/pages-1.img` (None if it holds none)."""
RUNTIME_RESTORE = "sim.nodeward.io/runtime-restore"
"""A node's annotation: `"false"` if its container runtime cannot restore checkpoints."""
CUDA_CHECKPOINT_LABEL = "nodeward.io/cuda-checkpoint"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Restore:
    """A container restored from a checkpoint image."""

    namespace: str
    pod: str
    uid: str
    node: str
    container: str
    image: str
    digest: str
    checkpoint: str
    marker: dict[str, Any] | None


class _Waiting(Exception):
    """A container cannot start: its waiting reason and message."""

    def __init__(self, container: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.container = container
        self.reason = reason
        self.message = message


class Kubelets:
    """Start every new pod bound to a node, and finish every one deleted gracefully, while
    the node's kubelet is up; `heartbeat` renews the nodes' Leases and posts their status;
    `install` hooks them on the store. `exits_after`: how long a pod's containers take to
    stop unless its annotation says otherwise (well-behaved ones: a moment)."""

    def __init__(
        self,
        store: Store,
        *,
        exits_after: float = 0.2,
        registries: Iterable[str] = (),
        pull_backoff: float = 1.0,
        pull_backoff_max: float = 30.0,
        lease_renew_s: float = 10.0,
        status_report_s: float = 300.0,
        grace_s: float = 50.0,
        archive_root: Path | None = None,
    ) -> None:
        """`registries`: the hosts (`127.0.0.1:5000`) whose images are pulled (plain HTTP);
        `pull_backoff`: the first wait after a failed pull (the kubelet's 10 s, shortened),
        doubled after each failure up to `pull_backoff_max`. `lease_renew_s`: how often
        `heartbeat` is to be called (the caller's loop calls it); `status_report_s`: how often
        an unchanged node status is posted; `grace_s`: how stale an external kubelet's Lease
        may be before that kubelet counts as down (the node lifecycle controller's grace).
        `archive_root`: the nodes' filesystems (`<archive_root>/<node>/`), where pods' Secret
        volumes, subPath binds and env are written (`sim.cluster.volumes`); None: none."""
        self.store = store
        self.exits_after = exits_after
        self.registries = frozenset(registries)
        self.pull_backoff = pull_backoff
        self.pull_backoff_max = pull_backoff_max
        self.lease_renew_s = lease_renew_s
        self.status_report_s = status_report_s
        self.grace_s = grace_s
        self.archive_root = archive_root
        self.restores: list[Restore] = []
        self._env: dict[tuple[str, str], dict[str, str]] = {}  # (pod uid, container) -> env
        self._blocked: set[str] = set()  # uids of pods waiting for a Secret to start
        self._warned: set[tuple[str, str]] = set()  # (pod uid, message) of events sent
        self._ips = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._down: dict[str, str] = {}  # node -> its bootID when its kubelet was seen down
        self._back: dict[str, bool] = {}  # node back -> rebooted meanwhile, until resumed
        self._next_report: dict[str, float] = {}  # node -> when its status is next posted
        self._jitter = random.Random()  # noqa: S311 - report jitter, not a secret
        self._log = get_logger(component="sim-kubelet")

    async def close(self) -> None:
        """Stop pulling: cancel the pending starts, close the registry client."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _pulled_images(self, pod: Obj) -> list[tuple[str, str]]:
        """(container, image) of the pod's containers whose images are on the registries."""
        out = []
        for c in (pod.get("spec") or {}).get("containers") or []:
            ref = ImageRef.parse(str(c.get("image") or ""))
            if ref is not None and ref.host in self.registries:
                out.append((str(c.get("name")), str(c.get("image"))))
        return out

    def install(self) -> None:
        self.store.hooks.append(self._hook)

    def _hook(self, change: Change) -> None:
        if change.key == NODES.key:
            self._node_changed(change)
            return
        if change.key == LEASES.key:
            name = change.obj["metadata"]["name"]
            if name in self._down and change.obj["metadata"].get("namespace") == (
                NODE_LEASE_NAMESPACE
            ):
                self._soon(self._check_back, name)
            return
        if change.key == SECRETS.key:
            meta = change.obj["metadata"]
            self._soon(self._secret_changed, meta.get("namespace") or "", meta["name"])
            return
        if change.key == PODS.key and change.type == "DELETED":
            self._soon(self._forget, change.obj)
            return
        if change.key != PODS.key:
            return
        pod = change.obj
        meta = pod["metadata"]
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no kubelet (a store used on its own)
        node = (pod.get("spec") or {}).get("nodeName")
        if change.type == "ADDED" or (
            node and not ((change.old or {}).get("spec") or {}).get("nodeName")
        ):
            if node and self._reachable(node):  # created bound, or just bound by the scheduler
                self._begin(pod)
            return
        was = (change.old or {}).get("metadata") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if (
            node
            and meta.get("deletionTimestamp")
            and grace != was.get("deletionGracePeriodSeconds")
            and self._reachable(node)
        ):
            self._stop(pod, self._stopping_s(pod, float(grace or 0)))

    @staticmethod
    def _soon(callback: Any, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # no loop, no kubelet
            asyncio.get_running_loop().call_soon(callback, *args)

    def _begin(self, pod: Obj) -> None:
        """Start a pod bound to a node whose kubelet is up (pulling its images first)."""
        meta = pod["metadata"]
        loop = asyncio.get_running_loop()
        if self.registries and self._pulled_images(pod):
            task = loop.create_task(
                self._pull_then_start(meta["namespace"], meta["name"], meta["resourceVersion"])
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            loop.call_soon(self._start, meta["namespace"], meta["name"], meta["resourceVersion"])

    def _stop(self, pod: Obj, after: float) -> None:
        meta = pod["metadata"]
        asyncio.get_running_loop().call_later(
            after, self._finish, meta["namespace"], meta["name"], meta["uid"]
        )

    # --- the kubelet up or down -----------------------------------------------------------

    def kubelet_up(self, node: Obj) -> bool:
        """Whether the node's kubelet runs: always for the sim's own; for an external one,
        while its Lease is fresher than `grace_s` and its `Ready` condition is posted."""
        if not external(node):
            return True
        ready = condition(node, "Ready")
        if ready is None or ready.get("status") == "Unknown":
            return False
        lease = self.store.peek_one(LEASES, NODE_LEASE_NAMESPACE, node["metadata"]["name"])
        renewed = parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
        return renewed is not None and time.time() - renewed <= self.grace_s

    def _reachable(self, name: str) -> bool:
        """Whether node `name`'s kubelet is up; if not, it is remembered as down, to do what
        is pending once it is back."""
        node = self.store.peek_one(NODES, "", name)
        if node is None:
            return True  # no node: nothing to wait for (its pods are collected)
        if self.kubelet_up(node):
            return True
        self._down.setdefault(name, boot_id(node))
        return False

    def _node_changed(self, change: Change) -> None:
        name = change.obj["metadata"]["name"]
        if change.type == "DELETED":
            self._down.pop(name, None)
            self._next_report.pop(name, None)
            return
        before = (condition(change.old or {}, "Ready") or {}).get("status")
        after = (condition(change.obj, "Ready") or {}).get("status")
        if after == "Unknown" and before != "Unknown":  # silent: what it does when back
            self._down.setdefault(name, boot_id(change.old or change.obj))
        elif name in self._down:
            self._soon(self._check_back, name)

    def _check_back(self, name: str) -> None:
        """If node `name`'s kubelet is back, have what waited for it done (with every other
        node back by then, in one pass over the pods)."""
        if name not in self._down:
            return
        node = self.store.peek_one(NODES, "", name)
        if node is None:
            self._down.pop(name, None)
            return
        if not self.kubelet_up(node):
            return
        rebooted = self._down.pop(name) != boot_id(node)
        self._log.info("kubelet back", node=name, rebooted=rebooted)
        if not self._back:
            self._soon(self._resume)
        self._back[name] = rebooted

    def _resume(self) -> None:
        """What a kubelet back does with the pods bound to its node: finishes the deleted
        ones, starts the pending ones, reports the running ones (restarted if rebooted)."""
        back, self._back = self._back, {}
        for pod in list(self.store.peek(PODS)):
            rebooted = back.get((pod.get("spec") or {}).get("nodeName") or "")
            if rebooted is None:
                continue
            meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase")
            try:
                if phase == "Running" and not meta.get("deletionTimestamp"):
                    self._refresh_volumes(pod)  # its sync: Secrets changed meanwhile
                if meta.get("deletionTimestamp"):
                    grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                    self._stop(pod, 0.0 if rebooted else self._stopping_s(pod, grace))
                elif phase == "Pending":
                    self._begin(pod)
                elif phase == "Running" and rebooted:
                    self._report(pod, _rebooted_status(pod, now()))
                    self._refresh_containers(pod)
                elif phase == "Running" and _marked_not_ready(pod):
                    self._report(pod, _ready_again(pod, now()))
            except ApiError as exc:
                self._log.info("pod status refused", pod=meta["name"], error=exc.message)

    def _report(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        new = copy.deepcopy(pod)
        new["status"] = status
        self.store.update(
            PODS, meta["namespace"], meta["name"], new, subresource="status", check_rv=False
        )

    # --- heartbeats ------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """One turn of every sim kubelet's heartbeat: renew its node's Lease (create it if
        missing), and post its node status if changed or due (`status_report_s`)."""
        loop = asyncio.get_running_loop()
        names = [n["metadata"]["name"] for n in self.store.peek(NODES)]
        for i, name in enumerate(names):
            if i and i % _BATCH == 0:
                await asyncio.sleep(0)  # a big fleet's heartbeats do not hold the loop
            node = self.store.peek_one(NODES, "", name)
            if node is None or external(node):
                continue
            try:
                self._renew(node)
                self._post_status(node, loop.time())
            except ApiError as exc:  # as a kubelet, tries again on its next turn
                self._log.info("heartbeat refused", node=name, error=exc.message)

    def _renew(self, node: Obj) -> None:
        """`lease.controller.sync`: renew the Lease (`renewTime` now), or create it."""
        name = node["metadata"]["name"]
        stamp = micro_time()
        lease = self.store.peek_one(LEASES, NODE_LEASE_NAMESPACE, name)
        if lease is not None:  # (the store copies what it is given)
            renewed = {**lease, "spec": {**(lease.get("spec") or {}), "renewTime": stamp}}
            self.store.update(LEASES, NODE_LEASE_NAMESPACE, name, renewed, check_rv=False)
            return
        owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
        self.store.create(
            LEASES,
            NODE_LEASE_NAMESPACE,
            {
                "metadata": {
                    "name": name,
                    "namespace": NODE_LEASE_NAMESPACE,
                    "ownerReferences": [owner],
                },
                "spec": {
                    "holderIdentity": name,
                    "leaseDurationSeconds": LEASE_DURATION_S,
                    "renewTime": stamp,
                },
            },
        )

    def _post_status(self, node: Obj, at: float) -> None:
        """`tryUpdateNodeStatus`: its conditions' healthy defaults where one is missing or
        `Unknown` (posted at once), else only their heartbeats once the report is due."""
        name = node["metadata"]["name"]
        due = self._next_report.get(name)
        if due is None:  # the status was just posted (registered, or seeded)
            due = self._next_report[name] = at + self._report_delay()
        posted = {
            c.get("type"): c.get("status")
            for c in (node.get("status") or {}).get("conditions") or []
        }
        if at < due and all(posted.get(k) in ("True", "False") for k in KUBELET_CONDITIONS):
            return  # nothing changed, no report due
        conditions = copy.deepcopy((node.get("status") or {}).get("conditions") or [])
        stamp = now()
        changed = False
        for kind, (status, reason, message) in KUBELET_CONDITIONS.items():
            current = next((c for c in conditions if c.get("type") == kind), None)
            if current is None:
                current = {"type": kind}
                conditions.append(current)
            if current.get("status") in (None, "Unknown"):
                current.update(status=status, reason=reason, message=message)
                current["lastTransitionTime"] = stamp
                changed = True
            current["lastHeartbeatTime"] = stamp
        if not changed and at < due:
            return
        self._next_report[name] = at + (self._report_delay() if changed else self.status_report_s)
        new = copy.deepcopy(node)
        new.setdefault("status", {})["conditions"] = conditions
        self.store.update(NODES, "", name, new, subresource="status", check_rv=False)

    def _report_delay(self) -> float:
        """`nodeStatusReportFrequency` plus `delayAfterNodeStatusChange`'s jitter."""
        return self.status_report_s * (1.0 + self._jitter.uniform(-0.5, 0.5))

    def _stopping_s(self, pod: Obj, grace: float) -> float:
        said = ((pod["metadata"].get("annotations") or {}).get(EXITS_AFTER)) or ""
        try:
            exits = float(said) if said else self.exits_after
        except ValueError:
            exits = self.exits_after
        return max(0.0, min(exits, grace))

    def _finish(self, namespace: str, name: str, uid: str) -> None:
        """The containers are stopped: the kubelet's final delete (grace 0) removes the pod,
        unless a finalizer still holds it."""
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        if not self._reachable(pod["spec"]["nodeName"]):
            return  # its kubelet went down: it finishes once back
        self.store.delete(PODS, namespace, name, grace_period=0, precondition_uid=uid)

    def _start(self, namespace: str, name: str, created_rv: str) -> None:
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["resourceVersion"] != created_rv:
            return  # gone, or reported on already (a seed's status, a test's)
        node = self.store.find(NODES, "", pod["spec"]["nodeName"])
        if node is None or not self._reachable(pod["spec"]["nodeName"]):
            return  # no node, or its kubelet down: started once back
        if not self._set_up(pod, node):
            return  # waiting for a Secret: tried again when one changes
        pod["status"] = admission.running_status(pod, _host_ip(node), self._pod_ip(pod), now())
        self.store.update(PODS, namespace, name, pod, subresource="status", check_rv=False)

    # --- volumes, subPaths and env --------------------------------------------------------

    def mount_source(self, pod: Obj, container: str, path: str) -> Path:
        """The file or directory on the node that `container` of `pod` sees at `path` (in a
        volume mount; through its subPath bind for a `subPath` mount): see
        `volumes.mount_source`. ValueError without `archive_root`."""
        if self.archive_root is None:
            raise ValueError("the sim's nodes have no filesystems (no archive_root)")
        return volumes.mount_source(self.archive_root, pod, container, path)

    def env(self, pod: Obj, container: str) -> dict[str, str]:
        """`container`'s environment as resolved when it was started (its Secrets' values
        then, never updated); KeyError if it was not started by this sim."""
        return dict(self._env[(pod["metadata"]["uid"], container)])

    def _secrets(self, namespace: str) -> volumes.SecretLookup:
        def lookup(name: str) -> Obj | None:
            return self.store.peek_one(SECRETS, namespace, name)

        return lookup

    def _set_up(self, pod: Obj, node: Obj) -> bool:
        """What the kubelet does before it starts a pod's containers: mount its Secret
        volumes (`WaitForAttachAndMount`), then per container resolve its env and bind its
        subPath mounts. If a volume cannot be set up the pod stays `Pending`, its containers
        `ContainerCreating`, with a `FailedMount` event; if a container's env cannot be
        resolved, it is waiting `CreateContainerConfigError`. Either way the pod is started
        again when a Secret of its namespace changes. False if it cannot start."""
        meta = pod["metadata"]
        uid, name = meta["uid"], meta["name"]
        lookup = self._secrets(meta["namespace"])
        try:
            volumes.set_up_volumes(self.archive_root, pod, lookup)
            envs = {
                str(c.get("name")): volumes.container_env(pod, str(c.get("name")), lookup)
                for c in (pod.get("spec") or {}).get("containers") or []
            }
        except volumes.MountError as exc:
            self._blocked.add(uid)
            self._log.info(
                "volume set-up failed", pod=f"{meta['namespace']}/{name}", error=str(exc)
            )
            self._warn(pod, "FailedMount", str(exc))
            self._report_blocked(pod, _creating_status(pod, _host_ip(node), now()))
            return False
        except volumes.EnvError as exc:
            self._blocked.add(uid)
            self._warn(pod, "Failed", f"Error: {exc.message}", exc.container)
            waiting = _Waiting(exc.container, "CreateContainerConfigError", exc.message)
            status = _waiting_status(pod, _host_ip(node), self._pod_ip(pod), now(), waiting)
            self._report_blocked(pod, status)
            return False
        self._blocked.discard(uid)
        for container, env in envs.items():
            self._env[(uid, container)] = env
            if self.archive_root is not None:
                volumes.write_env(self.archive_root, pod, container, env)
                volumes.bind_subpaths(self.archive_root, pod, container)
        return True

    def _report_blocked(self, pod: Obj, status: Obj) -> None:
        """Report the pod waiting, unless its containers already wait so (a retry)."""
        states = [c.get("state") for c in (pod.get("status") or {}).get("containerStatuses") or []]
        if states != [c.get("state") for c in status["containerStatuses"]]:
            self._report(pod, status)

    def _secret_changed(self, namespace: str, name: str) -> None:
        """A Secret changed: start the pods that waited for it, and refresh the volumes of
        the running pods that mount it (the kubelet's watch-based secret manager sees the
        change at once; its pod workers project it at their next sync, within the sync
        period). Env and subPath binds are left as they were."""
        lookup = self._secrets(namespace)
        for pod in list(self.store.peek(PODS, namespace)):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            node = spec.get("nodeName")
            if not node or meta.get("deletionTimestamp") or not volumes.uses_secret(pod, name):
                continue
            if not self._reachable(node):
                continue
            phase = (pod.get("status") or {}).get("phase")
            if meta["uid"] in self._blocked:
                if phase == "Pending":
                    self._start(namespace, meta["name"], meta["resourceVersion"])
                continue
            if phase != "Running" or self.archive_root is None:
                continue
            try:
                volumes.set_up_volumes(self.archive_root, pod, lookup, only=name)
            except volumes.MountError as exc:  # the volume keeps its files
                self._warn(pod, "FailedMount", str(exc))

    def _refresh_volumes(self, pod: Obj) -> None:
        """Write the running pod's Secret volumes again where their Secrets changed."""
        if self.archive_root is None:
            return
        try:
            volumes.set_up_volumes(
                self.archive_root, pod, self._secrets(pod["metadata"]["namespace"])
            )
        except volumes.MountError as exc:  # the volume keeps its files
            self._warn(pod, "FailedMount", str(exc))

    def _refresh_containers(self, pod: Obj) -> None:
        """Containers created again (after a reboot): their env and subPaths taken anew."""
        meta = pod["metadata"]
        lookup = self._secrets(meta["namespace"])
        for c in (pod.get("spec") or {}).get("containers") or []:
            container = str(c.get("name"))
            try:
                env = volumes.container_env(pod, container, lookup)
            except volumes.EnvError:
                continue
            self._env[(meta["uid"], container)] = env
            if self.archive_root is not None:
                volumes.write_env(self.archive_root, pod, container, env)
                volumes.bind_subpaths(self.archive_root, pod, container)

    def _forget(self, pod: Obj) -> None:
        """The pod is gone: its directory removed from its node (volumes torn down)."""
        uid = pod["metadata"]["uid"]
        self._blocked.discard(uid)
        for key in [k for k in self._env if k[0] == uid]:
            del self._env[key]
        self._warned = {w for w in self._warned if w[0] != uid}
        node = (pod.get("spec") or {}).get("nodeName")
        if node and self.archive_root is not None:
            volumes.remove_pod(self.archive_root, node, uid)

    def _warn(self, pod: Obj, reason: str, message: str, container: str = "") -> None:
        """The kubelet's Warning event about the pod (once per message; a real kubelet
        repeats it, counted, at each retry). Stored as `events.k8s.io/v1`, so it carries the
        `eventTime` and `action` that API requires and a kubelet's core event leaves empty."""
        meta = pod["metadata"]
        if (meta["uid"], message) in self._warned:
            return
        self._warned.add((meta["uid"], message))
        node = pod["spec"]["nodeName"]
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
        }
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        stamp = now()
        event = {
            "metadata": {
                "name": f"{meta['name']}.{time.time_ns():x}",
                "namespace": meta["namespace"],
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "eventTime": micro_time(),
            "action": reason,
            "reportingComponent": "kubelet",
            "reportingInstance": node,
        }
        try:
            self.store.create(EVENTS, meta["namespace"], convert.from_core_event(event))
        except ApiError as exc:
            self._log.info("event refused", pod=meta["name"], error=exc.message)

    def _pod_ip(self, pod: Obj) -> str:
        known = (pod.get("status") or {}).get("podIP")
        if known:
            return str(known)
        n = next(self._ips)
        return f"10.245.{n // 250}.{n % 250 + 1}"

    def _current(self, namespace: str, name: str, rv: str) -> tuple[Obj, Obj] | None:
        """The pod and its node if nobody else has written the pod since `rv`."""
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["resourceVersion"] != rv:
            return None
        if pod["metadata"].get("deletionTimestamp"):
            return None
        node = self.store.find(NODES, "", pod["spec"]["nodeName"])
        return None if node is None else (pod, node)

    async def _pull_then_start(self, namespace: str, name: str, rv: str) -> None:
        """Pull the pod's registry images, then start (or restore) it; while a pull fails,
        report the container waiting and pull again after a back-off."""
        backoff = self.pull_backoff
        while True:
            current = self._current(namespace, name, rv)
            if current is None:
                return
            pod, _ = current
            pulled: dict[str, Pulled] = {}
            try:
                for container, image in self._pulled_images(pod):
                    try:
                        pulled[container] = await pull(self._client(), image)
                    except PullError as exc:
                        raise _Waiting(container, "ErrImagePull", str(exc)) from None
            except _Waiting as waiting:
                self._log.info(
                    "image pull failed", pod=f"{namespace}/{name}", error=waiting.message
                )
                rv = self._report_waiting(namespace, name, rv, waiting) or ""
                await asyncio.sleep(backoff)
                image = dict(self._pulled_images(pod))[waiting.container]
                back_off = _Waiting(
                    waiting.container, "ImagePullBackOff", f'Back-off pulling image "{image}"'
                )
                rv = self._report_waiting(namespace, name, rv, back_off) or ""
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.pull_backoff_max)
                continue
            current = self._current(namespace, name, rv)
            if current is None:
                return
            pod, node = current
            try:
                restored = [
                    self._restore(pod, node, c, p) for c, p in pulled.items() if p.checkpoint_of
                ]
            except _Waiting as waiting:
                self._log.info(
                    "restore failed",
                    pod=f"{namespace}/{name}",
                    reason=waiting.reason,
                    error=waiting.message,
                )
                self._report_waiting(namespace, name, rv, waiting)
                return
            if restored:
                rv = self._mark_restored(pod, restored)
            self._start(namespace, name, rv)
            return

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self._session

    def _restore(self, pod: Obj, node: Obj, container: str, image: Pulled) -> Restore:
        """Check a checkpoint image as CRI-O's create and start do; _Waiting if it fails."""
        spec = next(c for c in pod["spec"]["containers"] if c.get("name") == container)
        for name in (checkpoints.SPEC_DUMP, checkpoints.CONFIG_DUMP):  # CRImportCheckpoint
            if name not in image.files:
                raise _Waiting(
                    container,
                    "CreateContainerError",
                    f"failed to read {json.dumps(name)}: open "
                    f"/var/lib/containers/storage/overlay/{image.digest[7:71]}/merged/{name}: "
                    "no such file or directory",
                )
        try:
            dumped = json.loads(image.files[checkpoints.SPEC_DUMP])
        except ValueError as exc:
            raise _Waiting(
                container, "CreateContainerError", f'failed to read "spec.dump": {exc}'
            ) from None
        wanted = set(checkpoints.container_mounts(spec))
        missing = [
            str(m.get("destination"))
            for m in dumped.get("mounts") or []
            if m.get("destination") not in checkpoints.RUNTIME_MOUNTS
            and m.get("destination") not in wanted
        ]
        if missing:
            raise _Waiting(
                container,
                "CreateContainerError",
                f'restoring "{image.image}" expects following bind mounts defined '
                f"({','.join(missing)})",
            )
        ctr_id = hashlib.sha256(f"{pod['metadata']['uid']}/{container}".encode()).hexdigest()
        meta = node["metadata"]
        cause = None
        if (meta.get("annotations") or {}).get(RUNTIME_RESTORE) == "false":
            cause = "configured runtime does not support checkpoint/restore"
        elif checkpoints.INVENTORY not in image.files:
            cause = (
                "a complete checkpoint for this container cannot be found, cannot restore: "
                f"stat /var/lib/containers/storage/overlay-containers/{ctr_id}/userdata/"
                f"{checkpoints.INVENTORY}: no such file or directory"
            )
        elif _gpus(pod) and (meta.get("labels") or {}).get(CUDA_CHECKPOINT_LABEL) != "true":
            cause = (
                "runc restore failed: criu failed: type RESTORE errno 0: the checkpoint holds "
                f"CUDA state and node {meta['name']} has no CUDA checkpoint support "
                f"({CUDA_CHECKPOINT_LABEL}=true): CRIU's cuda plugin is not loaded"
            )
        if cause is not None:
            raise _Waiting(
                container, "RunContainerError", f"failed to restore container {ctr_id}: {cause}"
            )
        page = image.files.get(checkpoints.PAGES)
        return Restore(
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            pod["metadata"]["uid"],
            meta["name"],
            container,
            image.image,
            image.digest,
            image.checkpoint_of or "",
            checkpoints.read_marker(page) if page else None,
        )

    def _mark_restored(self, pod: Obj, restored: list[Restore]) -> str:
        """Record the restores and annotate the pod with them; its new resourceVersion."""
        self.restores.extend(restored)
        meta = pod["metadata"]
        meta.setdefault("annotations", {})[RESTORED] = json.dumps(
            [
                {
                    "container": r.container,
                    "image": r.image,
                    "digest": r.digest,
                    "checkpoint": r.checkpoint,
                    "from": r.marker,
                }
                for r in restored
            ],
            sort_keys=True,
        )
        updated = self.store.update(PODS, meta["namespace"], meta["name"], pod)
        return str(updated["metadata"]["resourceVersion"])

    def _report_waiting(self, namespace: str, name: str, rv: str, waiting: _Waiting) -> str | None:
        """Report the pod `Pending`, `waiting.container` waiting; its new resourceVersion, or
        None if it is gone or someone else wrote it since `rv`."""
        current = self._current(namespace, name, rv)
        if current is None:
            return None
        pod, node = current
        pod["status"] = _waiting_status(pod, _host_ip(node), self._pod_ip(pod), now(), waiting)
        try:
            updated = self.store.update(
                PODS, namespace, name, pod, subresource="status", check_rv=False
            )
        except ApiError:
            return None
        return str(updated["metadata"]["resourceVersion"])


def external(node: Obj) -> bool:
    """Whether the node's kubelet is outside the sim (annotation `sim.nodeward.io/kubelet`)."""
    return (node["metadata"].get("annotations") or {}).get(KUBELET) == EXTERNAL


def condition(obj: Obj, kind: str) -> Obj | None:
    """The object's status condition of type `kind`, if any."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def boot_id(node: Obj) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")


def micro_time() -> str:
    """Now as a `metav1.MicroTime` (a Lease's `renewTime`)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> float | None:
    """An RFC 3339 time (`Time` or `MicroTime`) as seconds since the epoch; None if unset or
    not a time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _marked_not_ready(pod: Obj) -> bool:
    """`Ready=False` with its containers ready: what `MarkPodsNotReady` leaves (the kubelet's
    status manager posts `Ready=True` again once it syncs)."""
    ready = condition(pod, "Ready") or {}
    containers = condition(pod, "ContainersReady") or {}
    return ready.get("status") == "False" and containers.get("status") == "True"


def _ready_again(pod: Obj, at: str) -> Obj:
    status = copy.deepcopy(pod.get("status") or {})
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            cond.update(status="True", lastTransitionTime=at)
            cond.pop("reason", None)
            cond.pop("message", None)
    return status


def _rebooted_status(pod: Obj, at: str) -> Obj:
    """What the kubelet reports, after a reboot, for a pod that was running: its containers
    exited (255, `Unknown`, as containerd shows the ones a reboot killed); restarted in a new
    sandbox unless `restartPolicy: Never`, which leaves the pod `Failed`."""
    status = copy.deepcopy(pod.get("status") or {})
    restart = (pod.get("spec") or {}).get("restartPolicy", "Always") != "Never"
    for c in status.get("containerStatuses") or []:
        started = ((c.get("state") or {}).get("running") or {}).get("startedAt") or at
        killed = {"exitCode": 255, "reason": "Unknown", "startedAt": started, "finishedAt": at}
        if restart:
            c["lastState"] = {"terminated": killed}
            c["state"] = {"running": {"startedAt": at}}
            c["restartCount"] = int(c.get("restartCount") or 0) + 1
            c["containerID"] = f"containerd://{uuid.uuid4().hex}"
            c.update(ready=True, started=True)
        else:
            c["state"] = {"terminated": {**killed, "containerID": c.get("containerID")}}
            c.update(ready=False, started=False)
    for cond in status.get("conditions") or []:
        kind = cond.get("type")
        if kind not in ("PodReadyToStartContainers", "Ready", "ContainersReady"):
            continue
        cond.pop("reason", None)
        cond.pop("message", None)
        cond.update(status="True" if restart else "False", lastTransitionTime=at)
        if not restart and kind != "PodReadyToStartContainers":
            cond["reason"] = "PodCompleted"  # `GeneratePodReadyCondition` of a finished pod
    if not restart:
        status["phase"] = "Failed"
    return status


def _host_ip(node: Obj) -> str:
    addresses = (node.get("status") or {}).get("addresses") or []
    return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.250")


def _gpus(pod: Obj) -> bool:
    for c in (pod.get("spec") or {}).get("containers") or []:
        resources = c.get("resources") or {}
        for key in ("requests", "limits"):
            if str((resources.get(key) or {}).get(GPU_RESOURCE, "0")) not in ("0", ""):
                return True
    return False


def _waiting_status(pod: Obj, host_ip: str, pod_ip: str, at: str, waiting: _Waiting) -> Obj:
    """The status a kubelet reports for a pod whose container `waiting.container` cannot
    start: `Pending`, not ready, that container waiting with the reason and message."""
    status = admission.running_status(pod, host_ip, pod_ip, at)
    previous = pod.get("status") or {}
    status["startTime"] = previous.get("startTime") or at
    names = []
    for c in status["containerStatuses"]:
        c.update({"ready": False, "started": False, "imageID": ""})
        c.pop("containerID", None)  # no container created yet
        if c["name"] == waiting.container:
            c["state"] = {"waiting": {"reason": waiting.reason, "message": waiting.message}}
        else:
            c["state"] = {"waiting": {"reason": "PodInitializing"}}
        names.append(c["name"])
    unready = f"containers with unready status: [{' '.join(names)}]"
    for cond in status["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update({"status": "False", "reason": "ContainersNotReady", "message": unready})
    status["phase"] = "Pending"
    return status


def _creating_status(pod: Obj, host_ip: str, at: str) -> Obj:
    """The status a kubelet reports for a pod whose volumes are not mounted: no sandbox yet
    (no pod IP), `Pending`, every container waiting `ContainerCreating`
    (`convertToAPIContainerStatuses`' default state), not ready."""
    status = admission.running_status(pod, host_ip, "", at)
    status["startTime"] = (pod.get("status") or {}).get("startTime") or at
    for key in ("podIP", "podIPs"):
        status.pop(key, None)
    names = []
    for c in status["containerStatuses"]:
        c.update({"ready": False, "started": False, "imageID": ""})
        c.pop("containerID", None)
        c["state"] = {"waiting": {"reason": "ContainerCreating"}}
        names.append(c["name"])
    unready = f"containers with unready status: [{' '.join(names)}]"
    for cond in status["conditions"]:
        if cond["type"] == "PodReadyToStartContainers":
            cond["status"] = "False"
        elif cond["type"] in ("Ready", "ContainersReady"):
            cond.update({"status": "False", "reason": "ContainersNotReady", "message": unready})
    status["phase"] = "Pending"
    return status
