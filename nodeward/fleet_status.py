"""What `nodeward status` shows: the fleet as JetStream KV and streams hold it.

Read-only, and naming no service: what the runtime reads itself (GPU health from the
agents' heartbeats and changes, telemetry, energy and its totals, the agents seen, the
shared circuit breaker, the DLQ, the audit trail) with every registered service's view
(`nodeward.views`): their rows and attention, cells, marks, tables and data about each
node. Each source is read in one pass (`nodeward.bus.snapshot`), all of them concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Required, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import BusReads, Reads, Stored
from nodeward.config import Settings
from nodeward.durations import format_age
from nodeward.views import (
    Cell,
    Column,
    MarkHeld,
    Row,
    Shown,
    Table,
    View,
    data,
    decoded,
    records,
    registered,
)
from schemas import DecodeError, decode
from schemas.common import K8sName, PodRef
from schemas.energy import EnergyNode
from schemas.gpu import GpuHealth, GpuHeartbeat, HealthReason, HealthState, MigInstance
from schemas.remediation import Remediation
from schemas.state.breaker import SHARED, BreakerState
from schemas.state.energy import TOTALS, EnergyTotals
from schemas.tokens import token

HEALTH_ORDER = ("failed", "degraded", "unknown", "healthy")
AGENT_KINDS = ("gpu", "energy", "idle")
AgentKind = Literal["gpu", "energy", "idle"]
AgentState = Literal["live", "stale", "quiet", "never"]
SEVERITY_ORDER = ("critical", "warning", "info", "ok")
ON_DEMAND = frozenset({"idle"})
"""Agent kinds that publish only while their node has something for them (the idle agent:
sessions): silent, they are quiet unless a view `expects` them on the node."""

HEARTBEATS_FRESH = 3
"""A heartbeat younger than this many of its intervals bounds the read of its node's GPU
changes (those stored since); an older one's node is read from its last change per GPU."""
CLOCK_SLACK = timedelta(seconds=1)
"""How much earlier than the oldest fresh heartbeat the changes are read (two streams may
be stored by two servers' clocks)."""
SILENT_FILTERS = 256
"""At most this many nodes without a fresh heartbeat are read by their own subjects; more,
and every GPU's last change is read."""
NODE_ACTIONS_SCANNED = 5000
"""How far back the audit trail is read for one node's recent actions (`--node`)."""


class AgentSeen(BaseModel):
    """When a node's agent of one kind last published, and what that says."""

    last_at: datetime | None = Field(default=None, description="store time of its newest message")
    age_s: float | None = None
    clock_offset_s: float | None = Field(
        default=None,
        description="its newest message's own time (`ce-time`) minus when the bus stored it: "
        "how far ahead (+) or behind (-) of the bus its clock ran, plus the publish's delay",
    )
    state: AgentState = Field(
        description="live; stale (silent past the timeout); quiet (the idle agent, silent but "
        "with no session it should report on); never (nothing stored)"
    )


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


