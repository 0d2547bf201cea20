"""What the notifier may do in the cluster: read the owner annotations of pods and
namespaces. Its NATS grants are its handlers' (`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("notifier", frozenset({"namespaces.get", "pods.get"}))
