"""`nodeward up`'s BMC-run nodes: which nodes, and what a hang of a node without one says."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch import sim_bmc
from launch.sim_bmc import BmcNodes, bmc_nodes, chosen
from nodeward.config import ClusterSettings

GPU_NODES = ["gpu-h100-01", "gpu-h100-04", "gpu-a100-01"]


def test_the_default_bmc_node_is_gpu_h100_04_where_the_fleet_has_it() -> None:
    assert chosen(None, GPU_NODES) == ["gpu-h100-04"]
    assert chosen(None, ["gpu-h100-01"]) == []  # `--nodes 1`: none
    assert chosen(["gpu-a100-01", "gpu-a100-01"], GPU_NODES) == ["gpu-a100-01"]
    assert chosen(["none"], GPU_NODES) == []
    with pytest.raises(ValueError, match="--bmc-node gpu-x: not a GPU node of the sim cluster"):
        chosen(["gpu-x"], GPU_NODES)


async def test_without_ipmi_sim_no_bmc_runs_and_a_hang_says_why_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    why = "ipmi_sim is not installed (Debian openipmi; scripts/system-deps.sh installs it)"
    monkeypatch.setattr(sim_bmc, "missing_tool", lambda: why)
    admin = ClusterSettings(kubeconfig=tmp_path / "kubeconfig")
    async with bmc_nodes(tmp_path, admin, ["gpu-h100-04"]) as nodes:
        assert not nodes.nodes and nodes.unavailable == why
        reply = await nodes.hang("gpu-h100-04")
    assert not reply.ok and reply.error == f"no BMC runs its machine: {why}"
    assert not (tmp_path / "bmc").exists()


async def test_a_node_without_a_bmc_is_named_with_those_that_have_one() -> None:
    reply = await BmcNodes().hang("gpu-h100-03")
    assert not reply.ok and reply.node == "gpu-h100-03"
    assert reply.error == (
        "no BMC runs its machine in this nodeward up (BMC-run nodes: none; "
        "up --bmc-node chooses them)"
    )
