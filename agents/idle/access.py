"""What the idleness agent may do, as its node's agents' identities.

On Kubernetes, as the node agents' shared `agent` account: the port refuses an operation not
in `ACCESS`; `deploy/rbac/agent.yaml` grants the union of the node agents' declarations
(`tests/unit/test_rbac_roles.py`). On the bus, as its node's NATS user: `GRANTS`, its
subjects with `{node}` for its own node's token (`nodeward.nats_auth.node_agent`, the chart's
grants through `launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import AgentGrants

ACCESS = Access("agent", frozenset({"pods.list"}))

GRANTS = AgentGrants(publish=("session.activity.{node}.>", "session.idle.{node}.>"))
