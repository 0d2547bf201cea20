"""kube-controller-manager's node lifecycle controller for the sim cluster
(`pkg/controller/nodelifecycle/node_lifecycle_controller.go`, with
`pkg/controller/util/node/controller_utils.go` and `scheduler/rate_limited_queue.go`).

- **Node health** (`monitorNodeHealth`, `tryUpdateNodeHealth`), every `monitor_period_s`
  (`--node-monitor-period`, 5 s): a node is healthy while the controller keeps seeing its
  kubelet's signs: its Lease `kube-node-lease/<node>` renewed (a later `renewTime`) or its
  `Ready` condition's `lastHeartbeatTime` moved. When neither has happened for `grace_s`
  (`--node-monitor-grace-period`: 40 s up to 1.31, 50 s from 1.32; `startup_grace_s`, 60 s,
  for a node that never posted `Ready`), its `Ready`, `MemoryPressure`, `DiskPressure` and
  `PIDPressure` conditions become `Unknown` (reason `NodeStatusUnknown`, message `Kubelet
  stopped posting node status.`, `lastTransitionTime` now; a missing one is added,
  `NodeStatusNeverUpdated`), and, on that transition, every pod on the node gets `Ready=False`
  (`MarkPodsNotReady`).
- **Condition taints** (`doNoScheduleTaintingPass`, on every change of a node):
  `node.kubernetes.io/not-ready` (`Ready=False`), `unreachable` (`Ready=Unknown`),
  `memory-pressure`, `disk-pressure`, `pid-pressure`, `network-unavailable` (their conditions
  `True`) as `NoSchedule` taints with `timeAdded`, removed when the condition clears.
- **Taint-based eviction** (`processTaintBaseEviction`, `doNoExecuteTaintingPass`): a node
  seen `Ready=False` or `Unknown` at a pass is queued for the `not-ready` or `unreachable`
  `NoExecute` taint (the other one swapped out), added through a per-zone rate limiter
  (`eviction_qps`, `--node-eviction-rate` 0.1/s, burst 1); a node seen `Ready=True` loses both
  (`markNodeAsReachable`). Zones (`topology.kubernetes.io/region` and `zone`) follow
  `ComputeZoneState` and `handleDisruption`: a zone with more than 2 and at least 55 % of its
  nodes not ready is partially disrupted (tainting stops, or slows to 0.01/s over 50 nodes);
  when every zone has no Ready node at all, the controller takes every such taint off and
  taints nothing until one is Ready again. The `NoExecute` taints then act through the taint
  eviction controller (`sim.cluster.controllers`).

Not simulated: the controller's events (`NodeNotReady`, `RegisteredNode`, ...), the beta
OS/arch label reconciliation, and the `node.kubernetes.io/unschedulable` taint
`doNoScheduleTaintingPass` gives a cordoned node.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any

from nodeward.logs import get_logger
from sim.cluster.errors import ApiError
from sim.cluster.kubelet import LEASES, NODE_LEASE_NAMESPACE, condition, parse_time
from sim.cluster.resources import require
from sim.cluster.store import Change, Obj, Store, now

PODS = require("", "v1", "pods")
NODES = require("", "v1", "nodes")

NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
CONDITION_TAINTS: dict[str, dict[str, str]] = {
    "Ready": {"False": NOT_READY, "Unknown": UNREACHABLE},
    "MemoryPressure": {"True": "node.kubernetes.io/memory-pressure"},
    "DiskPressure": {"True": "node.kubernetes.io/disk-pressure"},
    "NetworkUnavailable": {"True": "node.kubernetes.io/network-unavailable"},
    "PIDPressure": {"True": "node.kubernetes.io/pid-pressure"},
}
"""`nodeConditionToTaintKeyStatusMap`."""
_CONDITION_TAINT_KEYS = frozenset(k for m in CONDITION_TAINTS.values() for k in m.values())
MONITORED = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
"""The conditions set `Unknown` when the kubelet stops posting (not `NetworkUnavailable`)."""
STOPPED_REASON = "NodeStatusUnknown"
STOPPED_MESSAGE = "Kubelet stopped posting node status."
NEVER_REASON = "NodeStatusNeverUpdated"
NEVER_MESSAGE = "Kubelet never posted node status."
EXCLUDE_DISRUPTION = "node.kubernetes.io/exclude-disruption"
LARGE_CLUSTER_THRESHOLD = 50  # --large-cluster-size-threshold
UNHEALTHY_ZONE_THRESHOLD = 0.55  # --unhealthy-zone-threshold
SECONDARY_EVICTION_QPS = 0.01  # --secondary-node-eviction-rate

INITIAL, NORMAL, FULL, PARTIAL = "Initial", "Normal", "FullDisruption", "PartialDisruption"


def default_grace_s(minor: int) -> float:
    """`--node-monitor-grace-period`'s default in release 1.`minor`: 40 s, 50 s from 1.32
    (kubernetes/kubernetes#126287)."""
    return 50.0 if minor >= 32 else 40.0


def zone_key(node: Obj) -> str:
    """`nodetopology.GetZoneKey`: region and zone (the beta labels as fallback), "" if none."""
    labels = node["metadata"].get("labels") or {}
    zone = labels.get("topology.kubernetes.io/zone")
    if zone is None:
        zone = labels.get("failure-domain.beta.kubernetes.io/zone", "")
    region = labels.get("topology.kubernetes.io/region")
    if region is None:
        region = labels.get("failure-domain.beta.kubernetes.io/region", "")
    return f"{region}:\x00:{zone}" if region or zone else ""


def _has_taint(node: Obj, key: str, effect: str) -> bool:
    return any(
        t.get("key") == key and t.get("effect") == effect
        for t in (node.get("spec") or {}).get("taints") or []
    )


@dataclass
class _Health:
    """`nodeHealthData`: when the controller last saw a sign of the kubelet (`probe`, its own
    clock), the `Ready` condition it saw then, and the Lease's `renewTime`."""

    probe: float
    ready: Obj | None
    renewed: float | None = None
    lease: str | None = None  # the renewTime as written, parsed only when it changes


@dataclass
class _ZoneQueue:
    """`RateLimitedTimedQueue` with its token bucket (burst 1): the nodes waiting for their
    `NoExecute` taint, in the order queued; a node stays a member once tainted (`UniqueQueue`'s
    set), so it is not queued again until removed."""

    qps: float
    available_at: float = 0.0
    pending: dict[str, None] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)

    def add(self, name: str) -> None:
        if name not in self.members:
            self.members.add(name)
            self.pending[name] = None

    def remove(self, name: str) -> None:
        self.members.discard(name)
        self.pending.pop(name, None)

    def try_accept(self, at: float) -> bool:
        if self.qps <= 0 or at < self.available_at:
            return False
        self.available_at = at + 1.0 / self.qps
        return True

    def swap(self, qps: float, at: float) -> None:
        """`SwapLimiter`: a new bucket, drained if the old one was."""
        if qps == self.qps:
            return
        exhausted = self.qps <= 0 or at < self.available_at
        self.qps = qps
        self.available_at = at + 1.0 / qps if qps > 0 and exhausted else at


