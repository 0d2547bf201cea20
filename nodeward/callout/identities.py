"""Who a Kubernetes ServiceAccount token speaks for on NATS, and with which grants (pure).

The auth callout knows no component by name: the grants come from the permissions document
(`nodeward.nats_auth.permissions_document`, the chart's `files/nats-permissions.json`), and
a ServiceAccount maps to its entry by the chart's naming, `<release>-<name>`:

- `<release>-agent`: a node's agents, bound to the node its pod runs on (the token must be
  bound to that pod), with `__NODE__` replaced by that node's subject token;
- `<release>-<service>`: that service's user; `<release>-<reader>`: that reading service's;
- `<release>-provision`: the admin user (the provision Job);
- `<release>-operator`: the operators' read-only user (`kubectl create token`).

Anything else, or a ServiceAccount of another namespace, is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from nodeward.nats_auth import NODE
from schemas.tokens import token

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
RESPONSE_TTL_NS = 120_000_000_000
"""`allow_responses: true` in a server config: one reply within 2 minutes
(nats-server's DEFAULT_ALLOW_RESPONSE_MAX_MSGS and _EXPIRATION)."""


class Refused(Exception):
    """A connection the callout will not authorise, with the one-line reason the client and
    the server's log see (never the token)."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str
    permissions: dict[str, Any]


class PermissionsDocument(BaseModel):
    """`nodeward.nats_auth.permissions_document`, as the chart ships it."""

    model_config = ConfigDict(extra="forbid")

    agent: _Entry
    admin: _Entry
    operator: _Entry
    readers: dict[str, _Entry] = {}
    services: dict[str, _Entry] = {}


@dataclass(frozen=True)
class Grant:
    """What one connection gets: a user name (the server's logs and `connz`) and its
    permissions in the server config's form."""

    user: str
    permissions: dict[str, Any]

    def user_claims(self) -> dict[str, Any]:
        """The `nats` part of a user JWT with these permissions (nats-io/jwt `User`)."""
        p = self.permissions
        out: dict[str, Any] = {
            "pub": _permission(p.get("publish")),
            "sub": _permission(p.get("subscribe")),
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
        }
        if p.get("allow_responses"):
            out["resp"] = {"max": 1, "ttl": RESPONSE_TTL_NS}
        return out


def _permission(value: Any) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        return {}
    return {k: list(value[k]) for k in ("allow", "deny") if value.get(k)}


@dataclass(frozen=True)
class Reviewed:
    """What TokenReview said of a token: its user and the extra facts of a pod-bound one."""

    username: str
    extra: dict[str, list[str]]

    def one(self, key: str) -> str | None:
        values = self.extra.get(key) or []
        return values[0] if len(values) == 1 else None


@dataclass(frozen=True)
class Rules:
    """How ServiceAccounts map to grants: the namespace and release the chart installed."""

    document: PermissionsDocument
    namespace: str
    release: str

    def account(self, reviewed: Reviewed) -> str:
        """The ServiceAccount's name, if it is one of this release's namespace."""
        if not reviewed.username.startswith(SERVICE_ACCOUNT_PREFIX):
            raise Refused(f"{reviewed.username} is not a ServiceAccount")
        namespace, _, name = reviewed.username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
        if namespace != self.namespace:
            raise Refused(f"ServiceAccount {namespace}/{name} is not in namespace {self.namespace}")
        return name

    def is_agent(self, account: str) -> bool:
        return account == f"{self.release}-agent"

    def fixed(self, account: str) -> Grant:
        """The grant of a ServiceAccount that is not the agents'."""
        doc = self.document
        prefix = f"{self.release}-"
        role = account.removeprefix(prefix) if account.startswith(prefix) else ""
        found = {
            "provision": doc.admin,
            "operator": doc.operator,
            **doc.readers,
            **doc.services,
        }.get(role)
        if not role or found is None:
            raise Refused(f"ServiceAccount {account} has no NATS grants in release {self.release}")
        return Grant(found.user, found.permissions)

    def agent(self, node: str) -> Grant:
        """A node's agents' grant: its subjects only."""
        text = json.dumps(self.document.agent.permissions).replace(NODE, token(node))
        return Grant(self.document.agent.user.replace(NODE, token(node)), json.loads(text))


def bound_pod(reviewed: Reviewed) -> tuple[str, str]:
    """The (name, uid) of the pod an agent's token is bound to."""
    name, uid = reviewed.one(POD_NAME), reviewed.one(POD_UID)
    if not name or not uid:
        raise Refused("an agent's token must be bound to its pod (a projected token)")
    return name, uid


def node_of(pod: dict[str, Any], uid: str, reviewed: Reviewed) -> str:
    """The node an agent's pod runs on, if that pod is the one its token is bound to and
    still running."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    name = meta.get("name")
    if meta.get("uid") != uid:
        raise Refused(f"pod {name} is not the one the token was bound to (recreated)")
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        raise Refused(f"pod {name} has terminated ({phase})")
    if meta.get("deletionTimestamp"):
        raise Refused(f"pod {name} is being deleted")
    node = spec.get("nodeName")
    if not node:
        raise Refused(f"pod {name} is not bound to a node")
    said = reviewed.one(NODE_NAME)
    if said is not None and said != node:
        raise Refused(f"pod {name} runs on {node}, its token says {said}")
    return str(node)
