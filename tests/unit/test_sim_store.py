"""The sim cluster's bookkeeping and its default seed."""

from __future__ import annotations

import pytest

from services.credentials.secret import LABEL
from sim.cluster import load_seed
from sim.cluster.disruption import budget_status
from sim.cluster.errors import ApiError
from sim.cluster.resources import require
from sim.cluster.seed import apply_seed
from sim.cluster.store import Store

NODES = require("", "v1", "nodes")
PODS = require("", "v1", "pods")
PDBS = require("policy", "v1", "poddisruptionbudgets")
NAMESPACES = require("", "v1", "namespaces")


@pytest.fixture(scope="module")
def seeded() -> Store:
    store = Store()
    apply_seed(store, load_seed())
    return store


def test_resource_version_generation_and_conflicts() -> None:
    store = Store()
    node = store.create(NODES, "", {"metadata": {"name": "n1"}, "spec": {}})
    assert node["metadata"]["generation"] == 1 and node["metadata"]["uid"]
    rv1 = int(node["metadata"]["resourceVersion"])
    node["metadata"]["labels"] = {"a": "b"}
    labelled = store.update(NODES, "", "n1", node)
    assert int(labelled["metadata"]["resourceVersion"]) > rv1
    assert labelled["metadata"]["generation"] == 1, "metadata changes do not bump generation"
    labelled["spec"]["unschedulable"] = True
    cordoned = store.update(NODES, "", "n1", labelled)
    assert cordoned["metadata"]["generation"] == 2
    same = store.update(NODES, "", "n1", cordoned)
    assert same["metadata"]["resourceVersion"] == cordoned["metadata"]["resourceVersion"], (
        "no-op writes are free"
    )
    with pytest.raises(ApiError) as err:
        store.update(NODES, "", "n1", node)  # node still carries rv1
    assert (err.value.code, err.value.reason) == (409, "Conflict")
    with pytest.raises(ApiError) as err:
        store.create(NODES, "", {"metadata": {"name": "n1"}})
    assert (err.value.code, err.value.reason) == (409, "AlreadyExists")
    with pytest.raises(ApiError) as err:
        store.create(NODES, "", {"metadata": {"name": "Bad_Name"}})
    assert (err.value.code, err.value.reason) == (422, "Invalid")
    with pytest.raises(ApiError) as err:
        store.create(
            PODS,
            "missing-ns",
            {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        )
    assert err.value.code == 404
    gone = store.delete(NODES, "", "n1")
    assert int(gone["metadata"]["resourceVersion"]) > int(cordoned["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as err:
        store.get(NODES, "", "n1")
    assert err.value.status()["details"] == {"name": "n1", "kind": "nodes"}


def test_duplicate_taints_are_invalid_as_on_a_real_cluster() -> None:
    store = Store()
    taint = {"key": "k", "effect": "NoSchedule"}
    with pytest.raises(ApiError, match="taints must be unique by key and effect pair"):
        store.create(
            NODES, "", {"metadata": {"name": "n1"}, "spec": {"taints": [taint, dict(taint)]}}
        )
    with pytest.raises(ApiError, match="Unsupported value"):
        store.create(
            NODES,
            "",
            {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "k", "effect": "Nope"}]}},
        )


def test_history_and_compaction() -> None:
    store = Store(history=3)
    for i in range(5):
        store.create(NODES, "", {"metadata": {"name": f"n{i}"}})
    assert store.oldest_resumable == store.resource_version - 3
    store.compact()
    assert store.oldest_resumable == store.resource_version
    assert store.history_since(0, NODES.key) == []


def test_default_seed_is_a_realistic_gpu_cluster(seeded: Store) -> None:
    nodes = seeded.list(NODES)
    assert len(nodes) == 11  # with the DRA node
    amd = [n for n in nodes if "amd.com/gpu.product-name" in n["metadata"]["labels"]]
    assert [n["status"]["allocatable"]["amd.com/gpu"] for n in amd] == ["8", "8"]
    assert {n["metadata"]["labels"]["amd.com/gpu.device-id"] for n in amd} == {"74a1"}
    nodes = [n for n in nodes if n not in amd]
    assert all(n["metadata"]["labels"]["nvidia.com/gpu.count"] == "8" for n in nodes)
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}
    assert products == {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}
    mig = [n for n in nodes if "nvidia.com/mig.strategy" in n["metadata"]["labels"]]
    assert len(mig) == 1 and mig[0]["status"]["capacity"]["nvidia.com/gpu"] == "0"
    dra = [n for n in nodes if "nvidia.com/gpu" not in n["status"]["capacity"]]
    assert [n["metadata"]["name"] for n in dra] == ["gpu-h100-dra-01"]
    pods = seeded.list(PODS)
    user = [p for p in pods if p["metadata"]["namespace"].startswith("ml-")]
    assert len(user) == 31
    assert len({p["metadata"]["namespace"] for p in user}) == 5
    assert {p["metadata"]["labels"]["nodeward.io/role"] for p in user} == {
        "notebook",
        "ssh",
        "training",
    }
    # Every pod has an owner but JupyterHub's single-user servers (KubeSpawner makes bare pods).
    bare = [p["metadata"]["name"] for p in pods if not p["metadata"].get("ownerReferences")]
    assert bare == ["jupyter-erin"]
    for node in nodes:  # what the pods on a node request fits what it has
        name = node["metadata"]["name"]
        capacity = node["status"]["allocatable"]
        used: dict[str, int] = {}
        for p in pods:
            if p["spec"]["nodeName"] == name:
                for c in p["spec"]["containers"]:
                    for res, qty in c["resources"].get("limits", {}).items():
                        if res.startswith("nvidia.com/"):
                            used[res] = used.get(res, 0) + int(qty)
        assert all(q <= int(capacity.get(res, "0")) for res, q in used.items()), (name, used)
    budgets = {b["metadata"]["name"]: budget_status(seeded, b) for b in seeded.list(PDBS)}
    assert budgets["llm-pretrain"]["disruptionsAllowed"] == 0
    assert budgets["sim-rl"]["disruptionsAllowed"] == 1
    assert len(seeded.list(require("kubeflow.org", "v1", "notebooks"))) == 10
    secrets = seeded.list(require("", "v1", "secrets"))
    opted_in = [s for s in secrets if (s["metadata"].get("labels") or {}).get(LABEL)]
    # each user's OAuth2 token set and the client secret it names; a Kerberos Secret that
    # `nodeward up` fills (and opts in) where a KDC is installed
    assert len(secrets) == 11
    assert len(opted_in) == 5
    assert {n["metadata"]["name"] for n in seeded.list(NAMESPACES)} >= {
        "nodeward",
        "kube-system",
        "default",
    }


def test_secret_string_data_is_merged_into_data_and_immutable_secrets_stay() -> None:
    import base64

    store = Store()
    secrets = require("", "v1", "secrets")
    store.create(NAMESPACES, "", {"metadata": {"name": "ns"}})
    created = store.create(
        secrets,
        "ns",
        {"metadata": {"name": "s"}, "data": {"a": "YQ=="}, "stringData": {"b": "bee"}},
    )
    assert "stringData" not in created
    assert created["data"] == {"a": "YQ==", "b": base64.b64encode(b"bee").decode()}
    created["immutable"] = True
    frozen = store.update(secrets, "ns", "s", created)
    frozen["data"] = {"a": "Yg=="}
    with pytest.raises(ApiError, match="immutable"):
        store.update(secrets, "ns", "s", frozen)
