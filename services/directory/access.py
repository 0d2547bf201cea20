"""What the directory service may do in the cluster: read and watch namespaces and merge
its own labels and annotations into them. Its NATS grants are its handlers' (`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "directory",
    frozenset({"namespaces.get", "namespaces.list", "namespaces.watch", "namespaces.patch"}),
)
