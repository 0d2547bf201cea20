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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from nodeward.logs import get_logger
from sim.cluster import admission, checkpoints
from sim.cluster.errors import ApiError
from sim.cluster.images import ImageRef, Pulled, PullError, pull
from sim.cluster.resources import require
from sim.cluster.store import Change, Obj, Store, now

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")


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
    """Start every new pod bound to a node, and finish every one deleted gracefully;
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
    ) -> None:
        """`registries`: the hosts (`127.0.0.1:5000`) whose images are pulled (plain HTTP);
        `pull_backoff`: the first wait after a failed pull (the kubelet's 10 s, shortened),
        doubled after each failure up to `pull_backoff_max`."""
        self.store = store
        self.exits_after = exits_after
        self.registries = frozenset(registries)
        self.pull_backoff = pull_backoff
        self.pull_backoff_max = pull_backoff_max
        self.restores: list[Restore] = []
        self._ips = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
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
        if change.key != PODS.key or change.type == "DELETED":
            return
        pod = change.obj
        meta = pod["metadata"]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop, no kubelet (a store used on its own)
        node = (pod.get("spec") or {}).get("nodeName")
        if change.type == "ADDED" or (
            node and not ((change.old or {}).get("spec") or {}).get("nodeName")
        ):
            if node and self.registries and self._pulled_images(pod):
                task = loop.create_task(
                    self._pull_then_start(meta["namespace"], meta["name"], meta["resourceVersion"])
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif node:  # created bound, or just bound by the scheduler
                loop.call_soon(
                    self._start, meta["namespace"], meta["name"], meta["resourceVersion"]
                )
            return
        was = (change.old or {}).get("metadata") or {}
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and grace != was.get("deletionGracePeriodSeconds"):
            loop.call_later(
                self._stopping_s(pod, float(grace or 0)),
                self._finish,
                meta["namespace"],
                meta["name"],
                meta["uid"],
            )

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
        self.store.delete(PODS, namespace, name, grace_period=0, precondition_uid=uid)

    def _start(self, namespace: str, name: str, created_rv: str) -> None:
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["resourceVersion"] != created_rv:
            return  # gone, or reported on already (a seed's status, a test's)
        node = self.store.find(NODES, "", pod["spec"]["nodeName"])
        if node is None:
            return
        pod["status"] = admission.running_status(pod, _host_ip(node), self._pod_ip(pod), now())
        self.store.update(PODS, namespace, name, pod, subresource="status", check_rv=False)

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
