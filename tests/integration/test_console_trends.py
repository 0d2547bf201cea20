"""The console's trends on a real nats-server: energy intervals, capacity changes, session
samples and the culler's warnings published into the real streams with explicit times (30
minutes, about 5 hours and 3 days ago), and the SVG of /energy, /capacity and /sessions
showing those points for the last hour, day and week; a bad range refused with a 400 in one
line; a hostile model name shown as text; a stream keeping less than the range said so."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import Settings
from schemas.base import make_event
from schemas.capacity import CapacityChanged, GpuCounts
from schemas.common import ObjectRef
from schemas.energy import CarbonBasis, CarbonIntensity, EnergyNode, Interval
from schemas.remediation import Outcome, Remediation
from schemas.session import ActivityState, SessionActivity, SessionKind
from services.console.service import Assembled, assemble
from services.console.trends import RANGES, EnergyTrend, Range, SessionTrend
from tests.conftest import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("console")]

H100 = "NVIDIA-H100-80GB-HBM3"
HOSTILE = "<script>window.pwned=1</script><img src=x onerror=alert(1)>"
HOUR, DAY, WEEK = RANGES


@dataclass
class Times:
    """When the history happened: M about 30 minutes ago (on a minute), H about 5 hours ago
    (at the start of a day's bucket), D about 3 days ago (at the start of a week's bucket);
    each a minute past its mark, so what happens in that minute stays in one bucket."""

    now: float
    m: float = 0.0
    h: float = 0.0
    d: float = 0.0

    def __post_init__(self) -> None:
        self.m = math.floor((self.now - 1800) / 60) * 60
        self.h = DAY.start(DAY.index(self.now - 5 * 3600))
        self.d = WEEK.start(WEEK.index(self.now - 3 * 86400))


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _iso(rng: Range, t: float) -> str:
    """The `data-at` of the bucket of `rng` holding `t`."""
    return rng.at(rng.index(t)).isoformat().replace("+00:00", "Z")


def _carbon(at: float) -> CarbonIntensity:
    return CarbonIntensity(
        g_per_kwh=100,
        zone="CH",
        provider="static",
        basis=CarbonBasis.LIFECYCLE,
        observed_at=_at(at),
    )


def _energy(node: str, start: float, joules: float, co2e: float | None) -> Any:
    data = EnergyNode(
        node=node,
        interval=Interval(start=_at(start), end=_at(start + 60)),
        readings=[],
        energy_j=joules,
        avg_power_w=joules / 60,
        covered_s=60,
        carbon=_carbon(start) if co2e is not None else None,
        co2e_g=co2e,
    )
    return make_event(data, source=f"agent/energy/{node}", time=_at(start + 60))


def _capacity(model: str, profile: str, at: float, now: GpuCounts, before: GpuCounts | None) -> Any:
    data = CapacityChanged(model=model, profile=profile, counts=now, previous=before)
    return make_event(data, source="service/capacity", time=_at(at))


def _sample(ns: str, pod: str, at: float, state: ActivityState) -> Any:
    data = SessionActivity(
        namespace=ns,
        pod=pod,
        node="gpu-node-01",
        kind=SessionKind.NOTEBOOK,
        state=state,
        idle_since=_at(at - 600) if state == ActivityState.IDLE else None,
        sampled_at=_at(at),
    )
    return make_event(data, source="agent/idle/gpu-node-01", time=_at(at))


def _culler(action: str, ns: str, pod: str, at: float, deadline: float) -> Any:
    data = Remediation(
        action=action,
        target=ObjectRef(kind="Pod", name=pod, namespace=ns, api_version="v1"),
        outcome=Outcome.APPLIED,
        reason=f"{action} {ns}/{pod}",
        actor="service/culler",
        details={"pod": f"{ns}/{pod}", "deadline": _at(deadline).isoformat()},
    )
    return make_event(data, source="service/culler", time=_at(at))


async def _publish_history(bus: Bus, t: Times) -> None:
    m, h, d = t.m, t.h, t.d
    events = [
        # energy: 1500 W and 3 g in M's minute, 2000 W and 4 g in H's, 500 W (no carbon) in D's
        _energy("gpu-a", m, 60_000, 2.0),
        _energy("gpu-b", m, 30_000, 1.0),
        _energy("gpu-a", h, 120_000, 4.0),
        _energy("gpu-a", d, 30_000, None),
        # capacity: 8 free at D, 6 free 2 used at H, 4 free 3 used 1 quarantined at M
        _capacity(H100, "gpu", d, GpuCounts(free=8), None),
        _capacity(H100, "gpu", h, GpuCounts(free=6, used=2), GpuCounts(free=8)),
        _capacity(
            H100, "gpu", m, GpuCounts(free=4, used=3, quarantined=1), GpuCounts(free=6, used=2)
        ),
        _capacity(HOSTILE, "1g.10gb", m, GpuCounts(free=1), None),
        # sessions: one active and one idle in M's minute, one idle in H's
        _sample("user-a", "nb-1", m + 10, ActivityState.ACTIVE),
        _sample("user-a", "nb-1", m + 40, ActivityState.ACTIVE),
        _sample("user-b", "nb-2", m + 20, ActivityState.IDLE),
        _sample("user-c", "nb-3", h + 10, ActivityState.IDLE),
        # warned: nb-2 from M on (its deadline ahead); nb-3 for half an hour at D
        _culler("warn", "user-b", "nb-2", m + 30, t.now + 3600),
        _culler("warn", "user-c", "nb-3", d + 60, d + 3600),
        _culler("stop", "user-c", "nb-3", d + 1800, d + 3600),
    ]
    await bus.publish_many(events, timeout=10)


class Svg(HTMLParser):
    """Each chart's series as drawn: figure id -> series -> [(data-at, data-value)]; and the
    notes under the trend."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, list[tuple[str, float]]]] = {}
        self.titles: dict[str, str] = {}
        self.notes: list[str] = []
        self._chart = ""
        self._series = ""
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and (a.get("id") or "").startswith("chart-"):
            self._chart = (a["id"] or "").removeprefix("chart-")
            self.charts[self._chart] = {}
        elif tag == "g" and a.get("data-series") is not None and self._chart:
            self._series = a["data-series"] or ""
            self.charts[self._chart][self._series] = []
        elif tag == "circle" and self._series:
            self.charts[self._chart][self._series].append(
                (a["data-at"] or "", float(a["data-value"] or "nan"))
            )
        elif tag == "figcaption" or (tag == "li" and self._in == "notes"):
            self._in = f"{self._in or ''}>{tag}"
        elif tag == "ul" and "notes" in (a.get("class") or ""):
            self._in = "notes"

    def handle_endtag(self, tag: str) -> None:
        if tag == "g":
            self._series = ""
        elif tag == "figure":
            self._chart = ""
        elif tag in ("figcaption", "li") and self._in:
            self._in = self._in.rsplit(">", 1)[0] or None
        elif tag == "ul":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in and self._in.endswith(">figcaption") and self._chart:
            self.titles[self._chart] = self.titles.get(self._chart, "") + data
        elif self._in == "notes>li":
            self.notes.append(data)


