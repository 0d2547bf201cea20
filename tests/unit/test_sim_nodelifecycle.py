"""The sim's node lifecycle controller and kubelet heartbeats, on a store, the controller's
clock given: grace periods, zones' disruption, the tainting rate, the kubelets' status.

Sources: `pkg/controller/nodelifecycle/node_lifecycle_controller.go` (`tryUpdateNodeHealth`,
`handleDisruption`, `ComputeZoneState`, `doNoExecuteTaintingPass`),
`pkg/controller/nodelifecycle/scheduler/rate_limited_queue.go`,
`pkg/kubelet/kubelet_node_status.go`, `pkg/kubelet/nodestatus/setters.go`.
"""

from __future__ import annotations

from sim.cluster.kubelet import KUBELET, Kubelets, micro_time, parse_time
from sim.cluster.nodelifecycle import NodeLifecycle, default_grace_s, zone_key
from sim.cluster.resources import require
from sim.cluster.seed import NodeSeed, Seed, apply_seed
from sim.cluster.store import Obj, Store

NODES = require("", "v1", "nodes")
LEASES = require("coordination.k8s.io", "v1", "leases")
GRACE = 40.0


def _store(zones: dict[str, int]) -> Store:
    store = Store()
    nodes = [
        NodeSeed(name=f"{zone}-{i}", zone=zone, gpu=None)
        for zone, count in zones.items()
        for i in range(count)
    ]
    apply_seed(store, Seed(nodes=nodes))
    return store


def _ready(store: Store, name: str) -> str:
    node = store.get(NODES, "", name)
    return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")


def _no_execute(store: Store, name: str) -> set[str]:
    node = store.get(NODES, "", name)
    return {t["key"] for t in node["spec"].get("taints") or [] if t["effect"] == "NoExecute"}


def _renew(store: Store, names: list[str]) -> None:
    """The kubelets of `names` renew their Leases (a later `renewTime` each time)."""
    for name in names:
        lease = store.get(LEASES, "kube-node-lease", name)
        lease["spec"]["renewTime"] = micro_time()
        store.update(LEASES, "kube-node-lease", name, lease)


def _passes(controller: NodeLifecycle, start: float, until: float, step: float = 5.0) -> float:
    at = start
    while at <= until:
        controller.monitor(at)
        at += step
    return at


def test_the_grace_period_is_the_releases() -> None:
    assert default_grace_s(31) == 40.0
    assert default_grace_s(32) == 50.0
    assert default_grace_s(37) == 50.0


def test_zone_key_as_get_zone_key() -> None:
    node: Obj = {"metadata": {"labels": {"topology.kubernetes.io/zone": "z"}}}
    assert zone_key(node) == ":\x00:z"
    assert zone_key({"metadata": {}}) == ""


def test_a_silent_node_goes_unknown_after_the_grace_then_gets_the_no_execute_taint() -> None:
    store = _store({"a": 3})
    controller = NodeLifecycle(store, grace_s=GRACE)
    t0 = 1_000_000.0
    controller.monitor(t0)
    healthy = ["a-0", "a-1"]
    at = t0
    while at < t0 + GRACE:
        at += 5.0
        _renew(store, healthy)
        controller.monitor(at)
    assert _ready(store, "a-2") == "True", "within the grace"
    at += 5.0
    _renew(store, healthy)
    controller.monitor(at)
    assert _ready(store, "a-2") == "Unknown"
    assert _no_execute(store, "a-2") == set(), "tainted on the pass that observes Unknown"
    at += 5.0
    _renew(store, healthy)
    controller.monitor(at)
    assert _no_execute(store, "a-2") == {"node.kubernetes.io/unreachable"}
    assert all(_ready(store, n) == "True" and not _no_execute(store, n) for n in healthy)


def test_when_every_zone_is_down_nothing_is_tainted() -> None:
    store = _store({"a": 2, "b": 1})
    controller = NodeLifecycle(store, grace_s=GRACE)
    t0 = 1_000_000.0
    _passes(controller, t0, t0 + 3 * GRACE)
    assert all(_ready(store, n) == "Unknown" for n in ("a-0", "a-1", "b-0"))
    assert not any(_no_execute(store, n) for n in ("a-0", "a-1", "b-0")), "master disruption"


