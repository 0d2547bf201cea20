"""A static preview of the dashboards, fed by a real Prometheus's query API: one HTML page per
dashboard, each panel drawn as inline SVG from `query_range` (Grafana does not install here;
this is how docs/observability.md's pictures are made, and how the e2e test looks at them).

    python -m launch.observability.preview --prometheus URL --out DIR [--minutes 30]
"""

from __future__ import annotations

import argparse
import html
import json
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy/helm/nodeward/files/dashboards"
COLOURS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#96d98d")
VARIABLES = {"$namespace": ".+", "$__rate_interval": "1m"}


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[float, float]]


def _get(prometheus: str, path: str, **params: str) -> Any:
    url = f"{prometheus}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an HTTP URL: {prometheus}")
    with urllib.request.urlopen(url, timeout=30) as reply:  # noqa: S310 - http(s) only, above
        body = json.loads(reply.read())
    return body["data"]


def _legend(template: str, labels: dict[str, str], fallback: str) -> str:
    if not template:
        return (
            ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or fallback
        )
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return " ".join(out.replace("{{", "").replace("}}", "").split())


def fetch(prometheus: str, expr: str, legend: str, start: float, end: float) -> list[Series]:
    """The series `expr` gives over [start, end], about 120 points each."""
    span = max(end - start, 60.0)
    expr = expr.replace("$__range", f"{int(span)}s")
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    step = max(span / 120, 1.0)
    data = _get(
        prometheus, "query_range", query=expr, start=str(start), end=str(end), step=str(step)
    )
    return [
        Series(
            _legend(legend, r["metric"], expr),
            [(float(t), float(v)) for t, v in r["values"] if math.isfinite(float(v))],
        )
        for r in data["result"]
    ]


def fmt(value: float, unit: str) -> str:
    """`value` as Grafana shows it in `unit` (the units the dashboards use)."""
    units: dict[str, list[tuple[float, str]]] = {
        "watt": [(1e6, "MW"), (1e3, "kW"), (1, "W")],
        "kwatth": [(1e3, "MWh"), (1, "kWh"), (1e-3, "Wh")],
        "massg": [(1e3, "kg"), (1, "g")],
        "masskg": [(1e3, "t"), (1, "kg"), (1e-3, "g")],
        "bytes": [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (1, "B")],
        "decmbytes": [(1e6, "TB"), (1e3, "GB"), (1, "MB")],
        "s": [(3600, "h"), (60, "min"), (1, "s"), (1e-3, "ms")],
    }
    scaled = units.get(unit, [])
    if unit == "percent":
        return f"{value:.1f}%"
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    for factor, suffix in scaled:
        if abs(value) >= factor or factor == scaled[-1][0]:
            return f"{value / factor:.3g} {suffix}"
    return f"{value:.3g}"


def _chart(series: Sequence[Series], unit: str, start: float, end: float, stacked: bool) -> str:
    w, h, left, bottom = 560, 170, 70, 22
    stacked_series: list[Series] = []
    if stacked:  # each series drawn on top of those before it
        totals: dict[float, float] = {}
        for s in series:
            pts = []
            for t, v in s.points:
                totals[t] = totals.get(t, 0.0) + v
                pts.append((t, totals[t]))
            stacked_series.append(Series(s.name, pts))
        series = stacked_series
    values = [v for s in series for _, v in s.points] or [0.0]
    lo, hi = min(0.0, *values), max(values)
    hi = hi if hi > lo else lo + 1

    def x(t: float) -> float:
        return left + (t - start) / (end - start) * (w - left - 8)

    def y(v: float) -> float:
        return 6 + (1 - (v - lo) / (hi - lo)) * (h - bottom - 6)

    parts = [f'<svg viewBox="0 0 {w} {h}" width="100%" role="img">']
    for frac in (0, 0.5, 1):
        v = lo + frac * (hi - lo)
        parts.append(
            f'<line x1="{left}" x2="{w - 8}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{html.escape(fmt(v, unit))}</text>'
        )
    for t, anchor in ((start, "start"), (end, "end")):
        label = time.strftime("%H:%M", time.localtime(t))
        parts.append(f'<text x="{x(t):.1f}" y="{h - 4}" text-anchor="{anchor}">{label}</text>')
    for i, s in enumerate(series):
        if not s.points:
            continue
        line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s.points)
        colour = COLOURS[i % len(COLOURS)]
        if stacked:  # the band between this series and the one below it, filled
            below = stacked_series[i - 1].points if i else [(t, 0.0) for t, _ in s.points]
            under = {t: v for t, v in below}
            back = " ".join(f"{x(t):.1f},{y(under.get(t, 0.0)):.1f}" for t, _ in reversed(s.points))
            parts.append(f'<polygon points="{line} {back}" fill="{colour}" fill-opacity="0.35"/>')
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.6"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend_html(series: Sequence[Series], unit: str) -> str:
    items = []
    for i, s in enumerate(series[:12]):
        last = fmt(s.points[-1][1], unit) if s.points else "-"
        colour = COLOURS[i % len(COLOURS)]
        items.append(
            f'<li><i style="background:{colour}"></i>{html.escape(s.name)} <b>{html.escape(last)}</b></li>'
        )
    more = f"<li>… {len(series) - 12} more</li>" if len(series) > 12 else ""
    return f'<ul class="legend">{"".join(items)}{more}</ul>'


