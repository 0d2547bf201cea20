"""Pods' CPU time from a cgroup v2 tree (`CgroupCpu`), read off the event loop."""

from __future__ import annotations

from pathlib import Path

from agents.sources.cgroups import CgroupCpu, _uid_of
from tests.unit.test_energy_pods import UID_A, UID_B, cgroup_tree


async def test_cgroup_cpu_reads_each_pods_counter_as_it_climbs(tmp_path: Path) -> None:
    cpu = CgroupCpu(tmp_path)
    cgroup_tree(tmp_path, node=10_000_000, a=3_000_000, b=1_000_000)
    assert await cpu.usage_usec() == {UID_A: 3_000_000, UID_B: 1_000_000}
    cgroup_tree(tmp_path, node=12_000_000, a=3_500_000, b=1_000_000)
    assert await cpu.usage_usec() == {UID_A: 3_500_000, UID_B: 1_000_000}


async def test_a_node_without_a_kubepods_tree_has_no_pods(tmp_path: Path) -> None:
    assert await CgroupCpu(tmp_path / "missing").usage_usec() == {}


async def test_a_pod_without_a_readable_counter_is_left_out(tmp_path: Path) -> None:
    cgroup_tree(tmp_path, node=10_000_000, a=3_000_000, b=1_000_000)
    pod_b = tmp_path / "kubepods.slice" / "besteffort" / f"pod{UID_B}" / "cpu.stat"
    pod_b.write_text("usage_usec not-a-number\n")
    assert await CgroupCpu(tmp_path).usage_usec() == {UID_A: 3_000_000}


def test_pod_uids_are_read_from_both_drivers_directory_names() -> None:
    assert _uid_of(f"kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice") == UID_A
    assert _uid_of(f"pod{UID_B}") == UID_B
    assert _uid_of("cri-containerd-abc.scope") is None
    assert _uid_of("kubepods-burstable.slice") is None
    assert _uid_of("notapod" + UID_A) is None
