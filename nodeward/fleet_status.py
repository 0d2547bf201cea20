"""What `nodeward status` shows: the fleet as JetStream KV and streams hold it.

Read-only. The cordon service's KV records are read as the service writes them: with its
record types and bucket declarations from `schemas.state.cordon` (`NODES`, `BREAKER`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.js.errors import BucketNotFoundError, NoKeysError, NotFoundError
from pydantic import BaseModel, Field, ValidationError

from schemas import DecodeError, decode
from schemas.gpu import GpuHealth, GpuTelemetry
from schemas.remediation import Remediation
from schemas.state.breaker import SHARED, BreakerState
from schemas.state.cordon import BREAKER, NODES, NodeRecord

HEALTH_ORDER = ("failed", "degraded", "unknown", "healthy")
MAX_SUBJECTS = 4096  # last-message lookups per stream; a bigger fleet is summarised by KV only


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


class NodeStatus(BaseModel):
    name: str
    health: str = Field(description="the worst state among the node's GPUs, or unknown")
    gpus: dict[str, str] = Field(default_factory=dict, description="GPU key -> state")
    agent_seen_at: datetime | None = Field(
        default=None, description="the newest gpu.health or gpu.telemetry from its agent"
    )
    agent_live: bool = False
    quarantine: Quarantined | None = None
    last_decision: str | None = None


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
    nodes: list[NodeStatus]
    breaker: BreakerStatus
    dlq: dict[str, int] = Field(description="DLQ subject -> messages held")
    recent_actions: list[ActionSummary] = Field(description="newest first")
    missing: list[str] = Field(default_factory=list, description="streams or buckets not found")
    notes: list[str] = Field(default_factory=list, description="where the picture is partial")

    @property
    def quarantined(self) -> list[NodeStatus]:
        return [n for n in self.nodes if n.quarantine is not None]


def worst(states: Iterable[str]) -> str:
    """The most severe GPU state of a node; `unknown` when none is known."""
    found = set(states)
    for state in HEALTH_ORDER:
        if state in found:
            return state
    return "unknown"


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


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
) -> FleetStatus:
    """One fleet picture from what was read: pure, so it is tested without a server."""
    gpus: dict[str, dict[str, str]] = {}
    seen: dict[str, datetime] = {}
    for h in health:
        gpus.setdefault(h.node, {})[h.gpu_key()] = h.state.value
        seen[h.node] = max(seen.get(h.node, _aware(h.observed_at)), _aware(h.observed_at))
    for node, at in telemetry.items():
        seen[node] = max(seen.get(node, _aware(at)), _aware(at))
    nodes = []
    for name in sorted(set(records) | set(gpus) | set(telemetry)):
        record = records.get(name, NodeRecord())
        states = gpus.get(name) or {k: g.state.value for k, g in record.gpus.items()}
        quarantine = None
        if (q := record.quarantine) is not None:
            since = _aware(q.started_at)
            quarantine = Quarantined(
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
        agent_seen = seen.get(name)
        nodes.append(
            NodeStatus(
                name=name,
                health=worst(states.values()),
                gpus=dict(sorted(states.items(), key=lambda kv: _gpu_order(kv[0]))),
                agent_seen_at=agent_seen,
                agent_live=agent_seen is not None and now - agent_seen <= agent_timeout,
                quarantine=quarantine,
                last_decision=record.last_decision,
            )
        )
    b = breaker or BreakerState()
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
        recent_actions=[
            ActionSummary(
                time=_aware(t),
                action=r.action,
                target=r.target.key(),
                outcome=r.outcome.value,
                reason=r.reason,
                actor=r.actor,
                dry_run=r.dry_run,
            )
            for t, r in actions
        ],
        missing=sorted(missing),
        notes=list(notes),
    )


def _gpu_order(key: str) -> tuple[int, str]:
    head = key.split("-", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, key)


async def _shared_breaker(js: Any, bucket: str) -> BreakerState | None:
    """The circuit breaker shared by every service that removes nodes (`SHARED`)."""
    try:
        kv = await js.key_value(bucket)
        entry = await kv.get(SHARED.key())
    except (BucketNotFoundError, NotFoundError, KeyError):
        return None
    try:
        return SHARED.load(entry.value) if entry.value else None
    except ValidationError:
        return None


async def _kv_records(
    js: Any, bucket: str, missing: list[str]
) -> tuple[dict[str, NodeRecord], BreakerState | None]:
    try:
        kv = await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        missing.append(f"KV {bucket}")
        return {}, None
    try:
        keys = await kv.keys()
    except NoKeysError:
        return {}, None
    records: dict[str, NodeRecord] = {}
    breaker: BreakerState | None = None
    for key in keys:
        try:
            entry = await kv.get(key)
        except (NotFoundError, KeyError):
            continue  # deleted since listed
        if not entry.value:
            continue
        try:
            if key == BREAKER.key():
                breaker = BREAKER.load(entry.value)
            elif NODES.holds(key):
                records[NODES.suffix(key)] = NODES.load(entry.value)
        except ValidationError:
            continue  # a record status cannot read is not worth failing the whole table for
    return records, breaker


async def _subjects(js: Any, stream: str, pattern: str, missing: list[str]) -> dict[str, int]:
    try:
        info = await js.stream_info(stream, subjects_filter=pattern)
    except NotFoundError:
        missing.append(f"stream {stream}")
        return {}
    return dict(info.state.subjects or {})


async def _last_events(
    js: Any, stream: str, subjects: Iterable[str], notes: list[str]
) -> list[Any]:
    """The newest decodable event on each subject (concurrently, a bounded batch at a time)."""

    async def last(subject: str) -> Any:
        try:
            msg = await js.get_last_msg(stream, subject)
            return decode(msg.subject or subject, msg.headers, msg.data or b"")
        except (NotFoundError, DecodeError):
            return None

    wanted = sorted(subjects)
    if len(wanted) > MAX_SUBJECTS:
        notes.append(
            f"{stream}: read the last event of {MAX_SUBJECTS} of {len(wanted)} subjects; "
            "the rest show what KV holds"
        )
        wanted = wanted[:MAX_SUBJECTS]
    out: list[Any] = []
    for i in range(0, len(wanted), 64):
        out.extend(await asyncio.gather(*(last(s) for s in wanted[i : i + 64])))
    return [e for e in out if e is not None]


async def _recent_actions(
    js: Any, count: int, missing: list[str]
) -> list[tuple[datetime, Remediation]]:
    try:
        info = await js.stream_info("AUDIT")
    except NotFoundError:
        missing.append("stream AUDIT")
        return []
    out: list[tuple[datetime, Remediation]] = []
    seq = info.state.last_seq
    while seq >= max(info.state.first_seq, 1) and len(out) < count:
        try:
            msg = await js.get_msg("AUDIT", seq)
            event = decode(msg.subject or "", msg.headers, msg.data or b"")
        except (NotFoundError, DecodeError):
            event = None
        if event is not None and isinstance(event.data, Remediation):
            out.append((event.time, event.data))
        seq -= 1
    return out


async def gather_status(
    nc: Any,
    *,
    nats_url: str,
    actions: int = 10,
    agent_timeout: timedelta = timedelta(seconds=90),
    bucket: str = NODES.name,
    breaker_bucket: str = SHARED.name,
) -> FleetStatus:
    """Read the cordon service's KV `bucket`, the circuit breaker's (`breaker_bucket`) and
    the GPU, TELEMETRY, DLQ and AUDIT streams into one picture."""
    js = nc.jetstream()
    missing: list[str] = []
    notes: list[str] = []
    records, legacy_breaker = await _kv_records(js, bucket, missing)
    breaker = await _shared_breaker(js, breaker_bucket) or legacy_breaker
    health_subjects = await _subjects(js, "GPU", "gpu.health.>", missing)
    health = [
        e.data
        for e in await _last_events(js, "GPU", health_subjects, notes)
        if isinstance(e.data, GpuHealth)
    ]
    telemetry_subjects = await _subjects(js, "TELEMETRY", "gpu.telemetry.>", missing)
    telemetry = {
        e.data.node: e.time
        for e in await _last_events(js, "TELEMETRY", telemetry_subjects, notes)
        if isinstance(e.data, GpuTelemetry)
    }
    dlq = await _subjects(js, "DLQ", "dlq.>", missing)
    recent = await _recent_actions(js, actions, missing)
    return assemble(
        nats_url=nats_url,
        now=datetime.now(UTC),
        records=records,
        breaker=breaker,
        health=health,
        telemetry=telemetry,
        dlq=dlq,
        actions=recent,
        agent_timeout=agent_timeout,
        missing=missing,
        notes=notes,
    )
