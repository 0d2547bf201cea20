"""What the accounting service may do in the cluster: read a pod (its owner annotation) and a
node (its GPU model label), nothing more. Its NATS grants are its handlers' (`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("accounting", frozenset({"pods.get", "nodes.get"}))
