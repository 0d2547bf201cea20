"""Helpers for the culler tests: a sim cluster with sessions, the service, events, read-back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from schemas import Event, make_event
from schemas.notify import Notification
from schemas.remediation import Remediation
from schemas.session import (
    ActivityState,
    IdleEvidence,
    SessionActivity,
    SessionIdle,
    SessionKind,
)
from services.culler.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, NotebookSeed, Owner, PodSeed, Seed
from tests.integration.cordon_fixtures import read_stream
from tests.integration.simkube import RunsService, fast_admin_client, service_settings, stop_env


@dataclass
class CullerEnv(RunsService):
    """A sim cluster with one node and its session pods in namespace `ns`; the culler's settings."""

    sim: SimCluster
    admin: Cluster
    bus: Bus
    node: str
    ns: str
    settings: Settings
    pods: dict[str, dict[str, Any]]
    seed: Seed
    daemons: list[Daemon] = field(default_factory=list)

    build = staticmethod(build)

    def kind(self, pod: str) -> SessionKind:
        return SessionKind.NOTEBOOK if pod.startswith("nb-") else SessionKind.SSH

    def idle(
        self, pod: str, since: datetime, *, uid: str | None = None, at: datetime | None = None
    ) -> Event[SessionIdle]:
        now = at or datetime.now(UTC)
        data = SessionIdle(
            namespace=self.ns,
            pod=pod,
            node=self.node,
            kind=self.kind(pod),
            uid=uid or self.pods[pod]["metadata"]["uid"],
            idle_since=since,
            idle_for_s=max((now - since).total_seconds(), 0.0),
            evidence=[IdleEvidence(signal="cpu", idle_since=since, detail="0.00 cores")],
            gpus_held=1,
        )
        return make_event(data, source=f"agent/idle/{self.node}", time=now)

    def activity(self, pod: str, state: ActivityState = ActivityState.ACTIVE) -> Event[Any]:
        now = datetime.now(UTC)
        data = SessionActivity(
            namespace=self.ns,
            pod=pod,
            node=self.node,
            kind=self.kind(pod),
            uid=self.pods[pod]["metadata"]["uid"],
            state=state,
            cpu_cores=2.0,
            last_activity=now,
            sampled_at=now,
        )
        return make_event(data, source=f"agent/idle/{self.node}", time=now)

    async def publish(self, *events: Event[Any]) -> None:
        await self.bus.publish_many(list(events))

    async def settled(self) -> bool:
        """True once the culler has handled (acked) every event published so far."""
        consumer = self.settings.services["culler"]["consumer"]
        info = await self.bus.js.consumer_info("SESSIONS", consumer)
        return info.num_pending == 0 and info.num_ack_pending == 0

    async def notebook(self, name: str) -> dict[str, Any]:
        return await self.admin.notebooks.get(self.ns, name)

    async def stopped(self, name: str) -> str | None:
        annotations = (await self.notebook(name))["metadata"].get("annotations") or {}
        return annotations.get("kubeflow-resource-stopped")

    async def user_notices(self, pod: str) -> list[Notification]:
        events = await read_stream(self.bus, "NOTIFY", "notify.*.idle-session")
        return [e.data for e in events if e.data.audience == f"user:{self.ns}/{pod}"]

    async def audits(self, action: str = "*") -> list[Remediation]:
        events = await read_stream(self.bus, "AUDIT", f"remediation.{action}.>")
        return [e.data for e in events if e.data.target.namespace == self.ns]

    async def idle_until(
        self,
        pod: str,
        since: datetime,
        done: Callable[[], Awaitable[Any]],
        *,
        timeout: float = 15.0,
        every: float = 0.3,
    ) -> Any:
        """Publish `session.idle` for `pod` as the agent does, each `every` s, until `done()`."""
        import asyncio

        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            await self.publish(self.idle(pod, since))
            result = await done()
            if result:
                return result
            await asyncio.sleep(every)  # the agent's interval, not a synchronisation
        raise AssertionError(f"timed out after {timeout}s publishing idle events for {pod}")


EnvFactory = Callable[..., Awaitable[CullerEnv]]


def session_seed(node: str, ns: str, annotations: dict[str, dict[str, str]] | None = None) -> Seed:
    """One node; notebooks nb-a, nb-b, nb-c, nb-exempt (one GPU each); SSH pods under a
    StatefulSet and bare. `annotations`: extra annotations per pod name."""
    extra = annotations or {}
    notebooks = ["nb-a", "nb-b", "nb-c", "nb-exempt"]
    pods = [
        PodSeed(
            name=f"{nb}-0",
            namespace=ns,
            node=node,
            role="notebook",
            gpus=1,
            owner=Owner(kind="StatefulSet", name=nb),
            labels={"notebook-name": nb, "statefulset": nb}
            | ({"nodeward.io/exempt": "true"} if nb == "nb-exempt" else {}),
            annotations=extra.get(f"{nb}-0", {}),
        )
        for nb in notebooks
    ]
    pods += [
        PodSeed(
            name="ssh-kept-0",
            namespace=ns,
            node=node,
            role="ssh",
            owner=Owner(kind="StatefulSet", name="ssh-kept"),
            labels={"nodeward.io/session": "ssh", "statefulset": "ssh-kept"},
            annotations=extra.get("ssh-kept-0", {}),
        ),
        PodSeed(
            name="ssh-bare",
            namespace=ns,
            node=node,
            role="ssh",
            labels={"nodeward.io/session": "ssh"},
        ),
    ]
    return Seed(
        namespaces=[ns, "nodeward"],
        nodes=[NodeSeed(name=node)],
        pods=pods,
        notebooks=[NotebookSeed(name=nb, namespace=ns) for nb in notebooks],
    )


@pytest.fixture
async def culler_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    """`await culler_env(dry_run=True, ...)`: a fresh sim and the culler's settings."""
    made: list[CullerEnv] = []

    async def make(
        annotations: dict[str, dict[str, str]] | None = None, **culler: Any
    ) -> CullerEnv:
        uid = uuid.uuid4().hex[:8]
        node, ns = f"gpu-{uid}", f"user-{uid}"
        seed = session_seed(node, ns, annotations)
        sim = SimCluster(seed, port=0, bookmark_interval=0.2)
        await sim.start()
        kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-culler-{uid}", identity="culler")
        admin_client = fast_admin_client(sim, tmp_path, uid)
        admin = Cluster(admin_client)
        pods = {p["metadata"]["name"]: p for p in await admin.pods.list(ns)}
        service: dict[str, Any] = {
            "consumer": f"culler-{uid}",
            "bucket": f"culler-{uid}",
            "subjects": [f"session.*.{node}.>"],
            "warn_after": "2s",
            "cull_after": "3s",
            "rate_limit": {"per_minute": 60000, "burst": 1000},
        } | culler
        settings = service_settings(nats_url, kubeconfig, "culler", service)
        env = CullerEnv(sim, admin, bus, node, ns, settings, pods, seed)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)
