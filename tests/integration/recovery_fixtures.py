"""The recovery service's test platform: NATS, the sim cluster, the cordon, checkpoint and
recovery services, a simulated node's GPU agent and the simulated reboot operator, each
under its own ServiceAccount. Used by test_recovery.py and the property test."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.sources.pods import PodSource
from launch.sim_agents.gpu import build_sim_gpu_agent
from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.config import ClusterSettings, Settings
from nodeward.daemon import Daemon
from nodeward.kube.client import Backoff, KubeClient
from schemas.remediation import Remediation
from services.cordon.service import build as build_cordon
from services.maintenance.service import build as build_checkpoint
from services.recovery.service import build as build_recovery
from services.recovery.state import RecoveryRecord, node_key
from sim.cluster import SimCluster
from sim.cluster.seed import Gpu, NodeSeed, Seed
from sim.nvml import SimNvml
from sim.reboot import SimRebootOperator
from tests.conftest import wait_for as shared_wait_for
from tests.integration.cordon_fixtures import read_stream


@dataclass
class RecoveryEnv:
    sim: SimCluster
    admin: KubeClient
    bus: Bus
    node: str
    settings: Settings
    bucket: str
    daemons: list[Daemon] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def settings_for(self, who: str) -> Settings:
        """The settings with `who`'s own ServiceAccount."""
        identity = self.sim.write_kubeconfig(
            Path(self.settings.cluster.kubeconfig or ".").with_name(f"kc-{who}-{self.bucket}"),
            identity=who,
        )
        return self.settings.model_copy(
            update={"cluster": ClusterSettings(kubeconfig=identity, retries=1)}
        )

    async def start(self, build: Callable[[Settings], Awaitable[Daemon]], who: str) -> Daemon:
        daemon = await build(self.settings_for(who))
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    async def record(self) -> RecoveryRecord | None:
        kv = await self.bus.kv(self.bucket)
        found = await TypedKV(kv, RecoveryRecord).get(node_key(self.node))
        return found.value if found else None

    async def node_obj(self) -> dict[str, Any]:
        got: dict[str, Any] = await self.admin.request("GET", f"/api/v1/nodes/{self.node}")
        return got

    async def audits(self) -> list[Remediation]:
        events = await read_stream(self.bus, "AUDIT", f"remediation.*.{self.node}")
        return [e.data for e in events]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for daemon in reversed(self.daemons):
            await daemon.stop()
        await self.admin.close()
        await self.sim.stop()


async def wait_for(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 60) -> Any:
    """The shared `tests.conftest.wait_for`, with this file's longer default."""
    return await shared_wait_for(check, timeout=timeout, interval=0.1, what=what)


