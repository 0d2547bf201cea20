"""Where a moved pod goes (filtered as the scheduler would) and the pod that replaces it."""

from __future__ import annotations

import json
from typing import Any

from services.maintenance.placement import (
    HOSTNAME_LABEL,
    PRODUCT_LABEL,
    RESTORED_ANNOTATION,
    choose_target,
    replacement,
    restored_by,
)
from services.maintenance.plan import MOVE_ANNOTATION, move_plan, plan_pods
from services.maintenance.state import CUDA_CHECKPOINT_LABEL, PodPlan

H100 = "NVIDIA-H100-80GB-HBM3"


def node(
    name: str,
    *,
    gpus: int = 8,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {HOSTNAME_LABEL: name, PRODUCT_LABEL: H100, **(labels or {})},
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)}},
    }


def bound(node_name: str, gpus: int) -> dict[str, Any]:
    return {
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
        "status": {"phase": "Running"},
    }


def plan(gpus: int = 0, **spec: Any) -> PodPlan:
    resources = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": "4", "memory": "16Gi"}}
    return PodPlan(
        namespace="ml",
        name="session-0",
        uid="u-1",
        gpus=gpus,
        opted_in=True,
        status="checkpointed",
        spec={
            "nodeName": "src",
            "containers": [{"name": "main", "image": "jupyter:1", "resources": resources}],
            **spec,
        },
        labels={"app": "session"},
        annotations={"nodeward.io/checkpoint-archive": "{}", "team": "ml"},
    )


def in_zone(zone: str) -> dict[str, Any]:
    """A required node affinity to nodes labelled `zone=<zone>`."""
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]}
    required = {"nodeSelectorTerms": [term]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def test_the_node_with_most_room_wins_and_the_source_never() -> None:
    nodes = [node("src"), node("a"), node("b")]
    pods = [bound("a", 6), bound("b", 2)]
    assert choose_target(plan(), nodes, pods, source="src") == ("b", [])


def test_cordoned_tainted_and_unselected_nodes_are_filtered_with_reasons() -> None:
    nodes = [
        node("src"),
        node("cordoned", unschedulable=True),
        node("tainted", taints=[{"key": "nodeward.io/gpu-unhealthy", "effect": "NoSchedule"}]),
        node("other-pool", labels={"pool": "b"}),
        node("ok", labels={"pool": "a"}),
    ]
    target, why = choose_target(plan(nodeSelector={"pool": "a"}), nodes, [], source="src")
    assert target == "ok"
    assert any("cordoned" in w for w in why)
    assert any("nodeward.io/gpu-unhealthy" in w for w in why)
    assert any("node selector pool=a" in w for w in why)


def test_a_tolerated_taint_and_a_required_affinity_are_honoured() -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    tolerate = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    affinity = in_zone("z2")
    nodes = [
        node("src"),
        node("z1", labels={"zone": "z1"}, taints=[taint]),
        node("z2", labels={"zone": "z2"}, taints=[taint]),
    ]
    target, why = choose_target(
        plan(tolerations=tolerate, affinity=affinity), nodes, [], source="src"
    )
    assert target == "z2" and any("affinity" in w for w in why)


def test_a_gpu_pod_needs_cuda_checkpoint_the_same_model_and_free_gpus() -> None:
    cuda = {CUDA_CHECKPOINT_LABEL: "true"}
    nodes = [
        node("src", labels=cuda),
        node("no-cuda"),
        node("a100", labels={**cuda, PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}),
        node("full", labels=cuda),
        node("fits", labels=cuda),
    ]
    target, why = choose_target(plan(gpus=2), nodes, [bound("full", 7)], source="src")
    assert target == "fits"
    assert any("CUDA checkpoint" in w for w in why)
    assert any(f"no {H100} GPUs" in w for w in why)
    assert any("1 nvidia.com/gpu free, the pod requests 2" in w for w in why)
    assert choose_target(plan(gpus=2), nodes[:4], [bound("full", 7)], source="src")[0] is None


def test_the_replacement_keeps_the_pod_swaps_images_and_is_pinned() -> None:
    p = plan(
        affinity=in_zone("z"), priority=1000, ephemeralContainers=[{"name": "dbg"}]
    ).model_copy(
        update={"owners": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "c-1"}]}
    )
    images = {"main": "127.0.0.1:5000/ml/session-0-main@sha256:" + "a" * 64}
    pod = replacement(
        p, images, "b", node="src", maintenance_id="mnt-1", checkpointed_at="2026-12-05T10:00:00Z"
    )
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "session-0" and meta["namespace"] == "ml"
    assert meta["labels"] == {"app": "session"}
    assert meta["ownerReferences"][0]["uid"] == "c-1"
    assert "nodeName" not in spec and spec["containers"][0]["image"] == images["main"]
    # Set by the API server at create (a stale priority or ephemeral containers: refused).
    assert "priority" not in spec and "ephemeralContainers" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["z"]},
                {"key": HOSTNAME_LABEL, "operator": "In", "values": ["b"]},
            ]
        }
    ]
    assert "nodeward.io/checkpoint-archive" not in meta["annotations"]
    assert meta["annotations"]["team"] == "ml"
    origin = json.loads(meta["annotations"][RESTORED_ANNOTATION])
    assert origin == {
        "checkpointed_at": "2026-12-05T10:00:00Z",
        "images": images,
        "maintenance": "mnt-1",
        "node": "src",
        "uid": "u-1",
    }
    assert restored_by(pod, "mnt-1") and not restored_by(pod, "mnt-2")
    assert p.spec["containers"][0]["image"] == "jupyter:1"  # the plan is not changed


