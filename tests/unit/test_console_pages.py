"""The console's pure parts: the fleet grouped, filtered and aggregated; escaping; settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodeward.fleet_status import GpuSeen, NodeStatus, Seen
from nodeward.views import MarkHeld
from schemas.common import PodRef
from schemas.falco import FalcoAlert
from schemas.gpu import GpuHealth, GpuXid, HealthState
from schemas.remediation import Outcome, Remediation
from schemas.state.cordon import NodeRecord, Quarantine
from services.console.pages import ActionFilter, bars, escalation, fleet_page, gpu_rows
from services.console.settings import ConsoleSettings, loopback
from services.console.web import ConsoleError, check, environment
from services.cordon import view as cordon_view
from services.cordon.view import Quarantined
from services.recovery.view import RecoveryView
from tests.helpers.fleet import fleet_of
from tests.helpers.records import app_xid, gpu_health, node_action

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
    record = NodeRecord(
        quarantine=Quarantine(
            incident="e1",
            reason="r",
            rule="x",
            gpus=["0"],
            started_at=NOW,
            phase="applied",
            cordoned=True,
        )
    )
    marked = fleet_of(
        NOW, nats_url="", seen=Seen(shown=[cordon_view.shown({"gpu-q": record}, [], NOW)])
    ).nodes[0]
    marked = marked.model_copy(update={"gpus": {"0": "healthy"}, "health": "healthy"})
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
    # gpu-q is quarantined: it needs a look as well.
    assert names(fleet_page(nodes, models, state="attention")) == ["cpu-x", "gpu-b", "gpu-q"]
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
    r = node_action("quarantine", "gpu-1", "XID 79")
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


# -- the node page: an escalated node, and the pods on its GPUs -----------------------------

INCIDENT = "01a23bb4-58df-7420-85a9-ce97655c1a62"
ESCALATED_AT = datetime(2026, 11, 30, 11, 58, tzinfo=UTC)
RMA_REASON = (
    "gpu-q needs a human: the fault grew: row remapping failed; XID 64: RMA, no automatic cure. "
    "RMA suggested for GPU 1 (XID 64); the node stays quarantined until an operator releases "
    'it (`nodeward quarantine release gpu-q --reason "..."`)'
)


def _quarantined(
    since: datetime = datetime(2026, 11, 30, 11, 57, tzinfo=UTC), incident: str | None = INCIDENT
) -> NodeStatus:
    held = MarkHeld(
        node="gpu-q",
        owner="quarantine",
        phase="applied",
        incident=incident or "",
        cordon=True,
        taints=[],
    )
    marks = [] if incident is None else [held]
    return _node("gpu-q", "healthy", "failed").model_copy(
        update={
            "quarantine": Quarantined(
                reason="GPU 1 failed",
                rule="xid-node-action",
                gpus=["1"],
                since=since,
                age_s=60,
                phase="applied",
                dry_run=False,
                cordoned=True,
                taints=[],
            ),
            "marks": marks,
        }
    )


def _audit(
    action: str, outcome: str = "applied", reason: str = "r", **details: object
) -> Remediation:
    return node_action(
        action, "gpu-q", reason, actor="service/recovery", outcome=Outcome(outcome), details=details
    )


def _escalate(incident: str = INCIDENT) -> Remediation:
    return _audit("escalate", reason=RMA_REASON, incident=incident, rma=True)


def test_an_escalated_node_is_told_with_why_since_when_and_the_command_that_releases_it() -> None:
    later = ESCALATED_AT + timedelta(seconds=1)
    trail = [
        (later, _audit("release", "refused", guard="release_hold")),  # cordon's, held back
        (ESCALATED_AT, _escalate()),
        (ESCALATED_AT, _audit("recover", incident=INCIDENT)),
    ]
    e = escalation(_quarantined(), trail)
    assert e is not None
    assert (e.at, e.rma, e.gpus, e.incident) == (ESCALATED_AT, True, ["1"], INCIDENT)
    assert not e.dry_run
    # The banner says the node and the release around the reason: not twice.
    why = "the fault grew: row remapping failed; XID 64: RMA, no automatic cure. RMA suggested"
    assert e.why == f"{why} for GPU 1 (XID 64)"
    assert e.release("gpu-q") == 'nodeward quarantine release gpu-q --reason "GPU 1 replaced"'


def test_an_escalation_ends_with_its_quarantine() -> None:
    trail = [(ESCALATED_AT, _escalate())]
    after = ESCALATED_AT + timedelta(minutes=5)
    released = [(after, _audit("release", actor_reason="GPU 1 replaced")), *trail]
    assert escalation(_quarantined(), released) is None  # an operator released it
    assert escalation(_quarantined().model_copy(update={"quarantine": None}), trail) is None
    restarted = [(after, _audit("recover", incident="another")), *trail]
    assert escalation(_quarantined(), restarted) is None  # a later recovery under way
    # A later quarantine is not the escalated one: by its mark's incident, or by its start.
    assert escalation(_quarantined(incident="another"), trail) is None
    assert escalation(_quarantined(since=after, incident=None), trail) is None
    assert escalation(_quarantined(incident=None), trail) is not None
    # Words worded otherwise are shown whole; a retry limit's escalation suggests no RMA.
    limit = _audit("escalate", reason="needs a human: 3 recoveries within 24h", rma=False)
    e = escalation(_quarantined(), [(ESCALATED_AT, limit)])
    assert e is not None and not e.rma and e.why == "needs a human: 3 recoveries within 24h"
    assert e.release("gpu-q") == 'nodeward quarantine release gpu-q --reason "fixed"'


def test_an_escalation_the_picture_records_is_told_past_the_kept_audit() -> None:
    """The node's recovery record (the node's `recovery` part) tells an escalation whose audit
    record is no longer among those kept."""
    why = "the fault grew: row remapping failed. RMA suggested for GPU 1 (XID 64)"
    recovery = RecoveryView(
        step="escalated",
        plan="reset",
        incident=INCIDENT,
        since=ESCALATED_AT,
        why=why,
        held=True,
    )
    node = _quarantined().model_copy(update={"recovery": recovery})
    e = escalation(node, [])
    assert e is not None and (e.at, e.rma, e.why) == (ESCALATED_AT, True, why)
    assert escalation(node.model_copy(update={"recovery": None}), []) is None
    under_way = recovery.model_copy(update={"step": "rebooting"})
    assert escalation(node.model_copy(update={"recovery": under_way}), []) is None


def _change(gpu: int, at: datetime, *pods: str, heartbeat: bool = False) -> GpuHealth:
    refs = [PodRef(namespace=p.split("/")[0], name=p.split("/")[1]) for p in pods]
    return gpu_health(
        "gpu-q", gpu, f"GPU-{gpu}", HealthState.HEALTHY, at, pods=refs, heartbeat=heartbeat
    )


def _xid(gpu: int, at: datetime, *pods: str, instance: int | None = None) -> GpuXid:
    refs = [PodRef(namespace=p.split("/")[0], name=p.split("/")[1]) for p in pods]
    return app_xid(
        "gpu-q", gpu, f"GPU-{gpu}", refs, at, name="GR exception", gpu_instance_id=instance
    )


def test_each_gpu_names_the_pods_the_bus_last_named_for_it() -> None:
    """A heartbeat restating a GPU's state names no pods: the pods are its last change's, or
    its last XID's where that is newer."""
    t0 = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)
    beat = GpuSeen(
        node="gpu-q",
        key="0",
        gpu_index=0,
        gpu_uuid="GPU-0",
        state=HealthState.HEALTHY,
        observed_at=t0 + timedelta(minutes=30),  # the heartbeat, newer than any change
        stored=t0 + timedelta(minutes=30),
        agent_boot_id="b",
        sequence=1,
    )
    node = NodeStatus(
        name="gpu-q", health="healthy", gpus={"0": "healthy", "1": "healthy", "2": "healthy"}
    )
    changes = [
        _change(0, t0, "ml/train-0"),
        _change(1, t0, "ml/train-0"),
        _change(2, t0, "ml/old"),
        _change(2, t0 + timedelta(minutes=1), heartbeat=True),  # an old agent's heartbeat
    ]
    xids = [_xid(1, t0 + timedelta(minutes=5), "ml/train-0", "ml/eval-1")]
    rows = gpu_rows(node, {"0": beat}, changes, xids)
    assert [(r.key, r.pods) for r in rows] == [
        ("0", ["ml/train-0"]),
        ("1", ["ml/train-0", "ml/eval-1"]),
        ("2", ["ml/old"]),
    ]
    assert rows[0].observed_at == beat.observed_at and rows[1].pods_at == xids[0].observed_at
    # A change that names no pod frees the GPU; the feed's change wins over an older read.
    freed = gpu_rows(node, {"0": _change(0, t0 + timedelta(hours=1))}, changes, xids)
    assert freed[0].pods == []
    # A MIG instance's XID names its instance's pods, not the GPU's other instances'.
    mig = NodeStatus(
        name="gpu-q", health="healthy", gpus={"3-mig1-0": "healthy", "3-mig2-0": "healthy"}
    )
    rows = gpu_rows(mig, {}, [], [_xid(3, t0, "ml/a", instance=2)])
    assert [(r.key, r.pods) for r in rows] == [("3-mig1-0", []), ("3-mig2-0", ["ml/a"])]