def _parse(html: str) -> Svg:
    svg = Svg()
    svg.feed(html)
    return svg


def _dots(series: list[tuple[str, float]]) -> dict[str, float]:
    return dict(series)


@dataclass
class Console:
    url: str
    client: httpx.AsyncClient
    assembled: Assembled
    pages: dict[str, str] = field(default_factory=dict)

    async def get(self, path: str) -> httpx.Response:
        return await self.client.get(self.url + path, timeout=30)

    async def drawn(self, path: str, ready: Any) -> Svg:
        """The page once `ready(svg)` holds (a read may still be under way at first)."""

        async def look() -> Svg | None:
            answer = await self.get(path)
            assert answer.status_code == 200, answer.text
            svg = _parse(answer.text)
            self.pages[path] = answer.text
            return svg if ready(svg) else None

        return await wait_for(look, timeout=30, interval=0.2, what=f"{path} drawn")  # type: ignore[no-any-return]


@pytest_asyncio.fixture
async def history(own_nats: EmbeddedNats, own_bus: Bus) -> AsyncIterator[tuple[Console, Times]]:
    t = Times(time.time())
    await _publish_history(own_bus, t)
    settings = Settings.model_validate(
        {"bus": {"url": own_nats.url, "provision": False}, "services": {"console": {"port": 0}}}
    )
    assembled = await assemble(settings)
    await assembled.daemon.start()
    try:
        await wait_for(assembled.live.ready.is_set, timeout=20, what="the console's first read")
        async with httpx.AsyncClient() as client:
            yield Console(assembled.console.url, client, assembled), t
    finally:
        await assembled.daemon.stop()


