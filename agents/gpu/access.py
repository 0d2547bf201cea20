"""What the GPU agent may do on the bus, as its node's NATS user; it calls no Kubernetes API
(no `ACCESS`: it reads its pods from the kubelet's pod-resources socket).

`GRANTS` holds its subjects with `{node}` for its own node's token; the node's user
(`nodeward.nats_auth.node_agent`) and the chart's grants (`launch.access`) are built from the
node agents' declarations.
"""

from __future__ import annotations

from nodeward.nats_auth import AgentGrants
from schemas.recovery import AGENT_PREFIX

GRANTS = AgentGrants(
    publish=(
        "gpu.health.{node}.>",
        "gpu.xid.{node}.>",
        "gpu.heartbeat.{node}",
        "gpu.telemetry.{node}",
        # Its own newest heartbeat, read back for the bus's store time (`nodeward.bus.clock`);
        # with partitions, stored under one more token.
        "$JS.API.DIRECT.GET.HEARTBEATS.gpu.heartbeat.{node}",
        "$JS.API.DIRECT.GET.HEARTBEATS.gpu.heartbeat.{node}.*",
    ),
    # services.recovery's GPU reset and validation (`agent.gpu.<verb>.<node>`), to its own
    # node only; it answers each.
    subscribe=(f"{AGENT_PREFIX}.*.{{node}}",),
    allow_responses=True,
)
