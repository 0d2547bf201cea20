"""What `nodeward report` shows: the accounting rollups summed per namespace, owner, node,
GPU model, group or experiment over whole hours, with the time no energy reading covers
shown as a gap. Group and experiment are the namespace's as the directory service keeps them
on it (`schemas.directory.NamespaceOwner`: its labels `nodeward.io/group` and
`nodeward.io/experiment`, read when the report runs); a namespace without one is charged to
`(unknown)`.

Pure: it takes the records `services.accounting` keeps (`services/accounting/state.py`);
`services.accounting.show` reads them and prints this.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from schemas.directory import NamespaceOwner
from services.accounting.state import HOUR, NO_NODE, IdlePeriod, NodeHour, UsageCell, hour_of

By = Literal["namespace", "owner", "node", "model", "group", "experiment"]
BY: tuple[By, ...] = ("namespace", "owner", "node", "model", "group", "experiment")
BY_DIRECTORY: tuple[By, ...] = ("group", "experiment")
"""what is charged by the namespaces' directory labels (read from the cluster)"""
UNKNOWN = "(unknown)"
"""the group or experiment of a namespace the directory has not labelled (or is gone)"""
J_PER_KWH = 3_600_000.0
SILENT_AFTER = timedelta(minutes=3)
"""A node whose last interval ended longer ago than this is silent: the time since is a gap."""


def gap_tolerance(span_s: float) -> float:
    """Gaps this small are rounding between intervals, not missing readings."""
    return max(2.0, 0.01 * span_s)


@dataclass(frozen=True)
class Window:
    """Whole UTC hours: from the hour `since` falls in to the end of the hour `until`
    falls in (an hour still in progress counts up to now)."""

    start: datetime
    end: datetime

    @classmethod
    def of(cls, since: datetime, until: datetime) -> Window:
        end = hour_of(until)
        return cls(hour_of(since), end if end == until else end + HOUR)

    def hours(self) -> list[datetime]:
        out, hour = [], self.start
        while hour < self.end:
            out.append(hour)
            hour += HOUR
        return out


