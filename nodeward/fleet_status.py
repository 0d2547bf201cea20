"""What `nodeward status` shows: the fleet as JetStream KV and streams hold it.

Read-only. Every KV record is read with the record type and bucket declaration its writer
uses (`schemas.state`): the cordon service's nodes and breaker, the maintenance workflow,
each owner's node marks, the culler's sessions, the energy totals, the credential locks.
Streams give each subject's last message: GPU health, telemetry, energy, sessions (agent
liveness), isolations on the audit trail, credential outcomes. Each source is read in one
pass (`nodeward.bus.snapshot`), all of them concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from nats.js.errors import NotFoundError
from pydantic import BaseModel, Field, ValidationError

from nodeward.bus.snapshot import Stored, kv_entries, last_per_subject, newest
from schemas import DecodeError, Event, EventData, decode
from schemas.credentials import CredentialFailed, CredentialRenewed
from schemas.energy import EnergyNode
from schemas.gpu import GpuHealth
from schemas.remediation import Outcome, Remediation
from schemas.state import Bucket
from schemas.state.breaker import SHARED, BreakerState
from schemas.state.cordon import BREAKER, NODES, NodeRecord
from schemas.state.credentials import LOCKS
from schemas.state.culler import SESSIONS, SessionRecord
from schemas.state.energy import TOTALS, EnergyTotals
from schemas.state.lease import LeaseRecord
from schemas.state.maintenance import MAINTENANCES, MaintenanceState
from schemas.state.marks import FALCO_MARKS, MarkIntent, intents
from schemas.tokens import token

M = TypeVar("M", bound=BaseModel)

HEALTH_ORDER = ("failed", "degraded", "unknown", "healthy")
AGENT_KINDS = ("gpu", "energy", "idle")
AgentKind = Literal["gpu", "energy", "idle"]
AgentState = Literal["live", "stale", "quiet", "never"]
ISOLATE = "isolate"
UNDO_ACTIONS = frozenset({"release", "unisolate", "lift"})
"""Actions on an isolated pod that end its isolation, when applied (or any undone one)."""
HELD = frozenset({"applying", "applied", "releasing"})
NODE_ACTIONS_SCANNED = 5000
"""How far back the audit trail is read for one node's recent actions (`--node`)."""


class Quarantined(BaseModel):
    reason: str
    rule: str
    gpus: list[str]
    since: datetime
    age_s: float
    phase: str
    dry_run: bool
    cordoned: bool
    taints: list[str]


class AgentSeen(BaseModel):
    """When a node's agent of one kind last published, and what that says."""

    last_at: datetime | None = Field(default=None, description="store time of its newest message")
    age_s: float | None = None
    state: AgentState = Field(
        description="live; stale (silent past the timeout); quiet (the idle agent, silent but "
        "with no session it should report on); never (nothing stored)"
    )


class MarkHeld(BaseModel):
    """A nodeward owner's marks on the node (NodeMarks' intent in the owner's bucket)."""

    owner: str = Field(description="quarantine, falco or maintenance")
    phase: str
    incident: str
    cordon: bool
    taints: list[str]
    since: datetime | None = None


class MaintenanceView(BaseModel):
    maintenance_id: str
    phase: str
    active: bool = Field(description="not done or failed yet")
    reason: str
    requested_by: str | None
    requested_at: datetime
    start_at: datetime
    started_at: datetime | None
    deadline_at: datetime | None
    finished_at: datetime | None
    cordoned: bool = Field(description="nodeward cordoned the node for it")
    dry_run: bool
    pods: dict[str, str] = Field(description="namespace/pod -> its plan's status")
    failures: list[str]
    error: str | None


class IsolatedPod(BaseModel):
    pod: str = Field(description="namespace/name")
    node: str | None
    since: datetime
    rule: str | None = Field(description="the Falco rule")
    reason: str
    dry_run: bool


class EnergyView(BaseModel):
    """The node's last `energy.node` interval and its totals."""

    at: datetime = Field(description="the interval's end")
    interval_s: float
    avg_power_w: float | None
    energy_j: float | None
    co2e_g: float | None
    g_per_kwh: float | None
    energy_total_j: float | None
    co2e_total_g: float | None
    degraded: list[str]


