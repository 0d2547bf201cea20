"""The sim cluster inside `nodeward up`: started unless a kubeconfig is given.

async with embedded_cluster(state_dir) as embedded:
    settings = embedded.settings_for("cordon")   # ClusterSettings for that service's identity
    ...                                          # <state-dir>/kubeconfig works with kubectl
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nodeward.config import ClusterSettings
from sim.cluster.seed import Seed, load_seed
from sim.cluster.server import SimCluster

if TYPE_CHECKING:
    from nodeward.kube.access import Access

KUBECONFIG_NAME = "kubeconfig"


@dataclass(frozen=True)
class EmbeddedCluster:
    """A running sim cluster and the kubeconfig written for it."""

    sim: SimCluster
    kubeconfig: Path

    @property
    def url(self) -> str:
        return self.sim.url

    def settings_for(self, service: str | None = None) -> ClusterSettings:
        """Cluster settings that authenticate as `service`'s ServiceAccount (admin if None)."""
        context = f"nodeward-{service}" if service else "nodeward-admin"
        if service is not None and service not in self.sim.identities:
            raise KeyError(f"the sim cluster has no identity for {service!r}")
        return ClusterSettings(kubeconfig=self.kubeconfig, context=context)


@asynccontextmanager
async def embedded_cluster(
    state_dir: Path,
    *,
    seed: Path | Seed | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    rbac_dirs: list[Path] | None = None,
    access: Iterable[Access] = (),
    archive_root: Path | None = None,
    registries: Iterable[str] = (),
    lease_renew_s: float = 10.0,
    node_status_report_s: float = 300.0,
    node_monitor_period_s: float = 5.0,
    node_monitor_grace_s: float | None = None,
    node_startup_grace_s: float = 60.0,
    node_eviction_qps: float = 0.1,
    webhook_endpoints: Mapping[tuple[str, str], str] | None = None,
) -> AsyncIterator[EmbeddedCluster]:
    """Start the sim cluster and write `<state_dir>/kubeconfig` (admin context current, a
    context per service); stop it on exit. `seed`: a file, a loaded seed, or the default.
    `archive_root`: where the nodes' checkpoint archives are written (`<root>/<node>/...`);
    `registries`: the registry hosts the kubelets pull from; the `lease_renew_s` ..
    `node_eviction_qps` timings of the nodes' heartbeats and health, as `SimCluster` takes
    them (the real components' defaults); `webhook_endpoints`: where the Services admission
    webhooks name listen, by (namespace, service) (also `.sim.webhook_endpoints` later).
    Raises `SeedError` for a bad seed and `OSError` if
    the port cannot be bound."""
    seed_data = seed if isinstance(seed, Seed) else load_seed(seed)
    sim = SimCluster(
        seed_data,
        host=host,
        port=port,
        rbac_dirs=rbac_dirs,
        access=access,
        archive_root=archive_root,
        registries=registries,
        lease_renew_s=lease_renew_s,
        node_status_report_s=node_status_report_s,
        node_monitor_period_s=node_monitor_period_s,
        node_monitor_grace_s=node_monitor_grace_s,
        node_startup_grace_s=node_startup_grace_s,
        node_eviction_qps=node_eviction_qps,
        webhook_endpoints=webhook_endpoints,
    )
    await sim.start()
    try:
        path = sim.write_kubeconfig(Path(state_dir) / KUBECONFIG_NAME)
        yield EmbeddedCluster(sim, path)
    finally:
        await sim.stop()
