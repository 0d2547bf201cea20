"""What the capacity service may do: its Kubernetes operations and its NATS grants.

It only reads: it lists and watches nodes, pods and (DRA) ResourceSlices. The port refuses any other operation
(`nodeward.kube.access.Guard`); `deploy/rbac/capacity.yaml` grants exactly these
(`tests/unit/test_rbac_roles.py`). Its NATS grants are derived from its handler declarations
(`services.capacity.service:app`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("capacity", frozenset({"nodes.watch", "pods.watch", "resourceslices.watch"}))
