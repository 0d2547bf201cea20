"""NATS users and subject permissions: least privilege for each component.

Renders the `authorization` block of a nats-server config with one user per service and
one per node (its agents'). A node's agents may publish only their own node's subjects and
receive only on their own inbox prefix (`bus.inbox_prefix = _INBOX_<node>`) and the requests
to their own node, so one compromised node cannot forge another node's GPU health. A
service may use only its own durable consumers and KV buckets, publish only its outputs and
receive only on `_INBOX_<service>` (and its own operator controls,
`control.<service>.<verb>`, which it answers). Operators get one read-only user
(`operator`): every stream and bucket to read, the controls to send.

The runtime names no service's or agent's subject: a service's grants (a `ServiceGrants`)
are derived from its handler declarations (`nodeward.handlers.Service.grants()`), an agent
declares its own in its package (`agents/<name>/access.py`, an `AgentGrants` with `{node}`
for its node), and the composition
root (`launch.access`) collects them and hands them to `node_agent`, `operator` and
`permissions_document`. The Helm chart reads them from
`deploy/helm/nodeward/files/nats-permissions.json`, which `permissions_document()`
generates (`python -m launch.access nats-permissions FILE`); a unit test keeps the two in
sync.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from schemas.control import control_subject
from schemas.streams import STREAMS
from schemas.tokens import token

NODE = "__NODE__"  # the placeholder the chart replaces with a node's subject token


@dataclass(frozen=True)
class NatsUser:
    """One user of the `authorization` block: a name and password, or an nkey public key."""

    user: str
    password: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    deny_publish: tuple[str, ...] = field(default=())
    nkey: str | None = None

    def permissions(self) -> dict[str, object]:
        permissions: dict[str, object] = {
            "publish": {"allow": list(self.publish), "deny": list(self.deny_publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            permissions["allow_responses"] = True
        return permissions

    def render(self) -> dict[str, object]:
        if self.nkey:
            return {"nkey": self.nkey, "permissions": self.permissions()}
        return {"user": self.user, "password": self.password, "permissions": self.permissions()}


MAX_PARTITIONS = 16
"""The most partitions `bus.partitions` may say (the NATS permissions name each durable)."""


@dataclass(frozen=True)
class ServiceGrants:
    """What one service uses on the bus: its durable consumers, KV buckets and outputs.

    Derived from each service's handler declarations (`Service.grants()`).
    """

    consumers: tuple[tuple[str, str], ...]  # (stream, durable)
    buckets: tuple[str, ...]
    publish: tuple[str, ...]
    controls: tuple[str, ...] = ()
    """The operator controls it answers: verbs of `control.<service>.<verb>`."""
    partitioned: tuple[str, ...] = ()
    """Its durables that run partitioned with `bus.partitions` > 1: granted as well as
    `<durable>-p<i>` for every partition up to `MAX_PARTITIONS` (`nodeward.bus.partitions`)."""
    reads: tuple[str, ...] = ()
    """Streams whose newest messages it reads by direct get (`$JS.API.DIRECT.GET`): read
    only, no consumer."""

    def durables(self) -> tuple[tuple[str, str], ...]:
        """(stream, durable) of every durable it may use, partitions included."""
        out = list(self.consumers)
        for stream, durable in self.consumers:
            if durable in self.partitioned:
                out += [(stream, f"{durable}-p{i}") for i in range(MAX_PARTITIONS)]
        return tuple(out)


def agent_inbox(node: str) -> str:
    """The inbox prefix a node's agent connects with (`bus.inbox_prefix`)."""
    return f"_INBOX_{token(node)}"


def service_inbox(service: str) -> str:
    """The inbox prefix a service connects with (`bus.inbox_prefix`)."""
    return f"_INBOX_{token(service)}"


NODE_PLACEHOLDER = "{node}"
"""Where a node agent's declared subject (`AgentGrants`) takes its node's subject token."""


