"""`nodeward status`'s picture of the fleet from the cordon service's own KV records, and the table; no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rich.console import Console

from nodeward.cli.status import format_age, gpu_summary, render
from nodeward.fleet_status import GpuSeen, Seen, worst
from nodeward.views import Shown
from schemas.gpu import GpuHealth, HealthState
from schemas.state.breaker import BreakerState
from schemas.state.cordon import BREAKER, NODES, GpuRecord, NodeRecord, Quarantine
from services.cordon import view as cordon_view
from services.culler import view as culler_view
from services.culler.state import SessionRecord
from tests.helpers.fleet import fleet_of
from tests.helpers.records import gpu_health, node_action

NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


def _cordon(records: dict[str, NodeRecord]) -> Seen:
    """What the cordon service's view reads from its records."""
    return Seen(shown=[cordon_view.shown(records, [], NOW)])


def _health(node: str, index: int, state: str, at: datetime) -> GpuHealth:
    return gpu_health(node, index, f"GPU-{node}-{index}", HealthState(state), at)


def _quarantined_record() -> NodeRecord:
    """What the cordon service writes for a quarantined node (its own model)."""
    return NodeRecord(
        gpus={"0": GpuRecord(state=HealthState.FAILED, observed_at=NOW, event_id="e1", sequence=3)},
        quarantine=Quarantine(
            incident="e1",
            rule="xid-node-action",
            reason="GPU 0 failed: XID 79",
            gpus=["0"],
            started_at=NOW - timedelta(minutes=3, seconds=5),
            cordoned=True,
            taints=["NoSchedule"],
        ),
    )


def test_status_reads_the_bucket_as_the_cordon_service_declares_it() -> None:
    assert (NODES.name, NODES.key("gpu-a"), BREAKER.name, BREAKER.key()) == (
        "cordon",
        "node.gpu-a",
        "cordon",
        "breaker",
    )
    assert NODES.holds("node.gpu-a") and NODES.suffix("node.gpu-a") == "gpu-a"
    assert not NODES.holds(BREAKER.key())
    record = NODES.load(_quarantined_record().model_dump_json())
    assert record == _quarantined_record()
    state = BreakerState(admitted={"Node/a": 1.0}, tripped_at=2.0, trip_reason="too many", trips=1)
    assert BREAKER.load(state.model_dump_json().encode()) == state


def test_status_lists_the_quarantine_with_reason_age_and_live_agents() -> None:
    action = node_action("quarantine", "gpu-a", "GPU 0 failed: XID 79")
    fleet = fleet_of(
        NOW,
        breaker=BreakerState(admitted={"Node/gpu-a": 1.0}),
        seen=_cordon({"gpu-a": _quarantined_record()}),
        health=[
            _health("gpu-a", 0, "failed", NOW - timedelta(seconds=10)),
            _health("gpu-a", 1, "healthy", NOW - timedelta(seconds=10)),
            _health("gpu-b", 0, "healthy", NOW - timedelta(minutes=10)),
        ],
        telemetry={"gpu-c": NOW - timedelta(seconds=5)},
        dlq={"dlq.GPU.cordon": 2},
        actions=[(NOW - timedelta(minutes=3), action)],
    )
    by_name = {n.name: n for n in fleet.nodes}
    assert list(by_name) == ["gpu-a", "gpu-b", "gpu-c"]
    a = by_name["gpu-a"]
    assert a.health == "failed" and a.gpus == {"0": "failed", "1": "healthy"}
    assert a.quarantine is not None and a.quarantine.reason == "GPU 0 failed: XID 79"
    assert a.quarantine.age_s == 185
    assert a.agent_live and not by_name["gpu-b"].agent_live and by_name["gpu-c"].agent_live
    assert by_name["gpu-c"].health == "unknown"
    assert fleet.breaker.open is False and fleet.breaker.admitted == 1
    assert [n.name for n in fleet.nodes if n.quarantine] == ["gpu-a"]

    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    assert "gpu-a" in text and "applied 3m05s" in text
    assert "GPU 0 failed: XID 79" in text
    assert "taint nodeward.io/gpu-unhealthy:NoSchedule, cordoned" in text
    assert "silent 10m00s" in text  # gpu-b's agent stopped reporting
    assert "circuit breaker: closed (1 admitted" in text
    assert "dlq.GPU.cordon  2" in text
    assert "quarantine" in text and "node/gpu-a" in text


