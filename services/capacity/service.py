"""services.capacity: how many GPUs of each model and MIG profile are free, now.

It lists and watches nodes and pods (its port allows nothing else), and takes failed GPUs
from `gpu.health.>` and maintenance phases from `maintenance.>` (durable consumers, in
order per node). After a change, once `debounce` has passed without another, it counts
every node again (`policy`), writes the snapshot to KV (`schemas.state.capacity`), sets
the gauges `nodeward_gpus{model,profile,state}` and publishes a `capacity.v1` for each
model and profile whose counts changed. Run one replica: each holds the whole picture.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Gauge
from pydantic import Field, ValidationError

from nodeward.bus import Bus, Delivery
from nodeward.bus.kv import TypedKV
from nodeward.durations import Duration
from nodeward.handlers import Consuming, Runtime, Service, setting
from nodeward.kube import Cluster, KubeError, WatchEvent
from nodeward.kube.base import Listing
from schemas.base import Event, make_event
from schemas.capacity import STATES, CapacityChanged, GpuCounts
from schemas.gpu import GpuHealth, HealthState
from schemas.maintenance import Maintenance
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot, NodeCapacity
from services.capacity.access import ACCESS
from services.capacity.policy import (
    BusView,
    NodeView,
    count,
    node_view,
    pod_gpus,
    slice_gpus,
)

NAME = "capacity"
ACTOR = "service/capacity"


class CapacitySettings(Consuming):
    """`services.capacity` in the config file."""

    health_subjects: list[str] = Field(default_factory=lambda: ["gpu.health.>"], min_length=1)
    maintenance_subjects: list[str] = Field(default_factory=lambda: ["maintenance.>"], min_length=1)
    bucket: str = SNAPSHOT.name
    debounce: Duration = timedelta(seconds=0.5)
    """count once changes pause this long"""
    max_delay: Duration = timedelta(seconds=2)
    """count at least this soon after a change"""
    relist_delay: Duration = timedelta(seconds=2)
    """wait before listing again after a watch fails"""
    dra_drivers: list[str] = Field(
        default_factory=lambda: ["gpu.nvidia.com"],
        description="DRA drivers whose ResourceSlices publish GPUs (counted on nodes without"
        " a GPU extended resource)",
    )


app = Service(
    NAME,
    settings=CapacitySettings,
    access=ACCESS,
    buckets=(SNAPSHOT.name,),
    publishes=("capacity.>",),
)
_IN_ORDER: dict[str, Any] = {
    "concurrency": 4,
    "order_key": lambda e: str(e.data.node),
    "retry_delays": (0.5, 2.0, 10.0),
}
"""Both consumers (one durable name on GPU and on MAINTENANCE): in order per node."""


class CapacityService:
    """The fleet as the watches and the bus describe it, counted on each change."""

    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        snapshots: TypedKV[CapacitySnapshot],
        settings: CapacitySettings,
        registry: CollectorRegistry,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.snapshots = snapshots
        self.settings = settings
        self.nodes: dict[str, NodeView] = {}
        self.plain: dict[str, dict[str, Any]] = {}
        """Nodes with no GPU extended resource: counted if their ResourceSlices list GPUs."""
        self.slices: dict[str, tuple[str, int]] = {}
        """Per ResourceSlice name: its node and the GPUs it publishes (DRA)."""
        self.pods: dict[str, tuple[str, dict[str, int]]] = {}
        """Per pod uid: its node and the GPUs it holds there (only pods holding some)."""
        self.seen: dict[str, BusView] = {}
        self.published: dict[tuple[str, str], GpuCounts] = {}
        self.last: list[NodeCapacity] | None = None
        self.synced = {"nodes": False, "pods": False, "resourceslices": False}
        self.changed = asyncio.Event()
        self.gpus = Gauge(
            "nodeward_gpus",
            "GPUs (or MIG slices) per model, profile and state",
            ["model", "profile", "state"],
            registry=registry,
        )
        self.log = structlog.get_logger().bind(service=NAME)

    @property
    @app.ready("counted")
    def ready(self) -> bool:
        """Both lists read and the first snapshot written."""
        return all(self.synced.values()) and self.last is not None

    async def restore(self) -> None:
        """Take what the bus said from the last snapshot (the consumers resume after it)."""
        try:
            current = await self.snapshots.get(SNAPSHOT.key())
        except ValidationError as exc:  # a record it cannot read: count afresh
            self.log.warning("capacity.snapshot_unreadable", error=str(exc).splitlines()[0])
            return
        if current is None:
            return
        for n in current.value.nodes:
            self.seen[n.node] = BusView(dict(n.failed_gpus), n.maintenance_phase)
        for total in current.value.totals():
            self.published[(total.model, total.profile)] = total.counts

    # the bus --------------------------------------------------------------------------
    @app.consumes("GPU", subjects=setting("health_subjects"), types=(GpuHealth,), **_IN_ORDER)
    async def on_health(self, event: Event[Any], delivery: Delivery) -> None:
        health: GpuHealth = event.data
        failed = self.seen.setdefault(health.node, BusView()).failed
        key = health.gpu_key()
        was = key in failed
        if health.state == HealthState.FAILED:
            failed[key] = health.mig.profile if health.mig else None
        else:
            failed.pop(key, None)
        if was != (key in failed):
            self.log.info("capacity.gpu_health", node=health.node, gpu=key, state=health.state)
            self.changed.set()

    @app.consumes(
        "MAINTENANCE", subjects=setting("maintenance_subjects"), types=(Maintenance,), **_IN_ORDER
    )
    async def on_maintenance(self, event: Event[Any], delivery: Delivery) -> None:
        m: Maintenance = event.data
        view = self.seen.setdefault(m.node, BusView())
        if view.maintenance != m.phase.value:
            view.maintenance = m.phase.value
            self.log.info("capacity.maintenance", node=m.node, phase=m.phase.value)
            self.changed.set()

    # the watches ----------------------------------------------------------------------
    async def follow(
        self,
        what: str,
        listing: Callable[[], Awaitable[Listing]],
        watch: Callable[[str], AsyncIterator[WatchEvent]],
        replace: Callable[[list[dict[str, Any]]], None],
        apply: Callable[[WatchEvent], None],
    ) -> None:
        """List, then watch from the list's version; list again whenever the watch fails or
        its version expires (a relist replaces everything, so nothing deleted meanwhile stays)."""
        log = self.log.bind(watch=what)
        while True:
            try:
                listed = await listing()
                replace(listed.items)
                self.synced[what] = True
                self.changed.set()
                log.info("capacity.listed", count=len(listed.items))
                changes = watch(listed.resource_version)
                try:
                    async for change in changes:
                        if change.relisted:  # the version expired (410): what went is unknown
                            log.info("capacity.watch_expired")
                            break
                        apply(change)
                        self.changed.set()
                finally:
                    close = getattr(changes, "aclose", None)  # ends the watch request
                    if close is not None:
                        await close()
            except KubeError as exc:  # a watch that breaks is listed again, not fatal
                log.warning("capacity.watch_failed", error=str(exc) or type(exc).__name__)
            await asyncio.sleep(self.settings.relist_delay.total_seconds())

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        self.nodes, self.plain = {}, {}
        for node in items:
            self._apply_node(WatchEvent("ADDED", node))

    def _apply_node(self, change: WatchEvent) -> None:
        name = str(change.object.get("metadata", {}).get("name", ""))
        view = None if change.type == "DELETED" else node_view(change.object)
        self.nodes.pop(name, None)
        self.plain.pop(name, None)
        if view is not None:
            self.nodes[name] = view
        elif change.type != "DELETED":
            self.plain[name] = change.object

    def _replace_slices(self, items: list[dict[str, Any]]) -> None:
        self.slices = {}
        for item in items:
            self._apply_slice(WatchEvent("ADDED", item))

    def _apply_slice(self, change: WatchEvent) -> None:
        name = str(change.object.get("metadata", {}).get("name", ""))
        node, gpus = (
            (None, 0)
            if change.type == "DELETED"
            else slice_gpus(change.object, self.settings.dra_drivers)
        )
        if node is None or not gpus:
            self.slices.pop(name, None)
        else:
            self.slices[name] = (node, gpus)

    @app.task("watch-resourceslices")
    async def follow_slices(self) -> None:
        """ResourceSlices, where the cluster serves them (DRA); else nothing to follow."""
        version = None
        while version is None:
            try:
                version = await self.cluster.devices.slice_version()
            except KubeError as exc:
                self.log.warning("capacity.discovery_failed", error=str(exc))
                await asyncio.sleep(self.settings.relist_delay.total_seconds())
                continue
            if version is None:
                self.synced["resourceslices"] = True  # no DRA: no slices to wait for
                self.changed.set()
                return
        await self.follow(
            "resourceslices",
            lambda: self.cluster.devices.slice_listing(version),
            lambda rv: self.cluster.devices.slice_watch(version, resource_version=rv),
            self._replace_slices,
            self._apply_slice,
        )

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        self.pods = {}
        for pod in items:
            self._apply_pod(WatchEvent("ADDED", pod))

    def _apply_pod(self, change: WatchEvent) -> None:
        meta = change.object.get("metadata") or {}
        uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        node, gpus = (None, {}) if change.type == "DELETED" else pod_gpus(change.object)
        if node is None or not gpus:
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = (node, gpus)

    @app.task("watch-nodes")
    async def follow_nodes(self) -> None:
        await self.follow(
            "nodes",
            self.cluster.nodes.listing,
            lambda rv: self.cluster.nodes.watch(resource_version=rv),
            self._replace_nodes,
            self._apply_node,
        )

    @app.task("watch-pods")
    async def follow_pods(self) -> None:
        await self.follow(
            "pods",
            self.cluster.pods.listing,
            lambda rv: self.cluster.pods.watch(resource_version=rv),
            self._replace_pods,
            self._apply_pod,
        )

    # counting -------------------------------------------------------------------------
    def counted(self) -> list[NodeCapacity]:
        used: dict[str, dict[str, int]] = {}
        for node, gpus in self.pods.values():
            on = used.setdefault(node, {})
            for profile, n in gpus.items():
                on[profile] = on.get(profile, 0) + n
        views = dict(self.nodes)
        dra: dict[str, int] = {}
        for holder, published in self.slices.values():
            dra[holder] = dra.get(holder, 0) + published
        for name, obj in self.plain.items():
            if dra.get(name) and (view := node_view(obj, dra_gpus=dra[name])) is not None:
                views[name] = view
        return [
            count(view, used.get(name, {}), self.seen.get(name))
            for name, view in sorted(views.items())
        ]

    async def publish_once(self) -> None:
        """Count; if anything changed, write the snapshot, set the gauges, publish events."""
        nodes = self.counted()
        if nodes == self.last:
            return
        snapshot = CapacitySnapshot(at=datetime.now(UTC), nodes=nodes)
        await self.snapshots.put(SNAPSHOT.key(), snapshot)
        self.last = nodes
        totals = {(t.model, t.profile): t.counts for t in snapshot.totals()}
        self._gauges(totals)
        free_by_node: dict[tuple[str, str], dict[str, int]] = {}
        for n in nodes:
            for profile, counts in n.profiles.items():
                if counts.free:
                    free_by_node.setdefault((n.model, profile), {})[n.node] = counts.free
        events = []
        for key in sorted(totals.keys() | self.published.keys()):
            now, before = totals.get(key, GpuCounts()), self.published.get(key)
            if now == before:
                continue
            data = CapacityChanged(
                model=key[0],
                profile=key[1],
                counts=now,
                previous=before,
                free_by_node=free_by_node.get(key, {}),
            )
            events.append(make_event(data, source=ACTOR))
        if events:
            await self.bus.publish_many(events)
        self.published = totals
        self.log.info(
            "capacity.counted",
            nodes=len(nodes),
            free=sum(c.free for c in totals.values()),
            changed=len(events),
        )

    def _gauges(self, totals: dict[tuple[str, str], GpuCounts]) -> None:
        for key in self.published.keys() - totals.keys():
            for state in STATES:
                with contextlib.suppress(KeyError):
                    self.gpus.remove(key[0], key[1], state)
        for (model, profile), counts in totals.items():
            for state in STATES:
                self.gpus.labels(model, profile, state).set(counts.of(state))

    @app.task("count")
    async def publish_loop(self) -> None:
        """Count after each burst of changes: once `debounce` is quiet, or `max_delay` on."""
        debounce = self.settings.debounce.total_seconds()
        most = self.settings.max_delay.total_seconds()
        loop = asyncio.get_running_loop()
        while True:
            await self.changed.wait()
            first = loop.time()
            while True:  # wait out the burst
                self.changed.clear()
                await asyncio.sleep(min(debounce, max(most - (loop.time() - first), 0)))
                if not self.changed.is_set() or loop.time() - first >= most:
                    break
            self.changed.clear()
            if not all(self.synced.values()):
                continue
            try:
                await self.publish_once()
            except Exception:  # the next change tries again
                self.log.exception("capacity.publish_failed")
                self.changed.set()
                await asyncio.sleep(debounce)


@app.setup
async def setup(rt: Runtime[CapacitySettings]) -> CapacityService:
    """The counting over its snapshot, restored; `settings.cluster` must authenticate as its
    ServiceAccount."""
    kv = await rt.kv(rt.config.bucket, history=1)
    service = CapacityService(
        rt.bus, rt.acting, TypedKV(kv, CapacitySnapshot), rt.config, rt.daemon.metrics.registry
    )
    await service.restore()
    return service


build = app.build
component, standalone = app.daemon()