@dataclass(frozen=True)
class AgentGrants:
    """What one node agent uses on the bus: subjects with `NODE_PLACEHOLDER` (`{node}`) where
    its own node's subject token goes.

    Each agent declares its own in its package (`agents/<name>/access.py`, `GRANTS`); a
    node's NATS user (`node_agent`) holds what its agents declare, for that node only.
    """

    publish: tuple[str, ...] = ()
    """Its outputs, and the JetStream API calls (KV, direct gets) of its own keys and messages."""
    subscribe: tuple[str, ...] = ()
    """The requests it takes, besides its node's inbox (which every node user has)."""
    allow_responses: bool = False
    """It answers those requests: the reply to each, nothing more."""

    def __post_init__(self) -> None:
        for subject in (*self.publish, *self.subscribe):
            rest = subject.replace(NODE_PLACEHOLDER, "")
            if "{" in rest or "}" in rest:
                raise ValueError(f"{subject!r}: the one placeholder is {NODE_PLACEHOLDER}")

    def publish_for(self, node_token: str) -> tuple[str, ...]:
        return tuple(s.replace(NODE_PLACEHOLDER, node_token) for s in self.publish)

    def subscribe_for(self, node_token: str) -> tuple[str, ...]:
        return tuple(s.replace(NODE_PLACEHOLDER, node_token) for s in self.subscribe)


def _once(subjects: Iterable[str]) -> tuple[str, ...]:
    """`subjects` in order, each once."""
    return tuple(dict.fromkeys(subjects))


def node_agent(node: str, password: str, agents: Iterable[AgentGrants]) -> NatsUser:
    """A node's agents: what each declares in `agents` for this node (in their order), their
    node's inbox; nothing of another node."""
    n = token(node)
    declared = tuple(agents)
    return NatsUser(
        user=f"agent-{n}",
        password=password,
        publish=_once(s for a in declared for s in a.publish_for(n)),
        subscribe=(
            f"{agent_inbox(node)}.>",
            *_once(s for a in declared for s in a.subscribe_for(n)),
        ),
        allow_responses=any(a.allow_responses for a in declared),
        # The allow list is the whole grant; a deny of `$JS.API.>` would override the
        # agents' declared reads (NATS denies win), so none is set.
        deny_publish=(),
    )


def node_agent_nkey(node: str, public_key: str, agents: Iterable[AgentGrants]) -> NatsUser:
    """The same grants as `node_agent`, for an agent that signs in with its node's nkey."""
    if not (public_key.startswith("U") and len(public_key) == 56):
        raise ValueError(f"node {node}: {public_key[:8]}... is not an nkey user public key (U...)")
    plain = node_agent(node, "", agents)
    return NatsUser(
        user=plain.user,
        password="",
        publish=plain.publish,
        subscribe=plain.subscribe,
        allow_responses=plain.allow_responses,
        deny_publish=plain.deny_publish,
        nkey=public_key,
    )


def _consumer_api(stream: str, durable: str) -> tuple[str, ...]:
    api = "$JS.API.CONSUMER"
    return (
        f"{api}.CREATE.{stream}.{durable}",
        f"{api}.CREATE.{stream}.{durable}.>",
        f"{api}.DURABLE.CREATE.{stream}.{durable}",
        f"{api}.INFO.{stream}.{durable}",
        f"{api}.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
        f"dlq.{stream}.{durable}",
    )


def _bucket_api(bucket: str) -> tuple[str, ...]:
    kv = f"KV_{bucket}"
    return (
        f"$KV.{bucket}.>",
        f"$JS.API.STREAM.INFO.{kv}",
        f"$JS.API.STREAM.CREATE.{kv}",
        f"$JS.API.STREAM.MSG.GET.{kv}",
        f"$JS.API.DIRECT.GET.{kv}",
        f"$JS.API.DIRECT.GET.{kv}.>",
        f"$JS.API.CONSUMER.CREATE.{kv}",
        f"$JS.API.CONSUMER.CREATE.{kv}.>",
        f"$JS.API.CONSUMER.INFO.{kv}.>",
        f"$JS.API.CONSUMER.DELETE.{kv}.>",
        f"$JS.FC.{kv}.>",
    )


REFUSALS = (
    "remediation.identity_mismatch.>",
    "remediation.future_event.>",
    "notify.critical.security",
    "notify.warning.clock",
)
"""What the bus runtime of every consumer publishes when it refuses an event before its
handler sees it (`nodeward.bus.consumer`): the audit and on-call's notice of an identity
mismatch or of a time in the future."""


def _covered(subject: str, granted: Iterable[str]) -> bool:
    """True if `subject` is among `granted` or under one of its `prefix.>` wildcards."""
    return any(g == subject or (g.endswith(".>") and subject.startswith(g[:-1])) for g in granted)


