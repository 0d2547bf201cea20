"""Pod attribution: GPU energy to the pods holding the GPUs, CPU energy by cgroup CPU time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.energy.pods import CpuTimes, PodEnergy, attribute
from agents.sources.cgroups import read_cpu_usage
from schemas.common import PodRef
from schemas.energy import EnergyReading, PowerSource

UID_A = "0a1b2c3d-0000-4000-8000-00000000000a"
UID_B = "0a1b2c3d-0000-4000-8000-00000000000b"
ALICE = PodRef(namespace="user-alice", name="train-a", uid=UID_A)
BOB = PodRef(namespace="user-bob", name="nb-b", uid=UID_B)


def write_stat(directory: Path, usage_usec: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cpu.stat").write_text(
        f"usage_usec {usage_usec}\nuser_usec {usage_usec // 2}\nsystem_usec {usage_usec // 2}\n"
    )


def cgroup_tree(root: Path, node: int, a: int, b: int) -> None:
    """The systemd driver's layout for A, the cgroupfs driver's for B (both are found)."""
    write_stat(root, node)
    kp = root / "kubepods.slice"
    write_stat(kp, node // 2)
    pod_a = (
        kp / "kubepods-burstable.slice" / f"kubepods-burstable-pod{UID_A.replace('-', '_')}.slice"
    )
    write_stat(pod_a, a)
    write_stat(pod_a / "cri-containerd-abc.scope", a)  # a container: not a pod of its own
    write_stat(kp / "besteffort" / f"pod{UID_B}", b)


def test_cpu_usage_is_read_per_pod_uid(tmp_path: Path) -> None:
    cgroup_tree(tmp_path, node=10_000_000, a=3_000_000, b=1_000_000)
    node, pods = read_cpu_usage(tmp_path)
    assert node == 10_000_000
    assert pods == {UID_A: 3_000_000, UID_B: 1_000_000}


def _two_gpus_shared(readings: list[EnergyReading], node_j: float, **usage: Any) -> list[PodEnergy]:
    """`attribute` on a node whose GPU 0 (3000 J) Alice holds and whose GPU 1 (2000 J, in MIG
    mode) Alice and Bob share an instance each, with `readings` besides the GPUs'."""
    gpus = [
        EnergyReading(source=PowerSource.NVML, component="gpu-0", energy_j=3000, avg_power_w=300),
        EnergyReading(source=PowerSource.NVML, component="gpu-1", energy_j=2000, avg_power_w=200),
    ]
    return attribute(
        [*readings, *gpus],
        node_j,
        gpu_devices={"0": ["GPU-aaa", "0"], "1": ["GPU-bbb", "1", "MIG-b1", "MIG-b2"]},
        by_device={"GPU-aaa": [ALICE], "MIG-b1": [ALICE], "MIG-b2": [BOB]},
        **usage,
    )


def test_gpu_and_cpu_energy_are_shared_among_pods(tmp_path: Path) -> None:
    times = CpuTimes()
    cgroup_tree(tmp_path, node=10_000_000, a=3_000_000, b=1_000_000)
    times.delta(*read_cpu_usage(tmp_path))
    # Over the interval the node used 8 CPU-s: A 4 s (half), B 1 s (an eighth).
    cgroup_tree(tmp_path, node=18_000_000, a=7_000_000, b=2_000_000)
    node_us, pod_us = times.delta(*read_cpu_usage(tmp_path))
    assert (node_us, pod_us) == (8_000_000, {UID_A: 4_000_000, UID_B: 1_000_000})
    package = EnergyReading(
        source=PowerSource.RAPL, component="package-0", energy_j=800, avg_power_w=80
    )
    shares = _two_gpus_shared(
        [package], 6000.0, node_pods=[ALICE, BOB], cpu_node_us=node_us, cpu_pod_us=pod_us
    )
    got = {s.pod.name: s for s in shares}
    assert got["train-a"].gpu_energy_j == pytest.approx(3000 + 1000)  # GPU 0, half of GPU 1
    assert got["train-a"].cpu_energy_j == pytest.approx(400)  # half of the package's 800 J
    assert got["nb-b"].gpu_energy_j == pytest.approx(1000)
    assert got["nb-b"].cpu_energy_j == pytest.approx(100)
    assert "cpu-time-ratio-estimate" in got["nb-b"].attribution
    assert "gpu-equal-share" in got["nb-b"].attribution


def test_without_rapl_cpu_energy_is_the_nodes_non_gpu_share() -> None:
    readings = [
        EnergyReading(
            source=PowerSource.IPMI_SDR, component="system", energy_j=1000, avg_power_w=1
        ),
        EnergyReading(source=PowerSource.NVML, component="gpu-0", energy_j=600, avg_power_w=1),
    ]
    [share] = attribute(
        readings,
        1000.0,
        gpu_devices={},
        by_device={},
        node_pods=[ALICE],
        cpu_node_us=100,
        cpu_pod_us={UID_A: 25},
    )
    assert share.cpu_energy_j == pytest.approx(100)  # a quarter of the node's 400 non-GPU J
    assert share.gpu_energy_j == 0


def test_a_pod_first_seen_gets_nothing_until_it_has_a_delta(tmp_path: Path) -> None:
    times = CpuTimes()
    write_stat(tmp_path, 1000)
    times.delta(*read_cpu_usage(tmp_path))
    cgroup_tree(tmp_path, node=2000, a=500, b=100)
    assert times.delta(*read_cpu_usage(tmp_path)) == (1000, {})


def test_a_pods_gpu_utilisation_is_the_mean_of_the_devices_it_holds() -> None:
    from agents.energy.pods import GpuBusy
    from agents.sources.activity import DeviceUtilization

    busy = GpuBusy()
    for pct in (20.0, 40.0):  # two ticks of GPU 0; GPU 1 in MIG mode: its instances
        busy.add(
            {
                "GPU-aaa": DeviceUtilization("GPU-aaa", pct),
                "0": DeviceUtilization("GPU-aaa", pct),
                "MIG-b1": DeviceUtilization("MIG-b1", 80.0),
                "MIG-b2": DeviceUtilization("MIG-b2", None, "GPM: first sample taken"),
            }
        )
    means = busy.close()
    assert means == {"GPU-aaa": 30.0, "0": 30.0, "MIG-b1": 80.0}
    assert busy.close() == {}  # the next interval starts empty
    shares = _two_gpus_shared(
        [], 5000.0, node_pods=[], cpu_node_us=0, cpu_pod_us={}, gpu_util=means
    )
    got = {s.pod.name: s for s in shares}
    # Alice: GPU 0 (30 %) whole, half of GPU 1 through MIG-b1 (80 %): (30 + 0.5 x 80) / 1.5.
    assert got["train-a"].gpu_utilization_pct == pytest.approx((30 + 0.5 * 80) / 1.5)
    assert got["nb-b"].gpu_utilization_pct is None  # its instance could not be read
