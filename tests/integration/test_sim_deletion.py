"""The sim cluster deletes as the API server does: graceful pods, finalizers, garbage collection.

Sources: `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go` (`Delete`,
`updateForGracefulDeletionAndFinalizers`, `shouldDeleteDuringUpdate`), `pkg/registry/rest/
delete.go` (`BeforeDelete`: a grace period may only shorten), `pkg/registry/core/pod/strategy.go`
(`CheckGracefulDelete`: the pod's own `terminationGracePeriodSeconds` unless the request says
one; none for an unbound or finished pod), the pod registry's `ReturnDeletedObject`, and the
garbage collector's propagation policies (Background, Foreground with the
`foregroundDeletion` finalizer, Orphan), per the API reference of DeleteOptions.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cluster import SimCluster
from sim.cluster.kubelet import EXITS_AFTER
from tests.conftest import wait_for
from tests.integration.simkube import run_kubectl, sim_http

NS = "ml-nlp"
PODS = f"/api/v1/namespaces/{NS}/pods"


def _pod(name: str, *, node: str | None = "gpu-h100-01", exits: float | None = None) -> Any:
    meta: dict[str, Any] = {"name": name}
    if exits is not None:
        meta["annotations"] = {EXITS_AFTER: str(exits)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


async def _delete(http: httpx.AsyncClient, path: str, options: dict[str, Any]) -> httpx.Response:
    """DELETE with a DeleteOptions body, as clients send it."""
    body = {"apiVersion": "v1", "kind": "DeleteOptions", **options}
    return await http.request("DELETE", path, json=body)


async def _gone(http: httpx.AsyncClient, path: str) -> bool:
    return (await http.get(path)).status_code == 404


async def test_a_deleted_pod_terminates_for_its_grace_then_goes(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        assert (await http.post(PODS, json=_pod("slow", exits=3.0))).status_code == 201
        answer = await http.delete(f"{PODS}/slow")
        assert answer.status_code == 200, answer.text
        meta = answer.json()["metadata"]
        assert meta["deletionGracePeriodSeconds"] == 30
        assert meta["deletionTimestamp"]
        still = await http.get(f"{PODS}/slow")
        assert still.status_code == 200, "Terminating: still in the API"
        assert still.json()["metadata"]["deletionTimestamp"] == meta["deletionTimestamp"]
        await wait_for(lambda: _gone(http, f"{PODS}/slow"), timeout=20, what="the kubelet")


async def test_grace_zero_an_unbound_pod_and_a_shorter_second_delete(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await http.post(PODS, json=_pod("now", exits=30))
        answer = await http.delete(f"{PODS}/now", params={"gracePeriodSeconds": "0"})
        assert answer.status_code == 200
        assert await _gone(http, f"{PODS}/now")
        loose = _pod("loose", node=None)  # for a scheduler that does not run: never bound
        loose["spec"]["schedulerName"] = "no-such-scheduler"
        await http.post(PODS, json=loose)
        await http.delete(f"{PODS}/loose")
        assert await _gone(http, f"{PODS}/loose"), "an unbound pod has no kubelet to wait for"
        await http.post(PODS, json=_pod("stubborn", exits=30))
        first = (await http.delete(f"{PODS}/stubborn")).json()["metadata"]
        assert first["deletionGracePeriodSeconds"] == 30
        longer = await _delete(http, f"{PODS}/stubborn", {"gracePeriodSeconds": 60})
        assert longer.json()["metadata"]["deletionGracePeriodSeconds"] == 30, "only shorter"
        await _delete(http, f"{PODS}/stubborn", {"gracePeriodSeconds": 0})
        assert await _gone(http, f"{PODS}/stubborn")


async def test_an_eviction_terminates_the_pod_gracefully(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await http.post(PODS, json=_pod("evicted", exits=3.0))
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "evicted", "namespace": NS},
        }
        assert (await http.post(f"{PODS}/evicted/eviction", json=eviction)).status_code == 201
        assert (await http.get(f"{PODS}/evicted")).json()["metadata"]["deletionTimestamp"]
        await wait_for(lambda: _gone(http, f"{PODS}/evicted"), timeout=20, what="the kubelet")


async def test_finalizers_hold_an_object_until_removed(sim: SimCluster) -> None:
    path = f"/api/v1/namespaces/{NS}/configmaps"
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "finalizers": ["example.com/keep"]},
    }
    async with sim_http(sim) as http:
        assert (await http.post(path, json=body)).status_code == 201
        answer = await http.delete(f"{path}/held")
        assert answer.status_code == 200
        assert answer.json()["metadata"]["deletionTimestamp"], "the object, marked"
        held = (await http.get(f"{path}/held")).json()
        assert held["metadata"]["finalizers"] == ["example.com/keep"]
        released = await http.patch(
            f"{path}/held",
            content='{"metadata":{"finalizers":null}}',
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert released.status_code == 200, released.text
        assert await _gone(http, f"{path}/held")


async def _owner_and_pod(http: httpx.AsyncClient, name: str) -> tuple[str, str]:
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
            },
        },
    }
    made = await http.post(f"/apis/apps/v1/namespaces/{NS}/replicasets", json=owner)
    assert made.status_code == 201, made.text
    # long enough that a loaded machine still sees it Terminating right after the delete
    pod = _pod(f"{name}-0", exits=3.0)
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": name,
            "uid": made.json()["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert (await http.post(PODS, json=pod)).status_code == 201
    return f"/apis/apps/v1/namespaces/{NS}/replicasets/{name}", f"{PODS}/{name}-0"


@pytest.mark.parametrize("policy", [None, "Background"])
async def test_background_collects_the_dependents(sim: SimCluster, policy: str | None) -> None:
    async with sim_http(sim) as http:
        owner, pod = await _owner_and_pod(http, "bg")
        params = {"propagationPolicy": policy} if policy else {}
        assert (await http.delete(owner, params=params)).status_code == 200
        assert await _gone(http, owner), "the owner goes at once"
        assert (await http.get(pod)).json()["metadata"]["deletionTimestamp"]
        await wait_for(lambda: _gone(http, pod), timeout=20, what="the dependent pod")


async def test_foreground_keeps_the_owner_until_its_dependents_are_gone(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        owner, pod = await _owner_and_pod(http, "fg")
        answer = await _delete(http, owner, {"propagationPolicy": "Foreground"})
        assert answer.status_code == 200
        held = (await http.get(owner)).json()
        assert held["metadata"]["finalizers"] == ["foregroundDeletion"]
        await wait_for(lambda: _gone(http, owner), timeout=20, what="the owner, after its pod")
        assert await _gone(http, pod)


async def test_orphan_leaves_the_dependents(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        owner, pod = await _owner_and_pod(http, "orphan")
        await http.delete(owner, params={"propagationPolicy": "Orphan"})
        assert await _gone(http, owner)
        left = (await http.get(pod)).json()
        assert not left["metadata"].get("ownerReferences")
        assert not left["metadata"].get("deletionTimestamp")


@pytest.mark.peer("kubectl")
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_shows_terminating_then_waits_for_it(sim: SimCluster, tmp_path: Path) -> None:
    async with sim_http(sim) as http:
        await http.post(PODS, json=_pod("kubectl-slow", exits=30))

    async def kubectl(*args: str) -> str:
        rc, out, err = await run_kubectl(sim, tmp_path, *args)
        assert rc == 0, err
        return out

    assert "deleted" in await kubectl("delete", "pod", "-n", NS, "kubectl-slow", "--wait=false")
    assert "Terminating" in await kubectl("get", "pod", "-n", NS, "kubectl-slow")
    async with sim_http(sim) as http:
        await http.post(PODS, json=_pod("kubectl-waited", exits=0.5))
        # kubectl delete waits (by watching) until the pod is gone from the API
        await kubectl("delete", "pod", "-n", NS, "kubectl-waited")
        assert await _gone(http, f"{PODS}/kubectl-waited")
