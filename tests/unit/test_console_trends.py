"""The console's trends, pure: ranges and their buckets, an interval shared among buckets,
fleet power and CO2e, capacity steps, sessions counted once a bucket and the culler's
warnings, the notes under a chart, and the folds from stored events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.base import make_event
from schemas.capacity import CapacityChanged, GpuCounts
from schemas.cloudevents import encode
from schemas.common import ObjectRef
from schemas.energy import EnergyNode, Interval
from schemas.remediation import Outcome, Remediation
from services.console.charts import line_chart
from services.console.history import (
    Held,
    Kept,
    culler_fold,
    fold_capacity,
    fold_energy,
    session_of,
)
from services.console.pages import capacity_trend, energy_trend, sessions_trend, trend_notes
from services.console.trends import (
    RANGES,
    CapacityTrend,
    EnergyTrend,
    Gpus,
    RangeError,
    SessionTrend,
    range_named,
    spread,
)

HOUR, DAY, WEEK = RANGES
NOW = 1_800_000_000.0  # Fri 2027-01-15T08:00:00Z, on a minute
W1 = HOUR.window(NOW)


def test_the_ranges_and_their_buckets() -> None:
    assert [(r.name, r.width) for r in RANGES] == [("1h", 60), ("1d", 1440), ("1w", 10080)]
    assert range_named(None) is HOUR and range_named("1w") is WEEK
    for bad in ("", "2h", "1H", "1h "):
        with pytest.raises(RangeError, match=r"^range must be one of 1h, 1d, 1w$"):
            range_named(bad)
    first, last = HOUR.window(NOW + 30)
    assert last - first + 1 == 60 and HOUR.start(last) == NOW  # the last holds now
    assert HOUR.at(last) == datetime.fromtimestamp(NOW, UTC)
    assert DAY.window(NOW)[1] - DAY.window(NOW)[0] == 59


def test_an_interval_is_shared_among_the_buckets_it_overlaps() -> None:
    first, last = W1
    shares = dict(spread(NOW - 90, NOW - 30, HOUR, first, last))
    assert shares == {HOUR.index(NOW - 90): 0.5, HOUR.index(NOW - 60): 0.5}
    assert dict(spread(NOW - 60, NOW, HOUR, first, last)) == {HOUR.index(NOW - 60): 1.0}
    # the part outside the window counts for nothing; shares inside stay shares
    before = HOUR.start(first)
    assert dict(spread(before - 30, before + 30, HOUR, first, last)) == {first: 0.5}
    assert list(spread(NOW + 60, NOW + 120, HOUR, first, last)) == []


def test_fleet_power_is_the_energy_over_the_time_reported_in_each_bucket() -> None:
    trend = EnergyTrend(HOUR)
    m = NOW - 1800
    trend.add(m, m + 60, 60_000, 2.0, W1)  # node a: 1000 W
    trend.add(m, m + 60, 30_000, None, W1)  # node b: 500 W, no carbon intensity
    trend.add(m + 60, m + 90, 15_000, 1.0, W1)  # a half-minute reported in the next bucket
    trend.add(NOW - 30, NOW + 30, 60_000, 1.0, W1)  # the bucket under way: its half so far
    points = {p.at.timestamp(): p for p in trend.points(W1)}
    assert len(points) == 60
    assert points[m].power_w == pytest.approx(1500) and points[m].co2e_g == pytest.approx(2.0)
    assert points[m + 60].power_w == pytest.approx(500)  # over the 30 s reported, not 60
    assert points[NOW - 60].power_w == pytest.approx(1000)
    assert points[NOW].power_w == pytest.approx(1000)
    assert points[m - 60].power_w is None and points[m - 60].co2e_g is None  # a gap, not 0
    assert trend.joules(W1) == pytest.approx(60_000 + 30_000 + 15_000 + 60_000)
    trend.prune(HOUR.index(m) + 1)
    assert HOUR.index(m) not in trend.energy_j and HOUR.index(m) not in trend.spans


def test_capacity_holds_each_change_until_the_next() -> None:
    trend = CapacityTrend(HOUR)
    key = ("H100", "gpu")
    trend.add(NOW - 7200, key, Gpus(8, 0, 0), None, W1)  # before the window: it holds at its start
    trend.add(NOW - 1800, key, Gpus(6, 2, 0), Gpus(8, 0, 0), W1)
    trend.add(NOW - 1790, key, Gpus(5, 2, 1), Gpus(6, 2, 0), W1)  # same bucket: the newest wins
    trend.add(NOW + 600, key, Gpus(0, 0, 0), None, W1)  # after the window: not drawn
    line = trend.points(W1)[key]
    i = HOUR.index(NOW - 1800) - W1[0]
    assert line[:i] == [Gpus(8, 0, 0)] * i
    assert line[i:] == [Gpus(5, 2, 1)] * (60 - i)
    # a series whose first change says what was before it, with nothing older stored
    other = ("A100", "1g.10gb")
    trend.add(NOW - 600, other, Gpus(1, 0, 0), Gpus(3, 0, 0), W1)
    assert trend.points(W1)[other][0] == Gpus(3, 0, 0)
    # one with no `previous` and nothing before: not drawn until its first change
    new = ("L4", "gpu")
    trend.add(NOW - 600, new, Gpus(2, 0, 0), None, W1)
    assert trend.points(W1)[new][0] is None
    # as the window moves on, the change leaving it holds at the new start
    later = HOUR.window(NOW + 1800 + 60)
    trend.prune(later[0])
    assert trend.points(later)[key][0] == Gpus(5, 2, 1)


def test_a_session_counts_once_a_bucket_with_its_last_state() -> None:
    trend = SessionTrend(HOUR)
    m = NOW - 1800
    trend.sample("a/nb", m + 5, "active", W1)
    trend.sample("a/nb", m + 35, "idle", W1)  # the same bucket: counted once, as idle now
    trend.sample("a/nb", m + 20, "active", W1)  # older than the one counted: no change
    trend.sample("b/nb", m + 10, "active", W1)
    trend.sample("a/nb", m + 65, "idle", W1)
    points = {p.at.timestamp(): p for p in trend.points(NOW, W1) if p is not None}
    assert (points[m].active, points[m].idle) == (1, 1)
    assert (points[m + 60].active, points[m + 60].idle) == (0, 1)
    # before the first sample the history is not known: not drawn as zero
    assert trend.points(NOW, W1)[HOUR.index(m) - W1[0] - 1] is None
    assert points[NOW].active == 0  # known, and nobody sampled


def test_warned_from_the_warning_to_its_stop_cancel_or_deadline() -> None:
    trend = SessionTrend(HOUR)
    trend.covered(NOW - 3600)
    m = NOW - 1800
    trend.warn("a/nb", m, NOW + 3600)  # still pending: warned until now
    trend.warn("a/nb", m + 120, NOW + 3600)  # warned again while pending: once
    trend.warn("b/nb", m, m + 600)
    trend.end_warning("b/nb", m + 300, W1)  # stopped early
    trend.warn("c/nb", m, m + 120)  # no stop or cancel: ends at its deadline
    warned = {p.at.timestamp(): p.warned for p in trend.points(NOW, W1) if p is not None}
    assert warned[m] == 3 and warned[m + 60] == 3
    assert warned[m + 120] == 2  # c's deadline: warned up to it, not in the bucket it opens
    assert warned[m + 240] == 2 and warned[m + 300] == 1  # b stopped at m + 300
    assert warned[NOW] == 1 and warned[m - 60] == 0
    assert "c/nb" not in trend.open  # settled at its deadline
    # b warned again, from a bucket it was already counted in: counted there once
    trend.warn("b/nb", m + 250, m + 900)
    trend.end_warning("b/nb", m + 420, W1)
    warned = {p.at.timestamp(): p.warned for p in trend.points(NOW, W1) if p is not None}
    assert warned[m + 240] == 2 and warned[m + 300] == 2 and warned[m + 360] == 2
    assert warned[m + 420] == 1


def _held(source: str, trend: object, **kept: Kept | None) -> Held:
    held = Held(source, HOUR, trend)  # type: ignore[arg-type]
    held.kept = dict(kept)
    held.read_at = datetime.fromtimestamp(NOW, UTC)
    return held


def test_the_notes_say_what_is_kept_and_from_when() -> None:
    trend = EnergyTrend(WEEK)
    window = WEEK.window(NOW)
    trend.add(NOW - 3 * 86400, NOW - 3 * 86400 + 60, 60_000, 1.0, window)
    held = _held("energy", trend, ENERGY=Kept("ENERGY", 30 * 86400, None))
    held.rng = WEEK
    view = energy_trend(held, NOW)
    notes = [n.text for n in view.notes]
    assert notes[0] == "history kept: 30 days (stream ENERGY)."
    assert notes[1] == (
        "history from Tue 12 Jan 06:00 UTC: 3 days 2 h of the last week; nothing was stored before."
    )
    assert view.summary == "Over the last week: 0.02 kWh reported, 0.001 kg CO2e."

    held.kept = {"ENERGY": Kept("ENERGY", 6 * 3600, None), "GONE": None}
    held.limited = {"ENERGY": datetime.fromtimestamp(NOW - 3600, UTC)}
    held.error = "stream ENERGY: 12 messages read, then nothing for 10s"
    said = [(n.text, n.warn) for n in trend_notes(held, view.charts, NOW)]
    assert said[0] == (
        "history kept: 6 h (stream ENERGY), shorter than the last week: nothing before "
        "Fri 15 Jan 02:00 UTC is drawn.",
        True,
    )
    assert said[1] == ("No stream GONE on this server: nothing to draw from it.", True)
    assert said[2][0].startswith("Only the newest messages of ENERGY were read") and said[2][1]
    assert any(text.startswith("The last read failed (stream ENERGY:") for text, _ in said)

    empty = _held("energy", EnergyTrend(HOUR), ENERGY=Kept("ENERGY", 0, None))
    notes = [n.text for n in energy_trend(empty, NOW).notes]
    assert notes[:2] == [
        "history kept: without a limit (stream ENERGY).",
        "Nothing stored in the last hour.",
    ]


def test_the_pages_charts_per_trend() -> None:
    capacity = CapacityTrend(HOUR)
    capacity.add(NOW - 600, ("H100", "gpu"), Gpus(4, 3, 1), Gpus(6, 2, 0), W1)
    capacity.add(NOW - 600, ("A100", "1g.10gb"), Gpus(7, 0, 0), None, W1)
    charts = capacity_trend(_held("capacity", capacity), NOW).charts
    assert [(c.title, c.unit) for c in charts] == [
        ("A100 · 1g.10gb", "MIG slices"),
        ("H100", "GPUs"),
    ]
    assert [line.name for line in charts[1].lines] == ["free", "used", "quarantined"]
    assert charts[1].lines[0].last == "4"
    sessions = SessionTrend(HOUR)
    sessions.sample("a/nb", NOW - 100, "idle", W1)
    chart = sessions_trend(_held("sessions", sessions), NOW).charts[0]
    assert [(line.name, line.last) for line in chart.lines] == [
        ("active", "0"),
        ("idle", "0"),
        ("warned", "0"),
    ]
    assert chart.unit == "sessions" and [t.text for t in chart.y_ticks] == ["0", "1", "2", "3", "4"]


def _wire(data: Any, at: float) -> tuple[str, dict[str, str], bytes]:
    w = encode(make_event(data, source="test/x", time=datetime.fromtimestamp(at, UTC)))
    return w.subject, w.headers, w.body


def test_the_folds_read_what_the_bus_stores() -> None:
    energy = EnergyTrend(HOUR)
    start = datetime.fromtimestamp(NOW - 120, UTC)
    node = EnergyNode(
        node="gpu-a",
        interval=Interval(start=start, end=datetime.fromtimestamp(NOW - 60, UTC)),
        readings=[],
        energy_j=6000,
        co2e_g=0.5,
    )
    fold_energy(energy, *_wire(node, NOW - 60), W1)
    fold_energy(energy, "energy.node.x", None, b"not json", W1)  # skipped, not raised
    assert energy.points(W1)[-3].power_w == pytest.approx(100)

    capacity = CapacityTrend(HOUR)
    change = CapacityChanged(model="H100", profile="gpu", counts=GpuCounts(free=2, unhealthy=1))
    fold_capacity(capacity, *_wire(change, NOW - 30), W1)
    assert capacity.points(W1)[("H100", "gpu")][-1] == Gpus(2, 0, 0)

    sessions = SessionTrend(HOUR)
    fold = culler_fold("service/culler")

    def audit(
        action: str, actor: str = "service/culler", outcome: Outcome = Outcome.APPLIED
    ) -> Remediation:
        return Remediation(
            action=action,
            target=ObjectRef(kind="Notebook", name="nb", namespace="a"),
            outcome=outcome,
            reason="r",
            actor=actor,
            details={
                "pod": "a/nb-0",
                "deadline": datetime.fromtimestamp(NOW + 60, UTC).isoformat(),
            },
        )

    fold(sessions, *_wire(audit("warn", actor="service/other"), NOW - 300), W1)
    fold(sessions, *_wire(audit("warn", outcome=Outcome.REFUSED), NOW - 300), W1)
    assert sessions.open == {}
    fold(sessions, *_wire(audit("warn"), NOW - 300), W1)
    assert sessions.open == {"a/nb-0": (NOW - 300, NOW + 60)}
    fold(sessions, *_wire(audit("cancel"), NOW - 200), W1)
    assert sessions.open == {} and sum(sessions.warned.values()) == 2
    assert session_of(audit("stop").model_copy(update={"details": {}})) == "a/nb"


def test_a_chart_leaves_gaps_and_draws_steps() -> None:
    values: list[float | None] = [None] * 60
    values[10:13] = [1.0, 2.0, 2.0]
    values[20] = 4.0
    chart = line_chart(
        "x", "X", "GPUs", rng=HOUR, first=W1[0], series=[("free", "s1", values)], whole=True
    )
    line = chart.lines[0]
    assert len(line.dots) == 4 and len(line.paths) == 1  # the lone point is a dot, no line to 0
    assert line.last == "4"
    stepped = line_chart(
        "x",
        "X",
        "GPUs",
        rng=HOUR,
        first=W1[0],
        series=[("free", "s1", values)],
        whole=True,
        steps=True,
    )
    xs = stepped.lines[0].paths[0].split()
    assert len(xs) == 5 and xs[1].split(",")[1] == xs[0].split(",")[1]  # level, then up


def test_the_trend_is_drawn_escaped() -> None:
    from services.console.pages import Note, TrendView
    from services.console.web import environment

    hostile = "<script>alert(1)</script>"
    values: list[float | None] = [1.0] * 60
    chart = line_chart(
        "c", hostile, "GPUs", rng=HOUR, first=W1[0], series=[(hostile, "s1", values)], whole=True
    )
    view = TrendView(HOUR, [chart], [Note(f"history kept: {hostile}", True)])
    html = environment().get_template("_trend.html").render(trend=view)
    assert "<script>" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4  # title, legend, dots, note
    assert 'href="?range=1d"' in html and 'class="here" aria-current="page">last hour' in html
