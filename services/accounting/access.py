"""What the accounting service may do: its Kubernetes operations and its NATS grants.

It reads a pod (its `nodeward.io/owner-email` annotation) and a node (its GPU model label);
it changes nothing in the cluster. `deploy/rbac/accounting.yaml` grants exactly these
(`tests/unit/test_rbac_roles.py`), and the chart's NATS permissions are generated from
`GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from services.accounting.state import BUCKET
from services.kernel.access import PUBLISHES

ACCESS = Access("accounting", frozenset({"pods.get", "nodes.get"}))

CONSUMERS = (
    ("ENERGY", "accounting-energy"),
    ("SESSIONS", "accounting-sessions"),
    ("AUDIT", "accounting-audit"),
    ("NODES", "accounting-findings"),
)

GRANTS = ServiceGrants(consumers=CONSUMERS, buckets=(BUCKET,), publish=PUBLISHES)
