"""Every daemon's declared access, collected where all of them are visible.

Each service and node agent declares what it may do in its own package (`access.py`):
`ACCESS` (its Kubernetes operations) and, for a service, `GRANTS` (its NATS consumers,
buckets and outputs). The RBAC test, the sim cluster's fallback roles and the chart's
NATS permissions file are built from these.

`python -m launch.access nats-permissions FILE` writes the chart's copy
(`deploy/helm/nodeward/files/nats-permissions.json`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from nodeward.kube.access import Access, by_account
from nodeward.nats_auth import ServiceGrants, permissions_document

READERS: frozenset[str] = frozenset({"console"})
"""Services that only read the bus: no Kubernetes access, and a NATS user of their own kind
(`nodeward.nats_auth.console`) rather than one built from grants."""


def _declared(kind: str) -> tuple[ModuleType, ...]:
    """Each registered agent's or service's `access` module, from the `nodeward.<kind>s`
    entry points: one added in its folder and registered is collected here. A service must
    have one (but a reader); an agent that needs no Kubernetes access has none."""
    found = []
    for entry in sorted(entry_points(group=f"nodeward.{kind}s"), key=lambda e: e.name):
        if kind == "service" and entry.name in READERS:
            continue
        module = f"{entry.value.split(':')[0].rsplit('.', 1)[0]}.access"
        if kind == "agent" and importlib.util.find_spec(module) is None:
            continue
        found.append(importlib.import_module(module))
    return tuple(found)


_SERVICES = _declared("service")

DECLARED: tuple[Access, ...] = tuple(m.ACCESS for m in (*_SERVICES, *_declared("agent")))
"""Each daemon's own declaration; the node agents share the `agent` account."""

ACCOUNTS: dict[str, Access] = by_account(DECLARED)
"""Per ServiceAccount, what its role must grant: the union of its daemons' declarations."""

GRANTS: dict[str, ServiceGrants] = {s.ACCESS.account: s.GRANTS for s in _SERVICES}
"""Per service, its NATS grants (the user `nodeward-<service>`)."""


def main(argv: list[str]) -> int:
    """`nats-permissions FILE`: write the chart's NATS grants as JSON."""
    if len(argv) != 2 or argv[0] != "nats-permissions":
        print("usage: python -m launch.access nats-permissions FILE", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(json.dumps(permissions_document(GRANTS), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
