"""What the admission webhook may do in the cluster: read namespaces, and list and watch
credential Secrets' metadata (never a Secret's data: `nodeward.kube.secrets`). It
publishes nothing on the bus: its NATS grants (`service:app`) are empty."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("admission", frozenset({"namespaces.get", "namespaces.watch", "secrets.watch"}))