def test_the_replacement_of_a_controllers_pod_has_the_controller_given_or_none() -> None:
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s-1"}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "c-1"}
    p = plan().model_copy(update={"owners": [{**sts, "controller": True}, other]})
    args: dict[str, Any] = {"node": "src", "maintenance_id": "m", "checkpointed_at": None}
    orphan = replacement(p, {}, "b", **args)
    assert orphan["metadata"]["ownerReferences"] == [other]  # for the set to adopt
    holder = {"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": "db", "uid": "n-1"}
    held = replacement(p, {}, "b", **args, controller={**holder, "controller": True})
    assert held["metadata"]["ownerReferences"] == [other, {**holder, "controller": True}]


def _pod(
    name: str,
    *,
    owner: str | None = None,
    api: str = "apps/v1",
    annotations: dict[str, str] | None = None,
) -> Any:
    refs = (
        [{"apiVersion": api, "kind": owner, "name": "o", "uid": "o-1", "controller": True}]
        if owner
        else []
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"u-{name}",
            "labels": {"nodeward.io/checkpoint": "true"},
            "annotations": annotations or {},
            "ownerReferences": refs,
        },
        "spec": {"containers": [{"name": "main", "image": "i"}]},
    }


def test_only_pods_that_asked_move_and_only_a_statefulsets_through_its_owner() -> None:
    src = node("src", labels={CUDA_CHECKPOINT_LABEL: "true"})
    asked = {MOVE_ANNOTATION: "true"}
    pods = [
        _pod("bare", annotations=asked),
        _pod("sts-0", owner="StatefulSet", annotations=asked),
        _pod("job-x", owner="Job", api="batch/v1", annotations=asked),
        _pod("quiet"),
        _pod("in-ns"),
    ]
    plans = plan_pods(src, pods, [], move=True, moving_namespaces=frozenset())
    assert plans["ml/bare"].move is not None and plans["ml/bare"].move.stage == "planned"
    assert not plans["ml/bare"].move.through_owner
    owned = plans["ml/sts-0"].move
    assert owned is not None and owned.stage == "planned" and owned.through_owner
    assert (owned.owner, owned.owner_name, owned.via) == ("StatefulSet", "o", None)
    assert plans["ml/sts-0"].owners[0]["uid"] == "o-1"  # kept: the take-over checks it
    controlled = plans["ml/job-x"].move
    assert controlled is not None and controlled.stage == "failed"
    assert "owned by Job o" in (controlled.reason or "")
    assert plans["ml/quiet"].move is None
    by_ns = plan_pods(src, pods, [], move=True, moving_namespaces=frozenset({"ml"}))
    assert by_ns["ml/in-ns"].move is not None
    assert plan_pods(src, pods, [], move=False)["ml/bare"].move is None
    assert move_plan(_pod("x")).owner == "pod"
