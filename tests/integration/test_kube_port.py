"""The cluster port against the sim cluster: every operation, its errors and its retries."""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path

import pytest

from nodeward.config import ClusterSettings
from nodeward.kube import (
    CheckpointFailed,
    Cluster,
    Conflict,
    EvictionBlocked,
    Forbidden,
    Gone,
    Invalid,
    MultipleBudgets,
    NotFound,
    Unavailable,
    UndeclaredOperation,
)
from nodeward.kube.access import Access
from nodeward.kube.client import MERGE_PATCH, STRATEGIC_PATCH, Backoff, KubeClient
from nodeward.kube.errors import ServerError, UnsupportedMediaType
from nodeward.kube.netpol import isolate_pod_policy
from nodeward.kube.secrets import decode, encode
from nodeward.kube.watch import watch
from services.culler.access import ACCESS as CULLER
from sim.cluster import SimCluster
from sim.cluster.kubelet import EXITS_AFTER
from sim.cluster.resources import require
from tests.helpers.kube import manifest
from tests.integration.simkube import PortFactory

TAINT = "nodeward.io/gpu-unhealthy"
NODES = require("", "v1", "nodes")
SECRETS = require("", "v1", "secrets")
PODS = require("", "v1", "pods")


# --- nodes ------------------------------------------------------------------------------------