def service_publish(grants: ServiceGrants) -> tuple[str, ...]:
    """Every subject a service may publish on: its consumers' and KV buckets' API calls
    and dead letters, its reads, its outputs and, with consumers, the runtime's `REFUSALS`."""
    publish: list[str] = []
    for stream, durable in grants.durables():
        publish += _consumer_api(stream, durable)
    for bucket in grants.buckets:
        publish += _bucket_api(bucket)
    for stream in grants.reads:
        publish += [f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]
    publish += grants.publish
    if grants.consumers:
        publish += [s for s in REFUSALS if not _covered(s, publish)]
    return tuple(publish)


def service_user(service: str, grants: ServiceGrants, password: str) -> NatsUser:
    """A service: its own consumers and KV buckets, its outputs (and, with consumers, the
    runtime's `REFUSALS`), its own inbox."""
    controls = tuple(control_subject(service, verb) for verb in grants.controls)
    return NatsUser(
        user=f"nodeward-{service}",
        password=password,
        publish=service_publish(grants),
        subscribe=(f"{service_inbox(service)}.>", *controls),
        allow_responses=bool(controls),  # the reply to each control request, nothing more
    )


OPERATOR_USER = "nodeward-operator"
OPERATOR_INBOX = "_INBOX_operator"
"""The inbox prefix an operator's commands connect with (`bus.inbox_prefix`)."""

_READ_API = (
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.*",
    "$JS.API.DIRECT.GET.*.>",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.INFO.*.*",
    # Ephemeral consumers: `tail`, `replay`, the story, a KV watch or key listing
    # (ordered, no acks), and their removal; never a service's durable one (denied below).
    "$JS.API.CONSUMER.CREATE.*",
    "$JS.API.CONSUMER.CREATE.*.>",
    "$JS.API.CONSUMER.MSG.NEXT.*.*",
    "$JS.API.CONSUMER.DELETE.*.*",
    "$JS.FC.>",  # flow-control answers of an ordered consumer
)
_NO_WRITES = (
    "$KV.>",
    "$JS.API.STREAM.CREATE.>",
    "$JS.API.STREAM.UPDATE.>",
    "$JS.API.STREAM.DELETE.>",
    "$JS.API.STREAM.PURGE.>",
    "$JS.API.STREAM.MSG.DELETE.>",
    "$JS.API.CONSUMER.DURABLE.CREATE.>",
    "$JS.ACK.>",
)


def operator(password: str, services: Mapping[str, ServiceGrants]) -> NatsUser:
    """Operators: read every stream and KV bucket (`tail`, `status`, `replay`, `streams`,
    the `nats` CLI's reads), send every service's operator controls and get the replies;
    nothing else: no event, no KV write or delete, no stream change, no service's durable
    consumer (creating, pulling, acknowledging or deleting one)."""
    deny: list[str] = list(_NO_WRITES)
    controls: list[str] = []
    for service, grants in services.items():
        controls += [control_subject(service, verb) for verb in grants.controls]
        for stream, durable in grants.durables():
            api = "$JS.API.CONSUMER"
            deny += [
                f"{api}.CREATE.{stream}.{durable}",
                f"{api}.CREATE.{stream}.{durable}.>",
                f"{api}.MSG.NEXT.{stream}.{durable}",
                f"{api}.DELETE.{stream}.{durable}",
            ]
    streams = tuple(subject for spec in STREAMS for subject in spec.subjects)
    return NatsUser(
        user=OPERATOR_USER,
        password=password,
        publish=(*_READ_API, *controls),
        subscribe=(f"{OPERATOR_INBOX}.>", *streams),
        deny_publish=tuple(deny),
    )


def reader(name: str, password: str, services: Mapping[str, ServiceGrants]) -> NatsUser:
    """A service that only reads the bus (its plugin declares no access; the web console is
    one): what the operators' user reads (every stream, every KV bucket through ephemeral
    consumers), and the KV buckets' changes as they happen (`$KV.>`, subscribe only), on
    its own inbox prefix (`service_inbox`); nothing else: no operator control, no event, no
    KV write, no stream change, no service's durable consumer."""
    durables = {
        n: ServiceGrants(g.consumers, buckets=(), publish=(), partitioned=g.partitioned)
        for n, g in services.items()
    }
    read = operator(password, durables)  # the operator's reads and denials, no control
    return NatsUser(
        user=f"nodeward-{name}",
        password=password,
        publish=_READ_API,
        subscribe=(f"{service_inbox(name)}.>", *read.subscribe[1:], "$KV.>"),
        deny_publish=read.deny_publish,
    )