class NodeStatus(BaseModel):
    """One node as the picture shows it. Open: each view's data about the node (`Shown.parts`)
    is held under the view's own keys (`quarantine`, `sessions`...), in `--json` beside these."""

    model_config = ConfigDict(extra="allow")

    name: str
    health: str = Field(description="the worst state among the node's GPUs, or unknown")
    gpus: dict[str, str] = Field(default_factory=dict, description="GPU key -> state")
    agent_seen_at: datetime | None = Field(
        default=None,
        description="the newest gpu.heartbeat or gpu.health from its GPU agent, or "
        "gpu.telemetry where no heartbeat is recent",
    )
    agent_live: bool = Field(default=False, description="its GPU agent is live")
    agents: dict[str, AgentSeen] = Field(
        default_factory=dict, description="gpu, energy, idle -> when it last published"
    )
    clock_offset_s: float | None = Field(
        default=None,
        description="the node's clock against the bus: the largest of its agents' offsets "
        "(the most promptly published message says the least about delays)",
    )
    marks: list[MarkHeld] = Field(default_factory=list, description="the owners' marks held")
    energy: EnergyView | None = None
    rows: list[Row] = Field(default_factory=list, description="what the services' views say of it")
    cells: list[Cell] = Field(
        default_factory=list, description="the views' words in its cells (marks, pods, badges)"
    )
    pods: list[str] = Field(
        default_factory=list, description="the pods on it the views know (namespace/name)"
    )
    attention: list[str] = Field(
        default_factory=list, description="why it needs a look, most serious first; [] if none"
    )
    rank: int = Field(default=9, description="0 most serious; 9 nothing to see")

    @property
    def cordoned(self) -> bool:
        return any(m.cordon for m in self.marks)

    def part(self, key: str) -> Any:
        """A view's data about the node under `key`; None if no view gave it."""
        return (self.__pydantic_extra__ or {}).get(key)

    def said(self, column: Column) -> list[Cell]:
        """The views' cells of one column, the most severe first (else in the views' order)."""
        cells = [c for c in self.cells if c.column == column]
        return sorted(cells, key=lambda c: SEVERITY_ORDER.index(c.severity))

    def badges(self) -> list[str]:
        """The words on its console cell, each once; `cordoned` last (any owner's cordon)."""
        said = list(dict.fromkeys(c.text for c in self.said("badge")))
        cordoned = self.cordoned or "cordoned" in said
        return [b for b in said if b != "cordoned"] + (["cordoned"] if cordoned else [])


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
    rows: list[Row] = Field(
        default_factory=list, description="what the services' views say of the fleet"
    )
    tables: list[Table] = Field(
        default_factory=list, description="the services' views' tables under the fleet"
    )
    missing: list[str] = Field(default_factory=list, description="streams or buckets not found")
    notes: list[str] = Field(default_factory=list, description="where the picture is partial")

    def needing_attention(self) -> list[NodeStatus]:
        """Nodes with something to see, most serious first."""
        return sorted((n for n in self.nodes if n.attention), key=lambda n: (n.rank, n.name))


class NodeReport(BaseModel):
    """`nodeward status --node N`: one node in detail, with the actions on it."""

    nats_url: str
    at: datetime
    node: NodeStatus
    recent_actions: list[ActionSummary] = Field(description="on the node or its pods, newest first")
    tables: list[Table] = Field(
        default_factory=list, description="the services' views' tables about the node"
    )
    missing: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def worst(states: Iterable[str]) -> str:
    """The most severe GPU state of a node; `unknown` when none is known."""
    found = set(states)
    for state in HEALTH_ORDER:
        if state in found:
            return state
    return "unknown"


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _newest(a: datetime | None, b: datetime) -> datetime:
    b = _aware(b)
    return b if a is None or b > a else a