@contextlib.asynccontextmanager
async def recovery_platform(
    bus: Bus,
    nats_url: str,
    tmp_path: Path,
    *,
    operator: type[SimRebootOperator] = SimRebootOperator,
) -> AsyncIterator[Callable[..., Awaitable[RecoveryEnv]]]:
    """`make(...)` builds a platform; all are stopped on exit. `gpu_pods(sim)`: the agent's
    pod-resources (by the sim GPUs' UUIDs), else one that says no pod holds a GPU."""
    made: list[RecoveryEnv] = []

    async def make(
        *,
        agent_gpus: int = 8,
        in_process: bool = True,
        reboot_operator: bool = True,
        workload: Callable[[str], dict[str, Any]] | None = None,
        gpu_pods: Callable[[SimNvml], PodSource] | None = None,
        cordon: dict[str, Any] | None = None,
        node_annotations: dict[str, str] | None = None,
        sim_options: dict[str, Any] | None = None,
        on_cluster: Callable[[SimCluster, Path, str], Awaitable[None]] | None = None,
        **recovery: Any,
    ) -> RecoveryEnv:
        """`node_annotations`: on the node; `sim_options`: the sim cluster's (its node
        lifecycle's timings); `on_cluster(sim, admin kubeconfig, node)`: run once the cluster
        is up, before any service (e.g. the BMC whose machine heartbeats the node)."""
        uid = uuid.uuid4().hex[:8]
        node = f"rcv-{uid}"
        seed = Seed(
            namespaces=["nodeward"],
            nodes=[
                NodeSeed(
                    name=node,
                    gpu=Gpu(product="NVIDIA-H100-80GB-HBM3", count=8),
                    annotations=node_annotations or {},
                ),
                *(NodeSeed(name=f"{node}-spare{i}") for i in range(3)),
            ],
            **(workload(node) if workload else {}),
        )
        sim = SimCluster(seed, port=0, bookmark_interval=0.2, **(sim_options or {}))
        await sim.start()
        admin_path = sim.write_kubeconfig(tmp_path / f"kubeconfig-admin-{uid}")
        if on_cluster is not None:
            await on_cluster(sim, admin_path, node)
        admin = KubeClient.from_settings(ClusterSettings(kubeconfig=admin_path))
        admin.backoff = Backoff(base=0.01, cap=0.05)
        breaker = {"max_percent": 100, "max_nodes": 10, "calm_period": None,
                   "bucket": f"breaker-{uid}"}  # fmt: skip
        settings = Settings(
            bus={"url": nats_url, "publish_timeout": "2s"},
            cluster={"kubeconfig": admin_path, "retries": 1},
            daemon={"shutdown_timeout": "4s"},
            agents={"gpu": {"poll_interval": "0.3s", "heartbeat_interval": "5s"}},
            services={
                "cordon": {
                    "consumer": f"cordon-{uid}",
                    "bucket": f"cordon-{uid}",
                    "subjects": [f"gpu.health.{node}.>"],
                    "heartbeat_subjects": [f"gpu.heartbeat.{node}"],
                    "healthy_period": "1h",  # no passive release: recovery's to do
                    "breaker": breaker,
                    "xid_repeats": {"enabled": False},
                }
                | (cordon or {}),
                "checkpoint": {
                    "consumer": f"checkpoint-{uid}",
                    "bucket": f"checkpoint-{uid}",
                    "subjects": [f"maintenance.requested.{node}"],
                    "tick": "0.1s",
                    "annotation_interval": "0.5s",
                    "lease_ttl": "3s",
                    "breaker": breaker,
                },
                "recovery": {
                    # durables recovery-<uid>-quarantines and recovery-<uid>-maintenance
                    "consumer": f"recovery-{uid}",
                    "subjects": [f"remediation.quarantine.{node}"],
                    "maintenance_subjects": [
                        f"maintenance.{p}.{node}" for p in ("done", "failed", "cancelled")
                    ],
                    "bucket": f"recovery-{uid}",
                    "interval": "0.2s",
                    "drain_deadline": "2s",
                    "retry_backoff": "0.2s",
                    "evict_retry": "0.5s",
                    "request_timeout": "3s",
                    "breaker": breaker,
                }
                | recovery,
            },
        )
        env = RecoveryEnv(sim, admin, bus, node, settings, f"recovery-{uid}")
        made.append(env)
        await env.start(build_cordon, "cordon")
        await env.start(build_checkpoint, "checkpoint")
        if in_process:
            await env.start(build_recovery, "recovery")
        node_seed = NodeSeed(name=node, gpu=Gpu(product="NVIDIA-H100-80GB-HBM3", count=agent_gpus))
        agent, gpu_agent, sim_gpus = await build_sim_gpu_agent(settings, node_seed)
        if gpu_pods is not None:  # what the node's pod-resources says holds each GPU
            assert isinstance(sim_gpus, SimNvml)
            gpu_agent.pods = gpu_pods(sim_gpus)
        await agent.start()
        env.daemons.append(agent)
        await wait_for(lambda: _ready(agent), "the GPU agent watching its GPUs")
        if reboot_operator:
            reboots = operator(admin, bus.nc, interval=0.2)
            env.tasks.append(asyncio.create_task(reboots.run()))
        return env

    try:
        yield make
    finally:
        for env in made:
            await env.stop()


async def _ready(daemon: Daemon) -> bool:
    return (await daemon.readiness()).ready
