"""The sim cluster's nodes live and die as a real cluster's do: kubelets renew their Leases,
the node lifecycle controller marks a silent node `Unknown` and taints it, nothing happens on
it while its kubelet is down, and the out-of-service taint lets Pod GC force-delete its
terminating pods (the non-graceful node shutdown).

Sources: `pkg/controller/nodelifecycle/node_lifecycle_controller.go` (`tryUpdateNodeHealth`,
`MarkPodsNotReady`, `doNoScheduleTaintingPass`, `processTaintBaseEviction`,
`markNodeAsReachable`), `pkg/kubelet/nodelease` with `component-helpers/apimachinery/lease`,
`pkg/kubelet/kubelet_node_status.go`, `pkg/controller/podgc/gc_controller.go`
(`gcTerminating`), `pkg/controller/tainteviction/taint_eviction.go`
(`addConditionAndDeletePod`), `plugin/pkg/admission/defaulttolerationseconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from sim.cluster import SimCluster
from sim.cluster.kubelet import KUBELET
from sim.cluster.seed import NodeSeed, Seed
from tests.conftest import wait_for
from tests.integration.simkube import sim_http

NS = "ml-life"
PODS = f"/api/v1/namespaces/{NS}/pods"
STATEFULSETS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
SMP = {"Content-Type": "application/strategic-merge-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
GRACE = 3.0  # the lifecycle controller's grace here: a loaded machine's loop stalls far less
SHORT = {
    "lease_renew_s": 0.25,
    "node_monitor_period_s": 0.25,
    "node_monitor_grace_s": GRACE,
    "node_eviction_qps": 100.0,
}
NODES = ("life-a", "life-b", "life-c", "life-d")


@pytest.fixture
async def sim() -> AsyncIterator[SimCluster]:
    seed = Seed(namespaces=[NS], nodes=[NodeSeed(name=n, gpu=None) for n in NODES])
    async with SimCluster(seed, port=0, bookmark_interval=0.2, **SHORT) as cluster:
        yield cluster


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _taints(node: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(t["key"], t["effect"]): t for t in (node.get("spec") or {}).get("taints") or []}


async def _node(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    answer = await http.get(f"/api/v1/nodes/{name}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def _get(http: httpx.AsyncClient, path: str) -> dict[str, Any] | None:
    answer = await http.get(path)
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def _patch(http: httpx.AsyncClient, path: str, body: Any, headers: Any = MERGE) -> Any:
    answer = await http.patch(path, content=json.dumps(body), headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def _make_external(http: httpx.AsyncClient, node: str) -> None:
    """The node's kubelet is an outside process from now on (here: none yet)."""
    await _patch(
        http, f"/api/v1/nodes/{node}", {"metadata": {"annotations": {KUBELET: "external"}}}
    )


def _pod(name: str, node: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox:1.36"}],
            **spec,
        },
    }


