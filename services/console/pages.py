"""What each view shows, from the console's picture: pure, so it is tested without a server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from nodeward.fleet_status import HEALTH_ORDER, GpuSeen, NodeStatus, worst
from schemas.capacity import WHOLE_GPU
from schemas.gpu import GpuHealth, GpuXid
from schemas.remediation import Outcome, Remediation
from services.console.charts import Chart, duration_words, line_chart
from services.console.history import Held
from services.console.live import marks_of
from services.console.trends import RANGES, CapacityTrend, EnergyTrend, Range, SessionTrend
from services.kernel.holds import release_command

STATE_FILTERS = ("all", "attention", "failed", "degraded", "unknown", "marked")
"""The fleet view's `state` filter: every node, those needing a look, by worst GPU, marked."""


@dataclass(frozen=True)
class Physical:
    """One physical GPU of a node: its worst state, and its MIG instances (key, state)."""

    key: str
    state: str
    slices: list[tuple[str, str]]


def physical_gpus(gpus: Mapping[str, str]) -> list[Physical]:
    """A node's GPUs as the hardware has them: a MIG instance (`3-mig1-0`) inside its GPU
    (`3`), whose state is the worst of its instances'; in GPU order."""
    by_gpu: dict[str, list[tuple[str, str]]] = {}
    whole: dict[str, str] = {}
    for key, state in gpus.items():
        index, _, rest = key.partition("-mig")
        if rest:
            by_gpu.setdefault(index, []).append((key, state))
        else:
            whole[key] = state
    out = [
        Physical(
            k,
            worst([st for _, st in by_gpu.get(k, [])] + ([whole[k]] if k in whole else [])),
            sorted(by_gpu.get(k, [])),
        )
        for k in {*whole, *by_gpu}
    ]
    return sorted(out, key=lambda p: (int(p.key) if p.key.isdigit() else 1 << 30, p.key))


@dataclass(frozen=True)
class Tile:
    """One node's cell: its GPUs (when shown in detail), worst health, marks."""

    name: str
    health: str
    gpus: list[Physical]
    marks: list[str]
    attention: list[str]
    detailed: bool


@dataclass
class Group:
    """The nodes of one GPU model, with GPU counts by health."""

    model: str
    tiles: list[Tile] = field(default_factory=list)
    gpus: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HEALTH_ORDER, 0))
    nodes: int = 0


@dataclass(frozen=True)
class FleetPage:
    groups: list[Group]
    shown: int
    total: int
    gpus: dict[str, int]
    marked: int
    models: list[str]
    compact: bool


def _wanted(node: NodeStatus, query: str, state: str) -> bool:
    if query and query not in node.name:
        return False
    if state == "attention":
        return bool(node.attention)
    if state == "marked":
        return bool(marks_of(node))
    if state in HEALTH_ORDER:
        return node.health == state
    return True


def fleet_page(
    nodes: Iterable[NodeStatus],
    models: Mapping[str, str],
    *,
    query: str = "",
    state: str = "all",
    model: str = "",
    detail_limit: int = 1000,
) -> FleetPage:
    """The fleet grouped by GPU model, filtered; nodes needing a look first in each group.

    Past `detail_limit` nodes shown, quiet nodes are one cell (their worst health), so a
    fleet of thousands stays one light page; nodes needing a look keep a cell per GPU."""
    every = list(nodes)
    totals = dict.fromkeys(HEALTH_ORDER, 0)
    physical = {n.name: physical_gpus(n.gpus) for n in every}  # MIG instances inside
    for n in every:
        for gpu in physical[n.name]:
            totals[gpu.state] = totals.get(gpu.state, 0) + 1
    query = query.strip().lower()
    picked = [
        n
        for n in every
        if _wanted(n, query, state) and (not model or models.get(n.name, "unknown") == model)
    ]
    compact = len(picked) > detail_limit
    groups: dict[str, Group] = {}
    for n in sorted(picked, key=lambda n: (n.rank, n.name)):
        g = groups.setdefault(models.get(n.name, "unknown"), Group(models.get(n.name, "unknown")))
        g.nodes += 1
        for gpu in physical[n.name]:
            g.gpus[gpu.state] = g.gpus.get(gpu.state, 0) + 1
        g.tiles.append(
            Tile(
                name=n.name,
                health=n.health,
                gpus=physical[n.name],
                marks=marks_of(n),
                attention=n.attention,
                detailed=not compact or bool(n.attention),
            )
        )
    return FleetPage(
        groups=[groups[k] for k in sorted(groups)],
        shown=len(picked),
        total=len(every),
        gpus=totals,
        marked=sum(1 for n in every if marks_of(n)),
        models=sorted({models.get(n.name, "unknown") for n in every}),
        compact=compact,
    )


