"""What the notifier may do: its Kubernetes operations and its NATS grants.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/notifier.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`), and the
chart's NATS permissions are generated from `GRANTS` (`launch.access`).
"""

from __future__ import annotations

from nodeward.kube.access import Access
from nodeward.nats_auth import ServiceGrants
from services.notifier.state import SETTLED

ACCESS = Access(
    "notifier",
    frozenset(
        {
            "namespaces.get",
            "pods.get",
        }
    ),
)

GRANTS = ServiceGrants(
    # Critical notices have a consumer of their own, so a backlog never holds a page.
    consumers=(("NOTIFY", "notifier-critical"), ("NOTIFY", "notifier")),
    buckets=(SETTLED.name,),
    # Refused notices are audited and told to on-call (`speakers`, and the runtime's
    # identity check): the security audit and on-call's security notice, nothing else.
    publish=("remediation.identity_mismatch.>", "notify.critical.security"),
)