def test_a_tripped_breaker_is_shown_open_with_its_reason() -> None:
    fleet = fleet_of(
        NOW,
        breaker=BreakerState(tripped_at=NOW.timestamp(), trip_reason="2 of 8 nodes", trips=1),
        missing=["stream AUDIT"],
    )
    assert fleet.breaker.open and fleet.breaker.tripped_at == NOW
    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    assert "circuit breaker: OPEN (tripped 1x) — 2 of 8 nodes" in text
    assert "DLQ: empty" in text and "no actions recorded" in text
    assert "not found on this server: stream AUDIT" in text
    assert fleet.model_dump(mode="json")["breaker"]["open"] is True


def test_helpers() -> None:
    assert [format_age(s) for s in (5, 65, 3600 * 2 + 600, 86400 * 3 + 3600 * 4)] == [
        "5s",
        "1m05s",
        "2h10m",
        "3d4h",
    ]
    assert worst(["healthy", "degraded", "healthy"]) == "degraded"
    assert worst([]) == "unknown"
    assert gpu_summary({"0": "healthy", "1": "healthy"}) == "2/2 healthy"
    assert gpu_summary({"0": "failed", "1": "healthy", "2": "degraded"}) == (
        "1/3 healthy; failed: 0; degraded: 2"
    )


def test_a_thousand_quiet_nodes_are_one_line_and_those_needing_attention_come_first() -> None:
    """At fleet scale the table lists what needs a look, most serious first, and sums up the
    rest in one line; `--all` (show_all) lists every node."""
    health = [
        _health(f"gpu-{i:04d}", g, "healthy", NOW - timedelta(seconds=5))
        for i in range(1000)
        for g in range(2)
    ]
    health[2 * 500] = _health("gpu-0500", 0, "failed", NOW - timedelta(seconds=5))
    health[2 * 700] = _health("gpu-0700", 0, "degraded", NOW - timedelta(seconds=5))
    silent = _health("gpu-0900", 0, "healthy", NOW - timedelta(minutes=5))
    health[2 * 900 : 2 * 900 + 2] = [silent, silent.model_copy(update={"gpu_index": 1})]
    fleet = fleet_of(NOW, seen=_cordon({"gpu-0300": _quarantined_record()}), health=health)
    assert [n.name for n in fleet.needing_attention()] == [
        "gpu-0300",  # quarantined, GPU 0 failed (its record)
        "gpu-0500",  # GPU 0 failed
        "gpu-0700",  # degraded
        "gpu-0900",  # its GPU agent is silent
    ]
    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    assert "1000 node(s), 4 needing attention" in text
    assert "... and 996 more node(s) healthy, unmarked, agents live, nothing pending" in text
    assert "gpu-0001" not in text
    assert text.index("gpu-0300") < text.index("gpu-0500") < text.index("gpu-0900")
    assert "gpu silent 5m00s" in text
    assert len(text.splitlines()) < 60

    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet, show_all=True))
    every = console.export_text()
    assert "gpu-0001" in every and "more node(s)" not in every


def test_an_idle_agent_with_no_session_to_report_is_quiet_not_stale() -> None:
    """The idle agent publishes only while its node has sessions: its silence is stale only
    while the culler holds a warned session on that node."""
    old = NOW - timedelta(minutes=10)
    sessions = {
        "user-b/nb": SessionRecord(node="gpu-b", warned_at=old, deadline=NOW + timedelta(minutes=5))
    }
    seen = Seen(
        agents={"gpu-a": {"idle": old}, "gpu-b": {"idle": old}},
        shown=[culler_view.shown(sessions, NOW)],
    )
    fleet = fleet_of(
        NOW, health=[_health(n, 0, "healthy", NOW) for n in ("gpu-a", "gpu-b")], seen=seen
    )
    a, b = fleet.nodes
    assert a.agents["idle"].state == "quiet" and a.attention == []
    assert b.agents["idle"].state == "stale"
    assert b.attention == ["idle agent silent 10m00s", "1 idle session(s) warned"]