@dataclass(frozen=True)
class ActionFilter:
    action: str = ""
    outcome: str = ""
    actor: str = ""
    text: str = ""

    def admits(self, r: Remediation) -> bool:
        if self.action and r.action != self.action:
            return False
        if self.outcome and r.outcome.value != self.outcome:
            return False
        if self.actor and self.actor not in r.actor:
            return False
        text = self.text.lower()
        return not text or text in r.target.key().lower() or text in r.reason.lower()


def filtered_actions(
    actions: Iterable[tuple[datetime, Remediation]], f: ActionFilter, limit: int
) -> list[tuple[datetime, Remediation]]:
    out = []
    for at, r in actions:
        if f.admits(r):
            out.append((at, r))
            if len(out) >= limit:
                break
    return out


def choices(actions: Iterable[tuple[datetime, Remediation]]) -> tuple[list[str], list[str]]:
    """The actions and outcomes present, for the filter's menus."""
    seen = list(actions)
    return sorted({r.action for _, r in seen}), sorted({r.outcome.value for _, r in seen})


def sessions(nodes: Iterable[NodeStatus]) -> list[Any]:
    """Every session the culler watches, warned ones first, soonest deadline first."""
    rank = {"warned": 0, "watched": 1, "stopped": 2}
    every = [s for n in nodes for s in n.part("sessions") or []]
    return sorted(
        every, key=lambda s: (rank[s.state], s.deadline.timestamp() if s.deadline else 0, s.pod)
    )


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    width: float
    text: str
    y: int


def bars(items: Sequence[tuple[str, float]], *, unit: str, width: float = 320.0) -> list[Bar]:
    """Horizontal bars for an inline SVG chart, largest first (no script, no library)."""
    top = max((v for _, v in items), default=0.0) or 1.0
    ordered = sorted(items, key=lambda kv: (-kv[1], kv[0]))
    return [
        Bar(label, value, round(width * value / top, 1), f"{value:,.1f} {unit}", 22 * i)
        for i, (label, value) in enumerate(ordered)
    ]


# -- the node page -------------------------------------------------------------------------

TOOK = (Outcome.APPLIED, Outcome.DRY_RUN)
SLACK = timedelta(seconds=5)
"""How much earlier than its quarantine's start an escalation may be dated (two services'
clocks) and still be that quarantine's."""


@dataclass(frozen=True)
class Escalation:
    """Recovery gave a node up to a human: when, why, and what the operator does next."""

    at: datetime
    why: str
    rma: bool
    gpus: list[str]
    incident: str
    dry_run: bool

    def release(self, node: str) -> str:
        """The command that ends it, as it works when typed (`--reason` is required)."""
        done = f"GPU {', '.join(self.gpus)} replaced" if self.rma and self.gpus else "fixed"
        return f'nodeward quarantine release {node} --reason "{done}"'


def _why(node: str, reason: str) -> str:
    """The escalation's reason without what the banner says around it (the node needing a
    human, the release command); the whole reason where it is worded otherwise."""
    tail = f"; the node stays quarantined until an operator releases it ({release_command(node)})"
    return reason.removeprefix(f"{node} needs a human: ").removesuffix(tail)


def escalation(
    node: NodeStatus, actions: Iterable[tuple[datetime, Remediation]]
) -> Escalation | None:
    """The escalation holding `node` now, from the audit trail (newest first): recovery's
    newest `escalate` of the quarantine the node is still under, with no recovery started
    or release applied since. None when the node is not quarantined (an operator released
    it), or its quarantine is a later one.

    An escalation older than the audit records kept is read from the node's recovery
    record (the node's `recovery` part)."""
    q = node.part("quarantine")
    if q is None:
        return None
    held = {m.incident for m in node.marks if m.owner == "quarantine" and m.incident}
    for at, r in actions:
        if r.target.kind.lower() != "node" or r.target.name != node.name:
            continue
        if r.outcome in TOOK and r.action in ("recover", "release"):
            return None  # a recovery started, or the quarantine released, after it
        if r.action != "escalate" or r.outcome not in TOOK:
            continue
        incident = str(r.details.get("incident") or "")
        if (held and incident and incident not in held) or (not held and at < q.since - SLACK):
            return None  # an earlier quarantine's
        rma = r.details.get("rma")
        return Escalation(
            at=at,
            why=_why(node.name, r.reason),
            rma=bool(rma) if rma is not None else "RMA suggested" in r.reason,
            gpus=list(q.gpus),
            incident=incident,
            dry_run=r.outcome == Outcome.DRY_RUN,
        )
    return _recorded(node, held)


