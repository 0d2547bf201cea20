"""What the recovery service may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/recovery.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from schemas.control import control_subject
from schemas.state.breaker import SHARED
from services.kernel.access import PUBLISHES
from services.recovery.state import BUCKET

ACCESS = Access(
    "recovery",
    frozenset(
        {
            "nodes.get",
            "nodes.list",  # the circuit breaker's population
            "nodes.patch",  # its reboot request and its human hold, and taking them back
            "pods.list",  # drained means empty: the pods left on the node
            "pods.get",  # an evicted pod waited for until it has terminated and is gone
            "pods.evict",  # the pods a drain left, evicted again (budgets honoured)
            "pods.delete",  # only at an operator's word: `nodeward recovery force-drain`
            "namespaces.get",  # a pod's namespace exemption
        }
    ),
)

GRANTS = ServiceGrants(
    consumers=(("AUDIT", "recovery-quarantines"), ("MAINTENANCE", "recovery-maintenance")),
    buckets=(BUCKET, SHARED.name),
    publish=(
        "maintenance.requested.*",  # the drain before a reset or reboot
        "agent.gpu.reset.*",  # request/reply to a node's GPU agent
        "agent.gpu.validate.*",
        # The owners' release paths, asked as `service/recovery` (audited by them); `cancel`:
        # its own maintenance taken back when the quarantine ended without recovery.
        control_subject("checkpoint", "finish"),
        control_subject("checkpoint", "cancel"),
        control_subject("cordon", "release"),
        *PUBLISHES,
    ),
    # `nodeward recovery force-drain`.
    controls=("force-drain",),
)
