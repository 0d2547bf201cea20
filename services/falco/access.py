"""What the Falco response service may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/falco.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from schemas.state.breaker import SHARED
from schemas.state.dedup import FALCO
from schemas.state.marks import FALCO_MARKS
from services.kernel.access import PUBLISHES

ACCESS = Access(
    "falco",
    frozenset(
        {
            "pods.get",
            "pods.patch",
            "pods.delete",
            "namespaces.get",
            "nodes.get",
            "nodes.list",  # the circuit breaker's population (the cordon action)
            "nodes.patch",
            "nodes.checkpoint",
            "networkpolicies.create",
            "events.create",
        }
    ),
)

GRANTS = ServiceGrants(
    consumers=(("SECURITY", "falco-urgent"), ("SECURITY", "falco")),
    buckets=(FALCO.name, FALCO_MARKS.name, SHARED.name),
    publish=("falco.>", *PUBLISHES),
    controls=("release",),  # `nodeward falco release NAMESPACE/POD`
)