def admin(password: str) -> NatsUser:
    return NatsUser(user="nodeward-admin", password=password, publish=(">",), subscribe=(">",))


def render_authorization(users: Iterable[NatsUser]) -> str:
    """The `authorization { users = [...] }` block (nats-server config accepts JSON values)."""
    rendered = [u.render() for u in users]
    return "authorization {\n  users = " + json.dumps(rendered, indent=2) + "\n}\n"


CALLOUT_ACCOUNT = "NODEWARD"
"""The account the auth callout places nodeward's components in (server config mode)."""


def callout_authorization(
    issuer: str,
    callout_user: str,
    account: str = CALLOUT_ACCOUNT,
    timeout: float = 5,
    xkey: str | None = None,
) -> str:
    """The server config for auth callout (nats-server 2.10+, config mode): nodeward's
    account with JetStream, the callout's own account holding only its nkey user, and
    `auth_callout` sending every other connection to it. `issuer` is the account public key
    (A...) whose seed signs the callout's answers; `callout_user` its nkey public key (U...).
    `timeout` (seconds; the server's default is 2) bounds a connection's authentication,
    here a TokenReview and a pod read. With `xkey` (a curve public key, X...) the server
    seals its requests, which carry the clients' tokens, to the callout. The Helm chart
    renders the same block."""
    if not (issuer.startswith("A") and len(issuer) == 56):
        raise ValueError(f"{issuer[:8]}... is not an account public key (A...)")
    if not (callout_user.startswith("U") and len(callout_user) == 56):
        raise ValueError(f"{callout_user[:8]}... is not an nkey user public key (U...)")
    return (
        "accounts {\n"
        f"  {account}: {{ jetstream: enabled }}\n"
        f"  AUTH: {{ users: [ {{ nkey: {callout_user} }} ] }}\n"
        "}\n"
        "authorization {\n"
        f"  timeout: {timeout:g}\n"
        "  auth_callout {\n"
        f"    issuer: {issuer}\n"
        f"    auth_users: [ {callout_user} ]\n"
        "    account: AUTH\n" + (f"    xkey: {xkey}\n" if xkey else "") + "  }\n"
        "}\n"
    )


def permissions_document(
    services: Mapping[str, ServiceGrants],
    agents: Iterable[AgentGrants],
    readers: Iterable[str] = (),
) -> dict[str, object]:
    """The grants the Helm chart renders: per service (as each declares them), per reading
    service (`reader`), admin, the operators' read-only user, and per node (as its agents
    declare them) with `__NODE__`. `launch.access` writes it with every service's and
    agent's `GRANTS` and the registered readers."""
    agent = node_agent(NODE, "", agents)
    return {
        "agent": {"user": f"agent-{NODE}", "permissions": agent.permissions()},
        "admin": {"user": "nodeward-admin", "permissions": admin("").permissions()},
        "operator": {
            "user": OPERATOR_USER,
            "permissions": operator("", services).permissions(),
        },
        "readers": {
            name: {
                "user": f"nodeward-{name}",
                "permissions": reader(name, "", services).permissions(),
            }
            for name in sorted(readers)
        },
        "services": {
            name: {
                "user": f"nodeward-{name}",
                "permissions": service_user(name, grants, "").permissions(),
            }
            for name, grants in services.items()
        },
    }


def write_seed(path: Path, prefix: int, *, force: bool = False) -> str:
    """Write a new nkey seed of kind `prefix` (`nkeys.PREFIX_BYTE_USER`, `_ACCOUNT`) to
    `path` (mode 0600) and return its public key. An existing file is kept unless `force`
    (`FileExistsError`): replacing a key locks out whoever holds the old one."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), prefix)
    public = str(nkeys.from_seed(bytearray(seed)).public_key.decode())
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(seed + b"\n")
    path.chmod(0o600)
    return public


def write_agent_seed(path: Path, *, force: bool = False) -> str:
    """Write a new nkey user seed to `path` (mode 0600) and return its public key (U...).

    The seed stays on the node; the public key goes into the chart's `agents.nodeKeys`.
    An existing file is kept unless `force`: replacing it locks the agent out until the
    new public key is deployed.
    """
    import nkeys

    return write_seed(path, nkeys.PREFIX_BYTE_USER, force=force)
