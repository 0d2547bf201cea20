"""What the capacity service may do: its Kubernetes operations and its NATS grants.

It only reads: it lists and watches nodes, pods and (DRA) ResourceSlices. The port refuses any other operation
(`nodeward.kube.access.Guard`); `deploy/rbac/capacity.yaml` grants exactly these
(`tests/unit/test_rbac_roles.py`), and the chart's NATS permissions are generated from
`GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from schemas.state.capacity import SNAPSHOT

ACCESS = Access("capacity", frozenset({"nodes.watch", "pods.watch", "resourceslices.watch"}))

GRANTS = ServiceGrants(
    consumers=(("GPU", "capacity"), ("MAINTENANCE", "capacity")),
    buckets=(SNAPSHOT.name,),
    publish=("capacity.>",),
)
