"""What the Falco response service may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/falco.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`). Its NATS
grants are derived from its handler declarations (`services.falco.service:app`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

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