def panel_html(prometheus: str, panel: dict[str, Any], start: float, end: float) -> str:
    """One panel's box: its title, and its chart, big number or bars (or "No data")."""
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    series: list[Series] = []
    for target in panel.get("targets", []):
        series += fetch(prometheus, target["expr"], target.get("legendFormat", ""), start, end)
    kind = panel["type"]
    stacked = (
        panel.get("fieldConfig", {})
        .get("defaults", {})
        .get("custom", {})
        .get("stacking", {})
        .get("mode")
        == "normal"
    )
    if not any(s.points for s in series):
        body = '<p class="nodata">No data</p>'
    elif kind == "stat":
        body = f'<p class="big">{html.escape(fmt(series[0].points[-1][1], unit))}</p>'
    elif kind == "bargauge":
        rows = sorted(((s.points[-1][1], s.name) for s in series if s.points), reverse=True)[:10]
        top = max(v for v, _ in rows) or 1
        body = "".join(
            f'<div class="bar"><span>{html.escape(n)}</span><i style="width:{max(v / top, 0) * 60:.1f}%"></i>'
            f"<b>{html.escape(fmt(v, unit))}</b></div>"
            for v, n in rows
        )
    else:
        body = _chart(series, unit, start, end, stacked) + _legend_html(series, unit)
    width = panel["gridPos"]["w"]
    return (
        f'<section class="panel" style="grid-column: span {width}" data-kind="{kind}">'
        f"<h3>{html.escape(panel['title'])}</h3>{body}</section>"
    )


STYLE = """
body { background:#111217; color:#ccccdc; font:13px Inter,Helvetica,Arial,sans-serif; margin:16px; }
h1 { font-size:18px; color:#fff; margin:0 0 4px; } p.sub { margin:0 0 12px; color:#8e8e9e; }
.grid24 { display:grid; grid-template-columns:repeat(24, 1fr); gap:8px; align-items:start; }
h2 { grid-column: span 24; font-size:14px; color:#fff; margin:10px 0 0; }
.panel { background:#181b1f; border:1px solid #2c3235; border-radius:3px; padding:6px 8px; }
.panel h3 { font-size:12px; font-weight:500; margin:0 0 4px; color:#ccccdc; }
svg text { fill:#8e8e9e; font-size:10px; } svg .grid { stroke:#2c3235; }
.legend { list-style:none; padding:0; margin:2px 0 0; columns:2; font-size:11px; }
.legend i { display:inline-block; width:10px; height:3px; margin-right:4px; vertical-align:middle; }
.big { font-size:34px; color:#73bf69; margin:10px 0; text-align:center; }
.nodata { color:#8e8e9e; text-align:center; margin:30px 0; }
.bar { display:flex; align-items:center; gap:6px; font-size:11px; margin:3px 0; }
.bar span { width:30%; overflow:hidden; white-space:nowrap; } .bar i { height:10px; background:#5794f2; }
"""


def page(prometheus: str, board: dict[str, Any], start: float, end: float) -> str:
    """The dashboard as one static HTML page."""
    parts = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            parts.append(f"<h2>{html.escape(panel['title'])}</h2>")
        else:
            parts.append(panel_html(prometheus, panel, start, end))
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(board['title'])}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(board['title'])}</h1>"
        f'<p class="sub">{html.escape(board.get("description", ""))}</p>'
        f'<div class="grid24">{"".join(parts)}</div></body></html>'
    )


def write(
    prometheus: str, out: Path, minutes: float, dashboards: Path = DEFAULT_DASHBOARDS
) -> list[Path]:
    """One page per dashboard in `dashboards`, over the last `minutes`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    end = time.time()
    written = []
    for path in sorted(dashboards.glob("*.json")):
        board = json.loads(path.read_text())
        target = out / f"{path.stem}.html"
        target.write_text(page(prometheus, board, end - minutes * 60, end))
        written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=30)
    args = parser.parse_args()
    for path in write(args.prometheus, args.out, args.minutes):
        print(path)


if __name__ == "__main__":
    main()