@dataclass
class Row:
    key: str
    energy_j: float = 0.0
    cpu_energy_j: float = 0.0
    gpu_energy_j: float = 0.0
    co2e_g: float = 0.0
    carbon_energy_j: float = 0.0
    carbon: set[str] = field(default_factory=set)
    gpu_s: float = 0.0
    gpu_unknown_j: float = 0.0
    idle_gpu_s: float = 0.0
    util_gpu_s: float = 0.0
    """GPU-seconds whose utilisation is known (measured, else a session cell's samples)."""
    util_weighted: float = 0.0
    """Sum of GPU-seconds x mean utilisation (%) over those cells."""
    util_gpu_energy_j: float = 0.0
    warned: int = 0
    stopped: int = 0
    pods: set[str] = field(default_factory=set)
    gap_s: float = 0.0
    silent_since: datetime | None = None
    measured: NodeHour | None = None
    """By node: what the node itself measured in the window (all its energy, pods or not),
    which the row's energy and CO2e are; its pods' share is `attributed_kwh`."""

    def add_measured(self, hour: NodeHour) -> None:
        m = self.measured
        self.measured = (
            hour
            if m is None
            else m.model_copy(
                update={
                    "energy_j": m.energy_j + hour.energy_j,
                    "co2e_g": m.co2e_g + hour.co2e_g,
                    "carbon_energy_j": m.carbon_energy_j + hour.carbon_energy_j,
                }
            )
        )

    @property
    def total_j(self) -> float:
        """The row's energy: the node's measurement by node, else its pods' attributed sum."""
        return self.measured.energy_j if self.measured is not None else self.energy_j

    def add(self, cell: UsageCell) -> None:
        self.energy_j += cell.energy_j
        self.cpu_energy_j += cell.cpu_energy_j
        self.gpu_energy_j += cell.gpu_energy_j
        self.co2e_g += cell.co2e_g
        self.carbon_energy_j += cell.carbon_energy_j
        self.carbon.update(cell.carbon)
        self.gpu_s += cell.gpu_s
        self.gpu_unknown_j += cell.gpu_unknown_j
        self.warned += cell.warned
        self.stopped += cell.stopped
        if cell.energy_j or cell.util_samples or cell.gpu_s:
            self.pods.add(f"{cell.namespace}/{cell.pod}")
        if cell.gpu_util_s > 0:  # measured by the energy agent over the intervals
            self.util_gpu_s += cell.gpu_util_s
            self.util_weighted += 100 * cell.gpu_busy_s
            measured = min(cell.gpu_util_s / cell.gpu_s, 1.0) if cell.gpu_s else 1.0
            self.util_gpu_energy_j += cell.gpu_energy_j * measured
        elif cell.util_samples and cell.gpu_s:  # a session's samples (the idleness agent's)
            self.util_gpu_s += cell.gpu_s
            self.util_weighted += cell.gpu_s * cell.util_sum / cell.util_samples
            self.util_gpu_energy_j += cell.gpu_energy_j

    def columns(self) -> dict[str, Any]:
        """One CSV/JSON row; None where a figure is unknown (not zero)."""
        kwh = self.total_j / J_PER_KWH
        gpu_h = self.gpu_s / 3600
        util = self.util_weighted / self.util_gpu_s if self.util_gpu_s else None
        busy_h = self.util_weighted / 100 / 3600
        co2e_g, carbon_j = self.co2e_g, self.carbon_energy_j
        if self.measured is not None:
            co2e_g, carbon_j = self.measured.co2e_g, self.measured.carbon_energy_j
        carbon_kwh = carbon_j / J_PER_KWH
        return {
            "energy_kwh": round(kwh, 6),
            "attributed_kwh": round(self.energy_j / J_PER_KWH, 6),
            "gpu_energy_kwh": round(self.gpu_energy_j / J_PER_KWH, 6),
            "cpu_energy_kwh": round(self.cpu_energy_j / J_PER_KWH, 6),
            "co2e_kg": round(co2e_g / 1000, 6) if carbon_kwh else None,
            "intensity_g_per_kwh": round(co2e_g / carbon_kwh, 3) if carbon_kwh else None,
            "carbon_source": ";".join(sorted(self.carbon)),
            "gpu_hours": round(gpu_h, 6),
            "idle_gpu_hours": round(self.idle_gpu_s / 3600, 6),
            "sessions_warned": self.warned,
            "sessions_stopped": self.stopped,
            "pods": len(self.pods),
            "gpu_util_pct": round(util, 2) if util is not None else None,
            "gpu_kwh_per_gpu_hour": (
                round(self.gpu_energy_j / J_PER_KWH / gpu_h, 6) if gpu_h else None
            ),
            "gpu_kwh_per_busy_gpu_hour": (
                round(self.util_gpu_energy_j / J_PER_KWH / busy_h, 6) if busy_h else None
            ),
            "gap_s": round(self.gap_s, 1),
            "complete": self.gap_s == 0,
        }


COLUMNS = (
    "energy_kwh",
    "gpu_energy_kwh",
    "cpu_energy_kwh",
    "co2e_kg",
    "intensity_g_per_kwh",
    "carbon_source",
    "gpu_hours",
    "idle_gpu_hours",
    "sessions_warned",
    "sessions_stopped",
    "pods",
    "attributed_kwh",
    "gpu_util_pct",
    "gpu_kwh_per_gpu_hour",
    "gpu_kwh_per_busy_gpu_hour",
    "gap_s",
    "complete",
)


def _key(by: By, cell: UsageCell | IdlePeriod, owners: Mapping[str, NamespaceOwner]) -> str:
    if by == "namespace":
        return cell.namespace
    if by in BY_DIRECTORY:
        found = owners.get(cell.namespace)
        value = None if found is None else (found.group if by == "group" else found.experiment)
        return value or UNKNOWN
    if by == "owner":
        return cell.owner
    if by == "node":
        return "unknown" if cell.node == NO_NODE else cell.node
    return cell.model or "unknown"


@dataclass(frozen=True)
class NodeSpan:
    """When a node's energy agent was heard, from all its hourly records."""

    first: datetime
    last_end: datetime


def node_spans(hours: Iterable[NodeHour]) -> dict[str, NodeSpan]:
    spans: dict[str, NodeSpan] = {}
    for h in hours:
        s = spans.get(h.node)
        spans[h.node] = (
            NodeSpan(h.first_start, h.last_end)
            if s is None
            else NodeSpan(min(s.first, h.first_start), max(s.last_end, h.last_end))
        )
    return spans


