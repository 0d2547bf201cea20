"""Simulated energy agents for `nodeward up`: one per sim node, power following its GPUs.

`SimNodePower` reads a node's `SimNvml`: each GPU's power as NVML would report it, and
the node's power as its BMC would (a base power for CPUs, memory and fans plus every
GPU's power). In `nodeward up` each energy agent keeps a copy of its node's simulated
GPUs and follows the node's `gpu.telemetry.<node>` events (the sim GPU agent's), so the
node's power and its GPUs' utilisation (read through NVML, as the real agent reads it)
follow the simulated GPU load. Its pods are the API's, as the real agent's are
(`KubeNodePods`), and their CPU time the node's simulated cgroups' (`SimCgroups`), so every
pod running on the node, CPU-only ones included, gets its share of the CPU energy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from agents.energy.access import GRANTS
from agents.energy.account import StaticCarbon
from agents.energy.agent import EnergyAgent
from agents.energy.pods import KubeNodePods, NodePods, StaticPodList
from agents.energy.settings import EnergySettings
from agents.energy.wiring import gpu_device_ids
from agents.sources.gpu_activity import NvmlUtilization
from agents.sources.pods import PodSource, StaticPods
from agents.sources.power import PowerSample, SourceError
from launch.sim_agents.gpu import follow_telemetry, sim_nvml_for, sim_pod_devices, sim_workload
from launch.sim_agents.pods import KUBELET_VIEW, LivePods, SimCgroups
from nodeward.config import ClusterSettings, Settings, section
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.platform import UpContext
from schemas.energy import PowerSource
from schemas.gpu import GpuSample
from schemas.tokens import token
from sim.cluster.seed import NodeSeed, PodSeed, Seed
from sim.nvml import SimNvml

BASE_POWER_W = 650.0  # CPUs, memory, fans, NICs of an 8-GPU server at rest


class SimNodePower:
    """A `PowerReader` over a `SimNvml`: `system` (as a BMC SDR sensor) and `gpu-<i>` (NVML)."""

    name = "sim"

    def __init__(self, nvml: SimNvml, *, base_w: float = BASE_POWER_W) -> None:
        self.nvml = nvml
        self.base_w = base_w
        self.broken: str | None = None  # set to make every read fail (tests, fault drills)

    def describe(self) -> str:
        return (
            f"simulated BMC system power ({self.base_w:g} W base) and {len(self.nvml.gpus)} GPU(s)"
        )

    def read(self) -> list[PowerSample]:
        if self.broken is not None:
            raise SourceError(f"sim: {self.broken}")
        at = time.monotonic()
        samples = []
        total = self.base_w
        for gpu in self.nvml.gpus:
            watts = gpu.power_mw / 1000
            total += watts  # the BMC sees a GPU's draw even when NVML cannot read it
            if not gpu.lost and gpu.hang is None:
                samples.append(PowerSample(PowerSource.NVML, f"gpu-{gpu.index}", at, watts=watts))
        samples.append(PowerSample(PowerSource.IPMI_SDR, "system", at, watts=total))
        return samples

    def close(self) -> None:
        pass


async def follow_gpu_telemetry(nc: Any, node: str, nvml: SimNvml) -> Any:
    """Copy each GPU's utilisation and power from the node's `gpu.telemetry` events into
    `nvml`."""

    def apply(sample: GpuSample) -> None:
        nvml.set_load(sample.gpu_index, sample.utilization_gpu_pct)  # power at that load...
        if sample.power_w is not None:
            nvml.set_power(sample.gpu_index, sample.power_w)  # ...unless it was read

    return await follow_telemetry(nc, node, nvml, apply, who="energy-sim")


async def build_sim_energy_agent(
    settings: Settings,
    node: NodeSeed,
    pods: Sequence[PodSeed] = (),
    live: ClusterSettings | None = None,
) -> tuple[Daemon, EnergyAgent, SimNvml]:
    """One simulated node's energy agent daemon (not started), its agent and its GPUs.

    With `live` (the node agents' cluster credentials) a GPU's pods are the seed's that the
    API still has on the node, as the kubelet says (`LivePods`), and the node's pods and
    their CPU time are the API's (`KubeNodePods`, `SimCgroups`); else the GPUs' pods are
    the seed's, fixed, and no pod has CPU time."""
    from nodeward.platform import bus_daemon

    config: EnergySettings = section(settings, "agents", "energy", EnergySettings)
    # A simulated node has no CPUs of its own: its cpufreq check would read this host's.
    config = config.model_copy(
        update={"cpufreq": config.cpufreq.model_copy(update={"enabled": False})}
    )
    sim = sim_workload(sim_nvml_for(node), pods)
    daemon, bus = await bus_daemon(
        f"agent-energy-{node.name}",
        settings,
        source=f"agent/energy/{node.name}",
        provision=False,
        publishes=GRANTS.publish_for(token(node.name)),
    )
    carbon = StaticCarbon(config.carbon.static_g_per_kwh, zone=config.carbon.zone)
    gpu_pods: PodSource = StaticPods(sim_pod_devices(sim, pods))
    node_pods: NodePods = StaticPodList()
    cluster: Cluster | None = None
    if live is not None:
        cluster = Cluster.connect(live, access=KUBELET_VIEW)
        gpu_pods = LivePods(sim_pod_devices(sim, pods), cluster, node.name)
        node_pods = KubeNodePods(cluster, node.name)
        daemon.add_shutdown_hook(cluster.close)
    roles = {(p.namespace, p.name): p.role for p in pods if p.node == node.name}
    agent = EnergyAgent(
        bus,
        config,
        [SimNodePower(sim)],
        carbon,
        node=node.name,
        registry=daemon.metrics.registry,
        gpu_pods=gpu_pods,
        node_pods=node_pods,
        gpu_devices=gpu_device_ids(sim),
        rack=node.labels.get(config.caps.rack_label),
        cpu=SimCgroups(cluster, node.name, roles),
        gpu_util=NvmlUtilization(sim, timeout=config.read_timeout.total_seconds()),
    )
    agent.attach(daemon)
    subscription = await follow_gpu_telemetry(bus.nc, node.name, sim)

    async def unsubscribe() -> None:
        await subscription.unsubscribe()

    daemon.add_shutdown_hook(unsubscribe)
    return daemon, agent, sim


async def build_for_up(context: UpContext, seed: Seed) -> list[Daemon]:
    """One simulated energy agent per GPU node of the seeded sim cluster."""
    daemons = []
    for node in seed.nodes:
        if node.gpu is not None and node.gpu.count > 0:
            daemon, _, _ = await build_sim_energy_agent(
                context.settings, node, seed.pods, live=context.settings_for("agent").cluster
            )
            daemons.append(daemon)
    return daemons