def _has(chart: str, series: str, n: int = 1) -> Any:
    return lambda svg: len(svg.charts.get(chart, {}).get(series, [])) >= n


async def test_energy_over_the_hour_day_and_week(history: tuple[Console, Times]) -> None:
    console, t = history
    svg = await console.drawn("energy", _has("power", "power"))  # the last hour by default
    assert _dots(svg.charts["power"]["power"]) == {_iso(HOUR, t.m): pytest.approx(1500.0)}
    assert _dots(svg.charts["co2e"]["CO2e"]) == {_iso(HOUR, t.m): pytest.approx(3.0)}
    assert " ".join(svg.titles["power"].split()) == "Fleet power (W, last hour)"
    assert "time (UTC) · one point per 1 min" in console.pages["energy"]
    assert any("history kept: 30 days (stream ENERGY)" in n for n in svg.notes), svg.notes

    svg = await console.drawn("energy?range=1d", _has("power", "power", 2))
    assert _dots(svg.charts["power"]["power"]) == {
        _iso(DAY, t.h): pytest.approx(2000.0),
        _iso(DAY, t.m): pytest.approx(1500.0),
    }
    assert _dots(svg.charts["co2e"]["CO2e"]) == {
        _iso(DAY, t.h): pytest.approx(4.0),
        _iso(DAY, t.m): pytest.approx(3.0),
    }
    assert "one point per 24 min" in console.pages["energy?range=1d"]

    svg = await console.drawn("energy?range=1w", _has("power", "power", 3))
    assert _dots(svg.charts["power"]["power"]) == {
        _iso(WEEK, t.d): pytest.approx(500.0),
        _iso(WEEK, t.h): pytest.approx(2000.0),
        _iso(WEEK, t.m): pytest.approx(1500.0),
    }
    # no carbon intensity at D: no CO2e drawn there, not a zero
    assert set(_dots(svg.charts["co2e"]["CO2e"])) == {_iso(WEEK, t.h), _iso(WEEK, t.m)}
    assert " ".join(svg.titles["co2e"].split()) == "CO2e per 2 h 48 min (g, last week)"


async def test_capacity_steps_per_model_and_a_hostile_name_as_text(
    history: tuple[Console, Times],
) -> None:
    console, t = history

    def h100(svg: Svg) -> dict[str, dict[str, float]]:
        chart = next(k for k, title in svg.titles.items() if title.startswith(H100))
        return {s: _dots(dots) for s, dots in svg.charts[chart].items()}

    def ready(svg: Svg) -> bool:
        return any(title.startswith(H100) for title in svg.titles.values())

    svg = await console.drawn("capacity", ready)
    got = h100(svg)
    first = HOUR.at(HOUR.window(t.now)[0]).isoformat().replace("+00:00", "Z")
    # before M: the counts of the change before the hour (H's); from M on, M's
    assert got["free"][first] == 6 and got["used"][first] == 2 and got["quarantined"][first] == 0
    at_m = _iso(HOUR, t.m)
    assert (got["free"][at_m], got["used"][at_m], got["quarantined"][at_m]) == (4, 3, 1)
    assert len(got["free"]) == HOUR.points
    page = console.pages["capacity"]
    assert "<script>window.pwned" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page  # the name, as text
    hostile = next(title for title in svg.titles.values() if "pwned" in title)
    assert hostile.startswith(HOSTILE + " · 1g.10gb")

    svg = await console.drawn("capacity?range=1d", ready)
    got = h100(svg)
    assert got["free"][_iso(DAY, t.h)] == 6 and got["free"][_iso(DAY, t.m)] == 4
    first = DAY.at(DAY.window(t.now)[0]).isoformat().replace("+00:00", "Z")
    assert got["free"][first] == 8  # D's counts held until H

    svg = await console.drawn("capacity?range=1w", ready)
    got = h100(svg)
    assert min(got["free"]) == _iso(WEEK, t.d)  # nothing drawn before the first change known
    assert got["free"][_iso(WEEK, t.d)] == 8
    assert got["free"][_iso(WEEK, t.h)] == 6 and got["free"][_iso(WEEK, t.m)] == 4
    assert len(got["free"]) == WEEK.window(t.now)[1] - WEEK.index(t.d) + 1


