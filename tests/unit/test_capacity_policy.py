"""Counting GPUs from nodes, pods and the bus (services.capacity.policy), by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas.capacity import GpuCounts
from schemas.state.capacity import CapacitySnapshot
from services.capacity.policy import BusView, count, node_view, pod_gpus, slice_gpus

H100 = "NVIDIA-H100-80GB-HBM3"


def node(
    name: str = "gpu-1",
    *,
    gpus: int = 8,
    mig: dict[str, int] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    annotations: dict[str, str] | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    allocatable = {"cpu": "96", "nvidia.com/gpu": "0" if mig else str(gpus)}
    allocatable |= {f"nvidia.com/mig-{p}": str(n) for p, n in (mig or {}).items()}
    return {
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": str(gpus)},
            "annotations": annotations or {},
        },
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(node_name: str | None, phase: str = "Running", **limits: int) -> dict[str, Any]:
    """A pod on `node_name` asking `gpu=N` (whole GPUs) or `mig=N` (1g.10gb slices)."""
    names = {"gpu": "nvidia.com/gpu", "mig": "nvidia.com/mig-1g.10gb"}
    resources = {"limits": {names[k]: str(v) for k, v in limits.items()}}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": phase},
    }


def test_free_is_allocatable_less_what_bound_pods_hold() -> None:
    view = node_view(node())
    assert view is not None
    running = pod_gpus(pod("gpu-1", gpu=3))
    pending = pod_gpus(pod("gpu-1", "Pending", gpu=2))  # bound, not started: it holds them
    assert running == ("gpu-1", {"gpu": 3}) and pending == ("gpu-1", {"gpu": 2})
    got = count(view, {"gpu": 5})
    assert got.profiles["gpu"] == GpuCounts(free=3, used=5)
    assert got.blocked is None


def test_finished_and_unbound_pods_hold_nothing() -> None:
    assert pod_gpus(pod("gpu-1", "Succeeded", gpu=8)) == (None, {})
    assert pod_gpus(pod(None, "Pending", gpu=8)) == (None, {})


def test_init_containers_count_as_the_scheduler_counts_them() -> None:
    p = pod("gpu-1", gpu=1)
    p["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"requests": {"nvidia.com/gpu": "4"}}}
    ]
    assert pod_gpus(p) == ("gpu-1", {"gpu": 4})


def test_mig_profiles_are_counted_apart() -> None:
    view = node_view(node(mig={"1g.10gb": 28, "2g.20gb": 12}))
    assert view is not None and view.allocatable == {"1g.10gb": 28, "2g.20gb": 12}
    _, held = pod_gpus(pod("gpu-1", mig=1))
    assert held == {"1g.10gb": 1}
    got = count(view, {"1g.10gb": 5})
    assert got.profiles["1g.10gb"] == GpuCounts(free=23, used=5)
    assert got.profiles["2g.20gb"] == GpuCounts(free=12)


def test_a_quarantined_node_holds_its_free_gpus_back() -> None:
    taint = {"key": "nodeward.io/gpu-unhealthy", "effect": "NoSchedule"}
    view = node_view(node(taints=[taint], unschedulable=True))
    assert view is not None
    got = count(view, {"gpu": 2}, BusView(failed={"0": None}))
    assert got.blocked == "quarantined"
    assert got.profiles["gpu"] == GpuCounts(used=2, unhealthy=1, quarantined=5)


def test_cordoned_maintenance_and_not_ready_nodes() -> None:
    for kwargs, state in (
        ({"unschedulable": True}, "cordoned"),
        (
            {"taints": [{"key": "nodeward.io/falco-compromised", "effect": "NoSchedule"}]},
            "cordoned",
        ),
        (
            {"unschedulable": True, "annotations": {"nodeward.io/maintenance-cordon": "{}"}},
            "maintenance",
        ),
        ({"ready": False}, "unhealthy"),
    ):
        view = node_view(node(**kwargs))  # type: ignore[arg-type]
        assert view is not None
        assert count(view, {}).profiles["gpu"].of(state) == 8, kwargs


def test_the_gpu_operators_own_taint_holds_nothing_back() -> None:
    view = node_view(node(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    assert view is not None and view.blocked is None


def test_a_maintenance_draining_on_the_bus_holds_the_node_back() -> None:
    view = node_view(node())
    assert view is not None
    assert count(view, {"gpu": 8}, BusView(maintenance="draining")).profiles["gpu"] == GpuCounts(
        used=8
    )
    assert count(view, {}, BusView(maintenance="draining")).profiles["gpu"] == GpuCounts(
        maintenance=8
    )
    assert count(view, {}, BusView(maintenance="done")).profiles["gpu"] == GpuCounts(free=8)


def test_a_failed_gpu_on_a_mig_node_takes_its_share_of_slices() -> None:
    view = node_view(node(mig={"1g.10gb": 28, "2g.20gb": 12}))
    assert view is not None
    got = count(view, {}, BusView(failed={"3": None, "1-mig2-0": "1g.10gb"}))
    assert got.profiles["1g.10gb"] == GpuCounts(free=23, unhealthy=5)  # 28/8 -> 4, +1 instance
    assert got.profiles["2g.20gb"] == GpuCounts(free=10, unhealthy=2)


def test_a_node_without_gpus_is_not_counted() -> None:
    plain = node()
    plain["status"]["allocatable"] = {"cpu": "8"}
    assert node_view(plain) is None


def test_the_snapshot_answers_whether_a_request_fits() -> None:
    a = node_view(node("gpu-a"))
    b = node_view(
        node("gpu-b", taints=[{"key": "nodeward.io/gpu-unhealthy", "effect": "NoSchedule"}])
    )
    c = node_view(node("gpu-c"))
    assert a and b and c
    snap = CapacitySnapshot(
        at=datetime.now(UTC), nodes=[count(a, {"gpu": 5}), count(b, {}), count(c, {"gpu": 2})]
    )
    assert [f.node for f in snap.fits({"nvidia.com/gpu": 4}, "h100")] == ["gpu-c"]
    assert [f.node for f in snap.fits({"nvidia.com/gpu": 3})] == ["gpu-c", "gpu-a"]
    assert snap.fits({"nvidia.com/gpu": 4}, "A100") == []
    assert snap.fits({"nvidia.com/mig-1g.10gb": 1}) == []
    (total,) = snap.totals()
    assert total.counts == GpuCounts(free=9, used=7, quarantined=8)


def _dra_slice(node_name: str, devices: int, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node_name}-{driver}-abcde"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}}
                for i in range(devices)
            ],
        },
    }


def test_a_dra_node_counts_the_gpus_its_slices_publish() -> None:
    dra = node("gpu-dra")
    dra["status"]["allocatable"] = {"cpu": "96"}  # no nvidia.com/gpu: the DRA driver serves them
    assert node_view(dra) is None
    assert slice_gpus(_dra_slice("gpu-dra", 8), ["gpu.nvidia.com"]) == ("gpu-dra", 8)
    assert slice_gpus(_dra_slice("gpu-dra", 8, "nic.example.com"), ["gpu.nvidia.com"]) == (
        None,
        0,
    )
    view = node_view(dra, dra_gpus=8)
    assert view is not None and view.dra and view.allocatable == {"gpu": 8}
    # One GPU tainted on its own (a DeviceTaintRule): 7 free and 1 unhealthy, not 8 held.
    counted = count(view, {}, BusView(failed={"3": None}))
    assert counted.profiles["gpu"] == GpuCounts(free=7, unhealthy=1)
    assert counted.blocked is None and counted.dra
    snap = CapacitySnapshot(at=datetime.now(UTC), nodes=[counted])
    assert snap.fits({"nvidia.com/gpu": 1}) == []  # a DRA GPU takes no extended-resource request


def test_amd_nodes_count_amd_gpus_by_the_amd_operators_labels() -> None:
    from sim.cluster.seed import load_seed, node_manifest

    seeded = next(n for n in load_seed().nodes if n.name == "gpu-mi300x-01")
    manifest = node_manifest(seeded, 8)
    manifest["spec"]["taints"] = [{"key": "amd.com/gpu", "effect": "NoSchedule"}]
    view = node_view(manifest)
    assert view is not None
    assert (view.model, view.gpus, view.allocatable) == ("AMD_Instinct_MI300X_OAM", 8, {"gpu": 8})
    assert view.blocked is None  # the AMD operator's own taint holds nothing back
    asked = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "nodeName": "gpu-mi300x-01",
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": "3"}}}],
        },
        "status": {"phase": "Running"},
    }
    assert pod_gpus(asked) == ("gpu-mi300x-01", {"gpu": 3})
    assert count(view, {"gpu": 3}).profiles["gpu"] == GpuCounts(free=5, used=3)