def _recorded(node: NodeStatus, held: set[str]) -> Escalation | None:
    """The escalation the node's recovery record says it is under (older than the audit
    records kept, or from before the console started)."""
    r, q = node.part("recovery"), node.part("quarantine")
    if q is None or r is None or not r.escalated or (held and r.incident not in held):
        return None
    return Escalation(
        at=r.since,
        why=r.why,
        rma="RMA suggested" in r.why,
        gpus=list(q.gpus),
        incident=r.incident,
        dry_run=q.dry_run,
    )


@dataclass(frozen=True)
class GpuRow:
    """One GPU (or MIG instance) of the node page: its state and why, the pods holding it
    as the bus last named them, and when its state was last observed."""

    key: str
    state: str
    why: list[str]
    pods: list[str]
    pods_at: datetime | None
    observed_at: datetime | None


def _keys_of(xid: GpuXid, keys: Iterable[str]) -> list[str]:
    """The node's GPU keys an XID is about: its GPU, or its MIG instance's."""
    if xid.gpu_instance_id is None:
        return [k for k in keys if k == str(xid.gpu_index)]
    return [k for k in keys if k.startswith(f"{xid.gpu_index}-mig{xid.gpu_instance_id}-")]


def gpu_rows(
    node: NodeStatus,
    health: Mapping[str, GpuHealth | GpuSeen],
    changes: Iterable[GpuHealth],
    xids: Iterable[GpuXid],
) -> list[GpuRow]:
    """The node's GPUs in order, each with the pods its newest word on the bus names: its
    last change (`gpu.health`) or its last XID (`gpu.xid`), whichever is newer. A heartbeat
    names no pods, so a GPU's state restated by one (`health`) keeps the pods of its change."""
    said: dict[str, tuple[datetime, list[str]]] = {}

    def take(key: str, at: datetime, pods: Iterable[Any]) -> None:
        if key not in said or at > said[key][0]:
            said[key] = (at, [f"{p.namespace}/{p.name}" for p in pods])

    for key, h in health.items():
        if h.pods or (isinstance(h, GpuHealth) and not h.heartbeat):
            take(key, h.observed_at, h.pods)
    for c in changes:
        if c.gpu_key() in node.gpus and (c.pods or not c.heartbeat):
            take(c.gpu_key(), c.observed_at, c.pods)
    for x in xids:
        for key in _keys_of(x, node.gpus):
            take(key, x.observed_at, x.pods)
    rows = []
    for key, state in node.gpus.items():
        last = health.get(key)
        at, pods = said.get(key, (None, []))
        rows.append(
            GpuRow(
                key=key,
                state=state,
                why=[r.message for r in last.reasons] if last else [],
                pods=pods,
                pods_at=at,
                observed_at=last.observed_at if last else None,
            )
        )
    return rows


# -- trends --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """One line under a trend: what the history holds, or why part of it is not drawn."""

    text: str
    warn: bool = False


@dataclass(frozen=True)
class TrendView:
    """A page's trend over its range: the range chosen, its charts, and the notes."""

    rng: Range
    charts: list[Chart]
    notes: list[Note]
    summary: str = ""
    ranges: tuple[Range, ...] = RANGES


def _utc(t: float, rng: Range) -> str:
    pattern = "%H:%M UTC" if rng.name == "1h" else "%a %d %b %H:%M UTC"
    return datetime.fromtimestamp(t, UTC).strftime(pattern)