async def test_nodes_get_and_list_with_selectors(admin: Cluster) -> None:
    nodes = await admin.nodes.list()
    assert len(nodes) == 11  # with the AMD and the DRA nodes
    h100 = await admin.nodes.list(label_selector="nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
    assert sorted(n["metadata"]["name"] for n in h100) == [
        *(f"gpu-h100-0{i}" for i in range(1, 5)),
        "gpu-h100-dra-01",
    ]
    mig = await admin.nodes.list(
        label_selector="nvidia.com/mig.strategy in (mixed),nvidia.com/gpu.present"
    )
    assert [n["metadata"]["name"] for n in mig] == ["gpu-a100-mig-01"]
    assert mig[0]["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "28"
    await admin.nodes.set_unschedulable("gpu-a100-01")
    cordoned = await admin.nodes.list(field_selector="spec.unschedulable=true")
    assert [n["metadata"]["name"] for n in cordoned] == ["gpu-a100-01"]
    node = await admin.nodes.get("gpu-a100-01")
    assert node["spec"]["unschedulable"] is True
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    with pytest.raises(NotFound, match='nodes "nope" not found'):
        await admin.nodes.get("nope")


async def test_requests_run_on_the_ports_own_threads(port_for: PortFactory) -> None:
    """Every thread of the loop's default executor busy elsewhere (more blocking calls than
    it has threads): the port still answers, `concurrency` requests at a time."""
    release = threading.Event()
    blockers = [asyncio.ensure_future(asyncio.to_thread(release.wait, 30)) for _ in range(64)]
    cluster = port_for()
    try:
        names = [f"gpu-h100-0{i}" for i in range(1, 5)] * 10
        got = await asyncio.wait_for(
            asyncio.gather(*(cluster.nodes.get(n) for n in names)), timeout=10
        )
        assert [n["metadata"]["name"] for n in got] == names
    finally:
        release.set()
        await asyncio.gather(*blockers)


async def test_taint_added_twice_appears_once(admin: Cluster, sim: SimCluster) -> None:
    assert await admin.nodes.add_taint("gpu-h100-01", TAINT, "NoSchedule", "true") is True
    rv = (await admin.nodes.get("gpu-h100-01"))["metadata"]["resourceVersion"]
    assert await admin.nodes.add_taint("gpu-h100-01", TAINT, "NoSchedule", "true") is False
    node = await admin.nodes.get("gpu-h100-01")
    assert node["metadata"]["resourceVersion"] == rv, "an idempotent add must not write"
    assert [t["key"] for t in node["spec"]["taints"]] == [TAINT]
    # another effect with the same key is another taint; other writers' taints are kept
    await admin.nodes.add_taint("gpu-h100-01", "example.com/other", "PreferNoSchedule")
    await admin.nodes.add_taint("gpu-h100-01", TAINT, "NoExecute")
    taints = (await admin.nodes.get("gpu-h100-01"))["spec"]["taints"]
    assert sorted((t["key"], t["effect"]) for t in taints) == [
        ("example.com/other", "PreferNoSchedule"),
        (TAINT, "NoExecute"),
        (TAINT, "NoSchedule"),
    ]
    assert await admin.nodes.remove_taint("gpu-h100-01", TAINT) is True
    assert await admin.nodes.remove_taint("gpu-h100-01", TAINT) is False
    taints = (await admin.nodes.get("gpu-h100-01"))["spec"]["taints"]
    assert [(t["key"], t["effect"]) for t in taints] == [("example.com/other", "PreferNoSchedule")]


async def test_mark_writes_taint_cordon_labels_annotations_once(admin: Cluster) -> None:
    await admin.nodes.add_taint("gpu-h100-03", "example.com/other", "PreferNoSchedule")
    marks = {
        "add_taints": [(TAINT, "NoSchedule")],
        "unschedulable": True,
        "labels": {"example.com/health": "failed"},
        "annotations": {"example.com/why": "xid 79"},
    }
    node = await admin.nodes.mark("gpu-h100-03", **marks)  # type: ignore[arg-type]
    assert node["spec"]["unschedulable"] is True
    assert sorted(t["key"] for t in node["spec"]["taints"]) == ["example.com/other", TAINT]
    assert node["metadata"]["labels"]["example.com/health"] == "failed"
    assert node["metadata"]["annotations"]["example.com/why"] == "xid 79"
    rv = node["metadata"]["resourceVersion"]
    again = await admin.nodes.mark("gpu-h100-03", **marks)  # type: ignore[arg-type]
    assert again["metadata"]["resourceVersion"] == rv, "an idempotent mark must not write"
    undone = await admin.nodes.mark(
        "gpu-h100-03", unschedulable=False, annotations={"example.com/why": None}
    )
    assert not undone["spec"].get("unschedulable")
    assert "example.com/why" not in (undone["metadata"].get("annotations") or {})


async def test_taint_conflict_is_reread_and_reapplied(admin: Cluster, sim: SimCluster) -> None:
    """A writer that changes the node between our read and our patch costs a 409 and a retry."""
    original = admin.client.request
    raced = []

    async def racing(method: str, path: str, **kw: object) -> object:
        if method == "PATCH" and not raced:
            node = sim.store.get(NODES, "", "gpu-h100-02")
            node["spec"]["taints"] = [{"key": "someone/else", "effect": "NoSchedule"}]
            sim.store.update(NODES, "", "gpu-h100-02", node)
            raced.append(True)
        return await original(method, path, **kw)  # type: ignore[arg-type]

    admin.client.request = racing  # type: ignore[method-assign]
    assert await admin.nodes.add_taint("gpu-h100-02", TAINT, "NoSchedule") is True
    taints = (await admin.nodes.get("gpu-h100-02"))["spec"]["taints"]
    assert {t["key"] for t in taints} == {"someone/else", TAINT}
    assert any(status == 409 for *_, status in sim.requests)


async def test_cordon_labels_annotations(admin: Cluster) -> None:
    assert await admin.nodes.set_unschedulable("gpu-h100-03", True) is False
    assert await admin.nodes.set_unschedulable("gpu-h100-03", True) is True
    await admin.nodes.set_labels("gpu-h100-03", {"nodeward.io/gpu-health": "failed"})
    await admin.nodes.set_annotations("gpu-h100-03", {"nodeward.io/quarantine": '{"by":"cordon"}'})
    node = await admin.nodes.get("gpu-h100-03")
    assert node["metadata"]["labels"]["nodeward.io/gpu-health"] == "failed"
    assert node["metadata"]["annotations"]["nodeward.io/quarantine"] == '{"by":"cordon"}'
    await admin.nodes.set_annotations("gpu-h100-03", {"nodeward.io/quarantine": None})
    assert await admin.nodes.set_unschedulable("gpu-h100-03", False) is True
    node = await admin.nodes.get("gpu-h100-03")
    assert "nodeward.io/quarantine" not in node["metadata"]["annotations"]
    assert "unschedulable" not in node["spec"]
    with pytest.raises(Invalid, match=r"metadata\.labels"):
        await admin.nodes.set_labels(
            "gpu-h100-03", {"nodeward.io/gpu-health": "not a valid value!"}
        )


async def test_node_condition_through_status_subresource(admin: Cluster) -> None:
    node = await admin.nodes.set_condition(
        "gpu-a100-02", "GPUHealthy", "False", "XidError", "GPU 3: Xid 79"
    )
    conditions = {c["type"]: c for c in node["status"]["conditions"]}
    assert conditions["GPUHealthy"]["status"] == "False"
    assert conditions["Ready"]["status"] == "True", "other conditions are kept (merge by type)"
    first = conditions["GPUHealthy"]["lastTransitionTime"]
    again = await admin.nodes.set_condition(
        "gpu-a100-02", "GPUHealthy", "False", "XidError", "still"
    )
    assert {c["type"]: c for c in again["status"]["conditions"]}["GPUHealthy"][
        "lastTransitionTime"
    ] == first
    # status is only written through /status: a main-resource patch cannot change it
    patched = await admin.client.request(
        "PATCH",
        "/api/v1/nodes/gpu-a100-02",
        body={
            "status": {"conditions": [{"type": "GPUHealthy", "status": "True"}]},
            "metadata": {"labels": {"x": "y"}},
        },
        content_type=STRATEGIC_PATCH,
    )
    assert {c["type"]: c for c in patched["status"]["conditions"]}["GPUHealthy"][
        "status"
    ] == "False"
    assert patched["metadata"]["labels"]["x"] == "y"


# --- pods -------------------------------------------------------------------------------------


async def test_pods_on_node_get_patch_delete(admin: Cluster) -> None:
    pods = await admin.pods.on_node("gpu-h100-02")
    names = sorted(p["metadata"]["name"] for p in pods)
    assert "llm-pretrain-worker-0" in names
    assert all(p["spec"]["nodeName"] == "gpu-h100-02" for p in pods)
    listed = await admin.pods.list("ml-nlp", node="gpu-h100-02")
    assert [p["metadata"]["name"] for p in listed] == ["llm-pretrain-worker-0"]
    pod = await admin.pods.get("ml-vision", "alice-jupyter-0")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    patched = await admin.pods.set_labels(
        "ml-vision", "alice-jupyter-0", {"nodeward.io/quarantined": "true"}
    )
    assert patched["metadata"]["labels"]["nodeward.io/quarantined"] == "true"
    assert patched["metadata"]["generation"] == pod["metadata"]["generation"], (
        "metadata is not spec"
    )
    with pytest.raises(Invalid, match=r"pod updates may not change fields"):
        await admin.pods.patch(
            "ml-vision", "alice-jupyter-0", {"spec": {"nodeName": "gpu-h100-04"}}
        )
    # its containers take 3 s to stop: still Terminating when looked at right after
    await admin.pods.set_annotations("ml-vision", "alice-jupyter-0", {EXITS_AFTER: "3"})
    assert await admin.pods.delete("ml-vision", "alice-jupyter-0") is True
    # Terminating for its grace period, as on a real cluster, until its kubelet is done
    terminating = await admin.pods.get("ml-vision", "alice-jupyter-0")
    assert terminating["metadata"]["deletionTimestamp"]
    uid = pod["metadata"]["uid"]
    assert await admin.pods.wait_gone("ml-vision", "alice-jupyter-0", uid, within=20)
    # its StatefulSet makes alice-jupyter-0 again once the old one is gone: another pod
    try:
        again = await admin.pods.get("ml-vision", "alice-jupyter-0")
    except NotFound:
        again = None
    assert again is None or again["metadata"]["uid"] != uid


async def test_evict_deletes_and_nothing_replaces(admin: Cluster) -> None:
    pod = await admin.pods.get("ml-speech", "whisper-distill-worker-0")
    assert await admin.pods.evict("ml-speech", "whisper-distill-worker-0", deadline=1) is True
    assert await admin.pods.wait_gone(
        "ml-speech", "whisper-distill-worker-0", pod["metadata"]["uid"], within=2
    )
    owner = pod["metadata"]["ownerReferences"][0]["name"]
    rest = [
        p
        for p in await admin.pods.list("ml-speech")
        if p["metadata"].get("ownerReferences", [{}])[0].get("name") == owner
    ]
    assert [p["metadata"]["name"] for p in rest] == ["whisper-distill-worker-1"]
    assert await admin.pods.evict("ml-speech", "whisper-distill-worker-0") is False


async def test_eviction_blocked_by_budget_until_deadline(admin: Cluster, sim: SimCluster) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(
        EvictionBlocked, match="llm-pretrain needs 2 healthy pods and has 2 currently"
    ):
        await admin.pods.evict("ml-nlp", "llm-pretrain-worker-0", deadline=0.4)
    assert loop.time() - start >= 0.4
    evictions = [r for r in sim.requests if r[2].endswith("/llm-pretrain-worker-0/eviction")]
    assert len(evictions) >= 2 and all(status == 429 for *_, status in evictions)
    assert (await admin.pods.get("ml-nlp", "llm-pretrain-worker-0"))["status"]["phase"] == "Running"


async def test_eviction_proceeds_once_the_budget_allows(admin: Cluster, sim: SimCluster) -> None:
    async def relax_budget_after_first_refusal() -> None:
        async with asyncio.timeout(5):  # wait for the condition: a refused eviction
            while not any(
                r[2].endswith("/llm-pretrain-worker-1/eviction") and r[3] == 429
                for r in sim.requests
            ):
                await asyncio.sleep(0.01)
        await admin.client.request(
            "PATCH",
            "/apis/policy/v1/namespaces/ml-nlp/poddisruptionbudgets/llm-pretrain",
            body={"spec": {"minAvailable": 1}},
            content_type=MERGE_PATCH,
        )

    relax = asyncio.create_task(relax_budget_after_first_refusal())
    assert await admin.pods.evict("ml-nlp", "llm-pretrain-worker-1", deadline=5) is True
    await relax
    pdb = await admin.client.request(
        "GET", "/apis/policy/v1/namespaces/ml-nlp/poddisruptionbudgets/llm-pretrain"
    )
    assert pdb["status"]["currentHealthy"] == 1 and pdb["status"]["disruptionsAllowed"] == 0


async def test_eviction_with_two_budgets_is_reported(admin: Cluster) -> None:
    await admin.client.request(
        "POST",
        "/apis/policy/v1/namespaces/ml-robotics/poddisruptionbudgets",
        body=manifest(
            "policy/v1",
            "PodDisruptionBudget",
            "second",
            spec={
                "maxUnavailable": 1,
                "selector": {"matchLabels": {"training.kubeflow.org/job-name": "sim-rl"}},
            },
        ),
    )
    with pytest.raises(MultipleBudgets, match="more than one PodDisruptionBudget"):
        await admin.pods.evict("ml-robotics", "sim-rl-worker-0", deadline=2)


# --- events, secrets, notebooks, network policies, leases ---------------------------------------


async def test_event_is_recorded_for_both_event_apis(admin: Cluster) -> None:
    node = await admin.nodes.get("gpu-h100-04")
    ev = await admin.events.create(
        node,
        reason="GPUUnhealthy",
        action="Quarantine",
        note="GPU 2 reported Xid 79",
        type_="Warning",
    )
    assert ev["reportingController"] == "nodeward"
    assert ev["metadata"]["namespace"] == "default"
    core = await admin.client.request(
        "GET",
        "/api/v1/namespaces/default/events",
        query={"fieldSelector": "involvedObject.kind=Node,involvedObject.name=gpu-h100-04"},
    )
    assert [(e["reason"], e["message"], e["source"]["component"]) for e in core["items"]] == [
        ("GPUUnhealthy", "GPU 2 reported Xid 79", "nodeward")
    ]
    with pytest.raises(Invalid, match="type"):
        await admin.events.create(node, reason="X", action="Y", type_="Bogus")  # type: ignore[arg-type]


async def test_secret_replace_conflict_is_retried_to_success(
    admin: Cluster, sim: SimCluster
) -> None:
    calls: list[str] = []

    def mutate(secret: dict) -> dict:  # type: ignore[type-arg]
        calls.append(secret["metadata"]["resourceVersion"])
        if len(calls) == 1:  # someone else writes between our read and our PUT
            other = sim.store.get(SECRETS, "ml-nlp", "bob-oauth")
            other["metadata"].setdefault("annotations", {})["renewed-by"] = "someone-else"
            sim.store.update(SECRETS, "ml-nlp", "bob-oauth", other)
        secret["data"] = {**secret["data"], **encode({"access_token": "new-token"})}
        return secret

    result = await admin.secrets.replace("ml-nlp", "bob-oauth", mutate)
    assert len(calls) == 2 and calls[0] != calls[1]
    assert decode(result)["access_token"] == "new-token"
    assert result["metadata"]["annotations"]["renewed-by"] == "someone-else", (
        "the other write survives"
    )
    assert any(s == 409 and "/secrets/bob-oauth" in p for _, m, p, s in sim.requests if m == "PUT")


async def test_secret_patch_with_resource_version(admin: Cluster, sim: SimCluster) -> None:
    seen: list[str] = []

    def make_patch(secret: dict) -> dict:  # type: ignore[type-arg]
        seen.append(secret["metadata"]["resourceVersion"])
        if len(seen) == 1:
            other = sim.store.get(SECRETS, "ml-vision", "alice-oauth")
            other["metadata"]["labels"]["touched"] = "yes"
            sim.store.update(SECRETS, "ml-vision", "alice-oauth", other)
        return {"data": encode({"refresh_token": "rotated"})}

    result = await admin.secrets.patch("ml-vision", "alice-oauth", make_patch)
    assert len(seen) == 2
    assert decode(result)["refresh_token"] == "rotated"
    assert decode(result)["client_id"] == "kubeflow-notebooks"  # the rest of the data stays
    assert result["metadata"]["labels"]["touched"] == "yes"
    stale = copy.deepcopy(result)
    stale["metadata"]["resourceVersion"] = "1"
    with pytest.raises(Conflict, match="the object has been modified"):
        await admin.client.request(
            "PUT", "/api/v1/namespaces/ml-vision/secrets/alice-oauth", body=stale
        )


async def test_notebook_annotations(admin: Cluster) -> None:
    nb = await admin.notebooks.get("ml-genomics", "erin-jupyter")
    assert nb["kind"] == "Notebook" and nb["apiVersion"] == "kubeflow.org/v1"
    patched = await admin.notebooks.set_annotations(
        "ml-genomics", "erin-jupyter", {"kubeflow-resource-stopped": "2026-11-29T12:00:00Z"}
    )
    assert patched["metadata"]["annotations"]["kubeflow-resource-stopped"] == "2026-11-29T12:00:00Z"
    assert patched["metadata"]["generation"] == nb["metadata"]["generation"]
    with pytest.raises(UnsupportedMediaType):
        await admin.client.request(
            "PATCH",
            "/apis/kubeflow.org/v1/namespaces/ml-genomics/notebooks/erin-jupyter",
            body={"metadata": {"labels": {"a": "b"}}},
            content_type=STRATEGIC_PATCH,
        )


async def test_network_policy_create_delete(admin: Cluster) -> None:
    policy = isolate_pod_policy("ml-speech", "nodeward-isolate-carol", {"app": "ssh-carol"})
    created = await admin.network_policies.create(policy)
    assert created["metadata"]["uid"]
    with pytest.raises(Conflict, match="already exists"):
        await admin.network_policies.create(policy)
    assert await admin.network_policies.delete("ml-speech", "nodeward-isolate-carol") is True
    assert await admin.network_policies.delete("ml-speech", "nodeward-isolate-carol") is False


async def test_lease_leader_election(port_for: PortFactory) -> None:
    creds = port_for("credentials")  # its scheduler holds a lease
    assert await creds.leases.try_acquire("renew-scheduler", "replica-a", duration_s=30) is True
    assert await creds.leases.try_acquire("renew-scheduler", "replica-b", duration_s=30) is False
    assert await creds.leases.try_acquire("renew-scheduler", "replica-a", duration_s=30) is True
    assert await creds.leases.release("renew-scheduler", "replica-a") is True
    assert await creds.leases.try_acquire("renew-scheduler", "replica-b", duration_s=30) is True
    with pytest.raises(Forbidden, match='in the namespace "default"'):
        await creds.leases.try_acquire("elsewhere", "replica-a", namespace="default")


# --- checkpoints ------------------------------------------------------------------------------


async def test_checkpoint_through_node_proxy(port_for: PortFactory, sim: SimCluster) -> None:
    cp = port_for("checkpoint")
    path = await cp.checkpoints.create(
        "gpu-a100-02", "ml-speech", "whisper-distill-worker-0", "pytorch", timeout_s=30
    )
    assert path.startswith(
        "/var/lib/kubelet/checkpoints/checkpoint-whisper-distill-worker-0_ml-speech-pytorch-"
    )
    assert [(c.node, c.pod, c.container, c.timeout) for c in sim.checkpoints] == [
        ("gpu-a100-02", "whisper-distill-worker-0", "pytorch", 30)
    ]
    with pytest.raises(CheckpointFailed, match="checkpoint/restore support not available"):
        await cp.checkpoints.create(
            "gpu-a100-02", "ml-speech", "whisper-distill-worker-1", "pytorch"
        )
    with pytest.raises(NotFound, match="pod does not exist"):
        await cp.checkpoints.create(
            "gpu-h100-01", "ml-speech", "whisper-distill-worker-0", "pytorch"
        )
    with pytest.raises(NotFound, match="container sidecar does not exist"):
        await cp.checkpoints.create(
            "gpu-a100-02", "ml-speech", "whisper-distill-worker-0", "sidecar"
        )
    assert len(sim.checkpoints) == 1


# --- watches ----------------------------------------------------------------------------------


async def test_watch_nodes_resumes_and_sees_bookmarks(admin: Cluster, sim: SimCluster) -> None:
    start = str(sim.store.resource_version)
    bookmarks: list[str] = []
    events = watch(admin.client, "/api/v1/nodes", resource_version=start, bookmarks=bookmarks)
    await admin.nodes.add_taint("gpu-h100-01", TAINT, "NoSchedule")
    first = await asyncio.wait_for(anext(events), 5)
    assert first.type == "MODIFIED" and first.object["metadata"]["name"] == "gpu-h100-01"
    await admin.nodes.set_labels("gpu-h100-02", {"x": "1"})
    second = await asyncio.wait_for(anext(events), 5)
    assert second.object["metadata"]["name"] == "gpu-h100-02"
    assert int(second.resource_version) > int(first.resource_version)
    await events.aclose()
    # resume from the first event's version: the second change is replayed
    resumed = watch(
        admin.client, "/api/v1/nodes", resource_version=first.resource_version, bookmarks=bookmarks
    )
    again = await asyncio.wait_for(anext(resumed), 5)
    assert again.object["metadata"]["name"] == "gpu-h100-02"
    watcher = asyncio.ensure_future(anext(resumed))
    async with asyncio.timeout(5):
        while not bookmarks:
            await asyncio.sleep(0.02)
    assert int(bookmarks[-1]) >= int(again.resource_version)
    await admin.nodes.set_labels("gpu-h100-03", {"x": "1"})
    third = await asyncio.wait_for(watcher, 5)
    assert third.object["metadata"]["name"] == "gpu-h100-03"
    await resumed.aclose()


async def test_watch_too_old_version_relists_or_raises(admin: Cluster, sim: SimCluster) -> None:
    old = str(sim.store.resource_version)
    await admin.nodes.set_labels("gpu-h100-01", {"x": "1"})
    sim.store.compact()
    strict = watch(admin.client, "/api/v1/nodes", resource_version=old, relist_on_gone=False)
    with pytest.raises(Gone, match="too old resource version"):
        await asyncio.wait_for(anext(strict), 5)
    relisting = admin.pods.watch("ml-nlp", resource_version=old)
    first = await asyncio.wait_for(anext(relisting), 5)
    assert first.relisted and first.type == "ADDED"
    await relisting.aclose()


async def test_watch_pods_on_a_node_sees_deletion(admin: Cluster, sim: SimCluster) -> None:
    events = admin.pods.watch(node="gpu-h100-04", resource_version=str(sim.store.resource_version))
    await admin.pods.delete("ml-genomics", "ssh-erin-5c8d9-4b2k")
    # a graceful deletion: first the pod marked Terminating, then gone once its kubelet is done
    ev = await asyncio.wait_for(anext(events), 5)
    assert (ev.type, ev.object["metadata"]["name"]) == ("MODIFIED", "ssh-erin-5c8d9-4b2k")
    assert ev.object["metadata"]["deletionTimestamp"]
    # its ReplicaSet has meanwhile made a replacement, which the scheduler may put here
    ev = await asyncio.wait_for(anext(events), 5)
    while ev.object["metadata"]["name"] != "ssh-erin-5c8d9-4b2k":
        assert ev.object["metadata"]["name"].startswith("ssh-erin-5c8d9-")
        ev = await asyncio.wait_for(anext(events), 5)
    assert ev.type == "DELETED"
    await events.aclose()


async def test_a_watch_from_a_listings_version_misses_no_change_after_it(
    admin: Cluster,
) -> None:
    """`listing()` then `watch(resource_version=...)`: a change made between the two is seen."""
    listed = await admin.nodes.listing()
    assert "gpu-h100-01" in {n["metadata"]["name"] for n in listed.items}
    await admin.nodes.set_labels("gpu-h100-01", {"between": "1"})  # before the watch starts
    events = admin.nodes.watch(resource_version=listed.resource_version)
    ev = await asyncio.wait_for(anext(events), 5)
    assert ev.object["metadata"]["labels"]["between"] == "1"
    await events.aclose()
    pods = await admin.pods.listing()
    assert len(pods.items) > 1 and int(pods.resource_version) >= int(listed.resource_version)


# --- identities, RBAC, errors, retries ---------------------------------------------------------


async def test_forbidden_outside_the_services_role(port_for: PortFactory) -> None:
    culler = port_for("culler", guarded=False)  # culler's token, without the port's own guard
    with pytest.raises(Forbidden) as err:
        await culler.nodes.add_taint("gpu-h100-01", TAINT, "NoSchedule")
    assert err.value.message == (
        'nodes "gpu-h100-01" is forbidden: User "system:serviceaccount:nodeward:nodeward-culler" cannot get '
        'resource "nodes" in API group "" at the cluster scope'
    )
    assert err.value.reason == "Forbidden" and err.value.status == 403
    with pytest.raises(Forbidden, match='cannot create resource "pods/eviction"'):
        await culler.pods.evict("ml-nlp", "bob-jupyter-0")
    cordon = port_for("cordon", guarded=False)
    with pytest.raises(
        Forbidden, match='cannot get resource "secrets" in API group "" in the namespace "ml-nlp"'
    ):
        await cordon.secrets.get("ml-nlp", "bob-oauth")
    agent = port_for("agent", guarded=False)
    assert len(await agent.pods.on_node("gpu-h100-01")) == 3
    with pytest.raises(Forbidden):
        await agent.nodes.set_labels("gpu-h100-01", {"a": "b"})
    assert (await port_for("culler").pods.get("ml-nlp", "bob-jupyter-0"))["metadata"][
        "name"
    ] == "bob-jupyter-0"


async def test_guard_refuses_undeclared_operations(port_for: PortFactory, sim: SimCluster) -> None:
    culler = port_for("culler")
    before = len(sim.requests)
    with pytest.raises(UndeclaredOperation, match=r"culler does not declare nodes\.patch"):
        await culler.nodes.add_taint("gpu-h100-01", TAINT, "NoSchedule")
    with pytest.raises(UndeclaredOperation):
        await anext(culler.nodes.watch())
    assert len(sim.requests) == before, "nothing reached the API server"
    with pytest.raises(ValueError, match=r"nodes\.fly not in OPERATIONS"):
        Access("culler", frozenset({"nodes.fly"}))


async def test_a_service_is_refused_what_its_access_py_does_not_declare(
    sim: SimCluster, tmp_path: Path
) -> None:
    """The declaration a service connects with is what the port enforces: the culler's
    own `ACCESS` may read a session pod but not cordon a node, even with a token that
    could (admin's), and nothing reaches the API server."""
    path = sim.write_kubeconfig(tmp_path / "kubeconfig", identity="admin")
    async with Cluster.connect(ClusterSettings(kubeconfig=path), access=CULLER) as culler:
        assert "nodes.patch" not in CULLER.operations
        pod = await culler.pods.get("ml-nlp", "bob-jupyter-0")
        assert pod["metadata"]["name"] == "bob-jupyter-0"
        before = len(sim.requests)
        with pytest.raises(UndeclaredOperation, match=r"culler does not declare nodes\.patch"):
            await culler.nodes.set_unschedulable("gpu-h100-01")
        assert len(sim.requests) == before
    async with Cluster.connect(ClusterSettings(kubeconfig=path)) as admin:
        assert not (await admin.nodes.get("gpu-h100-01"))["spec"].get("unschedulable")


async def test_server_errors_are_retried_with_backoff(admin: Cluster, sim: SimCluster) -> None:
    fault = sim.fail_next(2, 503, method="GET", path_contains="/nodes/gpu-h100-01")
    assert (await admin.nodes.get("gpu-h100-01"))["metadata"]["name"] == "gpu-h100-01"
    assert fault.count == 0
    sim.fail_next(10, 500, path_contains="/nodes/gpu-h100-02")
    with pytest.raises(ServerError, match="injected"):
        await admin.nodes.get("gpu-h100-02")
    sim.fail_next(1, 429, path_contains="/nodes/gpu-h100-03")
    assert (await admin.nodes.get("gpu-h100-03"))["metadata"]["name"] == "gpu-h100-03"


async def test_connection_errors_are_retried_then_typed(sim: SimCluster, tmp_path: object) -> None:
    from pathlib import Path

    kubeconfig = sim.write_kubeconfig(Path(str(tmp_path)) / "kc")
    client = KubeClient.from_kubeconfig(kubeconfig)
    client.retries = 2
    client.backoff = Backoff(base=0.01, cap=0.02)
    await sim.stop()
    with pytest.raises(Unavailable):
        await client.request("GET", "/api/v1/nodes")
    await client.close()


async def test_unauthenticated_and_bad_config(sim: SimCluster, tmp_path: object) -> None:
    from pathlib import Path

    from nodeward.kube import KubeError, Unauthorized

    path = sim.write_kubeconfig(Path(str(tmp_path)) / "kc")
    path.write_text(path.read_text().replace(sim.identities["admin"].token, "wrong-token"))
    client = KubeClient.from_kubeconfig(path)
    with pytest.raises(Unauthorized):
        await client.request("GET", "/api/v1/nodes")
    await client.close()
    with pytest.raises(KubeError, match="cannot load"):
        KubeClient.from_kubeconfig(Path(str(tmp_path)) / "missing")