async def test_sessions_active_idle_and_warned(history: tuple[Console, Times]) -> None:
    console, t = history
    svg = await console.drawn("sessions", _has("sessions", "active", HOUR.points))
    got = {s: _dots(d) for s, d in svg.charts["sessions"].items()}
    at_m = _iso(HOUR, t.m)
    assert {k for k, v in got["active"].items() if v} == {at_m}
    assert got["active"][at_m] == 1 and got["idle"][at_m] == 1
    warned = [k for k, v in sorted(got["warned"].items()) if v]
    assert warned[0] == at_m and warned[-1] == max(got["warned"])  # from M to now
    assert all(v == 1 for v in got["warned"].values() if v)

    svg = await console.drawn("sessions?range=1d", _has("sessions", "idle", DAY.points))
    got = {s: _dots(d) for s, d in svg.charts["sessions"].items()}
    assert {k: v for k, v in got["idle"].items() if v} == {_iso(DAY, t.h): 1, _iso(DAY, t.m): 1}

    svg = await console.drawn("sessions?range=1w", _has("sessions", "warned"))
    got = {s: _dots(d) for s, d in svg.charts["sessions"].items()}
    assert min(got["warned"]) == _iso(WEEK, t.d)  # known from the first warning on, not zeros
    assert got["warned"][_iso(WEEK, t.d)] == 1  # nb-3, warned then stopped, at D
    assert got["warned"][_iso(WEEK, t.h)] == 0
    assert got["warned"][_iso(WEEK, t.m)] == 1
    assert {k: v for k, v in got["idle"].items() if v} == {_iso(WEEK, t.h): 1, _iso(WEEK, t.m): 1}


async def test_a_bad_range_is_refused_in_one_line(history: tuple[Console, Times]) -> None:
    console, _ = history
    for path in ("energy", "capacity", "sessions"):
        for bad in ("2h", "", "<script>x</script>"):
            answer = await console.get(f"{path}?range={bad}")
            assert answer.status_code == 400, (path, bad)
            assert answer.text == "400: range must be one of 1h, 1d, 1w\n"
            assert answer.headers["Content-Security-Policy"].startswith("default-src 'none'")


async def test_a_stream_keeping_less_than_the_range_says_so(
    own_bus: Bus, history: tuple[Console, Times]
) -> None:
    console, _ = history
    info = await own_bus.js.stream_info("CAPACITY")
    info.config.max_age = timedelta(days=1).total_seconds()
    await own_bus.js.update_stream(config=info.config)

    def warned(svg: Svg) -> bool:
        return any("history kept: 1 day (stream CAPACITY)" in n for n in svg.notes)

    svg = await console.drawn("capacity?range=1w", warned)
    note = next(n for n in svg.notes if "stream CAPACITY" in n)
    assert "shorter than the last week: nothing before" in note
    page = console.pages["capacity?range=1w"]
    assert '<li class="warn">history kept: 1 day (stream CAPACITY)' in page
    svg = await console.drawn("capacity?range=1d", lambda s: bool(s.notes))
    assert any(n.startswith("history kept: 1 day (stream CAPACITY).") for n in svg.notes)


async def _console(url: str, **console: Any) -> Assembled:
    settings = Settings.model_validate(
        {"bus": {"url": url, "provision": False}, "services": {"console": {"port": 0, **console}}}
    )
    assembled = await assemble(settings)
    await assembled.daemon.start()
    await wait_for(assembled.live.ready.is_set, timeout=20, what="the console's first read")
    return assembled


