"""What the capacity service may do in the cluster: list and watch nodes, pods and (DRA)
ResourceSlices, nothing more. Its NATS grants are its handlers' (`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("capacity", frozenset({"nodes.watch", "pods.watch", "resourceslices.watch"}))
