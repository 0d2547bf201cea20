"""Every daemon's declared access, collected where all of them are visible.

Each service and node agent declares what it may do in its own package (`access.py`):
`ACCESS` (its Kubernetes operations; a node agent that calls no API has none) and `GRANTS`
(a service's NATS consumers, buckets and outputs; a node agent's subjects, with `{node}` for
its node). The RBAC test, the sim cluster's fallback roles, the chart's NATS permissions file
and the node users of the tests are built from these.

`python -m launch.access nats-permissions FILE` writes the chart's copy
(`deploy/helm/nodeward/files/nats-permissions.json`).
"""

from __future__ import annotations

import importlib
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from nodeward.kube.access import Access, by_account
from nodeward.nats_auth import AgentGrants, ServiceGrants, permissions_document
from sim.inject import GRANTS as INJECTIONS

READERS: frozenset[str] = frozenset({"console"})
"""Services that only read the bus: no Kubernetes access, and a NATS user of their own kind
(`nodeward.nats_auth.console`) rather than one built from grants."""


def _declared(kind: str) -> tuple[ModuleType, ...]:
    """Each registered agent's or service's `access` module, from the `nodeward.<kind>s`
    entry points: one added in its folder and registered is collected here. Every one must
    have one (but a reader): a service's or agent's NATS grants are there."""
    found = []
    for entry in sorted(entry_points(group=f"nodeward.{kind}s"), key=lambda e: e.name):
        if kind == "service" and entry.name in READERS:
            continue
        package = entry.value.split(":")[0].rsplit(".", 1)[0]
        found.append(importlib.import_module(f"{package}.access"))
    return tuple(found)


_SERVICES = _declared("service")
_AGENTS = _declared("agent")

DECLARED: tuple[Access, ...] = (
    *(m.ACCESS for m in _SERVICES),
    *(m.ACCESS for m in _AGENTS if hasattr(m, "ACCESS")),
)
"""Each daemon's own declaration; the node agents share the `agent` account."""

ACCOUNTS: dict[str, Access] = by_account(DECLARED)
"""Per ServiceAccount, what its role must grant: the union of its daemons' declarations."""

GRANTS: dict[str, ServiceGrants] = {s.ACCESS.account: s.GRANTS for s in _SERVICES}
"""Per service, its NATS grants (the user `nodeward-<service>`)."""

AGENT_GRANTS: tuple[AgentGrants, ...] = (INJECTIONS, *(m.GRANTS for m in _AGENTS))
"""What a node's NATS user (`agent-<node>`, `nodeward.nats_auth.node_agent`) holds: the
simulated driver's injections (`sim.inject`, answered on the GPU agent's connection), then
each registered agent's declaration, in name order."""


def main(argv: list[str]) -> int:
    """`nats-permissions FILE`: write the chart's NATS grants as JSON."""
    if len(argv) != 2 or argv[0] != "nats-permissions":
        print("usage: python -m launch.access nats-permissions FILE", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(
        json.dumps(permissions_document(GRANTS, AGENT_GRANTS), indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