async def test_viewers_share_one_read_per_range_and_a_first_read_is_bounded(
    own_nats: EmbeddedNats, own_bus: Bus
) -> None:
    """Ten viewers at once make one read of the range (one count, one ordered consumer);
    views within a bucket width read nothing; a first read past `trend_messages` takes only
    the newest and says so."""
    t = Times(time.time())
    nodes = 150
    await own_bus.publish_many(
        [_energy(f"gpu-{i:03d}", t.m, 6_000, None) for i in range(nodes)], timeout=10
    )
    created: list[str] = []

    async def made(msg: Any) -> None:
        created.append(msg.subject)

    watch = await own_bus.nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.ENERGY.>", cb=made)
    assembled = await _console(own_nats.url, trend_messages=100)
    try:
        async with httpx.AsyncClient() as client:
            url = assembled.console.url + "energy?range=1d"
            await own_bus.nc.flush()
            before = len(created)
            answers = await asyncio.gather(*(client.get(url, timeout=30) for _ in range(10)))
            assert all(a.status_code == 200 for a in answers)
            svg = _parse(answers[0].text)
            # 100 of the 150 intervals read: 100 nodes at 100 W
            assert _dots(svg.charts["power"]["power"]) == {_iso(DAY, t.m): pytest.approx(10_000)}
            assert any(
                n.startswith("Only the newest messages of ENERGY were read") for n in svg.notes
            ), svg.notes
            await own_bus.nc.flush()
            assert len(created) - before == 2  # the count, and the ordered consumer
            again = await client.get(url, timeout=30)
            assert _dots(_parse(again.text).charts["power"]["power"]) == {
                _iso(DAY, t.m): pytest.approx(10_000)
            }
            await own_bus.nc.flush()
            assert len(created) - before == 2  # within a bucket width: nothing read
    finally:
        await watch.unsubscribe()
        await assembled.daemon.stop()


async def test_a_later_read_takes_only_what_was_stored_since(own_bus: Bus) -> None:
    """A read a bucket width later folds the new messages once, the old ones not again, and
    ends at once where nothing new matches (the audit trail's other records)."""
    from services.console.history import Trends
    from services.console.settings import ConsoleSettings

    t = Times(time.time())
    trends = Trends(own_bus.nc, ConsoleSettings())
    try:
        await own_bus.publish_many([_energy("gpu-a", t.m, 60_000, 1.0)], timeout=10)
        await own_bus.publish_many([_culler("warn", "ns", "nb", t.m, t.now + 3600)], timeout=10)
        energy = await trends.get("energy", HOUR)
        sessions = await trends.get("sessions", HOUR)
        assert isinstance(energy.trend, EnergyTrend) and isinstance(sessions.trend, SessionTrend)
        assert energy.trend.joules(HOUR.window(time.time())) == pytest.approx(60_000)
        assert list(sessions.trend.open) == ["ns/nb"]
        # new: one more interval, and audit records of other actions only
        other = _culler("quarantine", "ns", "other", t.m + 5, t.now)
        await own_bus.publish_many([_energy("gpu-b", t.m, 30_000, 1.0), other], timeout=10)
        began = time.monotonic()
        energy.due = sessions.due = 0.0  # a bucket width later
        assert await trends.get("energy", HOUR) is energy
        await trends.get("sessions", HOUR)
        assert time.monotonic() - began < 5  # no wait for a message that never comes
        assert energy.error is None and sessions.error is None
        assert energy.trend.joules(HOUR.window(time.time())) == pytest.approx(90_000)
        assert list(sessions.trend.open) == ["ns/nb"]  # the quarantine is no culler's warning
        # and nothing new: nothing read
        energy.due = 0.0
        await trends.get("energy", HOUR)
        assert energy.trend.joules(HOUR.window(time.time())) == pytest.approx(90_000)
    finally:
        await trends.stop()


async def test_under_its_nats_user_the_trends_are_read(tmp_path: Path) -> None:
    """The chart's console user (a reader) may count, read and delete what the trends need:
    every page draws its history, and no read fails."""
    from tests.helpers.console_user import console_user

    async with console_user(tmp_path, provision=False) as (writer, settings):
        t = Times(time.time())
        await _publish_history(writer, t)
        assembled = await assemble(settings)
        await assembled.daemon.start()
        try:
            async with httpx.AsyncClient() as client:
                console = Console(assembled.console.url, client, assembled)
                for path, chart, series in (
                    ("energy?range=1w", "power", "power"),
                    ("sessions?range=1d", "sessions", "idle"),
                ):
                    svg = await console.drawn(path, _has(chart, series))
                    assert not any("failed" in n for n in svg.notes), svg.notes
                svg = await console.drawn("capacity?range=1w", lambda s: len(s.charts) == 2)
                assert not any("failed" in n for n in svg.notes), svg.notes
        finally:
            await assembled.daemon.stop()
