"""What the energy agent may do, as its node's agents' identities.

On Kubernetes, as the node agents' shared `agent` account: the port refuses an operation not
in `ACCESS`; `deploy/rbac/agent.yaml` grants the union of the node agents' declarations
(`tests/unit/test_rbac_roles.py`). On the bus, as its node's NATS user: `GRANTS`, its
subjects with `{node}` for its own node's token (`nodeward.nats_auth.node_agent`, the chart's
grants through `launch.access`).
"""

from __future__ import annotations

from agents.energy.caps import TOPIC
from nodeward.kube.access import Access
from nodeward.nats_auth import AgentGrants
from schemas.state.energy import TOTALS

ACCESS = Access("agent", frozenset({"nodes.get", "pods.list"}))

_TOTALS = TOTALS.name
_KEY = f"{TOTALS.prefix}{{node}}"  # `TOTALS.key(node)`: its own node's key

GRANTS = AgentGrants(
    publish=(
        "energy.node.{node}",
        "energy.pod.{node}.>",
        "node.finding.{node}.>",  # its node checks' findings (cpufreq)
        # Its power-cap notices, nothing else of `notify.>`: a topic any node may publish on,
        # so the notifier lets them address only on-call (`schemas.notify.NODE_TOPICS`).
        f"notify.*.{TOPIC}",
        # Its own key of the energy totals bucket (provisioned, direct get), no other:
        f"$KV.{_TOTALS}.{_KEY}",
        f"$JS.API.STREAM.INFO.KV_{_TOTALS}",
        f"$JS.API.DIRECT.GET.KV_{_TOTALS}.$KV.{_TOTALS}.{_KEY}",
        # Its own newest node energy, read back for the bus's store time (`nodeward.bus.clock`).
        "$JS.API.DIRECT.GET.ENERGY.energy.node.{node}",
    )
)
