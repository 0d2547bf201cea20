"""What the notifier may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/notifier.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`). Its NATS
grants are derived from its handler declarations (`services.notifier.service:app`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "notifier",
    frozenset(
        {
            "namespaces.get",
            "pods.get",
        }
    ),
)