def _pod(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


@dataclass(slots=True)
class GpuSeen:
    """One GPU's state as status read it: from its last change (`gpu.health`) or its node's
    last heartbeat, whichever is newer; read like a `GpuHealth` (`gpu_key()`, `state`,
    `observed_at`, `reasons`, `pods`, `model`). A heartbeat names no pods or model.

    Not frozen, though nothing changes one once read: a frozen dataclass sets each field
    through `object.__setattr__`, three times the cost of making the 40,000 of a fleet of
    5,000 nodes (`bench/status.py`)."""

    node: str
    key: str
    gpu_index: int
    gpu_uuid: str
    state: HealthState
    observed_at: datetime
    stored: datetime
    agent_boot_id: str | None
    sequence: int
    reasons: list[HealthReason] = field(default_factory=list)
    pods: list[PodRef] = field(default_factory=list)
    model: str | None = None
    mig: MigInstance | None = None

    def gpu_key(self) -> str:
        return self.key

    def newer_than(self, other: GpuSeen) -> bool:
        """Within one agent boot the change counter orders them (a heartbeat restates its
        last change's); across boots, or without one, the store time."""
        if self.agent_boot_id is not None and self.agent_boot_id == other.agent_boot_id:
            return self.sequence > other.sequence or (
                self.sequence == other.sequence and self.stored > other.stored
            )
        return self.stored > other.stored

    def restates(self, change: GpuSeen) -> bool:
        """Whether this is a heartbeat's restatement of `change` (the same boot and change
        counter, no pods): the change's pods and model still hold."""
        return (
            not self.pods
            and bool(change.pods or change.model)
            and self.agent_boot_id is not None
            and self.agent_boot_id == change.agent_boot_id
            and self.sequence == change.sequence
        )


@dataclass
class Seen:
    """What was read, before it is assembled into a picture (the reads' product)."""

    breaker: BreakerState | None = None
    health: list[GpuSeen] = field(default_factory=list)
    agents: dict[str, dict[str, datetime]] = field(default_factory=dict)
    """node -> agent kind -> store time of its newest message."""
    clocks: dict[str, dict[str, float]] = field(default_factory=dict)
    """node -> agent kind -> its newest message's own time minus its store time (seconds)."""
    energy: dict[str, EnergyNode] = field(default_factory=dict)
    totals: dict[str, EnergyTotals] = field(default_factory=dict)
    shown: list[Shown] = field(default_factory=list)
    """What each service's view read (`nodeward.views`), in the views' order."""
    dlq: dict[str, int] = field(default_factory=dict)
    actions: list[tuple[datetime, Remediation]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def saw(self, node: str, kind: str, at: datetime, claimed: datetime | None = None) -> None:
        """`node`'s `kind` agent published a message the bus stored `at`, dated `claimed`
        by the agent (its `ce-time`)."""
        kinds = self.agents.setdefault(node, {})
        newest = _newest(kinds.get(kind), at)
        if claimed is not None and newest is not kinds.get(kind):
            offset = (_aware(claimed) - newest).total_seconds()
            self.clocks.setdefault(node, {})[kind] = offset
        kinds[kind] = newest

    @property
    def rows(self) -> list[Row]:
        return [row for s in self.shown for row in s.rows]


@dataclass
class _Said:
    """What the views said, gathered by node."""

    rows: dict[str, list[Row]] = field(default_factory=dict)
    cells: dict[str, list[Cell]] = field(default_factory=dict)
    marks: dict[str, list[MarkHeld]] = field(default_factory=dict)
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, list[str]] = field(default_factory=dict)
    gpus: dict[str, dict[str, str]] = field(default_factory=dict)
    expects: dict[str, set[str]] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, shown: Iterable[Shown]) -> _Said:
        said = cls()
        for s in shown:
            for row in s.rows:
                if row.node is not None:
                    said.rows.setdefault(row.node, []).append(row)
            for cell in s.cells:
                said.cells.setdefault(cell.node, []).append(cell)
            for mark in s.marks:
                said.marks.setdefault(mark.node, []).append(mark)
            for node, parts in s.parts.items():
                said.parts.setdefault(node, {}).update(parts)
            for node, pods in s.pods.items():
                said.pods.setdefault(node, []).extend(pods)
            for node, states in s.gpus.items():
                said.gpus.setdefault(node, {}).update(states)
            for node, kinds in s.expects.items():
                said.expects.setdefault(node, set()).update(kinds)
            said.defaults.update(s.defaults)
        for key in list(said.defaults):
            if key in NodeStatus.model_fields:
                del said.defaults[key]  # a view's key may not hide the runtime's own
        return said

    def names(self) -> set[str]:
        return {*self.rows, *self.cells, *self.marks, *self.parts, *self.pods, *self.gpus}

    def parts_of(self, node: str) -> dict[str, Any]:
        parts = self.parts.get(node)
        if not parts:
            return self.defaults
        return self.defaults | {k: v for k, v in parts.items() if k not in NodeStatus.model_fields}


