"""Every daemon's declared access, collected where all of them are visible.

Each service and node agent declares what it may do in its own package (`access.py`):
`ACCESS` (its Kubernetes operations; a node agent that calls no API has none); a node agent
also `GRANTS` (its subjects, with `{node}` for its node). A service's NATS grants (consumers,
buckets, outputs, controls) are derived from its handler declarations (`Service.grants()`). The RBAC test, the sim cluster's fallback roles, the chart's NATS permissions file
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

from nodeward.callout.access import ACCESS as CALLOUT
from nodeward.kube.access import Access, by_account
from nodeward.nats_auth import AgentGrants, ServiceGrants, permissions_document
from nodeward.plugin import resolve, services
from sim.inject import GRANTS as INJECTIONS


def _declared_services() -> tuple[ModuleType, ...]:
    """Each registered service's access module (its plugin's `access`): one added in its
    folder and registered is collected here. A service without one only reads the bus: no
    Kubernetes access, and a NATS user of the readers' kind (`nodeward.nats_auth.reader`)."""
    return tuple(resolve(p.ref(p.access)) for p in services() if p.access is not None)


def _declared_agents() -> tuple[ModuleType, ...]:
    """Each registered agent's `access` module, beside its `nodeward.agents` entry point."""
    found = []
    for entry in sorted(entry_points(group="nodeward.agents"), key=lambda e: e.name):
        package = entry.value.split(":")[0].rsplit(".", 1)[0]
        found.append(importlib.import_module(f"{package}.access"))
    return tuple(found)


READERS: frozenset[str] = frozenset(p.name for p in services() if p.access is None)
"""The registered services that only read the bus."""

_SERVICES = _declared_services()
_AGENTS = _declared_agents()

DECLARED: tuple[Access, ...] = (
    *(m.ACCESS for m in _SERVICES),
    *(m.ACCESS for m in _AGENTS if hasattr(m, "ACCESS")),
    CALLOUT,
)
"""Each daemon's own declaration (the NATS auth callout's too); the node agents share the
`agent` account."""

ACCOUNTS: dict[str, Access] = by_account(DECLARED)
"""Per ServiceAccount, what its role must grant: the union of its daemons' declarations."""


def _service_grants() -> dict[str, ServiceGrants]:
    """Per service, its grants: derived from its handler declarations (`nodeward.handlers`),
    which its plugin names."""
    found = {}
    for p in services():
        if p.access is None:
            continue
        if p.handlers is None:
            raise TypeError(f"service {p.name}: declares access but no handlers to grant")
        module = resolve(p.ref(p.access))
        found[module.ACCESS.account] = p.load(p.handlers).grants()
    return found


GRANTS: dict[str, ServiceGrants] = _service_grants()
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
        json.dumps(permissions_document(GRANTS, AGENT_GRANTS, READERS), indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
