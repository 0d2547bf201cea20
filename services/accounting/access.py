"""What the accounting service may do: its Kubernetes operations and its NATS grants.

It reads a pod (its `nodeward.io/owner-email` annotation) and a node (its GPU model label);
it changes nothing in the cluster. `deploy/rbac/accounting.yaml` grants exactly these
(`tests/unit/test_rbac_roles.py`). Its NATS grants are derived from its handler declarations
(`services.accounting.service:app`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("accounting", frozenset({"pods.get", "nodes.get"}))
