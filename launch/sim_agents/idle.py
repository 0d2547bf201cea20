"""Simulated idleness agents for `nodeward up`: one per sim node, on the sim cluster's pods.

The session pods come from the sim cluster through the kube port (as the real agent's
do); the GPUs are a copy of the node's simulated GPUs following its `gpu.telemetry` (so
`nodeward sim inject NODE --gpu 0 --load 80` makes the session holding GPU 0 active).
Jupyter kernels and CPU use are simulated per pod and driven by annotations, so an
operator can play a user with kubectl:

    kubectl annotate pod NAME -n NS sim.nodeward.io/kernel=busy      # or idle, unreachable
    kubectl annotate pod NAME -n NS sim.nodeward.io/cpu=2            # cores in use
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agents.idle.access import ACCESS, GRANTS
from agents.idle.agent import IdleAgent, KubeSessionPods
from agents.idle.settings import IdleSettings
from agents.sources.activity import KernelsReading
from agents.sources.gpu_activity import NvmlUtilization
from launch.sim_agents.gpu import follow_telemetry, sim_nvml_for, sim_pod_devices, sim_workload
from launch.sim_agents.pods import CPU_ANNOTATION, IDLE_CORES, LivePods
from nodeward.config import Settings, section
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.platform import UpContext, bus_daemon
from schemas.gpu import GpuSample
from schemas.session import KernelActivity
from schemas.tokens import token
from sim.cluster.seed import NodeSeed, PodSeed, Seed

KERNEL_ANNOTATION = "sim.nodeward.io/kernel"


class SimSessionActivity:
    """Kernels and CPU time of simulated session pods, as their annotations say."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.started = datetime.now(UTC)
        self._rates: dict[str, float] = {}
        self._usec: dict[str, float] = {}
        self._at: float | None = None

    def _note(self, pod: Mapping[str, Any]) -> dict[str, str]:
        meta = pod.get("metadata") or {}
        annotations = dict(meta.get("annotations") or {})
        try:
            cores = max(float(annotations.get(CPU_ANNOTATION, IDLE_CORES)), 0.0)
        except ValueError:
            cores = IDLE_CORES
        if meta.get("uid"):
            self._rates[str(meta["uid"])] = cores
        return annotations

    async def kernels(self, pod: Mapping[str, Any]) -> KernelsReading:
        state = self._note(pod).get(KERNEL_ANNOTATION, "idle")
        if state == "unreachable":
            return KernelsReading(None, "sim: connection refused")
        busy = state == "busy"
        kernel = KernelActivity(
            id="00000000-0000-4000-8000-000000000001",
            name="python3",
            execution_state="busy" if busy else "idle",
            last_activity=datetime.now(UTC) if busy else self.started,
            connections=1,
        )
        return KernelsReading([kernel])

    def note_pods(self, pods: list[Mapping[str, Any]]) -> None:
        for pod in pods:
            self._note(pod)

    async def usage_usec(self) -> Mapping[str, int]:
        now = self.clock()
        if self._at is not None:
            for uid, cores in self._rates.items():
                self._usec[uid] = self._usec.get(uid, 0.0) + cores * (now - self._at) * 1e6
        self._at = now
        for uid in self._rates:
            self._usec.setdefault(uid, 0.0)
        return {uid: int(v) for uid, v in self._usec.items()}


class _NotingSessions(KubeSessionPods):
    """The sim's session pods; each listing tells the simulation their CPU annotations."""

    def __init__(self, cluster: Any, node: str, settings: IdleSettings, sim: SimSessionActivity):
        super().__init__(cluster, node, settings.selectors)
        self.sim = sim

    async def sessions(self) -> list[Any]:
        found = await super().sessions()
        self.sim.note_pods([s.pod for s in found])
        return found


async def build_sim_idle_agent(
    settings: Settings, node: NodeSeed, pods: list[PodSeed]
) -> tuple[Daemon, IdleAgent]:
    """One simulated node's idleness agent daemon (not started) and its agent."""
    config: IdleSettings = section(settings, "agents", "idle", IdleSettings)
    sim_gpus = sim_workload(sim_nvml_for(node), pods)
    daemon, bus = await bus_daemon(
        f"agent-idle-{node.name}",
        settings,
        source=f"agent/idle/{node.name}",
        provision=False,
        publishes=GRANTS.publish_for(token(node.name)),
    )
    cluster = Cluster.connect(settings.cluster, access=ACCESS)
    activity = SimSessionActivity()
    agent = IdleAgent(
        bus,
        config,
        sessions=_NotingSessions(cluster, node.name, config, activity),
        kernels=activity,
        cpu=activity,
        gpus=NvmlUtilization(sim_gpus),
        gpu_pods=LivePods(sim_pod_devices(sim_gpus, pods), cluster, node.name),
        node=node.name,
        registry=daemon.metrics.registry,
    )
    agent.attach(daemon)

    def apply(sample: GpuSample) -> None:
        sim_gpus.set_load(sample.gpu_index, sample.utilization_gpu_pct)

    subscription = await follow_telemetry(bus.nc, node.name, sim_gpus, apply, who="idle-sim")

    async def close() -> None:
        await subscription.unsubscribe()
        await cluster.close()

    daemon.add_shutdown_hook(close)
    return daemon, agent


async def build_for_up(context: UpContext, seed: Seed) -> list[Daemon]:
    """One simulated idleness agent per GPU node of the seeded sim cluster."""
    settings = context.settings_for("agent")
    daemons = []
    for node in seed.nodes:
        if node.gpu is not None and node.gpu.count > 0:
            daemon, _ = await build_sim_idle_agent(settings, node, seed.pods)
            daemons.append(daemon)
    return daemons
