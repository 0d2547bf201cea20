"""Helpers for the checkpoint (maintenance) service tests: a sim node with pods, the service."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.config import Settings
from nodeward.kube import Cluster
from schemas import Event, make_event
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.notify import Notification
from services.maintenance.plan import CHECKPOINT_LABEL
from services.maintenance.service import build
from services.maintenance.state import CUDA_CHECKPOINT_LABEL, MaintenanceState, state_key
from sim.cluster import SimCluster
from sim.cluster.seed import (
    CheckpointFailure,
    CheckpointSeed,
    ContainerSeed,
    NodeSeed,
    NotebookSeed,
    Owner,
    PdbSeed,
    PodSeed,
    Seed,
)
from tests.helpers.kube import daemonset_pod
from tests.integration.cordon_fixtures import read_stream
from tests.integration.simkube import SimServiceEnv, fast_admin_client, stop_env

NS = "ml-team"


@dataclass
class MaintenanceEnv(SimServiceEnv):
    """One sim node `node` with pods in namespace `ns`, and the checkpoint service's settings."""

    node: str
    settings: Settings
    bucket: str

    build = staticmethod(build)

    def request(
        self,
        *,
        node: str | None = None,
        deadline_s: float = 5.0,
        mid: str | None = None,
        move: bool = False,
    ) -> Event[Maintenance]:
        target = node or self.node
        return make_event(
            Maintenance(
                node=target,
                phase=MaintenancePhase.REQUESTED,
                maintenance_id=mid or f"mnt-test-{uuid.uuid4().hex[:6]}-{target}",
                reason="firmware update",
                requested_by="test",
                deadline_s=deadline_s,
                move=move,
            ),
            source="test/maintenance",
        )

    async def state(self) -> MaintenanceState | None:
        kv = await self.bus.kv(self.bucket)
        found = await TypedKV(kv, MaintenanceState).get(state_key(self.node))
        return found.value if found else None

    async def phase_is(self, *phases: MaintenancePhase) -> MaintenanceState | None:
        state = await self.state()
        return state if state is not None and state.phase in phases else None

    async def phases(self, node: str | None = None) -> list[Maintenance]:
        events = await read_stream(self.bus, "MAINTENANCE", f"maintenance.*.{node or self.node}")
        return [e.data for e in events]

    async def notices(self) -> list[Notification]:
        events = await read_stream(self.bus, "NOTIFY", "notify.*.maintenance")
        return [e.data for e in events if any(t.name == self.node for t in e.data.targets)]

    async def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in await self.admin.pods.on_node(self.node)}

    def checkpoint_calls(self) -> list[tuple[str, str]]:
        return [(c.pod, c.container) for c in self.sim.checkpoints if c.node == self.node]


def pod(
    name: str,
    node: str,
    *,
    opted_in: bool = False,
    gpus: int = 0,
    containers: tuple[str, ...] = ("main",),
    labels: dict[str, str] | None = None,
    owner: str = "StatefulSet",
) -> PodSeed:
    return PodSeed(
        name=name,
        namespace=NS,
        node=node,
        gpus=gpus,
        owner=Owner(kind=owner, name=name.rsplit("-", 1)[0]),
        labels={**(labels or {}), **({CHECKPOINT_LABEL: "true"} if opted_in else {})},
        containers=[ContainerSeed(name=c, image=f"registry.example.com/{c}:1") for c in containers],
    )


def standard_pods(node: str) -> list[PodSeed]:
    """Three opted-in pods (one with two containers) and two others under one PDB."""
    return [
        pod("train-0", node, opted_in=True, containers=("trainer", "logger")),
        pod("notebook-0", node, opted_in=True, gpus=1),
        pod("ssh-0", node, opted_in=True),
        pod("web-0", node, labels={"app": "web"}),
        pod("web-1", node, labels={"app": "web"}),
        daemonset_pod("agent-x", "nodeward", node, "nodeward-agent"),
    ]


EnvFactory = Callable[..., Awaitable[MaintenanceEnv]]


@pytest.fixture
async def maintenance_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    """`await maintenance_env(pods=..., cuda=True, fail=[pod names], **service settings)`."""
    made: list[MaintenanceEnv] = []

    async def make(
        pods: Callable[[str], list[PodSeed]] = standard_pods,
        *,
        cuda: bool = True,
        fail: tuple[str, ...] = (),
        pdb: dict[str, Any] | None = None,
        node_labels: dict[str, str] | None = None,
        spare_labels: dict[str, str] | None = None,
        spare_annotations: dict[str, str] | None = None,
        archive_root: Path | None = None,
        registries: tuple[str, ...] = (),
        notebooks: tuple[str, ...] = (),
        **service: Any,
    ) -> MaintenanceEnv:
        uid = uuid.uuid4().hex[:8]
        node = f"mnt-{uid}"
        labels = ({CUDA_CHECKPOINT_LABEL: "true"} if cuda else {}) | (node_labels or {})
        seed = Seed(
            namespaces=[NS, "nodeward"],
            nodes=[
                NodeSeed(name=node, labels=labels),
                NodeSeed(
                    name=f"{node}-spare",
                    labels=spare_labels or {},
                    annotations=spare_annotations or {},
                ),
            ],
            pods=pods(node),
            notebooks=[NotebookSeed(name=n, namespace=NS) for n in notebooks],
            pdbs=[
                PdbSeed.model_validate(
                    {"name": "web", "namespace": NS, "selector": {"app": "web"}}
                    | (pdb or {"maxUnavailable": 1})
                )
            ],
            checkpoint=CheckpointSeed(
                fail=[CheckpointFailure(namespace=NS, pod=name) for name in fail]
            ),
        )
        sim = SimCluster(
            seed,
            port=0,
            bookmark_interval=0.2,
            archive_root=archive_root,
            registries=registries,
        )
        await sim.start()
        kubeconfig = sim.write_kubeconfig(
            tmp_path / f"kubeconfig-ckpt-{uid}", identity="checkpoint"
        )
        admin_client = fast_admin_client(sim, tmp_path, uid)
        bucket = f"checkpoint-{uid}"
        settings = Settings(
            bus={"url": nats_url, "publish_timeout": "2s"},
            cluster={"kubeconfig": kubeconfig, "retries": 1},
            daemon={"shutdown_timeout": "6s"},
            services={
                "checkpoint": {
                    "consumer": f"checkpoint-{uid}",
                    "bucket": bucket,
                    "subjects": [
                        f"maintenance.requested.{node}",
                        f"maintenance.requested.{node}-x",
                    ],
                    "tick": "0.1s",
                    "annotation_interval": "0.2s",
                    "call_timeout": "5s",
                    "evict_timeout": "5s",
                    "lease_ttl": "3s",
                    "breaker": {"bucket": f"breaker-{uid}"},
                }
                | service
            },
        )
        env = MaintenanceEnv(sim, Cluster(admin_client), bus, node, settings, bucket)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)
