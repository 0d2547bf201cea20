"""The cluster port: every operation services perform on Kubernetes, grouped by resource."""

from __future__ import annotations

from nodeward.config import ClusterSettings
from nodeward.kube.access import Access, Guard
from nodeward.kube.checkpoints import Checkpoints
from nodeward.kube.client import KubeClient
from nodeward.kube.devices import Devices
from nodeward.kube.events import Events
from nodeward.kube.leases import Leases
from nodeward.kube.namespaces import Namespaces
from nodeward.kube.netpol import NetworkPolicies
from nodeward.kube.nodes import Nodes
from nodeward.kube.notebooks import Notebooks
from nodeward.kube.pods import Pods
from nodeward.kube.reviews import TokenReviews
from nodeward.kube.secrets import Secrets
from nodeward.kube.workloads import StatefulSets


class Cluster:
    """One service's view of the cluster. Operations it does not declare raise `UndeclaredOperation`."""

    def __init__(self, client: KubeClient, access: Access | None = None) -> None:
        self.client = client
        self.access = access
        guard = Guard(access)
        self.nodes = Nodes(client, guard)
        self.pods = Pods(client, guard)
        self.namespaces = Namespaces(client, guard)
        self.events = Events(client, guard)
        self.secrets = Secrets(client, guard)
        self.notebooks = Notebooks(client, guard)
        self.statefulsets = StatefulSets(client, guard)
        self.network_policies = NetworkPolicies(client, guard)
        self.leases = Leases(client, guard)
        self.checkpoints = Checkpoints(client, guard)
        self.devices = Devices(client, guard)
        self.token_reviews = TokenReviews(client, guard)

    @classmethod
    def connect(cls, settings: ClusterSettings, access: Access | None = None) -> Cluster:
        """A port from `settings` (kubeconfig and context, or in-cluster) that allows only
        what `access` declares (None: everything, for operator tools)."""
        agent = f"nodeward/{access.account}" if access else "nodeward"
        return cls(KubeClient.from_settings(settings, user_agent=agent), access)

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
