"""The hung-node policy, pure: when a node is unresponsive, the ladder's settings, the
group's floor, and a quiet bus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.node import Unresponsiveness
from services.recovery.hang import (
    HangSettings,
    Ladder,
    RungAction,
    floor_refusal,
    judge,
    silent_nodes,
    summary,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def node(name: str = "gpu-1", **conditions: tuple[str, timedelta]) -> dict[str, Any]:
    listed = [
        {
            "type": kind,
            "status": status,
            "reason": "NodeStatusUnknown" if status == "Unknown" else "Test",
            "message": "Kubelet stopped posting node status." if status == "Unknown" else "",
            "lastTransitionTime": (NOW - ago).isoformat().replace("+00:00", "Z"),
        }
        for kind, (status, ago) in conditions.items()
    ]
    return {"metadata": {"name": name}, "status": {"conditions": listed}}


def test_a_node_ready_is_responsive() -> None:
    assert judge(node(Ready=("True", timedelta(days=1))), NOW, HangSettings()) == []


def test_not_ready_counts_only_past_its_duration() -> None:
    settings = HangSettings(not_ready_after=timedelta(minutes=5))
    assert judge(node(Ready=("Unknown", timedelta(minutes=4))), NOW, settings) == []
    causes = judge(node(Ready=("Unknown", timedelta(minutes=5))), NOW, settings)
    assert [c.kind for c in causes] == [Unresponsiveness.NOT_READY]
    assert causes[0].reason == "NodeStatusUnknown"
    assert "Ready=Unknown" in summary("gpu-1", causes)
    assert judge(node(Ready=("False", timedelta(minutes=9))), NOW, settings)[0].status == "False"


def test_listed_conditions_each_with_its_duration() -> None:
    settings = HangSettings(
        conditions={"KernelDeadlock": timedelta(minutes=1), "GpuDriverStuck": timedelta(0)}
    )
    found = node(
        Ready=("True", timedelta(days=1)),
        KernelDeadlock=("True", timedelta(seconds=30)),
        GpuDriverStuck=("True", timedelta(seconds=1)),
        ReadonlyFilesystem=("True", timedelta(days=1)),  # not listed: not judged
    )
    assert [c.condition for c in judge(found, NOW, settings)] == ["GpuDriverStuck"]
    later = judge(found, NOW + timedelta(minutes=1), settings)
    assert [c.condition for c in later] == ["GpuDriverStuck", "KernelDeadlock"]
    assert all(c.kind == Unresponsiveness.CONDITION for c in later)


def test_agents_silent_past_their_timeout() -> None:
    settings = HangSettings(silent_after=timedelta(minutes=3))
    ok = node(Ready=("True", timedelta(days=1)))
    heard = NOW - timedelta(minutes=2)
    assert judge(ok, NOW, settings, silent_since=heard) == []
    causes = judge(ok, NOW + timedelta(minutes=1), settings, silent_since=heard)
    assert [c.kind for c in causes] == [Unresponsiveness.AGENTS_SILENT]


def test_a_quiet_bus_judges_nobody_silent() -> None:
    after = timedelta(minutes=3)
    heard = {f"n{i}": NOW - timedelta(minutes=10 if i < 6 else 0) for i in range(10)}
    silent, quiet = silent_nodes(heard, NOW, after, 0.5)
    assert quiet and silent == {}
    heard = {f"n{i}": NOW - timedelta(minutes=10 if i < 2 else 0) for i in range(10)}
    silent, quiet = silent_nodes(heard, NOW, after, 0.5)
    assert not quiet and sorted(silent) == ["n0", "n1"]


def test_the_default_ladder_escalates_through_the_bmc_to_oncall() -> None:
    ladder = HangSettings().ladders[0]
    assert [r.action for r in ladder.steps] == [
        RungAction.REBOOT,
        RungAction.POWER_OFF_ON,
        RungAction.POWER_CYCLE,
        RungAction.ONCALL,
    ]


@pytest.mark.parametrize("bad", ["half", "120%", "-1%", -1])
def test_a_floor_is_a_count_or_a_percentage(bad: Any) -> None:
    with pytest.raises(ValidationError):
        Ladder(name="gpu", min_healthy=bad)


def test_ladder_names_are_unique() -> None:
    with pytest.raises(ValidationError):
        HangSettings(ladders=[Ladder(name="a"), Ladder(name="a")])


def test_the_floor_refuses_the_fourth_of_four_hung_nodes() -> None:
    """A group of 6 keeping 3 healthy: of four nodes hanging one after another, three are
    remediated, not the fourth."""
    ladder = Ladder(name="gpu", min_healthy=3)
    group = [node(f"n{i}", Ready=("True", timedelta(days=1))) for i in range(6)]
    busy: list[str] = []
    for hung in range(3):
        group[hung] = node(f"n{hung}", Ready=("Unknown", timedelta(minutes=9)))
        assert floor_refusal(ladder, group, f"n{hung}", busy) is None
        busy.append(f"n{hung}")
    group[3] = node("n3", Ready=("Unknown", timedelta(minutes=9)))
    why = floor_refusal(ladder, group, "n3", busy)
    assert why == "group gpu: 2 of its other 5 node(s) healthy, its floor (min_healthy 3) is 3"


def test_nodes_hung_at_once_past_the_floor_are_all_refused() -> None:
    """A storm (more hung at once than the floor allows) is no node's fault: none is taken."""
    ladder = Ladder(name="gpu", min_healthy=3)
    group = [
        node(f"n{i}", Ready=("Unknown" if i < 4 else "True", timedelta(days=1))) for i in range(6)
    ]
    assert all(floor_refusal(ladder, group, f"n{i}", []) for i in range(4))


def test_a_percentage_floor_rounds_up() -> None:
    assert Ladder(name="gpu", min_healthy="50%").floor(5) == 3
    assert Ladder(name="gpu", min_healthy="0%").floor(5) == 0


def test_nodes_judged_unresponsive_are_not_healthy_though_ready() -> None:
    """A node with a listed condition (Ready, not yet in recovery) does not hold the floor."""
    ladder = Ladder(name="gpu", min_healthy=3)
    group = [node(f"n{i}", Ready=("True", timedelta(days=1))) for i in range(5)]
    stuck = {"n1", "n2"}
    assert floor_refusal(ladder, group, "n0", []) is None
    why = floor_refusal(ladder, group, "n0", [], unhealthy=lambda n: n["metadata"]["name"] in stuck)
    assert why == "group gpu: 2 of its other 4 node(s) healthy, its floor (min_healthy 3) is 3"
