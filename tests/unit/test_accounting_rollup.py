"""The accounting rollups and the report's sums, pure: hours, repeats, idle clipping, gaps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schemas.energy import EnergyNode, Interval
from schemas.session import IdleEvidence, SessionIdle
from services.accounting.report import Window, build, to_csv
from services.accounting.rollup import add_node_interval, extend_idle, node_hours
from services.accounting.state import IdlePeriod, NodeHour, UsageCell
from tests.helpers.records import notebook_idle

H = datetime(2026, 11, 30, 14, tzinfo=UTC)
MIN = timedelta(minutes=1)


def node_interval(start: datetime, seconds: float, covered: float | None) -> EnergyNode:
    return EnergyNode(
        node="n1",
        interval=Interval(start=start, end=start + timedelta(seconds=seconds)),
        readings=[],
        energy_j=None if covered == 0 else 100.0 * (covered or seconds),
        avg_power_w=None if covered == 0 else 100.0,
        covered_s=covered,
    )


def test_an_interval_across_the_hour_is_split_by_time() -> None:
    data = node_interval(H + 55 * MIN, 600, 300)
    assert node_hours(data) == [(H, 300.0, 150.0), (H + 60 * MIN, 300.0, 150.0)]
    assert node_hours(node_interval(H, 60, 0)) == [(H, 60.0, 0.0)]  # nothing read: all a gap


def test_a_node_interval_counts_once() -> None:
    data = node_interval(H, 600, None)
    first = add_node_interval(None, "e1", data, hour=H, seconds=600, covered_s=600, model=None)
    assert first is not None
    assert (
        add_node_interval(first, "e1", data, hour=H, seconds=600, covered_s=600, model=None) is None
    )


def test_an_idle_period_keeps_its_longest_report() -> None:
    def idle(for_s: float) -> SessionIdle:
        gpu = IdleEvidence(signal="gpu", idle_since=H)
        return notebook_idle("ns", "p", "n1", H, for_s, gpu, gpus_held=2)

    period = extend_idle(None, idle(600), "ns", None)
    assert period is not None
    longer = extend_idle(period, idle(1200), "ns", None)
    assert longer is not None and longer.idle_for_s == 1200
    assert extend_idle(longer, idle(600), "ns", None) is None  # a late repeat changes nothing
    # 2 GPUs x the part of [14:00, 14:20) inside [14:10, 15:00).
    assert longer.idle_gpu_s(H + 10 * MIN, H + 60 * MIN) == 2 * 600


def test_a_missing_hour_of_a_node_is_a_gap_and_a_short_one_is_rounding() -> None:
    now = H + timedelta(hours=3)
    hours = [
        NodeHour(hour=H, node="n1", first_start=H, last_end=H + 60 * MIN, covered_s=3599),
        NodeHour(
            hour=H + 120 * MIN,
            node="n1",
            first_start=H + 120 * MIN,
            last_end=now,
            covered_s=3600,
        ),
    ]
    cell = UsageCell(
        hour=H, node="n1", namespace="ns", pod="p", owner="ns", energy_j=3.6e6, gpu_s=3600
    )
    rows = build("node", Window(H, H + 180 * MIN), [cell], hours, [], now=now)
    assert [(r.key, r.gap_s) for r in rows] == [("n1", 3600.0)]  # the silent hour 15:00
    rows = build("namespace", Window(H, H + 180 * MIN), [cell], hours, [], now=now)
    assert rows[0].gap_s == 0  # its pod ran in the measured hour only
    text = to_csv("namespace", rows)
    assert text.splitlines()[1].startswith("ns,1.0,")


def test_idle_time_outside_the_window_is_not_counted() -> None:
    period = IdlePeriod(
        node="n1", namespace="ns", pod="p", owner="o", idle_since=H - 30 * MIN,
        idle_for_s=3600, gpus_held=1,
    )  # fmt: skip
    (row,) = build("owner", Window(H, H + 60 * MIN), [], [], [period], now=H + 2 * 60 * MIN)
    assert row.key == "o"
    assert row.idle_gpu_s == pytest.approx(1800)


def test_by_node_a_node_without_pods_reports_what_it_measured() -> None:
    """`report --by node` gave 0.000 kWh for nodes drawing 1.2-1.8 kW (no pods to attribute
    their energy to): by node, a row is the node's own measurement, with its CO2e; what its
    pods were attributed is a column of its own."""
    data = node_interval(H, 600, None).model_copy(update={"co2e_g": 3.0})
    hour = add_node_interval(None, "e1", data, hour=H, seconds=600, covered_s=600, model=None)
    assert hour is not None and hour.co2e_g == 3.0 and hour.carbon_energy_j == 60000.0
    pod = UsageCell(
        hour=H, node="n1", namespace="ml-a", pod="p", owner="a", energy_j=18000.0, co2e_g=0.9
    )
    pod = pod.model_copy(update={"carbon_energy_j": 18000.0})
    window = Window.of(H, H + 60 * MIN)
    [row] = build("node", window, [pod], [hour], [], now=H + 10 * MIN)
    c = row.columns()
    assert c["energy_kwh"] == round(60000 / 3.6e6, 6)  # the node's, not its pod's 0.005
    assert c["attributed_kwh"] == 0.005
    assert c["co2e_kg"] == 0.003 and c["intensity_g_per_kwh"] == 180.0
    [alone] = build("node", window, [], [hour], [], now=H + 10 * MIN)
    assert alone.columns()["energy_kwh"] > 0  # a node with no pod at all
    # By namespace nothing changes: the pods' attributed energy.
    [ns] = build("namespace", window, [pod], [hour], [], now=H + 10 * MIN)
    assert ns.columns()["energy_kwh"] == 0.005


def test_a_training_pods_measured_gpu_utilisation_is_its_rows() -> None:
    """The CSV had `gpu_util_pct` 0.0 on every row: utilisation came only from sessions'
    samples. A pod's energy now carries its GPUs' measured utilisation, weighted by GPU-time;
    where a cell has it, it is the cell's utilisation, not the samples."""
    from schemas.energy import EnergyPod
    from services.accounting.rollup import add_pod_energy, add_utilisation

    def pod(name: str, gpus: float, pct: float | None) -> EnergyPod:
        return EnergyPod(
            namespace="ml-a", pod=name, node="n1",
            interval=Interval(start=H, end=H + 10 * MIN), gpu_energy_j=6000.0,
            energy_j=6000.0, gpus=gpus, gpu_utilization_pct=pct, attribution="gpu-exclusive",
        )  # fmt: skip

    def cell(name: str) -> UsageCell:
        return UsageCell(hour=H, node="n1", namespace="ml-a", pod=name, owner="ml-a")

    train = add_pod_energy(cell("train"), "e1", pod("train", 4.0, 90.0))
    session = add_pod_energy(cell("nb"), "e2", pod("nb", 1.0, 0.0))
    assert train is not None and session is not None
    assert train.gpu_util_s == 2400.0 and train.gpu_busy_s == pytest.approx(2160.0)
    session = add_utilisation(session, "e3", 50.0)  # a peak sample: the measurement wins
    assert session is not None
    old = add_pod_energy(cell("old"), "e4", pod("old", 1.0, None))  # an agent before the field
    assert old is not None and old.gpu_util_s == 0
    window = Window(H, H + 60 * MIN)
    [row] = build("namespace", window, [train, session, old], [], [], now=H + 20 * MIN)
    # (4 GPUs x 90 % + 1 GPU x 0 %) / 5 GPUs; `old` has no utilisation: left out.
    assert row.columns()["gpu_util_pct"] == 72.0
    assert row.columns()["gpu_kwh_per_busy_gpu_hour"] == round(12000 / 3.6e6 / (2160 / 3600), 6)
