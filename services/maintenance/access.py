"""What the maintenance (checkpoint) service may do in the cluster
(`deploy/rbac/checkpoint.yaml` grants exactly these). Its NATS grants are its handlers'
(`service:app`)."""

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
            "pods.create",
            "pods.evict",
            "statefulsets.get",
            "statefulsets.create",
            "statefulsets.delete",
            "notebooks.get",
            "notebooks.patch",
            "events.create",
            "leases.hold",
        }
    ),
)
