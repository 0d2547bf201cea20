"""NATS users and subject permissions: least privilege for each component.

Renders the `authorization` block of a nats-server config with one user per service and
one per node agent. A node agent may publish only its own node's subjects and receive
only on its own inbox prefix (`bus.inbox_prefix = _INBOX_<node>`), so one compromised
node cannot forge another node's GPU health.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.tokens import token


@dataclass(frozen=True)
class NatsUser:
    user: str
    password: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    deny_publish: tuple[str, ...] = field(default=())

    def render(self) -> dict[str, object]:
        permissions: dict[str, object] = {
            "publish": {"allow": list(self.publish), "deny": list(self.deny_publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            permissions["allow_responses"] = True
        return {"user": self.user, "password": self.password, "permissions": permissions}


def agent_inbox(node: str) -> str:
    """The inbox prefix a node's agent connects with (`bus.inbox_prefix`)."""
    return f"_INBOX_{token(node)}"


def node_agent(node: str, password: str) -> NatsUser:
    """A node's agents: their own node's subjects, their own inbox, nothing of JetStream's API."""
    n = token(node)
    return NatsUser(
        user=f"agent-{n}",
        password=password,
        publish=(f"gpu.health.{n}.>", f"gpu.telemetry.{n}", f"energy.node.{n}"),
        subscribe=(f"{agent_inbox(node)}.>", f"sim.inject.{n}"),
        allow_responses=True,  # to answer sim.inject requests
        deny_publish=("$JS.API.>",),
    )


def admin(password: str) -> NatsUser:
    return NatsUser(user="nodeward-admin", password=password, publish=(">",), subscribe=(">",))


def render_authorization(users: Iterable[NatsUser]) -> str:
    """The `authorization { users = [...] }` block (nats-server config accepts JSON values)."""
    rendered = [u.render() for u in users]
    return "authorization {\n  users = " + json.dumps(rendered, indent=2) + "\n}\n"
