"""Power caps: crossing, power flapping around the cap, clearing below the hysteresis band."""

from __future__ import annotations

from agents.energy.caps import cap_notice, cap_watches
from agents.energy.settings import PowerCap, PowerCapSettings
from schemas.notify import Severity


def test_crossing_flapping_and_clearing() -> None:
    [watch] = cap_watches(
        PowerCapSettings(node=PowerCap(watts=1000, hysteresis=0.1)), "n1", rack=None
    )
    changes = [watch.check(w) for w in (900, 1001, 990, 1010, 950, 1005, 901, 899, 950, 1001)]
    # over at 1001; flapping 990..1005 (above 900) says nothing; clears at 899; over again
    assert changes == [None, "crossed", None, None, None, None, None, "cleared", None, "crossed"]


def test_rack_cap_applies_by_the_node_rack() -> None:
    caps = PowerCapSettings(
        node=PowerCap(watts=5000), racks={"r1": PowerCap(watts=3000), "r2": PowerCap(watts=9)}
    )
    watches = cap_watches(caps, "n1", rack="r1")
    assert [(w.scope, w.name, w.cap.watts) for w in watches] == [
        ("node", "n1", 5000),
        ("rack", "r1", 3000),
    ]
    assert [w.scope for w in cap_watches(caps, "n1", rack=None)] == ["node"]


def test_notices_are_for_oncall_on_the_power_limit_topic() -> None:
    [watch] = cap_watches(PowerCapSettings(node=PowerCap(watts=1000)), "n1", rack=None)
    crossed = cap_notice(watch, "crossed", "n1", 1200.0)
    cleared = cap_notice(watch, "cleared", "n1", 800.0)
    assert crossed.nats_subject() == "notify.warning.power-limit"
    assert cleared.nats_subject() == "notify.info.power-limit"
    assert crossed.audience == cleared.audience == "oncall"
    assert crossed.severity == Severity.WARNING
    assert "1200 W" in crossed.title and "1000 W" in crossed.title
    assert crossed.dedup_key == cleared.dedup_key