def test_a_partially_disrupted_small_zone_stops_tainting_and_the_rate_limits_the_rest() -> None:
    store = _store({"a": 4, "b": 4})
    controller = NodeLifecycle(store, grace_s=GRACE, eviction_qps=0.1)
    t0 = 1_000_000.0
    controller.monitor(t0)
    alive = ["a-0", "b-0", "b-1", "b-2"]  # zone a: 3 of 4 down (partial); zone b: 1 of 4
    at = t0
    while at < t0 + GRACE + 10.0:
        at += 5.0
        _renew(store, alive)
        controller.monitor(at)
    assert all(_ready(store, n) == "Unknown" for n in ("a-1", "a-2", "a-3", "b-3"))
    assert not any(_no_execute(store, n) for n in ("a-1", "a-2", "a-3")), "small partial zone"
    assert _no_execute(store, "b-3") == {"node.kubernetes.io/unreachable"}

    store2 = _store({"c": 8})
    controller2 = NodeLifecycle(store2, grace_s=GRACE, eviction_qps=0.1)
    controller2.monitor(t0)
    alive2 = [f"c-{i}" for i in range(6)]  # 2 of 8 down: normal, 0.1/s, burst 1
    at = t0
    tainted: list[tuple[float, str]] = []
    while at < t0 + GRACE + 40.0:
        at += 1.0
        _renew(store2, alive2)
        controller2.monitor(at)
        for name in ("c-6", "c-7"):
            if _no_execute(store2, name) and name not in {n for _, n in tainted}:
                tainted.append((at, name))
    assert len(tainted) == 2
    assert tainted[1][0] - tainted[0][0] >= 10.0, "one node per 10 s in a zone"


def test_a_node_that_never_posted_ready_gets_the_startup_grace() -> None:
    store = _store({"a": 2})
    node = store.get(NODES, "", "a-1")
    node["status"]["conditions"] = []
    store.update(NODES, "", "a-1", node, subresource="status")
    controller = NodeLifecycle(store, grace_s=GRACE, startup_grace_s=60.0)
    created = parse_time(node["metadata"]["creationTimestamp"])
    assert created is not None
    lease = store.get(LEASES, "kube-node-lease", "a-1")
    store.delete(LEASES, "kube-node-lease", "a-1")
    assert lease
    controller.monitor(created + 30.0)
    assert not store.get(NODES, "", "a-1")["status"]["conditions"]
    _renew(store, ["a-0"])
    controller.monitor(created + 61.0)
    conditions = {c["type"]: c for c in store.get(NODES, "", "a-1")["status"]["conditions"]}
    assert set(conditions) == {"Ready", "MemoryPressure", "DiskPressure", "PIDPressure"}
    assert conditions["Ready"]["reason"] == "NodeStatusNeverUpdated"
    assert conditions["Ready"]["message"] == "Kubelet never posted node status."


async def test_the_sim_kubelet_keeps_its_verdict_and_posts_ready_for_unknown() -> None:
    store = _store({"a": 3})
    node = store.get(NODES, "", "a-1")
    for c in node["status"]["conditions"]:
        if c["type"] == "Ready":
            c.update(status="False", reason="KubeletNotReady")
    store.update(NODES, "", "a-1", node, subresource="status")
    node = store.get(NODES, "", "a-2")
    for c in node["status"]["conditions"]:
        c["status"] = "Unknown"
    node["metadata"].setdefault("annotations", {})
    store.update(NODES, "", "a-2", node, subresource="status")
    external = store.get(NODES, "", "a-0")
    external["metadata"]["annotations"][KUBELET] = "external"
    store.update(NODES, "", "a-0", external)
    store.delete(LEASES, "kube-node-lease", "a-2")
    before = {n: store.get(NODES, "", n)["metadata"]["resourceVersion"] for n in ("a-0", "a-1")}
    lease_before = store.get(LEASES, "kube-node-lease", "a-0")["spec"]["renewTime"]

    kubelets = Kubelets(store, status_report_s=300.0)
    await kubelets.heartbeat()

    assert _ready(store, "a-1") == "False", "a NotReady it was told stands"
    assert store.get(NODES, "", "a-1")["metadata"]["resourceVersion"] == before["a-1"], (
        "nothing changed, no report due: no write"
    )
    fixed = {c["type"]: c for c in store.get(NODES, "", "a-2")["status"]["conditions"]}
    assert fixed["Ready"]["status"] == "True" and fixed["Ready"]["reason"] == "KubeletReady"
    assert fixed["MemoryPressure"]["status"] == "False"
    lease = store.get(LEASES, "kube-node-lease", "a-2")
    assert lease["spec"]["holderIdentity"] == "a-2" and lease["spec"]["leaseDurationSeconds"] == 40
    assert lease["metadata"]["ownerReferences"][0]["name"] == "a-2"
    assert store.get(NODES, "", "a-0")["metadata"]["resourceVersion"] == before["a-0"]
    assert store.get(LEASES, "kube-node-lease", "a-0")["spec"]["renewTime"] == lease_before
