"""Line charts over time as inline SVG geometry: drawn on the server, no script, no library.

Pure: `line_chart` turns the points of a trend (one value or None per bucket) into what
`templates/_trend.html` draws: the plot's lines (one polyline per run of known values; a
bucket with no value is a gap, never a zero), one dot per point with its time and value,
the time axis in UTC and the value axis in the chart's unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from services.console.trends import Range

WIDTH, HEIGHT = 640, 230
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40
"""The plot's margins inside the SVG: the value axis left, the time axis below, the legend
above."""

TICKS = 4
"""Value axis intervals."""

TIME_STEP = {"1h": 600, "1d": 4 * 3600, "1w": 86400}
"""Seconds between the time axis' labels per range (ten minutes, four hours, a day)."""


@dataclass(frozen=True)
class Dot:
    """One point: where it is drawn, its bucket's start (ISO 8601, UTC) and its value."""

    x: float
    y: float
    at: str
    value: float
    text: str


@dataclass(frozen=True)
class Line:
    """One series: its name, its CSS class, its polylines (runs of known values), its dots,
    and its newest value as text (the unit is the chart's)."""

    name: str
    css: str
    paths: list[str]
    dots: list[Dot]
    last: str


@dataclass(frozen=True)
class Tick:
    at: float
    text: str


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    unit: str
    axis: str
    """What the time axis is: UTC, and how long each point's bucket is."""
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    lines: list[Line]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    top: int = TOP
    right: int = WIDTH - RIGHT
    bottom: int = HEIGHT - BOTTOM

    @property
    def empty(self) -> bool:
        return not any(line.dots for line in self.lines)


def duration_words(seconds: float) -> str:
    """`1 min`, `24 min`, `2 h 48 min`, `1 day`, `3 days 1 h` (past a day, no minutes)."""
    s = round(seconds)
    if s >= 86400:
        days, hours = divmod(s // 3600, 24)
        said = f"{days} day" + ("s" if days > 1 else "")
        return f"{said} {hours} h" if hours else said
    h, m = divmod(s // 60, 60)
    if h and m:
        return f"{h} h {m} min"
    return f"{h} h" if h else f"{m} min" if m else f"{s} s"


def nice_step(value: float, *, whole: bool) -> float:
    """The smallest of 1, 2, 2.5 and 5 times a power of ten that is at least `value`
    (2.5 left out, and at least 1, for whole numbers)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * power
        if whole and (m == 2.5 or step < 1):
            continue
        if step >= value * (1 - 1e-9):
            return step
    return 10 * power


def number(value: float, step: float) -> str:
    """A value as an axis or a tooltip says it, with the decimals `step` needs (2.5: one)."""
    decimals = next((d for d in range(7) if abs(round(step, d) - step) < 1e-9 * max(step, 1)), 6)
    return f"{value:,.{decimals}f}"


def _clock(rng: Range) -> Callable[[float], str]:
    pattern = "%a %d %b" if rng.name == "1w" else "%H:%M"
    return lambda t: datetime.fromtimestamp(t, UTC).strftime(pattern)


def _when(rng: Range, t: float) -> str:
    pattern = "%a %d %b %H:%M UTC" if rng.name != "1h" else "%H:%M UTC"
    return datetime.fromtimestamp(t, UTC).strftime(pattern)


def line_chart(
    chart_id: str,
    title: str,
    unit: str,
    *,
    rng: Range,
    first: int,
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    whole: bool = False,
    steps: bool = False,
) -> Chart:
    """A chart of `series` (name, CSS class, one value or None per bucket from `first`) over
    `rng`; `whole` when the values are counts (integer axis), `steps` when a value holds
    until the next (drawn level, then up or down, not sloped)."""
    count = max((len(values) for _, _, values in series), default=rng.points)
    known = [v for _, _, values in series for v in values if v is not None]
    step = nice_step(max(known, default=0.0) / TICKS, whole=whole)
    top = step * TICKS
    plot_w, plot_h = WIDTH - RIGHT - LEFT, HEIGHT - BOTTOM - TOP

    def x(k: int) -> float:
        return round(LEFT + plot_w * k / max(count - 1, 1), 1)

    def y(v: float) -> float:
        return round(HEIGHT - BOTTOM - plot_h * v / top, 1)

    lines = []
    for name, css, values in series:
        paths: list[str] = []
        run: list[str] = []
        dots: list[Dot] = []
        for k, v in enumerate(values):
            if v is None:
                if len(run) > 1:
                    paths.append(" ".join(run))
                run = []
                continue
            t = rng.start(first + k)
            said = number(v, 1 if whole else step / 10)
            dots.append(Dot(x(k), y(v), _iso(t), v, f"{name}: {said} {unit} at {_when(rng, t)}"))
            if steps and run:
                run.append(f"{x(k)},{run[-1].split(',')[1]}")
            run.append(f"{x(k)},{y(v)}")
        if len(run) > 1:
            paths.append(" ".join(run))
        last = number(dots[-1].value, 1 if whole else step / 10) if dots else "-"
        lines.append(Line(name, css, paths, dots, last))

    t0, t1 = rng.start(first), rng.start(first + count - 1)
    every = TIME_STEP.get(rng.name, rng.seconds // 6)
    label = _clock(rng)
    x_ticks = [
        Tick(round(LEFT + plot_w * (t - t0) / max(t1 - t0, 1), 1), label(t))
        for t in range(math.ceil(t0 / every) * every, math.floor(t1) + 1, every)
    ]
    y_ticks = [Tick(y(step * i), number(step * i, step)) for i in range(TICKS + 1)]
    axis = f"time (UTC) · one point per {duration_words(rng.width)}"
    return Chart(chart_id, title, unit, axis, x_ticks, y_ticks, lines)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