def trend_notes(held: Held, charts: Sequence[Chart], now: float) -> list[Note]:
    """What the history behind `charts` holds: each stream's retention (and where it is
    shorter than the range, that nothing before it is drawn), where the drawn history
    begins, a first read limited to the newest messages, a read under way or failed."""
    rng = held.rng
    first, _ = rng.window(now)
    start = rng.start(first)
    notes: list[Note] = []
    for stream, kept in held.kept.items():
        if kept is None:
            notes.append(Note(f"No stream {stream} on this server: nothing to draw from it.", True))
        elif kept.max_age_s and kept.max_age_s < rng.seconds:
            notes.append(
                Note(
                    f"history kept: {duration_words(kept.max_age_s)} (stream {stream}), shorter "
                    f"than the {rng.label}: nothing before {_utc(now - kept.max_age_s, rng)} "
                    "is drawn.",
                    True,
                )
            )
        else:
            kept_for = duration_words(kept.max_age_s) if kept.max_age_s else "without a limit"
            notes.append(Note(f"history kept: {kept_for} (stream {stream})."))
    for stream, since in held.limited.items():
        notes.append(
            Note(
                f"Only the newest messages of {stream} were read "
                f"(services.console.trend_messages): nothing before "
                f"{_utc(since.timestamp(), rng)} is drawn.",
                True,
            )
        )
    drawn = [d.at for c in charts for line in c.lines for d in line.dots]
    if drawn:
        begins = datetime.fromisoformat(min(drawn)).timestamp()
        if begins > start + rng.width:
            notes.append(
                Note(
                    f"history from {_utc(begins, rng)}: {duration_words(now - begins)} of the "
                    f"{rng.label}; nothing was stored before."
                )
            )
    elif held.read_at is not None:
        notes.append(Note(f"Nothing stored in the {rng.label}."))
    if held.reading:
        notes.append(Note("Reading the stored history: reload for the rest."))
    if held.error:
        notes.append(Note(f"The last read failed ({held.error}); a later view reads again.", True))
    if held.read_at is not None:
        notes.append(
            Note(
                f"Read {held.read_at:%H:%M:%S} UTC; read again after "
                f"{duration_words(rng.width)} (one point)."
            )
        )
    return notes


def energy_trend(held: Held, now: float) -> TrendView:
    """Fleet power (W) and CO2e (g per bucket) over the range, and their totals."""
    rng = held.rng
    window = rng.window(now)
    trend = held.trend
    assert isinstance(trend, EnergyTrend)
    points = trend.points(window)
    charts = [
        line_chart(
            "power",
            "Fleet power",
            "W",
            rng=rng,
            first=window[0],
            series=[("power", "s1", [p.power_w for p in points])],
        ),
        line_chart(
            "co2e",
            f"CO2e per {duration_words(rng.width)}",
            "g",
            rng=rng,
            first=window[0],
            series=[("CO2e", "s2", [p.co2e_g for p in points])],
        ),
    ]
    kwh = trend.joules(window) / 3.6e6
    grams = sum(p.co2e_g or 0.0 for p in points)
    summary = f"Over the {rng.label}: {kwh:,.2f} kWh reported, {grams / 1000:,.3f} kg CO2e."
    return TrendView(rng, charts, trend_notes(held, charts, now), summary)


def capacity_trend(held: Held, now: float) -> TrendView:
    """Free, used and quarantined GPUs of each model and profile over the range."""
    rng = held.rng
    window = rng.window(now)
    trend = held.trend
    assert isinstance(trend, CapacityTrend)
    charts = []
    for k, ((model, profile), line) in enumerate(trend.points(window).items()):
        whole = profile == WHOLE_GPU
        charts.append(
            line_chart(
                f"capacity-{k}",
                model if whole else f"{model} · {profile}",
                "GPUs" if whole else "MIG slices",
                rng=rng,
                first=window[0],
                series=[
                    (state, css, [getattr(g, state) if g else None for g in line])
                    for state, css in (("free", "s1"), ("used", "s3"), ("quarantined", "s4"))
                ],
                whole=True,
                steps=True,
            )
        )
    return TrendView(rng, charts, trend_notes(held, charts, now))


def sessions_trend(held: Held, now: float) -> TrendView:
    """Sessions active, idle and warned over the range."""
    rng = held.rng
    window = rng.window(now)
    trend = held.trend
    assert isinstance(trend, SessionTrend)
    points = trend.points(now, window)
    charts = [
        line_chart(
            "sessions",
            "Sessions",
            "sessions",
            rng=rng,
            first=window[0],
            series=[
                (name, css, [getattr(p, name) if p else None for p in points])
                for name, css in (("active", "s1"), ("idle", "s3"), ("warned", "s4"))
            ],
            whole=True,
        )
    ]
    return TrendView(rng, charts, trend_notes(held, charts, now))
