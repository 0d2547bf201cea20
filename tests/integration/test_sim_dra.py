"""The sim cluster serves resource.k8s.io as the release it claims does (by default 1.37 with
DRADeviceTaints on):
discovery, ResourceSlices by node, DeviceTaintRules with validation and RBAC; the port finds
the version to use through discovery."""

from __future__ import annotations

from typing import Any

import pytest

from nodeward.kube import Cluster, Conflict, Forbidden, Invalid, NotFound
from nodeward.kube.devices import GROUP, device_taint_rule
from sim.cluster import SimCluster
from sim.cluster.versions import DRA_TAINTS
from sim.nvml import gpu_uuid
from tests.integration.simkube import PortFactory

DRA_NODE = "gpu-h100-dra-01"


def _release(
    version: str | None, enabled: tuple[str, ...] | None, groups: list[str], taints: str | None
) -> object:
    options = {k: v for k, v in (("kube_version", version), ("enabled", enabled)) if v is not None}
    return pytest.param(
        groups,
        taints,
        marks=pytest.mark.sim_cluster(**options),
        id=f"{version or 'default'}-{'+'.join(enabled) if enabled is not None else 'gate'}",
    )


ALPHA, BETA = f"{GROUP}/v1alpha3", f"{GROUP}/v1beta2"


@pytest.mark.parametrize(
    ("groups", "taints"),
    [
        # the sim's default: the client's release (1.37) with the DRADeviceTaints gate
        _release(None, None, ["v1"], "v1"),
        _release("1.37", (), ["v1"], None),  # the gate off: no DeviceTaintRules
        _release("1.36", (DRA_TAINTS, BETA), ["v1", "v1beta2"], "v1beta2"),
        _release("1.35", (DRA_TAINTS, ALPHA), ["v1", "v1alpha3"], "v1alpha3"),
        _release("1.35", (DRA_TAINTS,), ["v1"], None),  # alpha needs its runtime-config too
        _release("1.33", (DRA_TAINTS, BETA, ALPHA), ["v1beta2", "v1alpha3"], "v1alpha3"),
        _release("1.33", None, [], None),  # DRA's beta is off by default before 1.34
        _release("1.30", None, [], None),
    ],
)
async def test_discovery_serves_the_versions_of_the_claimed_release(
    admin: Cluster, sim: SimCluster, groups: list[str], taints: str | None
) -> None:
    """kube-apiserver serves resource.k8s.io/v1 from 1.34 (KEP-4381), its betas only with
    --runtime-config (KEP-3136), DeviceTaintRule behind DRADeviceTaints (KEP-5055); the port
    asks discovery which version to use."""
    if not groups:
        with pytest.raises(NotFound):
            await admin.client.request("GET", f"/apis/{GROUP}")
        assert await admin.devices.served_version() is None
        assert await admin.devices.slice_version() is None
        return
    group = await admin.client.request("GET", f"/apis/{GROUP}")
    assert [v["version"] for v in group["versions"]] == groups
    assert group["preferredVersion"]["version"] == groups[0]
    assert await admin.devices.served_version() == taints
    if taints:
        listed = await admin.client.request("GET", f"/apis/{GROUP}/{taints}")
        rules = [r for r in listed["resources"] if r["name"] == "devicetaintrules"]
        assert rules[0]["namespaced"] is False and rules[0]["kind"] == "DeviceTaintRule"
    slices = await admin.devices.slice_version()
    assert slices == ("v1" if "v1" in groups else "v1beta2")
    published = await admin.devices.slices_on(slices, DRA_NODE)
    assert published[0]["apiVersion"] == f"{GROUP}/{slices}"
    for version in {"v1", "v1beta2"} - set(groups):
        with pytest.raises(NotFound):
            await admin.client.request("GET", f"/apis/{GROUP}/{version}/resourceslices")
    version = await admin.client.request("GET", "/version")
    assert version["gitVersion"].startswith(f"v1.{sim.apis.minor}.")
    node = await admin.nodes.get(DRA_NODE)
    assert node["status"]["nodeInfo"]["kubeletVersion"] == version["gitVersion"]


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


def _gpu0_rule(name: str, value: str, effect: str, labels: dict[str, str]) -> dict[str, Any]:
    """A v1 DeviceTaintRule named `name` tainting gpu-0 of the DRA node unhealthy."""
    return device_taint_rule(
        name,
        api_version="v1",
        driver="gpu.nvidia.com",
        pool=DRA_NODE,
        device="gpu-0",
        key="nodeward.io/gpu-unhealthy",
        value=value,
        effect=effect,
        labels=labels,
        annotations={},
    )


async def test_device_taint_rules_are_validated(admin: Cluster) -> None:
    rule = _gpu0_rule("bad", "x", "Sometimes", {})
    with pytest.raises(Invalid, match=r"spec\.taint\.effect"):
        await admin.devices.create_taint_rule("v1", rule)
    rule["spec"]["taint"].pop("key")
    rule["spec"]["taint"]["effect"] = "NoSchedule"
    with pytest.raises(Invalid, match=r"spec\.taint\.key"):
        await admin.devices.create_taint_rule("v1", rule)
    with pytest.raises(NotFound):  # not served in v1alpha3 by this cluster
        await admin.devices.create_taint_rule("v1alpha3", rule)


async def test_cordon_may_create_get_and_delete_rules_and_nothing_more(
    port_for: PortFactory,
) -> None:
    cordon = port_for("cordon")
    rule = _gpu0_rule(
        "nodeward-test-gpu-0",
        "failed-gpu",
        "NoSchedule",
        {"app.kubernetes.io/managed-by": "nodeward"},
    )
    created = await cordon.devices.create_taint_rule("v1", rule)
    assert created["spec"]["taint"]["timeAdded"]
    got = await cordon.devices.get_taint_rule("v1", "nodeward-test-gpu-0")
    assert got is not None and got["metadata"]["uid"] == created["metadata"]["uid"]
    unguarded = port_for("cordon", guarded=False)
    with pytest.raises(Forbidden):
        await unguarded.client.request("GET", f"/apis/{GROUP}/v1/devicetaintrules")
    with pytest.raises(Conflict, match="Precondition failed"):  # never a rule that replaced it
        await cordon.devices.delete_taint_rule("v1", "nodeward-test-gpu-0", "another-uid")
    assert await cordon.devices.delete_taint_rule(
        "v1", "nodeward-test-gpu-0", created["metadata"]["uid"]
    )
    assert await cordon.devices.get_taint_rule("v1", "nodeward-test-gpu-0") is None