async def _running(http: httpx.AsyncClient, path: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = await _get(http, path)
        ok = pod and pod["status"].get("phase") == "Running"
        return pod if ok and _conditions(pod)["Ready"]["status"] == "True" else None

    return await wait_for(check, timeout=20, what=f"{path} running and ready")  # type: ignore[no-any-return]


async def _unknown(http: httpx.AsyncClient, node: str) -> dict[str, Any]:
    """Wait for the lifecycle controller to find `node` silent and taint it."""

    async def check() -> dict[str, Any] | None:
        got = await _node(http, node)
        tainted = ("node.kubernetes.io/unreachable", "NoExecute") in _taints(got)
        return got if tainted and _conditions(got)["Ready"]["status"] == "Unknown" else None

    return await wait_for(check, timeout=4 * GRACE, what=f"{node} Unknown and tainted")  # type: ignore[no-any-return]


async def _stays(
    check: Callable[[], Awaitable[bool]], seconds: float, what: str, interval: float = 0.1
) -> None:
    """Observe `check` hold for `seconds` (a duration observed, not a synchronisation)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        assert await check(), what
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def _external_kubelet(
    http: httpx.AsyncClient, node: str, *, boot_id: str | None = None, ready: str = "True"
) -> AsyncIterator[None]:
    """A stand-in for the outside kubelet of the contract in docs/sim-cluster.md: on start, a
    strategic merge PATCH of the node's status (its `bootID` and `Ready`); then it renews
    the node's Lease every 0.25 s and posts `Ready` again whenever it is not what it says."""
    reasons = {
        "True": ("KubeletReady", "kubelet is posting ready status"),
        "False": ("KubeletNotReady", "container runtime is down"),
    }

    async def post_status() -> None:
        reason, message = reasons[ready]
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status: dict[str, Any] = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ]
        }
        if boot_id is not None:
            status["nodeInfo"] = {"bootID": boot_id}
        await _patch(http, f"/api/v1/nodes/{node}/status", {"status": status}, SMP)

    async def beat() -> None:
        while True:
            lease = await _get(http, f"{LEASES}/{node}")
            assert lease is not None
            lease["spec"]["renewTime"] = _micro_now()
            answer = await http.put(f"{LEASES}/{node}", json=lease)
            assert answer.status_code in (200, 409), answer.text
            if _conditions(await _node(http, node))["Ready"]["status"] != ready:
                await post_status()
            await asyncio.sleep(0.25)

    await post_status()
    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_silent_external_kubelet_makes_its_node_unknown_until_it_posts_again(
    sim: SimCluster,
) -> None:
    async with sim_http(sim) as http:
        assert (await http.post(PODS, json=_pod("victim", "life-b"))).status_code == 201
        await _running(http, f"{PODS}/victim")
        before = await _node(http, "life-b")
        marked = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await _make_external(http, "life-b")

        node = await _unknown(http, "life-b")
        conditions = _conditions(node)
        for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"):
            assert conditions[kind]["status"] == "Unknown", kind
            assert conditions[kind]["reason"] == "NodeStatusUnknown"
            assert conditions[kind]["message"] == "Kubelet stopped posting node status."
            assert conditions[kind]["lastTransitionTime"] >= marked
            # the controller does not pretend a heartbeat
            assert (
                conditions[kind]["lastHeartbeatTime"]
                == _conditions(before)[kind]["lastHeartbeatTime"]
            )
        taints = _taints(node)
        assert set(taints) == {
            ("node.kubernetes.io/unreachable", "NoSchedule"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
        }
        assert all(t.get("timeAdded") for t in taints.values())
        pod = await _get(http, f"{PODS}/victim")
        assert pod is not None
        assert _conditions(pod)["Ready"]["status"] == "False", "MarkPodsNotReady"
        assert _conditions(pod)["ContainersReady"]["status"] == "True"
        assert pod["status"]["phase"] == "Running"
        # admission's 300 s tolerations keep it there for now
        tolerated = {t["key"]: t for t in pod["spec"]["tolerations"]}
        assert tolerated["node.kubernetes.io/unreachable"]["tolerationSeconds"] == 300
        others = [await _node(http, n) for n in NODES if n != "life-b"]
        assert all(_conditions(n)["Ready"]["status"] == "True" for n in others)
        assert not any(_taints(n) for n in others)

        async with _external_kubelet(http, "life-b"):

            async def back() -> bool:
                got = await _node(http, "life-b")
                return _conditions(got)["Ready"]["status"] == "True" and not _taints(got)

            await wait_for(back, timeout=4 * GRACE, what="life-b Ready and untainted")
            pod = await _running(http, f"{PODS}/victim")
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, "same boot"


async def test_a_node_posting_not_ready_gets_the_not_ready_taints(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _make_external(http, "life-c")
        async with _external_kubelet(http, "life-c", ready="False"):

            async def not_ready() -> bool:
                taints = _taints(await _node(http, "life-c"))
                return set(taints) == {
                    ("node.kubernetes.io/not-ready", "NoSchedule"),
                    ("node.kubernetes.io/not-ready", "NoExecute"),
                }

            await wait_for(not_ready, timeout=4 * GRACE, what="the not-ready taints")
        async with _external_kubelet(http, "life-c", ready="True"):

            async def clear() -> bool:
                return not _taints(await _node(http, "life-c"))

            await wait_for(clear, timeout=4 * GRACE, what="the taints gone")


async def test_nothing_happens_on_an_unreachable_node_until_it_is_out_of_service(
    sim: SimCluster,
) -> None:
    uid = uuid.uuid4().hex[:6]
    label = {"lifecycle-test": uid}
    template = {
        "metadata": {"labels": {"app": "svc"}},
        "spec": {
            "nodeSelector": label,
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "svc"},
        "spec": {
            "replicas": 1,
            "serviceName": "svc",
            "selector": {"matchLabels": {"app": "svc"}},
            "template": template,
        },
    }
    async with sim_http(sim) as http:
        await _patch(http, "/api/v1/nodes/life-a", {"metadata": {"labels": label}})
        assert (await http.post(STATEFULSETS, json=sts)).status_code == 201
        first = await _running(http, f"{PODS}/svc-0")
        assert first["spec"]["nodeName"] == "life-a"
        assert (await http.post(PODS, json=_pod("bare", "life-a"))).status_code == 201
        await _running(http, f"{PODS}/bare")
        await _patch(http, "/api/v1/nodes/life-d", {"metadata": {"labels": label}})

        await _make_external(http, "life-a")
        await _unknown(http, "life-a")
        deleted = await http.delete(f"{PODS}/svc-0")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["metadata"]["deletionTimestamp"]
        assert (await http.post(PODS, json=_pod("late", "life-a"))).status_code == 201

        async def stuck() -> bool:
            pod, late = await _get(http, f"{PODS}/svc-0"), await _get(http, f"{PODS}/late")
            return (
                pod is not None
                and pod["metadata"]["uid"] == first["metadata"]["uid"]
                and late is not None
                and late["status"]["phase"] == "Pending"
            )

        await _stays(stuck, 2.0, "Terminating, and not started, while the kubelet is down")

        mark = sim.store.resource_version
        taint = {
            "key": "node.kubernetes.io/out-of-service",
            "value": "nodeshutdown",
            "effect": "NoExecute",
        }
        node = await _node(http, "life-a")
        await _patch(
            http, "/api/v1/nodes/life-a", {"spec": {"taints": [*node["spec"]["taints"], taint]}}
        )

        async def replaced() -> dict[str, Any] | None:
            pod = await _get(http, f"{PODS}/svc-0")
            fresh = pod and pod["metadata"]["uid"] != first["metadata"]["uid"]
            return pod if fresh and pod["status"].get("phase") == "Running" else None

        again = await wait_for(replaced, timeout=20, what="svc-0 made again and running")
        assert again["spec"]["nodeName"] == "life-d"
        await wait_for(
            lambda: _gone(http, f"{PODS}/bare"), timeout=20, what="the bare pod evicted and gone"
        )
        await wait_for(
            lambda: _gone(http, f"{PODS}/late"), timeout=20, what="the unstarted pod gone"
        )

        seen = [
            c
            for c in sim.store.history_since(mark, ("", "pods"))
            if c.obj["metadata"]["name"] in ("svc-0", "bare")
            and c.obj["metadata"]["uid"] != again["metadata"]["uid"]
        ]
        for name in ("svc-0", "bare"):
            mine = [c for c in seen if c.obj["metadata"]["name"] == name]
            assert mine[-1].type == "DELETED", name
            last = mine[-1].obj
            assert last["status"]["phase"] == "Failed", "gcTerminating marks it Failed first"
        bare = [c.obj for c in seen if c.obj["metadata"]["name"] == "bare"][-1]
        disrupted = _conditions(bare)["DisruptionTarget"]
        assert (disrupted["status"], disrupted["reason"], disrupted["message"]) == (
            "True",
            "DeletionByTaintManager",
            "Taint manager: deleting due to NoExecute taint",
        )


async def _gone(http: httpx.AsyncClient, path: str) -> bool:
    return (await http.get(path)).status_code == 404


async def test_a_node_back_from_a_reboot_restarts_its_pods_and_finishes_its_deletions(
    sim: SimCluster,
) -> None:
    async with sim_http(sim) as http:
        for name, policy in (("always", "Always"), ("never", "Never"), ("doomed", "Always")):
            pod = _pod(name, "life-c", restartPolicy=policy)
            assert (await http.post(PODS, json=pod)).status_code == 201
            await _running(http, f"{PODS}/{name}")
        await _make_external(http, "life-c")
        await _unknown(http, "life-c")
        assert (await http.delete(f"{PODS}/doomed")).status_code == 200
        assert await _get(http, f"{PODS}/doomed") is not None

        async with _external_kubelet(http, "life-c", boot_id=uuid.uuid4().hex):
            await wait_for(lambda: _gone(http, f"{PODS}/doomed"), timeout=20, what="doomed gone")
            restarted = await _running(http, f"{PODS}/always")
            container = restarted["status"]["containerStatuses"][0]
            assert container["restartCount"] == 1
            assert container["lastState"]["terminated"]["exitCode"] == 255
            assert container["lastState"]["terminated"]["reason"] == "Unknown"

            async def failed() -> dict[str, Any] | None:
                pod = await _get(http, f"{PODS}/never")
                return pod if pod and pod["status"]["phase"] == "Failed" else None

            never = await wait_for(failed, timeout=20, what="the Never pod Failed")
            state = never["status"]["containerStatuses"][0]["state"]["terminated"]
            assert (state["exitCode"], state["reason"]) == (255, "Unknown")


async def test_seeded_nodes_keep_their_leases_and_stay_ready(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        leases = (await http.get(LEASES)).json()["items"]
        first = {lease["metadata"]["name"]: lease["spec"]["renewTime"] for lease in leases}
        assert set(first) == set(NODES)

        async def renewed() -> bool:
            now = (await http.get(LEASES)).json()["items"]
            return all(
                lease["spec"]["renewTime"] > first[lease["metadata"]["name"]] for lease in now
            )

        await wait_for(renewed, timeout=10, what="every lease renewed")
        for lease in (await http.get(LEASES)).json()["items"]:
            assert lease["spec"]["holderIdentity"] == lease["metadata"]["name"]
            assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"

        async def ready() -> bool:
            nodes = (await http.get("/api/v1/nodes")).json()["items"]
            return all(
                _conditions(n)["Ready"]["status"] == "True" and not _taints(n) for n in nodes
            )

        await _stays(ready, 2.5 * GRACE, "the seeded nodes stay Ready, untainted", interval=0.25)


@pytest.mark.sim_cluster(**SHORT)
async def test_the_default_seed_stays_ready_with_short_settings(default_sim: SimCluster) -> None:
    async with sim_http(default_sim) as http:

        async def ready() -> bool:
            nodes = (await http.get("/api/v1/nodes")).json()["items"]
            return len(nodes) == 11 and all(
                _conditions(n)["Ready"]["status"] == "True" and not _taints(n) for n in nodes
            )

        await _stays(ready, 2.5 * GRACE, "the default seed's nodes stay Ready", interval=0.25)


@pytest.fixture
async def default_sim(request: pytest.FixtureRequest) -> AsyncIterator[SimCluster]:
    """The default seed with the `sim_cluster` marker's options."""
    marker = request.node.get_closest_marker("sim_cluster")
    options = dict(marker.kwargs) if marker else {}
    async with SimCluster(port=0, bookmark_interval=0.2, **options) as cluster:
        yield cluster