def test_a_gpus_newest_word_is_its_change_counter_within_a_boot_else_the_store_time() -> None:
    t0 = datetime(2026, 8, 20, 14, 0, tzinfo=UTC)

    def seen(boot: str | None, seq: int, stored_s: int) -> GpuSeen:
        return GpuSeen(
            node="gpu-a",
            key="0",
            gpu_index=0,
            gpu_uuid="GPU-a-0",
            state=HealthState.HEALTHY,
            observed_at=t0,
            stored=t0 + timedelta(seconds=stored_s),
            agent_boot_id=boot,
            sequence=seq,
        )

    # A heartbeat stored later restating change 2 is not newer than change 3 of that boot.
    assert seen("b1", 3, 0).newer_than(seen("b1", 2, 5))
    assert not seen("b1", 2, 5).newer_than(seen("b1", 3, 0))
    assert seen("b1", 2, 5).newer_than(seen("b1", 2, 0))  # the same change: the later word
    # Another boot (a restarted agent counts from 1 again), or none: the store time.
    assert seen("b2", 1, 5).newer_than(seen("b1", 9, 0))
    assert not seen(None, 9, 0).newer_than(seen(None, 1, 5))


def test_a_node_whose_clock_is_off_says_so_and_by_how_much() -> None:
    """Each agent's newest message: its own time (`ce-time`) against the store time. A
    node ahead of the bus past `bus.max_clock_skew` has its events refused: it needs a look."""
    seen = Seen()
    stored = NOW - timedelta(seconds=20)
    seen.saw("ahead", "gpu", stored, stored + timedelta(hours=1))
    seen.saw("ahead", "energy", stored, stored + timedelta(hours=1, seconds=1))
    seen.saw("behind", "gpu", stored, stored - timedelta(minutes=3))
    seen.saw("fine", "gpu", stored, stored + timedelta(milliseconds=3))
    # An older message of a kind says nothing of the clock now: the newest one's offset stays.
    seen.saw("fine", "gpu", stored - timedelta(minutes=5), stored - timedelta(hours=2))
    # A late message of one kind (replayed) does not make the node look behind: the most
    # promptly published one speaks for the clock.
    seen.saw("late", "gpu", stored, stored + timedelta(milliseconds=2))
    seen.saw("late", "idle", stored, stored - timedelta(minutes=9))
    fleet = fleet_of(NOW, seen=seen, clock_skew=timedelta(seconds=5))
    nodes = {n.name: n for n in fleet.nodes}
    assert nodes["ahead"].clock_offset_s == 3601.0
    assert nodes["ahead"].agents["gpu"].clock_offset_s == 3600.0
    assert "clock 1h00m ahead of the bus: its events refused" in nodes["ahead"].attention
    assert nodes["ahead"].rank == 1
    assert nodes["behind"].clock_offset_s == -180.0
    assert "clock 3m00s behind the bus (or its messages late)" in nodes["behind"].attention
    assert nodes["fine"].clock_offset_s == 0.003 and nodes["fine"].attention == []
    assert nodes["late"].clock_offset_s == 0.002 and nodes["late"].attention == []


