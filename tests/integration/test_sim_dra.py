"""The sim cluster serves resource.k8s.io as Kubernetes 1.35 does with DRADeviceTaints on:
discovery, ResourceSlices by node, DeviceTaintRules with validation and RBAC; the port finds
the version to use through discovery."""

from __future__ import annotations

import pytest

from nodeward.kube import Cluster, Conflict, Forbidden, Invalid, NotFound
from nodeward.kube.devices import GROUP, device_taint_rule
from sim.nvml import gpu_uuid
from tests.integration.simkube import PortFactory

DRA_NODE = "gpu-h100-dra-01"


async def test_discovery_lists_the_group_and_its_versions(admin: Cluster) -> None:
    group = await admin.client.request("GET", f"/apis/{GROUP}")
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta2", "v1alpha3"]
    assert group["preferredVersion"]["version"] == "v1"
    alpha = await admin.client.request("GET", f"/apis/{GROUP}/v1alpha3")
    rules = [r for r in alpha["resources"] if r["name"] == "devicetaintrules"]
    assert rules and rules[0]["namespaced"] is False and rules[0]["kind"] == "DeviceTaintRule"
    assert await admin.devices.served_version() == "v1alpha3"
    assert await admin.devices.slice_version() == "v1"


async def test_the_dra_node_publishes_its_gpus_as_the_nvidia_driver_does(admin: Cluster) -> None:
    slices = await admin.devices.slices_on("v1", DRA_NODE, "gpu.nvidia.com")
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (
        "gpu.nvidia.com",
        DRA_NODE,
        DRA_NODE,
    )
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    first = spec["devices"][0]["attributes"]
    assert first["uuid"] == {"string": gpu_uuid(DRA_NODE, 0)}
    assert first["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert first["type"] == {"string": "gpu"}
    node = await admin.nodes.get(DRA_NODE)
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert await admin.devices.slices_on("v1", "gpu-h100-01") == []
    beta = await admin.devices.slices_on("v1beta2", DRA_NODE)
    assert beta[0]["apiVersion"] == f"{GROUP}/v1beta2"


async def test_device_taint_rules_are_validated(admin: Cluster) -> None:
    rule = device_taint_rule(
        "bad",
        api_version="v1alpha3",
        driver="gpu.nvidia.com",
        pool=DRA_NODE,
        device="gpu-0",
        key="nodeward.io/gpu-unhealthy",
        value="x",
        effect="Sometimes",
        labels={},
        annotations={},
    )
    with pytest.raises(Invalid, match=r"spec\.taint\.effect"):
        await admin.devices.create_taint_rule("v1alpha3", rule)
    rule["spec"]["taint"].pop("key")
    rule["spec"]["taint"]["effect"] = "NoSchedule"
    with pytest.raises(Invalid, match=r"spec\.taint\.key"):
        await admin.devices.create_taint_rule("v1alpha3", rule)
    with pytest.raises(NotFound):  # not served in v1 by this cluster
        await admin.devices.create_taint_rule("v1", rule)


async def test_cordon_may_create_get_and_delete_rules_and_nothing_more(
    port_for: PortFactory,
) -> None:
    cordon = port_for("cordon")
    rule = device_taint_rule(
        "nodeward-test-gpu-0",
        api_version="v1alpha3",
        driver="gpu.nvidia.com",
        pool=DRA_NODE,
        device="gpu-0",
        key="nodeward.io/gpu-unhealthy",
        value="failed-gpu",
        effect="NoSchedule",
        labels={"app.kubernetes.io/managed-by": "nodeward"},
        annotations={},
    )
    created = await cordon.devices.create_taint_rule("v1alpha3", rule)
    assert created["spec"]["taint"]["timeAdded"]
    got = await cordon.devices.get_taint_rule("v1alpha3", "nodeward-test-gpu-0")
    assert got is not None and got["metadata"]["uid"] == created["metadata"]["uid"]
    unguarded = port_for("cordon", guarded=False)
    with pytest.raises(Forbidden):
        await unguarded.client.request("GET", f"/apis/{GROUP}/v1alpha3/devicetaintrules")
    with pytest.raises(Conflict, match="Precondition failed"):  # never a rule that replaced it
        await cordon.devices.delete_taint_rule("v1alpha3", "nodeward-test-gpu-0", "another-uid")
    assert await cordon.devices.delete_taint_rule(
        "v1alpha3", "nodeward-test-gpu-0", created["metadata"]["uid"]
    )
    assert await cordon.devices.get_taint_rule("v1alpha3", "nodeward-test-gpu-0") is None
