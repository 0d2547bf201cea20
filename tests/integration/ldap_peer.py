"""The directory tests' peers: a real OpenLDAP slapd (`sim.ldap.Slapd`, skipped with the
reason when slapd is not installed), the sim cluster, real NATS, and the directory service
run as its own ServiceAccount."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.kube.base import core
from nodeward.kube.client import KubeClient
from schemas.notify import Notification
from services.directory.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import Seed
from sim.ldap import Group, Slapd, User, missing
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.simkube import fast_admin_client, service_settings, stop_env

USERS = [
    User("alice", 10001, 5000, "alice@example.org", "Alice Liddell", "ATLAS Tile-Cal"),
    User("bob", 10002, 5000, "bob@example.org", "Bob Marley", "CMS"),
    User("carol", 10003, 5001, "carol@example.org", "Carol Danvers"),
    User("dave", 10004, 5001, "dave@example.org", None, "LHCb"),
    User("erin", 10005, 5000, "erin@example.org", "Erin Brockovich", "ALICE"),
    User("frank", 10006, 5001, "frank@example.org", "Frank Zappa", "CMS"),
    User("grace", 10007, 5000, "grace@example.org", "Grace Hopper", "ATLAS"),
]
"""Seven users: more than the directory's sizelimit (5), so only a paged search reads them."""
GROUPS = [
    Group("physics", 5000),
    Group("computing", 5001),
    Group("gpu-users", 5100, ("alice", "bob", "carol", "dave", "erin", "frank", "grace")),
    Group("admins", 5200, ("bob",)),
]
EGROUPS = [Group("ep-sft", 7000, ("carol",)), Group("atlas-ml", 7001, ("carol", "alice"))]


@pytest.fixture
def slapd(tmp_path: Path) -> Iterator[Slapd]:
    """A seeded slapd (users, groups, e-groups) on free loopback ports; sizelimit 5."""
    why = missing()
    if why:
        pytest.skip(f"no LDAP peer: {why}")
    server = Slapd(tmp_path / "slapd")
    server.start()
    try:
        server.add_users(USERS)
        server.add_groups(GROUPS)
        server.add_groups(EGROUPS, egroups=True)
        yield server
    finally:
        server.stop()


@dataclass
class DirectoryEnv:
    sim: SimCluster
    admin: Cluster
    client: KubeClient
    bus: Bus
    slapd: Slapd
    settings: Settings
    uid: str
    daemons: list[Daemon] = field(default_factory=list)

    def ns(self, name: str) -> str:
        """A namespace name of this test's own (the bus is shared with other tests)."""
        return f"{name}-{self.uid}"

    async def start(self, **overrides: Any) -> Daemon:
        settings = self.settings
        if overrides:
            services = dict(settings.services)
            services["directory"] = {**services["directory"], **overrides}
            settings = settings.model_copy(update={"services": services})
        daemon = await build(settings)
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    async def stop(self, daemon: Daemon) -> None:
        await daemon.stop()
        self.daemons.remove(daemon)

    async def create(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        }
        await self.client.request("POST", core("namespaces"), body=body)

    async def meta(self, name: str) -> tuple[dict[str, str], dict[str, str]]:
        meta = (await self.admin.namespaces.get(name))["metadata"]
        return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})

    async def labelled(self, name: str, key: str, value: str | None = None) -> bool:
        labels, _ = await self.meta(name)
        return key in labels and (value is None or labels[key] == value)

    async def annotated(self, name: str, key: str, present: bool = True) -> bool:
        _, annotations = await self.meta(name)
        return (key in annotations) == present

    async def oncall(self, name: str) -> list[Notification]:
        """The notices on-call gets about namespace `name` (what the notifier would send)."""
        events = await read_stream(self.bus, "NOTIFY", "notify.*.directory")
        return [
            e.data
            for e in events
            if e.data.audience == "oncall" and any(t.name == name for t in e.data.targets)
        ]

    def syncs(self, outcome: str = "ok", scope: str = "full") -> float:
        return sum(
            d.metrics.registry.get_sample_value(
                "nodeward_directory_syncs_total", {"scope": scope, "outcome": outcome}
            )
            or 0.0
            for d in self.daemons
        )

    async def more_syncs(self, n: int, outcome: str = "ok", timeout: float = 20.0) -> None:
        target = self.syncs(outcome) + n
        await wait_for(
            lambda: self.syncs(outcome) >= target, timeout=timeout, what=f"{n} more {outcome} syncs"
        )

    async def ready(self, daemon: Daemon) -> bool:
        return (await daemon.readiness()).ready


EnvFactory = Callable[..., Awaitable[DirectoryEnv]]


@pytest.fixture
async def directory_env(
    bus: Bus, nats_url: str, tmp_path: Path, slapd: Slapd
) -> AsyncIterator[EnvFactory]:
    """`await directory_env(interval=..., ...)`: a fresh sim cluster and the service's
    settings against `slapd` (plain ldap://, bound as nodeward's account)."""
    made: list[DirectoryEnv] = []

    async def make(**service: Any) -> DirectoryEnv:
        uid = uuid.uuid4().hex[:8]
        sim = SimCluster(Seed(namespaces=["nodeward"]), port=0, bookmark_interval=0.2)
        await sim.start()
        kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-dir-{uid}", identity="directory")
        client = fast_admin_client(sim, tmp_path, uid)
        config: dict[str, Any] = {
            "url": slapd.url,
            "bind_dn": slapd.bind_dn,
            "bind_password_file": str(slapd.password_file),
            "ca_file": str(slapd.ca_file),
            "user_base": slapd.people,
            "group_base": slapd.groups,
            "experiment_group_base": slapd.egroups,
            "page_size": 3,
            "interval": "0.3s",
            "retry_initial": "0.1s",
            "retry_max": "0.4s",
            "timeout": "5s",
        } | service
        settings = service_settings(nats_url, kubeconfig, "directory", config)
        env = DirectoryEnv(sim, Cluster(client), client, bus, slapd, settings, uid)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)
