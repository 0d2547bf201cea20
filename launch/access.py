"""Every daemon's declared access, collected where all of them are visible.

Each service and node agent declares what it may do in its own package (`access.py`):
`ACCESS` (its Kubernetes operations) and, for a service, `GRANTS` (its NATS consumers,
buckets and outputs). The RBAC test, the sim cluster's fallback roles and the chart's
NATS permissions file are built from these.

`python -m launch.access nats-permissions FILE` writes the chart's copy
(`deploy/helm/nodeward/files/nats-permissions.json`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agents.energy import access as energy
from agents.idle import access as idle
from nodeward.kube.access import Access, by_account
from nodeward.nats_auth import ServiceGrants, permissions_document
from services.accounting import access as accounting
from services.capacity import access as capacity
from services.cordon import access as cordon
from services.credentials import access as credentials
from services.culler import access as culler
from services.falco import access as falco
from services.maintenance import access as maintenance
from services.notifier import access as notifier
from services.recovery import access as recovery

_SERVICES = (
    cordon,
    notifier,
    culler,
    credentials,
    falco,
    maintenance,
    capacity,
    accounting,
    recovery,
)

DECLARED: tuple[Access, ...] = (*(s.ACCESS for s in _SERVICES), energy.ACCESS, idle.ACCESS)
"""Each daemon's own declaration; the node agents share the `agent` account."""

ACCOUNTS: dict[str, Access] = by_account(DECLARED)
"""Per ServiceAccount, what its role must grant: the union of its daemons' declarations."""

GRANTS: dict[str, ServiceGrants] = {s.ACCESS.account: s.GRANTS for s in _SERVICES}
"""Per service, its NATS grants (the user `nodeward-<service>`)."""

READERS: frozenset[str] = frozenset({"console"})
"""Services that only read the bus: no Kubernetes access, and a NATS user of their own kind
(`nodeward.nats_auth.console`) rather than one built from grants."""


def main(argv: list[str]) -> int:
    """`nats-permissions FILE`: write the chart's NATS grants as JSON."""
    if len(argv) != 2 or argv[0] != "nats-permissions":
        print("usage: python -m launch.access nats-permissions FILE", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(json.dumps(permissions_document(GRANTS), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
