"""What the credentials service may do in the cluster. Its NATS grants are its handlers'
(`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "credentials",
    # The Secrets it renews, the Events it tells of them, and its scheduler's Lease.
    frozenset({"secrets.get", "secrets.list", "secrets.replace", "secrets.patch"})
    | {"events.create", "leases.hold"},
)
