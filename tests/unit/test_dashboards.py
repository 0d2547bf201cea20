"""The dashboards as code: the chart's JSON is what `make dashboards` generates, and every
panel says its unit, as the title says it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch.observability.dashboards import DASHBOARDS, Panel
from launch.observability.generate import rendered, stale
from tests.conftest import REPO

FOLDER = REPO / "deploy" / "helm" / "nodeward" / "files" / "dashboards"
UNITS = {"W": "watt", "kWh": "kwatth", "g": "massg", "kg": "masskg", "s": "s", "%": "percent"}


def _panels() -> list[Panel]:
    return [p for d in DASHBOARDS for row in d.rows for p in row.panels]


def test_the_committed_dashboards_are_the_generated_ones() -> None:
    assert stale(FOLDER) == [], "run `make dashboards` and commit the result"
    assert sorted(rendered()) == [
        "cluster.json",
        "operations.json",
        "sustainability.json",
        "user.json",
    ]


def test_stale_names_a_dashboard_edited_by_hand(tmp_path: Path) -> None:
    for name, text in rendered().items():
        (tmp_path / name).write_text(text)
    assert stale(tmp_path) == []
    (tmp_path / "user.json").write_text("{}")
    (tmp_path / "extra.json").write_text("{}")
    assert stale(tmp_path) == ["extra.json", "user.json"]


@pytest.mark.parametrize("panel", _panels(), ids=lambda p: p.title)
def test_every_panel_names_its_unit_and_uses_it(panel: Panel) -> None:
    said = re.search(r"\(([^),]+)(?:,[^)]*)?\)|(GPU-hours) per hour", panel.title)
    assert said, f"{panel.title!r} does not say its unit"
    unit = said.group(1) or said.group(2)
    if unit in UNITS:
        assert panel.unit in (UNITS[unit], "percentunit" if unit == "%" else UNITS[unit])
    assert panel.queries and all(q.expr for q in panel.queries)
