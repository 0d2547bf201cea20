"""What the maintenance (checkpoint) service may do in the cluster.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/checkpoint.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`). Its NATS
grants are its handlers' (`service:app`): the chart's NATS permissions are generated from
them (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

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