class NodeLifecycle:
    """The node lifecycle controller; `install` hooks its condition tainting on the store,
    `monitor` is one pass of its health monitor (the caller runs it every
    `monitor_period_s`)."""

    def __init__(
        self,
        store: Store,
        *,
        monitor_period_s: float = 5.0,
        grace_s: float = 50.0,
        startup_grace_s: float = 60.0,
        eviction_qps: float = 0.1,
    ) -> None:
        self.store = store
        self.monitor_period_s = monitor_period_s
        self.grace_s = grace_s
        self.startup_grace_s = startup_grace_s
        self.eviction_qps = eviction_qps
        self._health: dict[str, _Health] = {}
        self._known: set[str] = set()
        self._zones: dict[str, _ZoneQueue] = {}
        self._zone_states: dict[str, str] = {}
        self._tainting: set[str] = set()  # nodes whose NoSchedule pass is queued
        self._log = get_logger(component="sim-node-lifecycle")

    def install(self) -> None:
        self.store.hooks.append(self._hook)

    def _hook(self, change: Change) -> None:
        if change.key != NODES.key:
            return
        name = change.obj["metadata"]["name"]
        if change.type == "DELETED":
            self._health.pop(name, None)
            return
        if name in self._tainting:
            return
        with contextlib.suppress(RuntimeError):  # no loop, no controller
            asyncio.get_running_loop().call_soon(self._no_schedule_pass, name)
            self._tainting.add(name)

    # --- NoSchedule taints from conditions --------------------------------------------------

    def _no_schedule_pass(self, name: str) -> None:
        """`doNoScheduleTaintingPass`: the node's condition taints (`NoSchedule`) match its
        conditions."""
        self._tainting.discard(name)
        node = self.store.peek_one(NODES, "", name)
        if node is None:
            return
        wanted = {
            key
            for c in (node.get("status") or {}).get("conditions") or []
            if (key := CONDITION_TAINTS.get(str(c.get("type")), {}).get(str(c.get("status"))))
        }
        taints = (node.get("spec") or {}).get("taints") or []
        present = {
            t.get("key")
            for t in taints
            if t.get("effect") == "NoSchedule" and t.get("key") in _CONDITION_TAINT_KEYS
        }
        if wanted == present:
            return
        self._swap(
            name,
            add=[(k, "NoSchedule") for k in sorted(wanted - present)],
            remove=[(k, "NoSchedule") for k in sorted(present - wanted)],
        )

    def _swap(
        self, name: str, *, add: list[tuple[str, str]], remove: list[tuple[str, str]]
    ) -> bool:
        """`SwapNodeControllerTaint`: add the taints (key and effect, with `timeAdded` now),
        remove the others; False if the node is gone or the write refused."""
        node = self.store.find(NODES, "", name)
        if node is None:
            return False
        spec = node.setdefault("spec", {})
        before = spec.get("taints") or []
        gone, stamp = set(remove), now()
        taints = [t for t in before if (t.get("key"), t.get("effect")) not in gone]
        present = {(t.get("key"), t.get("effect")) for t in taints}
        taints += [
            {"key": k, "effect": e, "timeAdded": stamp} for k, e in add if (k, e) not in present
        ]
        if taints == before:
            return True
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        try:
            self.store.update(NODES, "", name, node, check_rv=False)
        except ApiError as exc:
            self._log.info("taint refused", node=name, error=exc.message)
            return False
        return True

    # --- the health monitor ---------------------------------------------------------------

    def monitor(self, at: float | None = None) -> None:
        """One pass of `monitorNodeHealth`, then of `doNoExecuteTaintingPass`; `at`: the
        controller's clock (seconds since the epoch; now by default)."""
        at = time.time() if at is None else at
        nodes = list(self.store.peek(NODES))
        names = {n["metadata"]["name"] for n in nodes}
        self._known &= names
        by_zone: dict[str, list[str | None]] = {}
        gone_not_ready: set[str] = set()
        for listed in nodes:
            node, name = listed, listed["metadata"]["name"]
            zone = zone_key(node)
            if zone not in self._zone_states:  # addPodEvictorForNewZone
                self._zone_states[zone] = INITIAL
                self._zones[zone] = _ZoneQueue(self.eviction_qps)
            if name not in self._known:  # a node added: as `classifyNodes` finds it
                self._known.add(name)
                self._mark_reachable(name)
                self._no_schedule_pass(name)
                node = self.store.peek_one(NODES, "", name) or node
            observed, current, wrote = self._update_health(node, at)
            if wrote:
                node = self.store.peek_one(NODES, "", name) or node
            if EXCLUDE_DISRUPTION not in (node["metadata"].get("labels") or {}):
                by_zone.setdefault(zone, []).append(current)
            if current is None:
                continue
            self._taint_based_eviction(node, zone, observed)
            if current != "True" and observed == "True":
                gone_not_ready.add(name)
        if gone_not_ready:
            self._mark_pods_not_ready(gone_not_ready)
        self._handle_disruption(by_zone, names, at)
        self._no_execute_tainting_pass(at)

    def _update_health(self, node: Obj, at: float) -> tuple[str, str | None, bool]:
        """`tryUpdateNodeHealth`: the Ready status observed, the one after this pass, and
        whether this pass wrote the node's status."""
        name = node["metadata"]["name"]
        ready = condition(node, "Ready")
        if ready is None:
            observed, grace = "Unknown", self.startup_grace_s
        else:
            observed, grace = str(ready.get("status")), self.grace_s
        health = self._health.get(name)
        saved = health.ready if health is not None else None
        if health is None:
            created = parse_time(node["metadata"].get("creationTimestamp")) or at
            health = _Health(probe=at if ready is not None else created, ready=ready)
        elif (saved is None) != (ready is None) or (
            saved is not None
            and ready is not None
            and saved.get("lastHeartbeatTime") != ready.get("lastHeartbeatTime")
        ):
            health = _Health(probe=at, ready=ready, renewed=health.renewed, lease=health.lease)
        lease = self.store.peek_one(LEASES, NODE_LEASE_NAMESPACE, name)
        text = ((lease or {}).get("spec") or {}).get("renewTime")
        if text != health.lease:  # parsed only when it changed
            renewed = parse_time(text)
            if renewed is not None and (health.renewed is None or health.renewed < renewed):
                health.renewed = renewed  # "Always update the probe time if node lease is renewed."
                health.lease = text
                health.probe = at
        self._health[name] = health
        if at <= health.probe + grace:
            return observed, observed if ready is not None else None, False
        new = copy.deepcopy(node)
        conditions = new.setdefault("status", {}).setdefault("conditions", [])
        stamp = now()
        for kind in MONITORED:
            current = next((c for c in conditions if c.get("type") == kind), None)
            if current is None:
                conditions.append(
                    {
                        "type": kind,
                        "status": "Unknown",
                        "reason": NEVER_REASON,
                        "message": NEVER_MESSAGE,
                        "lastHeartbeatTime": node["metadata"].get("creationTimestamp"),
                        "lastTransitionTime": stamp,
                    }
                )
            elif current.get("status") != "Unknown":
                current.update(
                    status="Unknown",
                    reason=STOPPED_REASON,
                    message=STOPPED_MESSAGE,
                    lastTransitionTime=stamp,
                )
        now_ready = condition(new, "Ready")
        if now_ready == ready:
            return observed, observed, False
        try:
            self.store.update(NODES, "", name, new, subresource="status", check_rv=False)
        except ApiError as exc:
            self._log.info("node status refused", node=name, error=exc.message)
            return observed, observed if ready is not None else None, False
        self._log.info("node unreachable", node=name, since_s=round(at - health.probe, 1))
        self._health[name] = _Health(
            probe=health.probe, ready=now_ready, renewed=health.renewed, lease=health.lease
        )
        return observed, "Unknown", True

    def _mark_pods_not_ready(self, nodes: set[str]) -> None:
        """`MarkPodsNotReady`: each pod on these nodes gets `Ready=False`."""
        for pod in list(self.store.peek(PODS)):
            if (pod.get("spec") or {}).get("nodeName") not in nodes:
                continue
            ready = condition(pod, "Ready")
            if ready is None or ready.get("status") == "False":
                continue
            new = copy.deepcopy(pod)
            cond = condition(new, "Ready")
            assert cond is not None
            cond.update(status="False", lastTransitionTime=now())
            meta = pod["metadata"]
            try:
                self.store.update(
                    PODS, meta["namespace"], meta["name"], new, subresource="status", check_rv=False
                )
            except ApiError as exc:
                self._log.info("pod status refused", pod=meta["name"], error=exc.message)

    # --- NoExecute taints -----------------------------------------------------------------

    def _taint_based_eviction(self, node: Obj, zone: str, observed: str) -> None:
        """`processTaintBaseEviction`, on the Ready status this pass observed."""
        name = node["metadata"]["name"]
        if observed == "False":
            if _has_taint(node, UNREACHABLE, "NoExecute"):
                self._swap(
                    name, add=[(NOT_READY, "NoExecute")], remove=[(UNREACHABLE, "NoExecute")]
                )
            else:
                self._mark_for_tainting(node, NOT_READY)
        elif observed == "Unknown":
            if _has_taint(node, NOT_READY, "NoExecute"):
                self._swap(
                    name, add=[(UNREACHABLE, "NoExecute")], remove=[(NOT_READY, "NoExecute")]
                )
            else:
                self._mark_for_tainting(node, UNREACHABLE)
        elif observed == "True" and (
            name in self._zones[zone].members
            or _has_taint(node, UNREACHABLE, "NoExecute")
            or _has_taint(node, NOT_READY, "NoExecute")
        ):
            self._mark_reachable(name)  # (nothing to do for a node with neither)

    def _mark_for_tainting(self, node: Obj, key: str) -> None:
        """`markNodeForTainting`: queued again unless it has the taint already."""
        queue = self._zones[zone_key(node)]
        name = node["metadata"]["name"]
        if not _has_taint(node, key, "NoExecute"):
            queue.remove(name)
        queue.add(name)

    def _mark_reachable(self, name: str) -> None:
        """`markNodeAsReachable`: both `NoExecute` taints off, out of the queue."""
        node = self.store.peek_one(NODES, "", name)
        if node is None:
            return
        if _has_taint(node, UNREACHABLE, "NoExecute") or _has_taint(node, NOT_READY, "NoExecute"):
            self._swap(name, add=[], remove=[(UNREACHABLE, "NoExecute"), (NOT_READY, "NoExecute")])
        queue = self._zones.get(zone_key(node))
        if queue is not None:
            queue.remove(name)

    def _no_execute_tainting_pass(self, at: float) -> None:
        """`doNoExecuteTaintingPass`: per zone, as its limiter allows, each queued node gets
        the taint its `Ready` condition calls for now (none if it is Ready again)."""
        for queue in self._zones.values():
            for name in list(queue.pending):
                if not queue.try_accept(at):
                    break
                node = self.store.peek_one(NODES, "", name)
                ready = condition(node, "Ready") if node is not None else None
                if node is not None and ready is None:
                    continue  # tried again on the next pass
                queue.pending.pop(name, None)
                status = (ready or {}).get("status")
                if status == "False":
                    add, remove = NOT_READY, UNREACHABLE
                elif status == "Unknown":
                    add, remove = UNREACHABLE, NOT_READY
                else:
                    continue
                if not self._swap(name, add=[(add, "NoExecute")], remove=[(remove, "NoExecute")]):
                    queue.pending[name] = None

    # --- zones ----------------------------------------------------------------------------

    def _zone_state(self, conditions: list[str | None]) -> str:
        """`ComputeZoneState`."""
        ready = sum(1 for c in conditions if c == "True")
        not_ready = len(conditions) - ready
        if ready == 0 and not_ready > 0:
            return FULL
        if not_ready > 2 and not_ready / (not_ready + ready) >= UNHEALTHY_ZONE_THRESHOLD:
            return PARTIAL
        return NORMAL

    def _qps(self, state: str, size: int) -> float:
        """`setLimiterInZone`."""
        if state == PARTIAL:
            return SECONDARY_EVICTION_QPS if size > LARGE_CLUSTER_THRESHOLD else 0.0
        return self.eviction_qps

    def _handle_disruption(
        self, by_zone: dict[str, list[str | None]], names: set[str], at: float
    ) -> None:
        """`handleDisruption`: the zones' states and their limiters; when every zone is fully
        disrupted, nobody is tainted (the master's own connectivity is more likely at fault)."""
        new_states = {zone: self._zone_state(conds) for zone, conds in by_zone.items()}
        all_are = all(s == FULL for s in new_states.values())
        for zone in by_zone:
            self._zone_states.setdefault(zone, INITIAL)
        all_were = True
        for zone, state in list(self._zone_states.items()):
            if zone not in by_zone:
                del self._zone_states[zone]
                continue
            if state != FULL:
                all_were = False
                break
        if all_are and all_were:
            return
        if all_are:
            self._log.info("every node not ready: master disruption mode")
            for name in names:
                self._mark_reachable(name)
            for zone in self._zone_states:
                self._zones[zone].swap(0.0, at)
                self._zone_states[zone] = FULL
            return
        if all_were:
            self._log.info("some nodes ready: out of master disruption mode")
            for health in self._health.values():
                health.probe = at
            for zone, old in self._zone_states.items():
                state = new_states.get(zone, old)
                self._zones[zone].swap(self._qps(state, len(by_zone.get(zone, []))), at)
                self._zone_states[zone] = state
            return
        for zone, state in self._zone_states.items():
            new = new_states.get(zone, state)
            if new != state:
                self._zones[zone].swap(self._qps(new, len(by_zone.get(zone, []))), at)
                self._zone_states[zone] = new

    def health(self) -> dict[str, Any]:
        """What the controller knows (for debugging): per node, seconds since its kubelet's
        last sign and the zone states."""
        at = time.time()
        return {
            "nodes": {n: round(at - h.probe, 3) for n, h in self._health.items()},
            "zones": dict(self._zone_states),
        }