class SessionView(BaseModel):
    pod: str = Field(description="namespace/name")
    node: str | None
    state: Literal["warned", "stopped", "watched"]
    reason: str | None
    idle_since: datetime | None
    warned_at: datetime | None
    deadline: datetime | None = Field(description="when it is stopped unless used again")
    dry_run: bool
    stopped_at: datetime | None
    stop_outcome: str | None


class CredentialView(BaseModel):
    credential: str = Field(description="namespace/secret")
    kind: str | None = None
    outcome: Literal["renewed", "failed"] | None = None
    at: datetime | None = None
    expires_at: datetime | None = None
    error: str | None = None
    renewing: bool = Field(default=False, description="a renewer holds its lock now")
    holder: str | None = None


class NodeStatus(BaseModel):
    name: str
    health: str = Field(description="the worst state among the node's GPUs, or unknown")
    gpus: dict[str, str] = Field(default_factory=dict, description="GPU key -> state")
    agent_seen_at: datetime | None = Field(
        default=None, description="the newest gpu.health or gpu.telemetry from its agent"
    )
    agent_live: bool = Field(default=False, description="its GPU agent is live")
    agents: dict[str, AgentSeen] = Field(
        default_factory=dict, description="gpu, energy, idle -> when it last published"
    )
    quarantine: Quarantined | None = None
    last_decision: str | None = None
    maintenance: MaintenanceView | None = None
    marks: list[MarkHeld] = Field(default_factory=list)
    isolated: list[IsolatedPod] = Field(default_factory=list)
    energy: EnergyView | None = None
    sessions: list[SessionView] = Field(default_factory=list)
    attention: list[str] = Field(
        default_factory=list, description="why it needs a look, most serious first; [] if none"
    )
    rank: int = Field(default=9, description="0 most serious; 9 nothing to see")

    @property
    def cordoned(self) -> bool:
        return any(m.cordon for m in self.marks)


class BreakerStatus(BaseModel):
    open: bool = Field(description="True while it refuses new quarantines (tripped)")
    admitted: int
    trips: int
    tripped_at: datetime | None = None
    reason: str | None = None


class ActionSummary(BaseModel):
    time: datetime
    action: str
    target: str
    outcome: str
    reason: str
    actor: str
    dry_run: bool


class FleetStatus(BaseModel):
    nats_url: str
    at: datetime
    nodes: list[NodeStatus] = Field(description="by name")
    breaker: BreakerStatus
    dlq: dict[str, int] = Field(description="DLQ subject -> messages held")
    recent_actions: list[ActionSummary] = Field(description="newest first")
    credentials: list[CredentialView] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list, description="streams or buckets not found")
    notes: list[str] = Field(default_factory=list, description="where the picture is partial")

    @property
    def quarantined(self) -> list[NodeStatus]:
        return [n for n in self.nodes if n.quarantine is not None]

    def needing_attention(self) -> list[NodeStatus]:
        """Nodes with something to see, most serious first."""
        return sorted((n for n in self.nodes if n.attention), key=lambda n: (n.rank, n.name))


class NodeReport(BaseModel):
    """`nodeward status --node N`: one node in detail, with the actions on it."""

    nats_url: str
    at: datetime
    node: NodeStatus
    recent_actions: list[ActionSummary] = Field(description="on the node or its pods, newest first")
    missing: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def worst(states: Iterable[str]) -> str:
    """The most severe GPU state of a node; `unknown` when none is known."""
    found = set(states)
    for state in HEALTH_ORDER:
        if state in found:
            return state
    return "unknown"


