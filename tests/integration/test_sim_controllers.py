"""The sim cluster's control plane: workloads' pods come back elsewhere when a node is drained,
and the scheduler places them where kube-scheduler's default filters would.

Sources: kube-scheduler's `NodeUnschedulable`, `TaintToleration`, `NodeAffinity` and
`NodeResourcesFit` filters and its `0/N nodes are available` message
(`pkg/scheduler/framework/plugins`, `pkg/scheduler/schedule_one.go`); the ReplicaSet,
Deployment, StatefulSet, Job and PodGC controllers (`pkg/controller/...`); the Job strategy's
generated selector (`pkg/registry/batch/job/strategy.go`); the Service defaults
(`pkg/apis/core/v1/defaults.go`); the API reference for the status fields.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodeward.kube import Cluster, Invalid, NotFound
from nodeward.kube.base import core, group_path
from nodeward.kube.client import MERGE_PATCH
from sim.cluster import SimCluster
from tests.conftest import wait_for
from tests.helpers.kube import manifest

NS = "ml-vision"
DEPLOYMENTS = group_path("apps", "v1", "deployments", namespace=NS)
STATEFULSETS = group_path("apps", "v1", "statefulsets", namespace=NS)
JOBS = group_path("batch", "v1", "jobs", namespace=NS)


def _template(app: str, gpus: int = 0, **spec: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox:1.36", "resources": resources}],
            **spec,
        },
    }


async def _pods(admin: Cluster, app: str) -> list[dict[str, Any]]:
    listing = await admin.client.request(
        "GET", core("pods", namespace=NS), query={"labelSelector": f"app={app}"}
    )
    return list(listing.get("items") or [])


async def _running(admin: Cluster, app: str, n: int) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        pods = [
            p
            for p in await _pods(admin, app)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return pods if len(pods) == n else None

    return await wait_for(check, timeout=20, what=f"{n} running pods of {app}")  # type: ignore[no-any-return]


async def _deployment(admin: Cluster, name: str, replicas: int, template: dict[str, Any]) -> None:
    await admin.client.request(
        "POST",
        DEPLOYMENTS,
        body=manifest(
            "apps/v1",
            "Deployment",
            name,
            spec={
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": template,
            },
        ),
    )


async def _cordon(admin: Cluster, node: str) -> None:
    await admin.client.request(
        "PATCH",
        core("nodes", node),
        body={"spec": {"unschedulable": True}},
        content_type=MERGE_PATCH,
    )


async def _evict(admin: Cluster, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    await admin.client.request(
        "POST",
        core("pods", meta["name"], NS, sub="eviction"),
        body={
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": NS},
        },
    )


async def test_a_drained_deployments_pod_comes_back_on_another_node(admin: Cluster) -> None:
    await _deployment(admin, "web", 3, _template("web"))
    pods = await _running(admin, "web", 3)
    owners = {p["metadata"]["ownerReferences"][0]["name"] for p in pods}
    assert len(owners) == 1 and owners.pop().startswith("web-")  # one ReplicaSet, web-<hash>
    assert all(p["metadata"]["labels"]["pod-template-hash"] for p in pods)
    assert all(p["spec"]["serviceAccountName"] == "default" for p in pods)  # admitted as any

    victim = pods[0]
    node = victim["spec"]["nodeName"]
    await _cordon(admin, node)
    await _evict(admin, victim)

    async def replaced() -> list[dict[str, Any]] | None:
        live = await _running(admin, "web", 3)
        uids = {p["metadata"]["uid"] for p in live}
        return live if victim["metadata"]["uid"] not in uids else None

    live = await wait_for(replaced, timeout=20, what="a replacement pod")
    newcomer = next(
        p for p in live if p["metadata"]["uid"] not in {q["metadata"]["uid"] for q in pods}
    )
    assert newcomer["spec"]["nodeName"] != node  # never onto the cordoned node
    scheduled = next(c for c in newcomer["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["status"] == "True"

    async def available() -> dict[str, Any] | None:
        d = await admin.client.request("GET", f"{DEPLOYMENTS}/web")
        status = d.get("status") or {}
        done = status.get("availableReplicas") == 3 and status.get("updatedReplicas") == 3
        return (
            d if done and status.get("observedGeneration") == d["metadata"]["generation"] else None
        )

    await wait_for(available, timeout=20, what="the Deployment's status")


async def test_a_pod_no_node_fits_stays_pending_and_says_why(
    admin: Cluster, sim: SimCluster
) -> None:
    # nodeSelector to a cordoned node; then a GPU request no node can satisfy
    await _cordon(admin, "gpu-h100-01")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned", "labels": {"app": "pinned"}},
        **_template("pinned", nodeSelector={"kubernetes.io/hostname": "gpu-h100-01"}),
    }
    pod["metadata"] = {"name": "pinned", "labels": {"app": "pinned"}}
    await admin.client.request("POST", core("pods", namespace=NS), body=pod)

    async def unschedulable() -> dict[str, Any] | None:
        got = await admin.client.request("GET", core("pods", "pinned", NS))
        conds = [c for c in got["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        return conds[0] if conds and conds[0]["status"] == "False" else None

    cond = await wait_for(unschedulable, timeout=20, what="PodScheduled=False")
    nodes = len((await admin.client.request("GET", core("nodes")))["items"])
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith(f"0/{nodes} nodes are available: ")
    assert "1 node(s) were unschedulable" in cond["message"]
    got = await admin.client.request("GET", core("pods", "pinned", NS))
    assert got["status"]["phase"] == "Pending" and "nodeName" not in got["spec"]

    await admin.client.request(
        "PATCH",
        core("nodes", "gpu-h100-01"),
        body={"spec": {"unschedulable": None}},
        content_type=MERGE_PATCH,
    )
    placed = await _running(admin, "pinned", 1)
    assert placed[0]["spec"]["nodeName"] == "gpu-h100-01"

    greedy = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "greedy", "labels": {"app": "greedy"}},
        "spec": _template("greedy", gpus=9)["spec"],
    }
    await admin.client.request("POST", core("pods", namespace=NS), body=greedy)

    async def insufficient() -> str | None:
        got = await admin.client.request("GET", core("pods", "greedy", NS))
        conds = [c for c in got["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        return conds[0]["message"] if conds else None

    message = await wait_for(insufficient, timeout=20, what="the greedy pod's verdict")
    assert "Insufficient nvidia.com/gpu" in message


async def test_taints_keep_pods_off_unless_tolerated(admin: Cluster) -> None:
    nodes = [
        n["metadata"]["name"] for n in (await admin.client.request("GET", core("nodes")))["items"]
    ]
    taint = {"key": "nodeward.io/gpu-unhealthy", "value": "failed-gpu", "effect": "NoSchedule"}
    for node in nodes:
        if node != "gpu-a100-01":
            await admin.client.request(
                "PATCH",
                core("nodes", node),
                body={"spec": {"taints": [taint]}},
                content_type=MERGE_PATCH,
            )
    await _deployment(admin, "plain", 2, _template("plain"))
    plain = await _running(admin, "plain", 2)
    assert {p["spec"]["nodeName"] for p in plain} == {"gpu-a100-01"}
    tolerating = _template(
        "tolerant",
        tolerations=[{"key": "nodeward.io/gpu-unhealthy", "operator": "Exists"}],
    )
    await _deployment(admin, "tolerant", 2, tolerating)
    tolerant = await _running(admin, "tolerant", 2)
    assert {p["spec"]["nodeName"] for p in tolerant} - {"gpu-a100-01"}  # spread by load


async def test_a_statefulset_pod_comes_back_under_its_name_once_the_old_is_gone(
    admin: Cluster, sim: SimCluster
) -> None:
    await admin.client.request(
        "POST",
        STATEFULSETS,
        body=manifest(
            "apps/v1",
            "StatefulSet",
            "lab",
            spec={
                "replicas": 2,
                "serviceName": "lab",
                "selector": {"matchLabels": {"app": "lab"}},
                "template": {
                    **_template("lab"),
                    "metadata": {
                        "labels": {"app": "lab"},
                        "annotations": {"sim.nodeward.io/exits-after": "1"},
                    },
                },
            },
        ),
    )
    pods = await _running(admin, "lab", 2)
    assert sorted(p["metadata"]["name"] for p in pods) == ["lab-0", "lab-1"]
    assert {p["spec"]["hostname"] for p in pods} == {"lab-0", "lab-1"}
    first = next(p for p in pods if p["metadata"]["name"] == "lab-0")
    node = first["spec"]["nodeName"]
    await _cordon(admin, node)
    await _evict(admin, first)
    # while the old lab-0 terminates, no second lab-0 exists: the name is the identity
    terminating = await admin.client.request("GET", core("pods", "lab-0", NS))
    assert terminating["metadata"]["uid"] == first["metadata"]["uid"]
    assert terminating["metadata"]["deletionTimestamp"]

    async def back() -> dict[str, Any] | None:
        try:
            pod = await admin.client.request("GET", core("pods", "lab-0", NS))
        except NotFound:
            return None
        fresh = pod["metadata"]["uid"] != first["metadata"]["uid"]
        return pod if fresh and pod["status"].get("phase") == "Running" else None

    again = await wait_for(back, timeout=20, what="lab-0 again")
    assert again["spec"]["nodeName"] != node
    assert again["spec"]["containers"][0]["image"] == "busybox:1.36"  # from the template

    await admin.client.request(
        "PATCH", f"{STATEFULSETS}/lab", body={"spec": {"replicas": 1}}, content_type=MERGE_PATCH
    )

    async def scaled_down() -> bool:
        names = [p["metadata"]["name"] for p in await _pods(admin, "lab")]
        return names == ["lab-0"]

    await wait_for(scaled_down, timeout=20, what="lab-1 deleted by the scale-down")


async def test_a_jobs_pods_are_replaced_and_its_selector_generated(admin: Cluster) -> None:
    with pytest.raises(Invalid, match="will be auto-generated"):
        await admin.client.request(
            "POST",
            JOBS,
            body=manifest(
                "batch/v1",
                "Job",
                "bad",
                spec={
                    "selector": {"matchLabels": {"app": "bad"}},
                    "template": _template("bad", restartPolicy="Never"),
                },
            ),
        )
    job = await admin.client.request(
        "POST",
        JOBS,
        body=manifest(
            "batch/v1",
            "Job",
            "eval",
            spec={
                "parallelism": 2,
                "completions": 4,
                "template": _template("eval", restartPolicy="Never"),
            },
        ),
    )
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert job["spec"]["backoffLimit"] == 6
    pods = await _running(admin, "eval", 2)
    assert all(p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "eval" for p in pods)
    await _evict(admin, pods[0])

    async def replaced() -> bool:
        live = await _running(admin, "eval", 2)
        return pods[0]["metadata"]["uid"] not in {p["metadata"]["uid"] for p in live}

    await wait_for(replaced, timeout=20, what="a replacement job pod")

    async def status() -> dict[str, Any] | None:
        got = await admin.client.request("GET", f"{JOBS}/eval")
        return got if (got.get("status") or {}).get("active") == 2 else None

    assert (await wait_for(status, timeout=20, what="the Job's status"))["status"]["startTime"]


async def test_a_deleted_nodes_pods_are_collected(admin: Cluster, sim: SimCluster) -> None:
    on_node = await admin.client.request(
        "GET", core("pods"), query={"fieldSelector": "spec.nodeName=gpu-h100-03"}
    )
    assert on_node["items"]
    await admin.client.request("DELETE", core("nodes", "gpu-h100-03"))

    async def collected() -> bool:
        left = await admin.client.request(
            "GET", core("pods"), query={"fieldSelector": "spec.nodeName=gpu-h100-03"}
        )
        return not left["items"]

    await wait_for(collected, timeout=20, what="the node's pods collected")


async def test_a_no_execute_taint_evicts_what_does_not_tolerate_it(admin: Cluster) -> None:
    before = await admin.client.request(
        "GET", core("pods"), query={"fieldSelector": "spec.nodeName=gpu-h100-04"}
    )
    assert before["items"]
    taint = {"key": "nodeward.io/gpu-unhealthy", "value": "failed-gpu", "effect": "NoExecute"}
    await admin.client.request(
        "PATCH",
        core("nodes", "gpu-h100-04"),
        body={"spec": {"taints": [taint]}},
        content_type=MERGE_PATCH,
    )

    async def evicted() -> bool:
        left = await admin.client.request(
            "GET", core("pods"), query={"fieldSelector": "spec.nodeName=gpu-h100-04"}
        )
        staying = [
            p
            for p in left["items"]
            if not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        return all(
            any(
                t.get("operator") == "Exists" and not t.get("key")
                for t in p["spec"].get("tolerations") or []
            )
            or any(t.get("key") == taint["key"] for t in p["spec"].get("tolerations") or [])
            for p in staying
        )

    await wait_for(evicted, timeout=20, what="the untolerating pods evicted")


async def test_a_service_gets_its_defaults_and_a_cluster_ip(admin: Cluster) -> None:
    svc = await admin.client.request(
        "POST",
        core("services", namespace=NS),
        body=manifest(
            "v1",
            "Service",
            "lab",
            spec={"selector": {"app": "lab"}, "ports": [{"port": 8888}]},
        ),
    )
    spec = svc["spec"]
    assert spec["type"] == "ClusterIP" and spec["clusterIP"].startswith("10.96.")
    assert spec["clusterIPs"] == [spec["clusterIP"]]
    assert spec["ports"] == [{"port": 8888, "protocol": "TCP", "targetPort": 8888}]


async def test_a_statefulset_deleted_leaving_its_pods_takes_them_back_when_made_again(
    admin: Cluster,
) -> None:
    body = manifest(
        "apps/v1",
        "StatefulSet",
        "keep",
        spec={
            "replicas": 1,
            "serviceName": "keep",
            "selector": {"matchLabels": {"app": "keep"}},
            "template": _template("keep"),
        },
    )
    first = await admin.client.request("POST", STATEFULSETS, body=body)
    pod = (await _running(admin, "keep", 1))[0]
    await admin.client.request(
        "DELETE",
        f"{STATEFULSETS}/keep",
        body={"propagationPolicy": "Orphan", "preconditions": {"uid": first["metadata"]["uid"]}},
    )
    # The pod runs on, no longer the set's (the garbage collector took the reference off).
    orphan = await admin.client.request("GET", core("pods", "keep-0", NS))
    assert orphan["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not orphan["metadata"].get("deletionTimestamp")
    assert not [r for r in orphan["metadata"].get("ownerReferences") or [] if r.get("controller")]

    again = await admin.client.request("POST", STATEFULSETS, body=body)

    async def adopted() -> dict[str, Any] | None:
        got = await admin.client.request("GET", core("pods", "keep-0", NS))
        refs = [r for r in got["metadata"].get("ownerReferences") or [] if r.get("controller")]
        return got if [r["uid"] for r in refs] == [again["metadata"]["uid"]] else None

    taken = await wait_for(adopted, timeout=10, what="keep-0 adopted by the new set")
    assert taken["metadata"]["uid"] == pod["metadata"]["uid"]  # the same pod, not a new one

    # Relabelled out of the selector: released by the set, which cannot make a keep-0 of
    # its own while the name is taken.
    await admin.client.request(
        "PATCH",
        core("pods", "keep-0", NS),
        body={"metadata": {"labels": {"app": "other"}}},
        content_type=MERGE_PATCH,
    )

    async def released() -> bool:
        got = await admin.client.request("GET", core("pods", "keep-0", NS))
        return not [r for r in got["metadata"].get("ownerReferences") or [] if r.get("controller")]

    await wait_for(released, timeout=10, what="keep-0 released by its set")
    left = await admin.client.request("GET", core("pods", "keep-0", NS))
    assert left["metadata"]["uid"] == pod["metadata"]["uid"]
