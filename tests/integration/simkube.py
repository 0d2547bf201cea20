"""Shared fixtures for tests against the sim cluster: the sim itself, the port as any identity, kubectl."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from launch.access import ACCOUNTS
from nodeward.bus import Bus
from nodeward.config import ClusterSettings, Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.kube.client import Backoff, KubeClient
from sim.cluster import SimCluster


def sim_http(sim: SimCluster, identity: str = "admin") -> httpx.AsyncClient:
    """Plain HTTPS to the sim cluster as `identity` (its CA trusted, its token sent)."""
    context = ssl.create_default_context(cadata=sim.tls.ca_pem.decode())
    return httpx.AsyncClient(
        base_url=sim.url,
        verify=context,
        headers={"Authorization": f"Bearer {sim.identities[identity].token}"},
    )


async def run_kubectl(
    sim: SimCluster, tmp_path: Path, *args: str, binary: str = "kubectl", timeout: float = 60
) -> tuple[int, str, str]:
    """`kubectl ARGS` against the sim as admin, with a home of its own: (rc, stdout, stderr)."""
    home = tmp_path / "kubectl-home"
    home.mkdir(exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--kubeconfig",
        str(sim.write_kubeconfig(tmp_path / "kubeconfig")),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "KUBECACHEDIR": str(home / "cache")},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def fast_admin_client(sim: SimCluster, tmp_path: Path, uid: str) -> KubeClient:
    """A client of `sim` as admin (a kubeconfig of its own), retrying without delay."""
    path = sim.write_kubeconfig(tmp_path / f"kubeconfig-admin-{uid}")
    client = KubeClient.from_settings(ClusterSettings(kubeconfig=path))
    client.backoff = Backoff(base=0.01, cap=0.05)
    return client


def own(service: str, uid: str) -> dict[str, str]:
    """A test's own durable consumers and bucket for `service` (`<service>-<uid>`)."""
    return {"consumer": f"{service}-{uid}", "bucket": f"{service}-{uid}"}


def service_settings(
    nats_url: str, kubeconfig: Path, service: str, config: dict[str, Any], **more: Any
) -> Settings:
    """`service`'s settings as the service fixtures run it (a 2 s publish timeout, one
    retry of the cluster, 4 s to shut down); `more`: other sections, or these replaced."""
    sections: dict[str, Any] = {
        "bus": {"url": nats_url, "publish_timeout": "2s"},
        "cluster": {"kubeconfig": kubeconfig, "retries": 1},
        "daemon": {"shutdown_timeout": "4s"},
        "services": {service: config},
    }
    return Settings(**(sections | more))


async def stop_env(
    daemons: Iterable[Daemon], sim: SimCluster, admin: Cluster | None = None
) -> None:
    """A service fixture's teardown: its daemons, then the admin client, then the cluster."""
    for daemon in list(daemons):
        await daemon.stop()
    if admin is not None:
        await admin.close()
    await sim.stop()


@pytest.fixture
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[SimCluster]:
    """The sim cluster; `@pytest.mark.sim_cluster(kube_version="1.35", enabled=...)` passes
    its keywords on."""
    marker = request.node.get_closest_marker("sim_cluster")
    options = dict(marker.kwargs) if marker else {}
    async with SimCluster(port=0, bookmark_interval=0.2, **options) as cluster:
        yield cluster


PortFactory = Callable[..., Cluster]


@pytest.fixture
async def port_for(sim: SimCluster, tmp_path: Path) -> AsyncIterator[PortFactory]:
    """`port_for("cordon")`: the port as that account (its own token, guarded by what its
    daemons declare); `port_for()`: admin."""
    made: list[Cluster] = []

    def make(identity: str | None = None, *, guarded: bool = True, retries: int = 3) -> Cluster:
        ident = identity or "admin"
        path = sim.write_kubeconfig(tmp_path / f"kubeconfig-{ident}", identity=ident)
        settings = ClusterSettings(kubeconfig=path, retries=retries)
        client = KubeClient.from_settings(settings)
        client.backoff = Backoff(base=0.01, cap=0.05)
        cluster = Cluster(client, ACCOUNTS[identity] if guarded and identity else None)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.close()


@pytest.fixture
async def admin(port_for: PortFactory) -> Cluster:
    return port_for()


def kubectl_binaries() -> list[str]:
    """Every kubectl this machine has: the one on PATH, its versioned siblings, NODEWARD_KUBECTLS."""
    found: list[str] = []
    main = shutil.which("kubectl")
    if main:
        found.append(main)
        real = Path(os.path.realpath(main))
        found += [str(p) for p in sorted(real.parent.glob("kubectl.1.*")) if os.access(p, os.X_OK)]
    found += [p for p in os.environ.get("NODEWARD_KUBECTLS", "").split(os.pathsep) if p]
    debian = (
        Path(__file__).resolve().parents[2]
        / ".cache"
        / "kubectl-debian"
        / "usr"
        / "bin"
        / "kubectl"
    )
    if debian.exists():
        found.append(str(debian))
    return list(dict.fromkeys(found))


def kubectl_version(binary: str) -> str:
    out = subprocess.run(
        [binary, "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    import json

    try:
        return str(json.loads(out.stdout)["clientVersion"]["gitVersion"])
    except (ValueError, KeyError):
        return "unknown"


class RunsService:
    """For a test env with `settings` and a `daemons` list: run the service (`build`) in it."""

    settings: Settings
    daemons: list[Daemon]
    build: ClassVar[Callable[[Settings], Awaitable[Daemon]]]

    async def start(self) -> Daemon:
        daemon = await type(self).build(self.settings)
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    async def stop(self, daemon: Daemon) -> None:
        await daemon.stop()
        self.daemons.remove(daemon)


@dataclass
class SimServiceEnv(RunsService):
    """A service fixture's env: the sim cluster, an admin's client of it and the bus, and
    (by keyword) the daemons it runs."""

    sim: SimCluster
    admin: Cluster
    bus: Bus
    daemons: list[Daemon] = field(default_factory=list, kw_only=True)