def assemble(
    *,
    nats_url: str,
    now: datetime,
    breaker: BreakerState | None,
    health: Iterable[GpuHealth | GpuSeen],
    telemetry: dict[str, datetime],
    dlq: dict[str, int],
    actions: Iterable[tuple[datetime, Remediation]],
    agent_timeout: timedelta,
    missing: Iterable[str] = (),
    notes: Iterable[str] = (),
    seen: Seen | None = None,
    clock_skew: timedelta = timedelta(seconds=5),
) -> FleetStatus:
    """One fleet picture from what was read: pure, so it is tested without a server.

    `telemetry` is the GPU agent's newest message per node; `seen` carries everything else
    (energy, other agents, what the services' views read). A node whose clock is off by
    more than `clock_skew` (`bus.max_clock_skew`) needs a look."""
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
    said = _Said.of(s.shown)
    names = set(gpus) | set(agents) | set(s.energy) | set(s.totals) | said.names()
    names.discard("")
    nodes = []
    for name in sorted(names):
        states = gpus.get(name) or said.gpus.get(name) or {}
        seen_at = agents.get(name, {})
        clocks = s.clocks.get(name, {})
        expected = said.expects.get(name, ())
        liveness = {
            kind: _agent(
                seen_at.get(kind),
                now,
                agent_timeout,
                quiet=kind in ON_DEMAND and kind not in expected,
                clock=clocks.get(kind),
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
            clock_offset_s=round(max(clocks.values()), 3) if clocks else None,
            marks=said.marks.get(name, []),
            energy=_energy(s.energy.get(name), s.totals.get(name)),
            rows=said.rows.get(name, []),
            cells=said.cells.get(name, []),
            pods=said.pods.get(name, []),
            **said.parts_of(name),
        )
        node.rank, node.attention = _attention(node, now, clock_skew)
        nodes.append(node)
    b = (
        breaker
        or next((v.breaker for v in s.shown if v.breaker), None)
        or s.breaker
        or next((v.breaker_before for v in s.shown if v.breaker_before), None)
        or BreakerState()
    )
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
        rows=[row for row in s.rows if row.node is None],
        tables=[t for v in s.shown for t in v.tables],
        missing=sorted(set(missing)),
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


def _agent(
    at: datetime | None,
    now: datetime,
    timeout: timedelta,
    *,
    quiet: bool,
    clock: float | None = None,
) -> AgentSeen:
    if at is None:
        return AgentSeen(state="never")
    age = max((now - at).total_seconds(), 0.0)
    offset = round(clock, 3) if clock is not None else None
    if age <= timeout.total_seconds():
        return AgentSeen(last_at=at, age_s=age, clock_offset_s=offset, state="live")
    state: AgentState = "quiet" if quiet else "stale"
    return AgentSeen(last_at=at, age_s=age, clock_offset_s=offset, state=state)


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


def _attention(
    n: NodeStatus, now: datetime, clock_skew: timedelta = timedelta(seconds=5)
) -> tuple[int, list[str]]:
    """Why `n` needs a look (most serious first) and its rank (0 most serious, 9 none):
    what the runtime reads itself, ranked with the views' rows' attention."""
    found: list[tuple[int, str]] = []
    skew = clock_skew.total_seconds()
    if (offset := n.clock_offset_s) is not None and abs(offset) > skew:
        if offset > 0:
            # Its events are refused as from the future: a GPU that fails is not acted on.
            found.append((1, f"clock {format_age(offset)} ahead of the bus: its events refused"))
        else:
            found.append((2, f"clock {format_age(-offset)} behind the bus (or its messages late)"))
    if n.health in ("failed", "degraded"):
        bad = [k for k, s in n.gpus.items() if s == n.health]
        found.append((0 if n.health == "failed" else 2, f"GPU {', '.join(bad)} {n.health}"))
    for kind, seen in n.agents.items():
        if seen.state == "stale":
            found.append((2, f"{kind} agent silent {format_age(seen.age_s or 0)}"))
    if n.health == "unknown" and n.agents.get("gpu", AgentSeen(state="never")).state == "never":
        found.append((3, "no GPU health reported"))
    found.extend((row.rank, row.attention) for row in n.rows if row.attention)
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


# -- reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Buckets:
    """The KV buckets the runtime reads itself (the services' views read their own): each
    declared name unless the settings rename it."""

    breaker: str = SHARED.name
    energy: str = TOTALS.name


AUDIT_SUBJECTS = "remediation.>"


def watched(buckets: Buckets, views: Mapping[str, View] | None = None) -> list[Watched]:
    """What `read_fleet` reads (with `views`), as mirrors that can answer it: the buckets and the audit
    trail tell their changes; GPU states (the console follows them itself), heartbeats,
    telemetry, energy and sessions arrive all the time and are read when something else
    changed, or on the next periodic drawing. One mirror per stream: a view's that names
    a stream already watched is the same."""
    own = [
        Watched.bucket(buckets.breaker),
        Watched.bucket(buckets.energy, tell=False),
        Watched("AUDIT", (AUDIT_SUBJECTS,)),
        Watched("GPU", ("gpu.health.>",), tell=False),
        Watched("HEARTBEATS", ("gpu.heartbeat.>",), tell=False),
        Watched("TELEMETRY", ("gpu.telemetry.*",), headers_only=True, tell=False),
        Watched("SESSIONS", ("session.*.*.>",), headers_only=True, tell=False),
        Watched("ENERGY", ("energy.node.*", "energy.pod.>"), tell=False),
    ]
    streams = {w.stream for w in own}
    theirs = {
        w.stream: w
        for view in (views or {}).values()
        for w in view.watched()
        if w.stream not in streams
    }
    return [*theirs.values(), *own]


def _claimed(m: Stored) -> datetime | None:
    """The time its publisher gave a binary-mode CloudEvent (`ce-time`), if it says one."""
    said = (m.headers or {}).get("ce-time")
    if not said:
        return None
    try:
        return _aware(datetime.fromisoformat(said))
    except ValueError:
        return None


class _Reader:
    """The concurrent reads of one `gather_status`, each noting what it did not find."""

    def __init__(self, reads: Reads, seen: Seen) -> None:
        self.reads = reads
        self.seen = seen

    async def kv(self, bucket: str, prefixes: Sequence[str]) -> dict[str, bytes]:
        """The bucket's entries; a missing bucket is empty (nothing wrote it here yet)."""
        return await self.reads.kv(bucket, prefixes) or {}

    async def last(
        self, stream: str, filters: Sequence[str], *, headers_only: bool = False
    ) -> list[Stored]:
        got = await self.reads.last(stream, filters, headers_only=headers_only)
        if got is None:
            self.seen.missing.append(f"stream {stream}")
            return []
        return got


async def _shared_breaker(r: _Reader, bucket: str) -> BreakerState | None:
    raw = await r.reads.kv(bucket, [SHARED.prefix])
    return records(SHARED, raw or {}).get("")


async def _energy_reads(r: _Reader, bucket: str, tok: str) -> None:
    for m, energy in data(await r.last("ENERGY", [f"energy.node.{tok}"]), EnergyNode):
        r.seen.energy[energy.node] = energy
        r.seen.saw(energy.node, "energy", m.time, _claimed(m))
    totals = records(TOTALS, await r.kv(bucket, [f"node.{tok}" if tok != "*" else TOTALS.prefix]))
    r.seen.totals = {node_of(k): v for k, v in totals.items()}


class _GpuStated(BaseModel):
    """What status reads of a heartbeat's GPU (`GpuState`): validated by pydantic-core alone,
    no Python validator per GPU (40,000 of them in a fleet of 5,000 nodes)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    gpu_index: int = Field(ge=0)
    gpu_uuid: str = Field(min_length=1)
    mig: MigInstance | None = None
    state: HealthState
    reasons: list[HealthReason] = Field(default_factory=list)
    sequence: int = Field(default=0, ge=0)

    def gpu_key(self) -> str:
        if self.mig is None:
            return str(self.gpu_index)
        return f"{self.gpu_index}-mig{self.mig.gpu_instance_id}-{self.mig.compute_instance_id}"


class _Heartbeat(BaseModel):
    """What status reads of a `gpu.heartbeat.v1`'s data (the same fields, the same rules)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    node: K8sName
    gpus: list[_GpuStated]
    interval_s: float = Field(gt=0)
    observed_at: datetime
    agent_boot_id: str | None = None


def _beats(stored: Iterable[Stored]) -> list[tuple[Stored, _Heartbeat]]:
    """Each stored heartbeat's data, if it names the node of its subject; a structured-mode
    CloudEvent is decoded whole."""
    out = []
    for m in stored:
        try:
            if (m.headers or {}).get("ce-type") == GpuHeartbeat.TYPE:
                beat = _Heartbeat.model_validate_json(m.data)
            else:
                data = decode(m.subject, m.headers, m.data).data
                if not isinstance(data, GpuHeartbeat):
                    continue
                beat = _Heartbeat.model_validate(data.model_dump())
        except (DecodeError, ValidationError):
            continue
        if m.subject.split(".")[2:3] == [token(beat.node)]:
            out.append((m, beat))
    return out


def _gpu_seen(g: _GpuStated | GpuHealth, said: _Heartbeat | GpuHealth, stored: datetime) -> GpuSeen:
    """GPU `g` as `said` (its heartbeat, or the change itself) stated it, stored at `stored`;
    a change's pods and model with it (a heartbeat names none)."""
    change = g if isinstance(g, GpuHealth) else None
    return GpuSeen(
        node=said.node,
        key=g.gpu_key(),
        gpu_index=g.gpu_index,
        gpu_uuid=g.gpu_uuid,
        mig=g.mig,
        state=g.state,
        reasons=g.reasons,
        pods=change.pods if change else [],
        model=change.model if change else None,
        observed_at=said.observed_at,
        stored=stored,
        agent_boot_id=said.agent_boot_id,
        sequence=g.sequence,
    )


async def _gpu_reads(r: _Reader, tok: str) -> tuple[list[GpuSeen], set[str]]:
    """Each GPU's state: a node's last heartbeat (every GPU restated, one message) and the
    changes stored since; a node without a recent heartbeat from its last change per GPU.
    With the tokens of the nodes whose heartbeat is fresh.

    The GPU stream keeps every GPU's last change (40,000 subjects for 5,000 nodes of 8);
    the heartbeats say the same in one message per node, so only the few changes since
    the oldest recent heartbeat, and the silent nodes' subjects, are read from it.
    """
    beats, listed = await asyncio.gather(
        # With bus.partitions > 1 the stream stores the partition as one more token.
        r.reads.last("HEARTBEATS", [f"gpu.heartbeat.{tok}", f"gpu.heartbeat.{tok}.*"]),
        r.reads.subjects("GPU", f"gpu.health.{tok}.>"),
    )
    if listed is None:
        r.seen.missing.append("stream GPU")
    said: dict[tuple[str, str], GpuSeen] = {}

    def take(new: GpuSeen) -> None:
        known = said.get((new.node, new.key))
        if known is None or new.newer_than(known):
            said[new.node, new.key] = new
            if known is not None and new.restates(known):
                new.pods, new.model = known.pods, known.model
        elif known.restates(new):
            known.pods, known.model = new.pods, new.model

    now = datetime.now(UTC)
    fresh: dict[str, datetime] = {}  # node token -> its heartbeat's store time
    for m, beat in _beats(beats or []):
        r.seen.saw(beat.node, "gpu", m.time, _claimed(m))
        if (now - m.time).total_seconds() <= HEARTBEATS_FRESH * beat.interval_s:
            fresh[token(beat.node)] = m.time
        for g in beat.gpus:
            take(_gpu_seen(g, beat, m.time))
    silent = sorted({subj.split(".")[2] for subj in listed or {}} - set(fresh))
    reads = []
    if fresh:
        start = min(fresh.values()) - CLOCK_SLACK
        reads.append(r.reads.since("GPU", [f"gpu.health.{tok}.>"], start))
    if silent:
        few = tok == "*" and len(silent) <= SILENT_FILTERS
        wanted = [f"gpu.health.{t}.>" for t in silent] if few else [f"gpu.health.{tok}.>"]
        reads.append(r.reads.last("GPU", wanted))
    for got in await asyncio.gather(*reads):
        for m, h in data(got or [], GpuHealth):
            r.seen.saw(h.node, "gpu", m.time, _claimed(m))
            take(_gpu_seen(h, h, m.time))
    return list(said.values()), set(fresh)


async def _telemetry(r: _Reader, tok: str, beating: set[str]) -> dict[str, datetime]:
    """When each node's GPU agent last sent telemetry (headers only), for the nodes without
    a fresh heartbeat (`beating`: node tokens), which says the agent is alive already."""
    wanted = [f"gpu.telemetry.{tok}"]
    if beating:
        listed = await r.reads.subjects("TELEMETRY", f"gpu.telemetry.{tok}")
        if listed is None:
            r.seen.missing.append("stream TELEMETRY")
            return {}
        rest = sorted({subj.split(".")[2] for subj in listed} - beating)
        if not rest:
            return {}
        if tok == "*" and len(rest) <= SILENT_FILTERS:
            wanted = [f"gpu.telemetry.{t}" for t in rest]
    out: dict[str, datetime] = {}
    for m in await r.last("TELEMETRY", wanted, headers_only=True):
        node = node_of(m.subject.split(".")[2])
        out[node] = _newest(out.get(node), m.time)
    return out


async def _idle_agents(r: _Reader, tok: str) -> None:
    for m in await r.last("SESSIONS", [f"session.*.{tok}.>"], headers_only=True):
        r.seen.saw(node_of(m.subject.split(".")[2]), "idle", m.time, _claimed(m))


async def _dlq(r: _Reader) -> None:
    counts = await r.reads.counts("DLQ", "dlq.>")
    if counts is None:
        r.seen.missing.append("stream DLQ")
        return
    r.seen.dlq = counts


async def _recent(r: _Reader, count: int) -> None:
    got = await r.reads.newest("AUDIT", count, filters=[AUDIT_SUBJECTS])
    if got is None:
        r.seen.missing.append("stream AUDIT")
        return
    r.seen.actions = [
        (e.time, e.data) for _, e in reversed(decoded(got)) if isinstance(e.data, Remediation)
    ][:count]


async def read_fleet(
    nc: Any,
    *,
    actions: int,
    buckets: Buckets,
    node: str | None = None,
    reads: Reads | None = None,
    views: Mapping[str, View] | None = None,
) -> Seen:
    """Every source of the picture, each in one pass, all at once, and every view's;
    `node` narrows the reads to one node's subjects and keys. `reads` answers them
    (default: the bus, asked once for each; `watched` says what mirrors would answer them
    all)."""
    r = _Reader(reads or BusReads(nc), Seen())
    tok = token(node) if node else "*"

    async def gpu() -> tuple[list[GpuSeen], dict[str, datetime]]:
        health, beating = await _gpu_reads(r, tok)
        return health, await _telemetry(r, tok, beating)

    now = datetime.now(UTC)
    (health, telemetry), shared, _, shown = await asyncio.gather(
        gpu(),
        _shared_breaker(r, buckets.breaker),
        asyncio.gather(
            _energy_reads(r, buckets.energy, tok),
            _idle_agents(r, tok),
            _dlq(r),
            _recent(r, NODE_ACTIONS_SCANNED if node else actions),
        ),
        asyncio.gather(*(v.read(r.reads, node=node, now=now) for v in (views or {}).values())),
    )
    r.seen.shown = list(shown)  # in the views' order, whichever answered first
    for said in shown:
        r.seen.missing.extend(said.missing)
    r.seen.health = health
    for n, at in telemetry.items():
        r.seen.saw(n, "gpu", at)
    r.seen.breaker = shared
    return r.seen


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector held off while a picture is read and assembled: its
    hundreds of thousands of objects otherwise trigger full collections that double the CPU
    time of a read at 5,000 nodes. Nothing it needs is cyclic; the first collection after
    (one, not a dozen) frees the rest. `nodeward status` turns the collector off for the
    whole command instead (it prints and exits)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


RECENT_ACTIONS = 10
"""How many recent actions status lists by default."""


class GatherOptions(TypedDict, total=False):
    """How `gather_status` and `gather_node` read: `buckets` the runtime's own (default:
    the default names), `views` the services' (default: every registered one, with default
    settings)."""

    nats_url: Required[str]
    actions: int
    agent_timeout: timedelta
    buckets: Buckets | None
    clock_skew: timedelta
    views: Mapping[str, View] | None


async def _gather(
    nc: Any,
    node: str | None,
    *,
    nats_url: str,
    actions: int = RECENT_ACTIONS,
    agent_timeout: timedelta = timedelta(seconds=90),
    buckets: Buckets | None = None,
    clock_skew: timedelta = timedelta(seconds=5),
    views: Mapping[str, View] | None = None,
) -> tuple[Seen, FleetStatus]:
    """What nodeward holds (of one `node`, or all) and the fleet status assembled from it;
    one node's status lists no DLQ nor actions (its report lists its own)."""
    views = registered(Settings()) if views is None else views
    b = buckets or Buckets()
    seen = await read_fleet(nc, actions=actions, buckets=b, node=node, views=views)
    whole = node is None
    return seen, assemble(
        nats_url=nats_url,
        now=datetime.now(UTC),
        breaker=None,
        health=seen.health,
        telemetry={},
        dlq=seen.dlq if whole else {},
        actions=seen.actions if whole else [],
        agent_timeout=agent_timeout,
        missing=seen.missing,
        notes=seen.notes,
        seen=seen,
        clock_skew=clock_skew,
    )


async def gather_status(nc: Any, **options: Unpack[GatherOptions]) -> FleetStatus:
    """The whole fleet from KV and the streams and the services' views."""
    return (await _gather(nc, None, **options))[1]


async def gather_node(nc: Any, node: str, **options: Unpack[GatherOptions]) -> NodeReport | None:
    """One node in detail, or None if nothing nodeward reads knows it."""
    seen, fleet = await _gather(nc, node, **options)
    actions = options.get("actions", RECENT_ACTIONS)
    nats_url = options["nats_url"]
    shown = next((n for n in fleet.nodes if n.name == node), None)
    if shown is None:
        return None
    return NodeReport(
        nats_url=nats_url,
        at=fleet.at,
        node=shown,
        recent_actions=[_action(t, r) for t, r in actions_on(shown, seen.actions)][:actions],
        tables=[t for t in (_about(t, node) for t in fleet.tables) if t is not None],
        missing=fleet.missing,
        notes=fleet.notes,
    )


def _about(table: Table, node: str) -> Table | None:
    """The table's rows about `node`, or its word for none (None: nothing to show)."""
    rows = [r for r in table.rows if r.node == node]
    if rows or table.empty:
        return table.model_copy(update={"rows": rows})
    return None


def actions_on(
    node: NodeStatus, actions: Iterable[tuple[datetime, Remediation]]
) -> list[tuple[datetime, Remediation]]:
    """The decisions about `node` itself or a pod the views know on it, in the given order."""
    pods = set(node.pods)
    out = []
    for t, r in actions:
        ref = r.target
        on_node = ref.kind.lower() == "node" and ref.name == node.name
        on_pod = ref.kind.lower() == "pod" and _pod(ref.namespace, ref.name) in pods
        told = r.details.get("node") == node.name or r.details.get("hostname") == node.name
        if on_node or on_pod or told:
            out.append((t, r))
    return out
