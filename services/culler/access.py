"""What the culler may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/culler.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from schemas.state.culler import SESSIONS
from services.kernel.access import PUBLISHES

ACCESS = Access(
    "culler",
    frozenset(
        {
            "namespaces.get",
            "pods.get",
            "pods.delete",
            "notebooks.get",
            "notebooks.patch",
        }
    ),
)

GRANTS = ServiceGrants(
    consumers=(("SESSIONS", "culler"),),
    buckets=(SESSIONS.name,),
    publish=PUBLISHES,
    partitioned=("culler",),  # per pod across replicas with bus.partitions > 1
)
