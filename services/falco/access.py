"""What the Falco response service may do in the cluster. Its NATS grants are its handlers'
(`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "falco",
    # Its responses on pods (label, delete, a NetworkPolicy), and the Events it tells.
    frozenset({"pods.get", "pods.patch", "pods.delete", "namespaces.get", "events.create"})
    | {"networkpolicies.create"}
    # The cordon action; nodes.list: the circuit breaker's population.
    | {"nodes.get", "nodes.list", "nodes.patch", "nodes.checkpoint"},
)
