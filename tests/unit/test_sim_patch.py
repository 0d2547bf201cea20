"""The sim cluster's patch types, selectors and table printing, against the real API's semantics."""

from __future__ import annotations

import pytest

from sim.cluster.errors import ApiError
from sim.cluster.patch import apply_patch, json_patch, merge_patch, strategic_merge_patch
from sim.cluster.selectors import (
    match_fields,
    match_labels,
    parse_field_selector,
    parse_label_selector,
)
from sim.cluster.tables import human_duration, node_status

NODE = {
    "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {
        "taints": [{"key": "k1", "effect": "NoSchedule"}, {"key": "k2", "effect": "NoExecute"}]
    },
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "DiskPressure", "status": "False"},
        ]
    },
}
POD = {
    "spec": {
        "containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"},
        ]
    }
}


def test_merge_patch_rfc7386() -> None:
    out = merge_patch(NODE, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"taints": []}})
    assert out["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert out["spec"]["taints"] == []
    assert NODE["metadata"]["labels"] == {"a": "1", "b": "2"}, "the input is not modified"
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}


def test_strategic_conditions_merge_by_type() -> None:
    out = strategic_merge_patch(
        NODE,
        {
            "status": {
                "conditions": [
                    {"type": "GPUHealthy", "status": "False"},
                    {"type": "Ready", "status": "False"},
                ]
            }
        },
        "Node",
    )
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "DiskPressure", "status": "False"},
        {"type": "GPUHealthy", "status": "False"},
    ]


def test_strategic_taints_are_atomic_as_in_the_real_api() -> None:
    out = strategic_merge_patch(
        NODE, {"spec": {"taints": [{"key": "k3", "effect": "NoSchedule"}]}}, "Node"
    )
    assert out["spec"]["taints"] == [{"key": "k3", "effect": "NoSchedule"}]


def test_strategic_containers_merge_by_name_and_directives() -> None:
    out = strategic_merge_patch(
        POD,
        {
            "spec": {
                "containers": [
                    {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
                    {"name": "b", "$patch": "delete"},
                ]
            }
        },
        "Pod",
    )
    assert out["spec"]["containers"] == [
        {
            "name": "a",
            "image": "a:2",
            "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}],
        }
    ]
    replaced = strategic_merge_patch(
        POD, {"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}]}}, "Pod"
    )
    assert replaced["spec"]["containers"] == [{"name": "c"}]
    ordered = strategic_merge_patch(
        NODE,
        {
            "status": {
                "$setElementOrder/conditions": [{"type": "DiskPressure"}, {"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "Unknown"}],
            }
        },
        "Node",
    )
    assert [c["type"] for c in ordered["status"]["conditions"]] == ["DiskPressure", "Ready"]
    retained = strategic_merge_patch(
        NODE, {"metadata": {"$retainKeys": ["name"], "name": "n1"}}, "Node"
    )
    assert retained["metadata"] == {"name": "n1"}
    merged_map = strategic_merge_patch(
        NODE, {"metadata": {"labels": {"$patch": "replace", "z": "9"}}}, "Node"
    )
    assert merged_map["metadata"]["labels"] == {"z": "9"}
    finalizers = strategic_merge_patch(
        NODE,
        {"metadata": {"finalizers": ["y"], "$deleteFromPrimitiveList/finalizers": ["x"]}},
        "Node",
    )
    assert finalizers["metadata"]["finalizers"] == ["y"]
    with pytest.raises(ApiError, match="merge key"):
        strategic_merge_patch(POD, {"spec": {"containers": [{"image": "x"}]}}, "Pod")


def test_json_patch_rfc6902() -> None:
    out = json_patch(
        NODE,
        [
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "k3", "effect": "NoSchedule"}},
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "9"},
            {"op": "add", "path": "/metadata/labels/nodeward.io~1gpu-health", "value": "failed"},
            {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/c"},
            {"op": "move", "from": "/metadata/labels/b", "path": "/metadata/labels/d"},
            {"op": "test", "path": "/metadata/name", "value": "n1"},
        ],
    )
    assert [t["key"] for t in out["spec"]["taints"]] == ["k2", "k3"]
    assert out["metadata"]["labels"] == {
        "a": "9",
        "nodeward.io/gpu-health": "failed",
        "c": "9",
        "d": "2",
    }
    with pytest.raises(ApiError, match="testing value"):
        json_patch(NODE, [{"op": "test", "path": "/metadata/name", "value": "other"}])
    with pytest.raises(ApiError, match="missing path"):
        json_patch(NODE, [{"op": "replace", "path": "/nope/x", "value": 1}])


def test_patch_content_types() -> None:
    assert apply_patch(
        {"a": 1}, {"b": 2}, "application/merge-patch+json; charset=utf-8", "Node"
    ) == {"a": 1, "b": 2}
    with pytest.raises(ApiError) as err:
        apply_patch({}, {}, "application/strategic-merge-patch+json", "Notebook", strategic=False)
    assert err.value.code == 415
    with pytest.raises(ApiError) as err:
        apply_patch({}, {}, "text/plain", "Node")
    assert err.value.code == 415


def test_label_and_field_selectors() -> None:
    labels = {"app": "web", "tier": "gpu", "env": "prod"}
    assert match_labels(parse_label_selector("app=web,tier in (gpu,cpu),!missing,env"), labels)
    assert not match_labels(parse_label_selector("app!=web"), labels)
    assert not match_labels(parse_label_selector("tier notin (gpu)"), labels)
    with pytest.raises(ApiError, match="unable to parse"):
        parse_label_selector("a=b=c")
    fields = parse_field_selector(
        "spec.nodeName=n1,status.phase!=Failed",
        frozenset({"spec.nodeName", "status.phase"}),
        "pods",
    )
    assert match_fields(fields, {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    assert not match_fields(fields, {"spec": {"nodeName": "n2"}, "status": {"phase": "Running"}})
    with pytest.raises(ApiError, match=r"field label not supported: spec\.bogus"):
        parse_field_selector("spec.bogus=1", frozenset(), "pods")


def test_table_printing_details() -> None:
    assert [
        human_duration(s) for s in (5, 119, 150, 600, 3 * 3600, 9 * 3600, 3 * 86400, 400 * 86400)
    ] == ["5s", "119s", "2m30s", "10m", "3h", "9h", "3d", "400d"]
    assert (
        node_status({"spec": {"unschedulable": True}, "status": NODE["status"]})
        == "Ready,SchedulingDisabled"
    )
    assert (
        node_status({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
        == "NotReady"
    )
