"""The console's pure parts: the fleet grouped, filtered and aggregated; escaping; settings."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from nodeward.fleet_status import NodeStatus, Quarantined
from schemas.falco import FalcoAlert
from services.console.pages import ActionFilter, bars, fleet_page
from services.console.settings import ConsoleSettings, loopback
from services.console.web import ConsoleError, check, environment

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _node(name: str, *states: str, attention: list[str] | None = None) -> NodeStatus:
    gpus = {str(i): s for i, s in enumerate(states)}
    worst = next(
        (s for s in ("failed", "degraded", "unknown", "healthy") if s in states), "unknown"
    )
    return NodeStatus(
        name=name,
        health=worst,
        gpus=gpus,
        attention=attention or ([] if worst == "healthy" else [f"GPU {worst}"]),
        rank=0 if attention or worst != "healthy" else 9,
    )


def test_groups_by_model_with_nodes_needing_a_look_first() -> None:
    nodes = [
        _node("b", "healthy", "healthy"),
        _node("a", "healthy", "failed"),
        _node("c", "healthy"),
    ]
    page = fleet_page(nodes, {"a": "H100", "b": "H100", "c": "A100"})
    assert [g.model for g in page.groups] == ["A100", "H100"]
    h100 = page.groups[1]
    assert [t.name for t in h100.tiles] == ["a", "b"]
    assert h100.gpus["failed"] == 1 and h100.gpus["healthy"] == 3
    assert page.gpus == {"failed": 1, "degraded": 0, "unknown": 0, "healthy": 4}
    assert not page.compact and all(t.detailed for g in page.groups for t in g.tiles)


def test_past_the_limit_quiet_nodes_are_one_cell_and_the_others_keep_their_gpus() -> None:
    nodes = [_node(f"n{i:03d}", "healthy") for i in range(20)] + [_node("bad", "failed")]
    page = fleet_page(nodes, {}, detail_limit=10)
    assert page.compact and page.shown == 21
    tiles = {t.name: t for g in page.groups for t in g.tiles}
    assert tiles["bad"].detailed and not tiles["n000"].detailed
    assert page.groups[0].model == "unknown"


def test_filters_by_name_state_mark_and_model() -> None:
    marked = _node("gpu-q", "healthy").model_copy(
        update={
            "quarantine": Quarantined(
                reason="r",
                rule="x",
                gpus=["0"],
                since=NOW,
                age_s=1,
                phase="applied",
                dry_run=False,
                cordoned=True,
                taints=[],
            )
        }
    )
    nodes = [
        _node("gpu-a", "healthy"),
        _node("gpu-b", "degraded"),
        marked,
        _node("cpu-x", "failed"),
    ]
    models = {"gpu-a": "H100", "gpu-b": "A100"}
    names = lambda page: sorted(t.name for g in page.groups for t in g.tiles)  # noqa: E731
    assert names(fleet_page(nodes, models, query="GPU-")) == ["gpu-a", "gpu-b", "gpu-q"]
    assert names(fleet_page(nodes, models, state="degraded")) == ["gpu-b"]
    assert names(fleet_page(nodes, models, state="marked")) == ["gpu-q"]
    assert names(fleet_page(nodes, models, state="attention")) == ["cpu-x", "gpu-b"]
    assert names(fleet_page(nodes, models, model="H100")) == ["gpu-a"]
    tiles = {t.name: t for g in fleet_page(nodes, models).groups for t in g.tiles}
    assert tiles["gpu-q"].marks == ["quarantined", "cordoned"]


def test_an_alerts_output_is_escaped_where_it_is_drawn() -> None:
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    alert = FalcoAlert(output=hostile, priority="Critical", rule="<b>r</b>", time=NOW, hostname="h")
    html = (
        environment()
        .get_template("security.html")
        .render(
            root="",
            path="/security",
            now=NOW,
            read_at=NOW,
            isolated=[],
            marked=[],
            alerts=[(NOW, alert)],
            breaker=None,
            dlq_total=0,
        )
    )
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>r</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert html.count("<script") == 1  # the one static file
    assert 'src="static/console.js"' in html


def test_off_loopback_a_token_is_required(tmp_path: Path) -> None:
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("10.0.0.5")
    assert check(ConsoleSettings()) is None
    with pytest.raises(ConsoleError, match="off loopback"):
        check(ConsoleSettings(host="0.0.0.0"))
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConsoleError, match="shorter than 16"):
        check(ConsoleSettings(host="0.0.0.0", token_file=short))
    good = tmp_path / "token"
    good.write_text("0123456789abcdef-token\n")
    assert check(ConsoleSettings(host="0.0.0.0", token_file=good)) == "0123456789abcdef-token"


def test_bars_scale_to_the_largest() -> None:
    drawn = bars([("a", 50.0), ("b", 200.0), ("c", 0.0)], unit="W", width=400)
    assert [(b.label, b.width, b.y) for b in drawn] == [
        ("b", 400.0, 0),
        ("a", 100.0, 22),
        ("c", 0.0, 44),
    ]
    assert drawn[0].text == "200.0 W"
    assert bars([], unit="W") == []


def test_action_filter() -> None:
    from schemas.common import ObjectRef
    from schemas.remediation import Outcome, Remediation

    r = Remediation(
        action="quarantine",
        target=ObjectRef(kind="Node", name="gpu-1"),
        outcome=Outcome.APPLIED,
        reason="XID 79",
        actor="service/cordon",
    )
    assert ActionFilter().admits(r)
    assert ActionFilter(action="quarantine", outcome="applied", actor="cordon", text="xid").admits(
        r
    )
    assert not ActionFilter(action="release").admits(r)
    assert not ActionFilter(outcome="refused").admits(r)
    assert not ActionFilter(text="gpu-2").admits(r)


def test_mig_instances_are_drawn_inside_their_gpu_and_the_fleet_counts_gpus() -> None:
    """The headline said `128 healthy` for 88 GPUs (48 MIG instances counted as GPUs) and a
    MIG node was drawn as 48 cells: a GPU is one cell, its instances inside it."""
    mig = {f"{g}-mig{i}-0": "healthy" for g in range(8) for i in range(1, 7)}
    mig["3-mig2-0"] = "failed"
    node = NodeStatus(name="mig", health="failed", gpus=mig, attention=["GPU 3"], rank=0)
    page = fleet_page([node, _node("h", *["healthy"] * 8)], {"mig": "A100", "h": "H100"})
    assert page.gpus == {"failed": 1, "degraded": 0, "unknown": 0, "healthy": 15}
    [tile] = page.groups[0].tiles
    assert [p.key for p in tile.gpus] == [str(i) for i in range(8)]
    three = tile.gpus[3]
    assert three.state == "failed" and len(three.slices) == 6
    assert ("3-mig2-0", "failed") in three.slices
    assert all(not p.slices for p in page.groups[1].tiles[0].gpus)