def hour_gap(
    node: str,
    hour: datetime,
    *,
    covered: dict[tuple[str, datetime], NodeHour],
    spans: dict[str, NodeSpan],
    window: Window,
    now: datetime,
) -> float:
    """Seconds of `hour` (within the window, since the node was first heard) that no energy
    reading of `node` covers; a node silent for longer than SILENT_AFTER counts to now."""
    span = spans.get(node)
    if span is None:
        return 0.0
    start = max(hour, span.first, window.start)
    stop = min(hour + HOUR, window.end, now)
    if now - span.last_end <= SILENT_AFTER:
        stop = min(stop, span.last_end)
    seconds = (stop - start).total_seconds()
    if seconds <= 0:
        return 0.0
    rec = covered.get((node, hour))
    gap = seconds - (rec.covered_s if rec else 0.0)
    return gap if gap > gap_tolerance(seconds) else 0.0


def build(
    by: By,
    window: Window,
    cells: Iterable[UsageCell],
    hours: Iterable[NodeHour],
    periods: Iterable[IdlePeriod],
    *,
    now: datetime | None = None,
    owners: Mapping[str, NamespaceOwner] | None = None,
) -> list[Row]:
    """The report's rows, sorted by energy (most first). `owners`: each namespace's owner
    as the directory labelled it, for `group` and `experiment`."""
    now = now or datetime.now(UTC)
    owners = owners or {}
    all_hours = list(hours)
    spans = node_spans(all_hours)
    covered = {(h.node, h.hour): h for h in all_hours}
    rows: dict[str, Row] = {}
    touched: dict[str, set[tuple[str, datetime]]] = {}
    for cell in cells:
        if not window.start <= cell.hour < window.end:
            continue
        key = _key(by, cell, owners)
        rows.setdefault(key, Row(key)).add(cell)
        if cell.node != NO_NODE and (cell.energy_j or cell.gpu_s):
            touched.setdefault(key, set()).add((cell.node, cell.hour))
    for period in periods:
        idle = period.idle_gpu_s(window.start, window.end)
        if idle > 0:
            key = _key(by, period, owners)
            rows.setdefault(key, Row(key)).idle_gpu_s += idle
    if by == "node":
        # What each node measured in the window, pods or not.
        for h in all_hours:
            if window.start <= h.hour < window.end:
                rows.setdefault(h.node, Row(h.node)).add_measured(h)
        # Every node heard before the window's end, each of its hours in the window.
        for node, span in spans.items():
            if span.first >= window.end:
                continue
            row = rows.setdefault(node, Row(node))
            touched.setdefault(node, set()).update(
                (node, hour) for hour in window.hours() if hour + HOUR > span.first
            )
            if now - span.last_end > SILENT_AFTER and span.last_end < window.end:
                row.silent_since = span.last_end
    for key, pairs in touched.items():
        rows[key].gap_s = sum(
            hour_gap(n, h, covered=covered, spans=spans, window=window, now=now) for n, h in pairs
        )
    return sorted(rows.values(), key=lambda r: (-r.total_j, r.key))


def to_csv(by: By, rows: Sequence[Row]) -> str:
    """Header row with units in the names, one row per key; unknown figures left empty."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([by, *COLUMNS])
    for row in rows:
        cols = row.columns()
        writer.writerow([row.key, *("" if cols[c] is None else cols[c] for c in COLUMNS)])
    return out.getvalue()


def to_json(by: By, window: Window, rows: Sequence[Row]) -> str:
    return json.dumps(
        {
            "by": by,
            "from": window.start.isoformat(),
            "until": window.end.isoformat(),
            "rows": [
                {
                    by: r.key,
                    **r.columns(),
                    "silent_since": r.silent_since.isoformat() if r.silent_since else None,
                }
                for r in rows
            ],
        },
        default=str,
    )


def gap_text(row: Row) -> str:
    if row.silent_since is not None:
        return f"silent since {row.silent_since:%Y-%m-%d %H:%M} UTC"
    if not row.gap_s:
        return ""
    minutes = row.gap_s / 60
    return f"{minutes:.0f} min unmeasured" if minutes >= 1 else f"{row.gap_s:.0f} s unmeasured"
