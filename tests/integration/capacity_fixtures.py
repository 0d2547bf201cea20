"""Helpers for the capacity tests: a sim cluster with whole-GPU and MIG pods, the service,
and the snapshot it writes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.kube import Cluster
from schemas.capacity import GpuCounts
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot
from services.capacity.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import Gpu, Mig, NodeSeed, PodSeed, Seed
from tests.integration.simkube import (
    SimServiceEnv,
    fast_admin_client,
    own,
    service_settings,
    stop_env,
)

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
NS = "ml-team"


@dataclass
class CapacityEnv(SimServiceEnv):
    """Nodes `h100-a`, `h100-b`, `a100`, `mig` and `cpu` (suffixed by `uid`), and the
    capacity service's settings (its own consumer, bucket and subjects)."""

    uid: str
    settings: Settings

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


def capacity_settings(
    nats_url: str, kubeconfig: Path, uid: str, nodes: list[str], **service: Any
) -> Settings:
    """The capacity service's settings with a consumer and bucket of its own (`uid`),
    watching `nodes`; `service`: its settings that differ."""
    config = {
        **own("capacity", uid),
        "health_subjects": [f"gpu.health.{n}.>" for n in nodes],
        "maintenance_subjects": [f"maintenance.*.{n}" for n in nodes],
        "debounce": "0.2s",
        "max_delay": "1s",
        "relist_delay": "0.2s",
    }
    return service_settings(nats_url, kubeconfig, "capacity", config | service)


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
        admin_client = fast_admin_client(sim, tmp_path, uid)
        nodes = [f"{n}-{uid}" for n in ("h100-a", "h100-b", "a100", "mig", "cpu")]
        settings = capacity_settings(nats_url, kubeconfig, uid, nodes, **service)
        env = CapacityEnv(sim, Cluster(admin_client), bus, uid, settings)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)
