"""Helpers for the capacity tests: a sim cluster with whole-GPU and MIG pods, the service,
and the snapshot it writes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.config import ClusterSettings, Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.kube.client import Backoff, KubeClient
from schemas.capacity import GpuCounts
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot
from services.capacity.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import Gpu, Mig, NodeSeed, PodSeed, Seed
from tests.integration.simkube import RunsService, stop_env

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
NS = "ml-team"


@dataclass
class CapacityEnv(RunsService):
    """Nodes `h100-a`, `h100-b`, `a100`, `mig` and `cpu` (suffixed by `uid`), and the
    capacity service's settings (its own consumer, bucket and subjects)."""

    sim: SimCluster
    admin: Cluster
    bus: Bus
    uid: str
    settings: Settings
    daemons: list[Daemon] = field(default_factory=list)

    build = staticmethod(build)

    def node(self, short: str) -> str:
        return f"{short}-{self.uid}"

    @property
    def bucket(self) -> str:
        return str(self.settings.services["capacity"]["bucket"])

    async def snapshot(self) -> CapacitySnapshot | None:
        kv = await self.bus.js.key_value(self.bucket)
        try:
            entry = await kv.get(SNAPSHOT.key())
        except Exception:  # noqa: BLE001 - not written yet
            return None
        return SNAPSHOT.load(entry.value) if entry.value else None

    async def counts(self, short: str, profile: str = "gpu") -> GpuCounts | None:
        snap = await self.snapshot()
        if snap is None:
            return None
        for n in snap.nodes:
            if n.node == self.node(short):
                return n.profiles.get(profile)
        return None


def capacity_seed(uid: str) -> Seed:
    """The counts by hand: h100-a 8, 4 running + 2 bound pending + 8 finished (holds
    none): free 2; h100-b 8, one notebook: free 7; a100 8, one 3-GPU job: free 5; mig
    14 x 1g.10gb and 2 x 3g.40gb, 2 and 1 in use: free 12 and 1; cpu: no GPU, not counted."""

    def p(name: str, node: str, gpus: int, resource: str = "nvidia.com/gpu", **kw: Any) -> PodSeed:
        return PodSeed.model_validate(
            {
                "name": name,
                "namespace": NS,
                "node": f"{node}-{uid}",
                "gpus": gpus,
                "gpuResource": resource,
            }
            | kw
        )

    a100 = Gpu(product=A100, count=8, memoryMiB=81920, family="ampere")
    return Seed(
        namespaces=[NS, "nodeward"],
        nodes=[
            NodeSeed(name=f"h100-a-{uid}"),
            NodeSeed(name=f"h100-b-{uid}"),
            NodeSeed(name=f"a100-{uid}", gpu=a100),
            NodeSeed(
                name=f"mig-{uid}",
                gpu=a100,
                mig=Mig(devices={"1g.10gb": 14, "3g.40gb": 2}),
            ),
            NodeSeed(name=f"cpu-{uid}", gpu=None),
        ],
        pods=[
            p("train-0", "h100-a", 4),
            p("waiting-0", "h100-a", 2, phase="Pending", ready=False),
            p("finished-0", "h100-a", 8, phase="Succeeded", ready=False),
            p("nb-0", "h100-b", 1, role="notebook"),
            p("eval-0", "a100", 3),
            p("small-0", "mig", 1, "nvidia.com/mig-1g.10gb"),
            p("small-1", "mig", 1, "nvidia.com/mig-1g.10gb"),
            p("medium-0", "mig", 1, "nvidia.com/mig-3g.40gb"),
            p("web-0", "cpu", 0),
        ],
    )


EnvFactory = Callable[..., Awaitable[CapacityEnv]]


@pytest.fixture
async def capacity_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    """`await capacity_env(**service settings)`: a fresh sim and the service's settings."""
    made: list[CapacityEnv] = []

    async def make(**service: Any) -> CapacityEnv:
        uid = uuid.uuid4().hex[:8]
        sim = SimCluster(capacity_seed(uid), port=0, bookmark_interval=0.2)
        await sim.start()
        kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-cap-{uid}", identity="capacity")
        admin_path = sim.write_kubeconfig(tmp_path / f"kubeconfig-admin-{uid}")
        admin_client = KubeClient.from_settings(ClusterSettings(kubeconfig=admin_path))
        admin_client.backoff = Backoff(base=0.01, cap=0.05)
        nodes = [f"{n}-{uid}" for n in ("h100-a", "h100-b", "a100", "mig", "cpu")]
        settings = Settings(
            bus={"url": nats_url, "publish_timeout": "2s"},
            cluster={"kubeconfig": kubeconfig, "retries": 1},
            daemon={"shutdown_timeout": "4s"},
            services={
                "capacity": {
                    "consumer": f"capacity-{uid}",
                    "bucket": f"capacity-{uid}",
                    "health_subjects": [f"gpu.health.{n}.>" for n in nodes],
                    "maintenance_subjects": [f"maintenance.*.{n}" for n in nodes],
                    "debounce": "0.2s",
                    "max_delay": "1s",
                    "relist_delay": "0.2s",
                }
                | service
            },
        )
        env = CapacityEnv(sim, Cluster(admin_client), bus, uid, settings)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)