def test_the_node_page_of_an_escalated_node_opens_with_it_and_escapes_what_it_says() -> None:
    hostile = "<script>alert(1)</script>"
    node = _quarantined()
    e = escalation(node, [(ESCALATED_AT, _audit("escalate", reason=hostile, incident=INCIDENT))])
    rows = gpu_rows(node, {}, [_change(1, NOW, "ml/train-0")], [])
    html = (
        environment()
        .get_template("node.html")
        .render(
            root="../",
            path="/node/gpu-q",
            now=NOW,
            age=lambda t: "2m00s",
            read_at=NOW,
            breaker=None,
            dlq_total=0,
            node=node,
            model="H100",
            gpus=rows,
            escalation=e,
            marks=["quarantined"],
            actions=[],
            pods_energy=[],
            xids=[],
        )
    )
    main = html[html.index("<main>") + len("<main>") :].lstrip()
    assert main.startswith('<section id="escalated"'), main[:200]
    banner = main[: main.index("</section>")]
    assert "gpu-q needs a human: RMA suggested for GPU 1" not in banner  # its reason said no RMA
    assert "gpu-q needs a human</h2>" in banner
    assert "2026-11-30 11:58:00 UTC</time> (2m00s ago)" in banner
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in banner and hostile not in html
    assert "nodeward quarantine release gpu-q --reason &#34;fixed&#34;" in banner
    assert (
        '<td class="pods" title="named 2026-11-30 12:00:00 UTC"><span>ml/train-0</span></td>'
        in html
    )
