"""What the credentials service may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/credentials.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from services.credentials.state import LOCKS
from services.kernel.access import PUBLISHES

ACCESS = Access(
    "credentials",
    frozenset(
        {
            "secrets.get",
            "secrets.list",
            "secrets.replace",
            "secrets.patch",
            "events.create",
            "leases.hold",
        }
    ),
)

GRANTS = ServiceGrants(
    consumers=(("CREDENTIALS", "credentials"),),
    buckets=(LOCKS.name,),
    publish=("credentials.>", *PUBLISHES),
)