def format_age(seconds: float) -> str:
    """`42s`, `3m05s`, `2h10m`, `3d4h`: short enough for a table cell."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _newest(a: datetime | None, b: datetime) -> datetime:
    b = _aware(b)
    return b if a is None or b > a else a


def _pod(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


@dataclass
class Seen:
    """What was read, before it is assembled into a picture (the reads' product)."""

    records: dict[str, NodeRecord] = field(default_factory=dict)
    breaker: BreakerState | None = None
    health: list[GpuHealth] = field(default_factory=list)
    agents: dict[str, dict[str, datetime]] = field(default_factory=dict)
    """node -> agent kind -> store time of its newest message."""
    maintenances: dict[str, MaintenanceState] = field(default_factory=dict)
    marks: dict[str, dict[str, MarkIntent]] = field(default_factory=dict)
    """owner -> node -> intent."""
    isolations: list[IsolatedPod] = field(default_factory=list)
    energy: dict[str, EnergyNode] = field(default_factory=dict)
    totals: dict[str, EnergyTotals] = field(default_factory=dict)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)
    """namespace/pod -> the culler's record."""
    credentials: list[CredentialView] = field(default_factory=list)
    dlq: dict[str, int] = field(default_factory=dict)
    actions: list[tuple[datetime, Remediation]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def saw(self, node: str, kind: str, at: datetime) -> None:
        kinds = self.agents.setdefault(node, {})
        kinds[kind] = _newest(kinds.get(kind), at)


def assemble(
    *,
    nats_url: str,
    now: datetime,
    records: dict[str, NodeRecord],
    breaker: BreakerState | None,
    health: Iterable[GpuHealth],
    telemetry: dict[str, datetime],
    dlq: dict[str, int],
    actions: Iterable[tuple[datetime, Remediation]],
    agent_timeout: timedelta,
    missing: Iterable[str] = (),
    notes: Iterable[str] = (),
    seen: Seen | None = None,
) -> FleetStatus:
    """One fleet picture from what was read: pure, so it is tested without a server.

    `telemetry` is the GPU agent's newest message per node; `seen` carries everything else
    (maintenance, marks, isolations, energy, sessions, credentials, other agents)."""
    s = seen or Seen()
    gpus: dict[str, dict[str, str]] = {}
    agents: dict[str, dict[str, datetime]] = {n: dict(k) for n, k in s.agents.items()}

    def saw(node: str, kind: str, at: datetime) -> None:
        kinds = agents.setdefault(node, {})
        kinds[kind] = _newest(kinds.get(kind), at)

    for h in health:
        gpus.setdefault(h.node, {})[h.gpu_key()] = h.state.value
        if "gpu" not in s.agents.get(h.node, {}):  # no store time: the agent's own clock
            saw(h.node, "gpu", h.observed_at)
    for reporting, at in telemetry.items():
        saw(reporting, "gpu", at)
    sessions_by_node: dict[str, list[SessionView]] = {}
    for key, rec in s.sessions.items():
        view = _session_view(key, rec)
        sessions_by_node.setdefault(rec.node or "", []).append(view)
    isolated_by_node: dict[str, list[IsolatedPod]] = {}
    for iso in s.isolations:
        isolated_by_node.setdefault(iso.node or "", []).append(iso)
    marks_by_node: dict[str, list[MarkHeld]] = {}
    for owner, by_node in sorted(s.marks.items()):
        for held_node, intent in by_node.items():
            if intent.phase in HELD and not intent.operator_released:
                marks_by_node.setdefault(held_node, []).append(_mark_held(owner, intent))
    names = (
        set(records)
        | set(gpus)
        | set(agents)
        | set(s.maintenances)
        | set(marks_by_node)
        | set(s.energy)
        | set(s.totals)
        | {n for n in sessions_by_node if n}
        | {n for n in isolated_by_node if n}
    )
    nodes = []
    for name in sorted(names):
        record = records.get(name, NodeRecord())
        states = gpus.get(name) or {k: g.state.value for k, g in record.gpus.items()}
        quarantine = _quarantined(record, now)
        sessions = sorted(sessions_by_node.get(name, []), key=lambda v: (v.deadline or now, v.pod))
        pending = any(v.state == "warned" for v in sessions)
        seen_at = agents.get(name, {})
        liveness = {
            kind: _agent(
                seen_at.get(kind), now, agent_timeout, quiet=kind == "idle" and not pending
            )
            for kind in AGENT_KINDS
        }
        node = NodeStatus(
            name=name,
            health=worst(states.values()),
            gpus=dict(sorted(states.items(), key=lambda kv: _gpu_order(kv[0]))),
            agent_seen_at=seen_at.get("gpu"),
            agent_live=liveness["gpu"].state == "live",
            agents=liveness,
            quarantine=quarantine,
            last_decision=record.last_decision,
            maintenance=_maintenance(s.maintenances.get(name)),
            marks=marks_by_node.get(name, []),
            isolated=sorted(isolated_by_node.get(name, []), key=lambda i: i.pod),
            energy=_energy(s.energy.get(name), s.totals.get(name)),
            sessions=sessions,
        )
        rank, attention = _attention(node, now)
        nodes.append(node.model_copy(update={"rank": rank, "attention": attention}))
    b = breaker or s.breaker or BreakerState()
    return FleetStatus(
        nats_url=nats_url,
        at=now,
        nodes=nodes,
        breaker=BreakerStatus(
            open=b.tripped_at is not None,
            admitted=len(b.admitted),
            trips=b.trips,
            tripped_at=datetime.fromtimestamp(b.tripped_at, UTC) if b.tripped_at else None,
            reason=b.trip_reason,
        ),
        dlq=dict(sorted(dlq.items())),
        recent_actions=[_action(t, r) for t, r in actions],
        credentials=sorted(s.credentials, key=lambda c: c.credential),
        missing=sorted(missing),
        notes=list(notes),
    )


def _action(t: datetime, r: Remediation) -> ActionSummary:
    return ActionSummary(
        time=_aware(t),
        action=r.action,
        target=r.target.key(),
        outcome=r.outcome.value,
        reason=r.reason,
        actor=r.actor,
        dry_run=r.dry_run,
    )


def _agent(at: datetime | None, now: datetime, timeout: timedelta, *, quiet: bool) -> AgentSeen:
    if at is None:
        return AgentSeen(state="never")
    age = max((now - at).total_seconds(), 0.0)
    if age <= timeout.total_seconds():
        return AgentSeen(last_at=at, age_s=age, state="live")
    return AgentSeen(last_at=at, age_s=age, state="quiet" if quiet else "stale")


def _quarantined(record: NodeRecord, now: datetime) -> Quarantined | None:
    q = record.quarantine
    if q is None:
        return None
    since = _aware(q.started_at)
    return Quarantined(
        reason=q.reason,
        rule=q.rule,
        gpus=q.gpus,
        since=since,
        age_s=max((now - since).total_seconds(), 0.0),
        phase=q.phase,
        dry_run=q.dry_run,
        cordoned=q.cordoned,
        taints=q.taints,
    )


def _mark_held(owner: str, intent: MarkIntent) -> MarkHeld:
    return MarkHeld(
        owner=owner,
        phase=intent.phase,
        incident=intent.incident,
        cordon=intent.entry.cordon or intent.spec.cordon,
        taints=intent.entry.taints or intent.spec.taints,
        since=datetime.fromtimestamp(intent.updated_at, UTC) if intent.updated_at else None,
    )


def _maintenance(state: MaintenanceState | None) -> MaintenanceView | None:
    if state is None:
        return None
    return MaintenanceView(
        maintenance_id=state.maintenance_id,
        phase=state.phase.value,
        active=not state.terminal,
        reason=state.reason,
        requested_by=state.requested_by,
        requested_at=_aware(state.requested_at),
        start_at=_aware(state.start_at),
        started_at=state.started_at,
        deadline_at=state.deadline_at(),
        finished_at=state.finished_at,
        cordoned=state.cordoned,
        dry_run=state.dry_run,
        pods={key: plan.status for key, plan in sorted(state.pods.items())},
        failures=state.failures,
        error=state.error,
    )


def _energy(event: EnergyNode | None, totals: EnergyTotals | None) -> EnergyView | None:
    if event is None and totals is None:
        return None
    if event is None:
        assert totals is not None
        return EnergyView(
            at=totals.updated_at or datetime.fromtimestamp(0, UTC),
            interval_s=0.0,
            avg_power_w=None,
            energy_j=None,
            co2e_g=None,
            g_per_kwh=None,
            energy_total_j=totals.energy_j,
            co2e_total_g=totals.co2e_g,
            degraded=[],
        )
    return EnergyView(
        at=event.interval.end,
        interval_s=(event.interval.end - event.interval.start).total_seconds(),
        avg_power_w=event.avg_power_w,
        energy_j=event.energy_j,
        co2e_g=event.co2e_g,
        g_per_kwh=event.carbon.g_per_kwh if event.carbon else None,
        energy_total_j=(
            event.energy_total_j
            if event.energy_total_j is not None
            else totals.energy_j
            if totals
            else None
        ),
        co2e_total_g=(
            event.co2e_total_g
            if event.co2e_total_g is not None
            else totals.co2e_g
            if totals
            else None
        ),
        degraded=event.degraded,
    )


def _session_view(key: str, rec: SessionRecord) -> SessionView:
    state: Literal["warned", "stopped", "watched"] = (
        "stopped" if rec.stopped_at is not None else "warned" if rec.pending else "watched"
    )
    return SessionView(
        pod=key,
        node=rec.node,
        state=state,
        reason=rec.reason,
        idle_since=rec.idle_since,
        warned_at=rec.warned_at,
        deadline=rec.deadline,
        dry_run=rec.dry_run,
        stopped_at=rec.stopped_at,
        stop_outcome=rec.stop_outcome,
    )


def _attention(n: NodeStatus, now: datetime) -> tuple[int, list[str]]:
    """Why `n` needs a look (most serious first) and its rank (0 most serious, 9 none)."""
    found: list[tuple[int, str]] = []
    if n.health in ("failed", "degraded"):
        bad = [k for k, s in n.gpus.items() if s == n.health]
        found.append((0 if n.health == "failed" else 2, f"GPU {', '.join(bad)} {n.health}"))
    if (q := n.quarantine) is not None:
        found.append((0, f"quarantined ({'dry run, ' if q.dry_run else ''}{q.phase})"))
    for mark in n.marks:
        if mark.owner == "quarantine" and n.quarantine is not None:
            continue  # said above
        if mark.owner == "maintenance" and n.maintenance is not None and n.maintenance.active:
            continue  # said below, with its phase
        what = "cordoned" if mark.cordon else "marked"
        found.append((0 if mark.owner == "falco" else 1, f"{what} by {mark.owner} ({mark.phase})"))
    if (m := n.maintenance) is not None:
        if m.active:
            found.append((1, f"maintenance {m.phase}{' (dry run)' if m.dry_run else ''}"))
        elif m.phase == "failed":
            found.append((1, f"maintenance failed: {m.error or '; '.join(m.failures) or '?'}"))
    if n.isolated:
        found.append((0, f"{len(n.isolated)} pod(s) isolated by Falco"))
    for kind, seen in n.agents.items():
        if seen.state == "stale":
            found.append((2, f"{kind} agent silent {format_age(seen.age_s or 0)}"))
    if n.health == "unknown" and n.agents.get("gpu", AgentSeen(state="never")).state == "never":
        found.append((3, "no GPU health reported"))
    warned = [v for v in n.sessions if v.state == "warned"]
    if warned:
        found.append((3, f"{len(warned)} idle session(s) warned"))
    if n.energy is not None and n.energy.degraded:
        found.append((3, f"energy degraded: {'; '.join(n.energy.degraded)}"))
    found.sort(key=lambda f: f[0])
    return (found[0][0] if found else 9), [why for _, why in found]


def _gpu_order(key: str) -> tuple[int, str]:
    head = key.split("-", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, key)


def node_of(tok: str) -> str:
    """A node name from its subject token: names have no `_`, and the token maps `.` to it."""
    return tok.replace("_", ".")


# -- reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Buckets:
    """The KV buckets status reads: each writer's declared name unless its settings rename it."""

    cordon: str = NODES.name
    breaker: str = SHARED.name
    maintenance: str = MAINTENANCES.name
    falco_marks: str = FALCO_MARKS.name
    culler: str = SESSIONS.name
    energy: str = TOTALS.name
    credentials: str = LOCKS.name


def _load(bucket: Bucket[M], raw: Mapping[str, bytes]) -> dict[str, M]:
    """The records of one kind among a bucket's entries, by key suffix; unreadable ones left
    out (a record status cannot read is not worth failing the whole table for)."""
    out: dict[str, M] = {}
    for key, value in raw.items():
        if not bucket.holds(key) or not value:
            continue
        try:
            out[bucket.suffix(key)] = bucket.load(value)
        except ValidationError:
            continue
    return out


D = TypeVar("D", bound=EventData)


def _data(stored: Iterable[Stored], model: type[D]) -> list[tuple[Stored, D]]:
    """The data of each message of type `model`; a binary-mode CloudEvent's body is read
    as the model directly (the envelope is not needed here), any other form decoded."""
    out: list[tuple[Stored, D]] = []
    for m in stored:
        try:
            if (m.headers or {}).get("ce-type") == model.TYPE:
                out.append((m, model.model_validate_json(m.data)))
                continue
            event = decode(m.subject, m.headers, m.data)
        except (DecodeError, ValidationError):
            continue
        if isinstance(event.data, model):
            out.append((m, event.data))
    return out


def _decoded(stored: Iterable[Stored]) -> list[tuple[Stored, Event[Any]]]:
    out = []
    for m in stored:
        try:
            out.append((m, decode(m.subject, m.headers, m.data)))
        except DecodeError:
            continue
    return out


class _Reader:
    """The concurrent reads of one `gather_status`, each noting what it did not find."""

    def __init__(self, nc: Any, seen: Seen) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.seen = seen

    async def kv(
        self, bucket: str, prefixes: Sequence[str], *, noted: bool = False
    ) -> dict[str, bytes]:
        """The bucket's entries; a missing bucket is empty (its service has not run here),
        and `noted` in `missing`."""
        raw = await kv_entries(self.nc, bucket, prefixes)
        if raw is None:
            if noted:
                self.seen.missing.append(f"KV {bucket}")
            return {}
        return raw

    async def last(
        self, stream: str, filters: Sequence[str], *, headers_only: bool = False
    ) -> list[Stored]:
        got = await last_per_subject(self.nc, stream, filters, headers_only=headers_only)
        if got is None:
            self.seen.missing.append(f"stream {stream}")
            return []
        return got


async def _cordon(r: _Reader, bucket: str, node: str | None) -> None:
    raw = await r.kv(
        bucket,
        [NODES.key(node) if node else NODES.prefix, BREAKER.prefix, _marks(node)],
        noted=True,
    )
    r.seen.records = _load(NODES, raw)
    r.seen.breaker = _load(BREAKER, raw).get("")
    r.seen.marks["quarantine"] = _load(intents(bucket), raw)


def _marks(node: str | None) -> str:
    return f"marks.{node}" if node else "marks."


async def _shared_breaker(r: _Reader, bucket: str) -> BreakerState | None:
    raw = await kv_entries(r.nc, bucket, [SHARED.prefix])
    return _load(SHARED, raw or {}).get("")


async def _maintenance_kv(r: _Reader, bucket: str, node: str | None) -> None:
    prefix = MAINTENANCES.key(node) if node else MAINTENANCES.prefix
    raw = await r.kv(bucket, [prefix, _marks(node)])
    r.seen.maintenances = {s.node: s for s in _load(MAINTENANCES, raw).values()}
    r.seen.marks["maintenance"] = _load(intents(bucket), raw)


async def _falco_marks(r: _Reader, bucket: str, node: str | None) -> None:
    r.seen.marks["falco"] = _load(intents(bucket), await r.kv(bucket, [_marks(node)]))


async def _sessions(r: _Reader, bucket: str) -> None:
    records = _load(SESSIONS, await r.kv(bucket, [SESSIONS.prefix]))
    # The key is `<ns token>.<pod token>`: a namespace has no dot, a pod name's became `_`.
    r.seen.sessions = {
        f"{k.split('.', 1)[0]}/{node_of(k.split('.', 1)[1])}": v
        for k, v in records.items()
        if "." in k
    }


async def _energy_reads(r: _Reader, bucket: str, tok: str) -> None:
    for m, energy in _data(await r.last("ENERGY", [f"energy.node.{tok}"]), EnergyNode):
        r.seen.energy[energy.node] = energy
        r.seen.saw(energy.node, "energy", m.time)
    totals = _load(TOTALS, await r.kv(bucket, [f"node.{tok}" if tok != "*" else TOTALS.prefix]))
    r.seen.totals = {node_of(k): v for k, v in totals.items()}


async def _gpu_reads(r: _Reader, tok: str) -> list[GpuHealth]:
    health = []
    for m, h in _data(await r.last("GPU", [f"gpu.health.{tok}.>"]), GpuHealth):
        health.append(h)
        r.seen.saw(h.node, "gpu", m.time)
    return health


async def _telemetry(r: _Reader, tok: str) -> dict[str, datetime]:
    out: dict[str, datetime] = {}
    for m in await r.last("TELEMETRY", [f"gpu.telemetry.{tok}"], headers_only=True):
        node = node_of(m.subject.split(".")[2])
        out[node] = _newest(out.get(node), m.time)
    return out


async def _idle_agents(r: _Reader, tok: str) -> None:
    for m in await r.last("SESSIONS", [f"session.*.{tok}.>"], headers_only=True):
        r.seen.saw(node_of(m.subject.split(".")[2]), "idle", m.time)


async def _isolations(r: _Reader) -> None:
    """Pods whose newest isolate decision was applied, unless a later decision on the same
    pod undid it."""
    isolated: dict[str, tuple[Stored, Remediation]] = {}
    for m, event in _decoded(await r.last("AUDIT", [f"remediation.{ISOLATE}.>"])):
        data = event.data
        if isinstance(data, Remediation) and data.outcome in (Outcome.APPLIED, Outcome.DRY_RUN):
            isolated[m.subject.split(".", 2)[2]] = (m, data)
    if isolated:
        later = await r.last("AUDIT", [f"remediation.*.{t}" for t in sorted(isolated)])
        for m, event in _decoded(later):
            t = m.subject.split(".", 2)[2]
            data = event.data
            if t not in isolated or not isinstance(data, Remediation):
                continue
            if m.seq > isolated[t][0].seq and (
                data.outcome == Outcome.UNDONE
                or (data.action in UNDO_ACTIONS and data.outcome == Outcome.APPLIED)
            ):
                del isolated[t]
    for m, data in isolated.values():
        node = data.details.get("node") or data.details.get("hostname")
        r.seen.isolations.append(
            IsolatedPod(
                pod=_pod(data.target.namespace, data.target.name),
                node=str(node) if node else None,
                since=m.time,
                rule=data.details.get("falco_rule") or data.policy,
                reason=data.reason,
                dry_run=data.outcome == Outcome.DRY_RUN,
            )
        )


async def _credentials(r: _Reader, bucket: str) -> None:
    views: dict[str, CredentialView] = {}
    for _, event in _decoded(
        await r.last("CREDENTIALS", ["credentials.renewed.>", "credentials.failed.>"])
    ):
        data = event.data
        if not isinstance(data, CredentialRenewed | CredentialFailed):
            continue
        key = f"{data.namespace}/{data.secret}"
        known = views.get(key)
        if known is not None and known.at is not None and known.at >= event.time:
            continue
        views[key] = CredentialView(
            credential=key,
            kind=data.kind.value,
            outcome="renewed" if isinstance(data, CredentialRenewed) else "failed",
            at=event.time,
            expires_at=data.expires_at,
            error=data.error if isinstance(data, CredentialFailed) else None,
        )
    now = datetime.now(UTC).timestamp()
    locks: dict[str, LeaseRecord] = _load(LOCKS, await r.kv(bucket, [LOCKS.prefix]))
    for name, lease in locks.items():
        if lease.expires_at < now or "." not in name:
            continue
        ns, secret = name.split(".", 1)
        key = f"{ns}/{secret}"
        view = views.get(key) or CredentialView(credential=key)
        views[key] = view.model_copy(update={"renewing": True, "holder": lease.holder})
    r.seen.credentials = list(views.values())


async def _dlq(r: _Reader) -> None:
    try:
        info = await r.js.stream_info("DLQ", subjects_filter="dlq.>")
    except NotFoundError:
        r.seen.missing.append("stream DLQ")
        return
    r.seen.dlq = dict(info.state.subjects or {})


async def _recent(r: _Reader, count: int) -> None:
    got = await newest(r.nc, "AUDIT", count)
    if got is None:
        r.seen.missing.append("stream AUDIT")
        return
    r.seen.actions = [
        (e.time, e.data) for _, e in reversed(_decoded(got)) if isinstance(e.data, Remediation)
    ][:count]


async def read_fleet(nc: Any, *, actions: int, buckets: Buckets, node: str | None = None) -> Seen:
    """Every source of the picture, each in one pass, all at once; `node` narrows the reads
    to one node's subjects and keys."""
    r = _Reader(nc, Seen())
    tok = token(node) if node else "*"
    health, telemetry, shared, _ = await asyncio.gather(
        _gpu_reads(r, tok),
        _telemetry(r, tok),
        _shared_breaker(r, buckets.breaker),
        asyncio.gather(
            _cordon(r, buckets.cordon, node),
            _maintenance_kv(r, buckets.maintenance, node),
            _falco_marks(r, buckets.falco_marks, node),
            _sessions(r, buckets.culler),
            _energy_reads(r, buckets.energy, tok),
            _idle_agents(r, tok),
            _isolations(r),
            _credentials(r, buckets.credentials),
            _dlq(r),
            _recent(r, NODE_ACTIONS_SCANNED if node else actions),
        ),
    )
    r.seen.health = health
    for n, at in telemetry.items():
        r.seen.saw(n, "gpu", at)
    r.seen.breaker = shared or r.seen.breaker
    return r.seen


async def gather_status(
    nc: Any,
    *,
    nats_url: str,
    actions: int = 10,
    agent_timeout: timedelta = timedelta(seconds=90),
    bucket: str = NODES.name,
    breaker_bucket: str = SHARED.name,
    buckets: Buckets | None = None,
) -> FleetStatus:
    """The whole fleet from KV and the streams (`bucket` and `breaker_bucket` rename the
    cordon service's buckets, `buckets` any of them)."""
    b = buckets or Buckets(cordon=bucket, breaker=breaker_bucket)
    seen = await read_fleet(nc, actions=actions, buckets=b)
    return assemble(
        nats_url=nats_url,
        now=datetime.now(UTC),
        records=seen.records,
        breaker=None,
        health=seen.health,
        telemetry={},
        dlq=seen.dlq,
        actions=seen.actions,
        agent_timeout=agent_timeout,
        missing=seen.missing,
        notes=seen.notes,
        seen=seen,
    )


async def gather_node(
    nc: Any,
    node: str,
    *,
    nats_url: str,
    actions: int = 10,
    agent_timeout: timedelta = timedelta(seconds=90),
    buckets: Buckets | None = None,
) -> NodeReport | None:
    """One node in detail, or None if nothing nodeward reads knows it."""
    seen = await read_fleet(nc, actions=actions, buckets=buckets or Buckets(), node=node)
    fleet = assemble(
        nats_url=nats_url,
        now=datetime.now(UTC),
        records=seen.records,
        breaker=None,
        health=seen.health,
        telemetry={},
        dlq={},
        actions=[],
        agent_timeout=agent_timeout,
        missing=seen.missing,
        notes=seen.notes,
        seen=seen,
    )
    shown = next((n for n in fleet.nodes if n.name == node), None)
    if shown is None:
        return None
    return NodeReport(
        nats_url=nats_url,
        at=fleet.at,
        node=shown,
        recent_actions=[_action(t, r) for t, r in actions_on(shown, seen.actions)][:actions],
        missing=fleet.missing,
        notes=fleet.notes,
    )


def actions_on(
    node: NodeStatus, actions: Iterable[tuple[datetime, Remediation]]
) -> list[tuple[datetime, Remediation]]:
    """The decisions about `node` itself or a pod nodeward knows on it, in the given order."""
    pods = (
        {s.pod for s in node.sessions}
        | {i.pod for i in node.isolated}
        | set(node.maintenance.pods if node.maintenance else ())
    )
    out = []
    for t, r in actions:
        ref = r.target
        on_node = ref.kind.lower() == "node" and ref.name == node.name
        on_pod = ref.kind.lower() == "pod" and _pod(ref.namespace, ref.name) in pods
        told = r.details.get("node") == node.name or r.details.get("hostname") == node.name
        if on_node or on_pod or told:
            out.append((t, r))
    return out
