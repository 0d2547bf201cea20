"""What each view shows, from the console's picture: pure, so it is tested without a server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from nodeward.fleet_status import HEALTH_ORDER, NodeStatus, SessionView, worst
from schemas.remediation import Remediation
from services.console.live import marks_of

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


def sessions(nodes: Iterable[NodeStatus]) -> list[SessionView]:
    """Every session the culler watches, warned ones first, soonest deadline first."""
    rank = {"warned": 0, "watched": 1, "stopped": 2}
    every = [s for n in nodes for s in n.sessions]
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
