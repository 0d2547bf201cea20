"""What the cordon service (GPU quarantine) may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/cordon.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from schemas.state.breaker import SHARED
from schemas.state.cordon import NODES
from services.kernel.access import AUDIT_READ, PUBLISHES

ACCESS = Access(
    "cordon",
    frozenset(
        {
            "nodes.get",
            "nodes.list",
            "nodes.watch",
            "nodes.patch",
            "nodes.set_condition",
            "namespaces.get",
            "pods.list",
            "pods.get",
            "pods.evict",
            "events.create",
            # Per-GPU exclusion where DRA serves the GPUs (services/cordon/devices.py).
            "resourceslices.list",
            "devicetaintrules.create",
            "devicetaintrules.get",
            "devicetaintrules.delete",
        }
    ),
)

# A quarantine rule with `maintenance: true` asks the checkpoint service for the node's maintenance.
GRANTS = ServiceGrants(
    consumers=(("GPU", "cordon"), ("GPU", "cordon-xids"), ("HEARTBEATS", "cordon-heartbeats")),
    # `breaker`: the one circuit breaker every service that removes nodes shares.
    buckets=(NODES.name, SHARED.name),
    # AUDIT_READ: a quarantine resumed after a restart is audited once (`Auditor.stored`).
    publish=("maintenance.requested.*", *PUBLISHES, AUDIT_READ),
    # `nodeward quarantine release`, `nodeward breaker reset`.
    controls=("release", "reset-breaker"),
    # Per node across replicas with bus.partitions > 1 (one lease group: services.cordon).
    partitioned=("cordon", "cordon-xids", "cordon-heartbeats"),
)