def test_at_80_columns_node_names_are_whole_and_other_columns_wrap() -> None:
    """At 80 columns `status` cut every node name to `gpu-a100…`, so rows could not be told
    apart: the identifying columns are never cut."""
    names = [f"gpu-a100-mig-{i:02d}.rack-17.example.org" for i in range(3)]
    records = {name: _quarantined_record() for name in names}
    fleet = fleet_of(
        NOW,
        seen=_cordon(records),
        breaker=BreakerState(),
        health=[_health(name, 0, "failed", NOW - timedelta(seconds=10)) for name in names],
    )
    console = Console(width=80, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    for name in names:
        assert name in text, text
    assert "…" not in text.split("quarantines")[0], text


def test_piped_tables_take_columns_from_the_environment(monkeypatch: object) -> None:
    import pytest

    from nodeward.cli.common import PIPE_WIDTH, table_console

    mp: pytest.MonkeyPatch = monkeypatch  # type: ignore[assignment]
    mp.delenv("COLUMNS", raising=False)
    assert table_console().width == PIPE_WIDTH  # not a terminal here
    mp.setenv("COLUMNS", "80")
    assert table_console().width == 80


def test_a_views_rows_join_their_node_and_its_attention_by_rank() -> None:
    """Rows a service's view reads (`nodeward.views.Row`): one about a node joins that node
    (which then exists in the picture even if nothing else knows it), its attention ranked
    with the runtime's own; a fleet row is the fleet's. Both are drawn under their section."""
    from nodeward.cli.status import render_node
    from nodeward.fleet_status import NodeReport
    from nodeward.views import Row

    seen = Seen(
        shown=[
            Shown(
                rows=[
                    Row(section="probe", text="fleet-wide line", severity="ok"),
                    Row(
                        section="probe",
                        text="gpu-x needs a look",
                        node="gpu-x",
                        severity="critical",
                        attention="probe says gpu-x is on fire",
                        rank=0,
                    ),
                    Row(section="probe", text="gpu-y is fine", node="gpu-y"),
                ]
            )
        ]
    )
    health = [_health("gpu-y", 0, "degraded", NOW)]
    fleet = fleet_of(NOW, nats_url="nats://x", health=health, seen=seen)
    nodes = {n.name: n for n in fleet.nodes}
    assert set(nodes) == {"gpu-x", "gpu-y"}
    assert [r.text for r in nodes["gpu-x"].rows] == ["gpu-x needs a look"]
    assert nodes["gpu-x"].attention[0] == "probe says gpu-x is on fire"
    assert nodes["gpu-x"].rank == 0
    # gpu-y's degraded GPU (rank 2) is its attention; its row asks for none.
    assert nodes["gpu-y"].attention == ["GPU 0 degraded"]
    assert [n.name for n in fleet.needing_attention()] == ["gpu-x", "gpu-y"]
    assert [r.text for r in fleet.rows] == ["fleet-wide line"]
    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet))
    assert "probe: fleet-wide line" in console.export_text()
    report = NodeReport(nats_url="nats://x", at=NOW, node=nodes["gpu-x"], recent_actions=[])
    console = Console(width=200, record=True, color_system=None)
    console.print(render_node(report))
    text = console.export_text()
    assert "probe: gpu-x needs a look" in text
    assert "attention: probe says gpu-x is on fire" in text


def test_several_services_views_share_a_node_most_severe_first() -> None:
    """A node quarantined, then drained for its recovery (the maintenance's cordon held):
    each service's view says its part; the marks cell and the console's badges put the
    quarantine first, whichever view was read first, and cordoned last."""
    from nodeward.views import MarkHeld
    from schemas.maintenance import MaintenancePhase
    from services.console.live import marks_of
    from services.maintenance import view as maintenance_view
    from services.maintenance.state import MaintenanceState

    drained = MaintenanceState(
        maintenance_id="m-1",
        node="gpu-a",
        phase=MaintenancePhase.DRAINING,
        requested_at=NOW - timedelta(minutes=1),
        trigger_id="t",
        start_at=NOW - timedelta(minutes=1),
        deadline_s=600,
        cordoned=True,
    )
    cordon = MarkHeld(
        node="gpu-a", owner="maintenance", phase="applied", incident="m-1", cordon=True, taints=[]
    )
    seen = Seen(
        shown=[  # the views in their registered order: the maintenance's daemon is `checkpoint`
            maintenance_view.shown({"gpu-a": drained}, [cordon], NOW),
            cordon_view.shown({"gpu-a": _quarantined_record()}, [], NOW),
        ]
    )
    fleet = fleet_of(
        NOW, nats_url="nats://x", health=[_health("gpu-a", 0, "failed", NOW)], seen=seen
    )
    (node,) = fleet.nodes
    assert [c.text for c in node.said("marks")] == [
        "quarantine applied 3m05s",
        "maintenance draining",
        "cordoned",
    ]
    assert marks_of(node) == ["quarantined", "maintenance", "cordoned"]
    assert node.attention == ["GPU 0 failed", "quarantined (applied)", "maintenance draining"]
    assert node.quarantine is not None and node.maintenance.phase == "draining"
    assert fleet.model_dump(mode="json")["nodes"][0]["maintenance"]["maintenance_id"] == "m-1"
    console = Console(width=200, record=True, color_system=None)
    console.print(render(fleet))
    text = console.export_text()
    assert "quarantine applied 3m05s, maintenance draining, cordoned" in text
    assert text.index("draining, cordoned") < text.index("circuit breaker")
