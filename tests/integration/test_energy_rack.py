"""The energy agent learns its rack from its node's label, as the agent's ServiceAccount."""

from __future__ import annotations

from pathlib import Path

from agents.energy.settings import EnergySettings
from agents.energy.wiring import rack_of
from nodeward.config import ClusterSettings, Settings
from nodeward.kube import Cluster
from sim.cluster import SimCluster


async def test_rack_comes_from_the_node_label_read_once(
    sim: SimCluster, admin: Cluster, tmp_path: Path
) -> None:
    nodes = await admin.nodes.list()
    name = nodes[0]["metadata"]["name"]
    await admin.nodes.set_labels(name, {"topology.kubernetes.io/rack": "r7"})
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig-agent", identity="agent")
    settings = Settings(cluster=ClusterSettings(kubeconfig=kubeconfig, retries=0))
    config = EnergySettings.model_validate({"caps": {"racks": {"r7": {"watts": 9000}}}})
    assert await rack_of(settings, config, name) == "r7"
    # Configured: no API call at all (an unreachable cluster does not matter).
    offline = Settings(cluster=ClusterSettings(kubeconfig=tmp_path / "missing", retries=0))
    pinned = EnergySettings.model_validate({"caps": {"rack": "r1", "racks": {"r1": {"watts": 1}}}})
    assert await rack_of(offline, pinned, name) == "r1"
    # Unreadable: no rack (the node cap still applies), and no crash.
    assert await rack_of(offline, config, name) is None
