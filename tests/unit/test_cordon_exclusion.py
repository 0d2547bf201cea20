"""Node or device: the cordon policy's scope of a quarantine, and finding a GPU's DRA device."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from nodeward.kube.devices import TAINT_RULE_VERSIONS, version_order
from schemas.common import PodRef
from schemas.gpu import GpuHealth, HealthState, MigInstance
from schemas.state.cordon import DeviceExclusion
from services.cordon.devices import is_ours, label_value, locate, rule_name
from services.cordon.policy import Decision, Exclusion, PolicyAction, Scope, load_policy

H100 = "NVIDIA H100 80GB HBM3"
QUARANTINE = Decision(rule="failed-gpu", action=PolicyAction.QUARANTINE)


def test_the_shipped_policy_keeps_todays_behaviour_on_device_plugin_nodes() -> None:
    exclusion = load_policy().exclusion
    assert exclusion.node_threshold == 1
    assert exclusion.scope(QUARANTINE, model=H100, failed=1, dra=False) == Scope.NODE


def test_a_dra_gpu_is_tainted_alone() -> None:
    exclusion = Exclusion()
    assert exclusion.scope(QUARANTINE, model=H100, failed=1, dra=True) == Scope.DEVICE
    assert exclusion.scope(QUARANTINE, model=H100, failed=5, dra=True) == Scope.DEVICE


def test_device_taints_off_falls_back_to_the_threshold() -> None:
    exclusion = Exclusion(device_taints=False, node_threshold=2)
    assert exclusion.scope(QUARANTINE, model=H100, failed=1, dra=True) == Scope.GPU
    assert exclusion.scope(QUARANTINE, model=H100, failed=2, dra=True) == Scope.NODE


@pytest.mark.parametrize(
    ("model", "failed", "scope"),
    [
        (H100, 1, Scope.GPU),
        (H100, 2, Scope.GPU),
        (H100, 3, Scope.NODE),
        ("NVIDIA A100-SXM4-80GB", 1, Scope.NODE),  # no per-model entry: node_threshold 1
        (None, 1, Scope.NODE),
    ],
)
def test_device_plugin_threshold_per_model(model: str | None, failed: int, scope: Scope) -> None:
    exclusion = Exclusion(thresholds={H100: 3})
    assert exclusion.scope(QUARANTINE, model=model, failed=failed, dra=False) == scope


def test_a_whole_node_rule_always_takes_the_node() -> None:
    decision = Decision(rule="gpu-lost", action=PolicyAction.QUARANTINE, whole_node=True)
    exclusion = Exclusion(node_threshold=4)
    assert exclusion.scope(decision, model=H100, failed=1, dra=True) == Scope.NODE
    assert exclusion.scope(decision, model=H100, failed=1, dra=False) == Scope.NODE


def test_thresholds_are_read_from_the_policy_file(tmp_path: Any) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "exclusion: {node_threshold: 2, thresholds: {'NVIDIA H100 80GB HBM3': 4}}\n"
        "rules: [{name: failed, when: {states: [failed]}, action: quarantine, whole_node: false}]\n"
    )
    policy = load_policy(path)
    assert policy.exclusion.threshold(H100) == 4
    assert policy.exclusion.threshold("other") == 2


def _health(index: int, uuid: str, *, mig: bool = False) -> GpuHealth:
    return GpuHealth(
        node="gpu-dra-01",
        gpu_index=index,
        gpu_uuid=uuid,
        mig=MigInstance(gpu_instance_id=1, compute_instance_id=0) if mig else None,
        state=HealthState.FAILED,
        observed_at=datetime.now(UTC),
        pods=[PodRef(namespace="ml", name="p")],
    )


def _slice(driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "nodeName": "gpu-dra-01",
            "pool": {"name": "gpu-dra-01"},
            "devices": devices,
        }
    }


def test_locate_by_uuid_then_index_then_name() -> None:
    current = _slice(
        "gpu.nvidia.com",
        [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(8)],
    )
    found = locate([current], ["gpu.nvidia.com"], _health(3, "GPU-3"))
    assert found is not None and (found.driver, found.pool, found.device) == (
        "gpu.nvidia.com",
        "gpu-dra-01",
        "gpu-3",
    )
    # A uuid the slice does not list is not guessed by index when uuids are published.
    assert locate([current], ["gpu.nvidia.com"], _health(3, "GPU-other")) is None
    older = _slice("gpu.nvidia.com", [{"name": "gpu-x", "attributes": {"index": {"int": 2}}}])
    found = locate([older], ["gpu.nvidia.com"], _health(2, "GPU-2"))
    assert found is not None and found.device == "gpu-x"
    bare = _slice("gpu.nvidia.com", [{"name": "gpu-5"}])
    found = locate([bare], ["gpu.nvidia.com"], _health(5, "GPU-5"))
    assert found is not None and found.device == "gpu-5"


def test_other_drivers_and_mig_instances_are_not_located() -> None:
    nic = _slice(
        "nic.example.com", [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}]
    )
    assert locate([nic], ["gpu.nvidia.com"], _health(0, "GPU-0")) is None
    gpu = _slice("gpu.nvidia.com", [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}])
    assert locate([gpu], ["gpu.nvidia.com"], _health(0, "GPU-0", mig=True)) is None


def test_rule_names_and_values_are_valid() -> None:
    assert rule_name("gpu-dra-01", "gpu-3") == "nodeward-gpu-dra-01-gpu-3"
    long = rule_name("n" * 250, "gpu-3")
    assert len(long) <= 253 and long.endswith("gpu-3")
    assert label_value("xid node/action!") == "xid-node-action"


def test_only_a_rule_nodeward_created_is_ours() -> None:
    ex = DeviceExclusion(
        gpu="3",
        gpu_uuid="GPU-3",
        kind="device_taint",
        incident="e1",
        rule="failed-gpu",
        reason="r",
        started_at=datetime.now(UTC),
        uid="u1",
    )
    ours = {
        "metadata": {
            "uid": "u1",
            "labels": {"app.kubernetes.io/managed-by": "nodeward"},
            "annotations": {"nodeward.io/gpu-uuid": "GPU-3"},
        }
    }
    assert is_ours(ours, ex)
    assert not is_ours({**ours, "metadata": {**ours["metadata"], "uid": "u2"}}, ex)
    assert not is_ours({"metadata": {"uid": "u1", "labels": {}}}, ex)
    assert not is_ours(None, ex)


def _group(*versions: str) -> dict[str, Any]:
    gvs = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "name": "resource.k8s.io",
        "versions": gvs,
        "preferredVersion": gvs[0],
    }


@pytest.mark.parametrize(
    ("served", "order"),
    [
        # 1.33-1.35 with the DRADeviceTaints gate and v1alpha3 enabled
        (("v1", "v1beta2", "v1beta1", "v1alpha3"), ["v1", "v1beta2", "v1alpha3"]),
        # 1.36: DeviceTaintRule in v1beta2 (v1 asked first: discovery says what it serves)
        (("v1", "v1beta2", "v1beta1"), ["v1", "v1beta2"]),
        # 1.32: v1beta1 and v1alpha3 (whose resource list, asked next, has no rules yet)
        (("v1beta1", "v1alpha3"), ["v1alpha3"]),
    ],
)
def test_discovery_asks_the_versions_that_can_serve_rules(
    served: tuple[str, ...], order: list[str]
) -> None:
    assert version_order(_group(*served), TAINT_RULE_VERSIONS) == order
    assert version_order({"versions": []}, TAINT_RULE_VERSIONS) == []
