"""What the maintenance (checkpoint) service may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/checkpoint.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from schemas.state.breaker import SHARED
from services.kernel.access import PUBLISHES
from services.maintenance.state import MAINTENANCES

ACCESS = Access(
    "checkpoint",
    frozenset(
        {
            "nodes.get",
            "nodes.list",
            "nodes.patch",
            "nodes.checkpoint",
            "namespaces.get",
            "pods.get",
            "pods.list",
            "pods.patch",
            "pods.evict",
            "events.create",
            "leases.hold",
        }
    ),
)

GRANTS = ServiceGrants(
    consumers=(("MAINTENANCE", "checkpoint"),),
    buckets=(MAINTENANCES.name, SHARED.name),
    publish=("maintenance.>", *PUBLISHES),
    controls=("cancel", "finish"),  # `nodeward maintenance cancel|finish NODE`
    partitioned=("checkpoint",),  # per node across replicas with bus.partitions > 1
)
