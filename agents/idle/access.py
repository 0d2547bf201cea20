"""What the idleness agent may do on Kubernetes, as the node agents' shared `agent` account.

The port refuses an operation not in `ACCESS`; `deploy/rbac/agent.yaml` grants the union
of the node agents' declarations (`tests/unit/test_rbac_roles.py`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("agent", frozenset({"pods.list"}))
