"""Energy accounting against hand-computed values: integration, counters, the node's basis."""

from __future__ import annotations

import pytest

from agents.energy.account import Accumulator
from agents.sources.carbon import co2e_grams
from agents.sources.power import PowerSample
from schemas.energy import PowerSource

IPMI, RAPL, NVML = PowerSource.IPMI_SDR, PowerSource.RAPL, PowerSource.NVML


def watts(source: PowerSource, component: str, at: float, w: float) -> PowerSample:
    return PowerSample(source, component, at, watts=w)


def counter(source: PowerSource, component: str, at: float, j: float) -> PowerSample:
    return PowerSample(source, component, at, energy_j=j)


def test_constant_420_w_for_60_s_is_25200_j_and_co2e_at_50_g_per_kwh() -> None:
    acc = Accumulator()
    for t in range(61):
        acc.tick([watts(IPMI, "system", float(t), 420.0)])
    got = acc.close(60.0)
    assert got.energy_j == pytest.approx(25_200.0)  # 420 W x 60 s
    assert got.avg_power_w == pytest.approx(420.0)
    assert (got.min_power_w, got.max_power_w) == (420.0, 420.0)
    assert got.basis == "system"
    # 25200 J = 0.007 kWh; x 50 g/kWh = 0.35 g
    assert co2e_grams(got.energy_j, 50.0) == pytest.approx(0.35)


def test_trapezoid_of_a_ramp_and_min_max() -> None:
    acc = Accumulator()
    for t, w in [(0.0, 100.0), (1.0, 300.0), (3.0, 300.0)]:
        acc.tick([watts(IPMI, "system", t, w)])
    got = acc.close(3.0)
    assert got.energy_j == pytest.approx(200.0 + 600.0)  # (100+300)/2 x 1 + 300 x 2
    assert (got.min_power_w, got.max_power_w) == (100.0, 300.0)


def test_segments_across_intervals_are_counted_once() -> None:
    acc = Accumulator()
    acc.tick([watts(IPMI, "system", 0.0, 400.0)])
    acc.tick([watts(IPMI, "system", 1.0, 400.0)])
    first = acc.close(1.0)
    acc.tick([watts(IPMI, "system", 2.0, 400.0)])
    acc.tick([watts(IPMI, "system", 3.0, 400.0)])
    second = acc.close(2.0)
    assert first.energy_j + second.energy_j == pytest.approx(1200.0)  # 400 W x 3 s


def test_counters_are_differenced_and_a_reset_adds_nothing() -> None:
    acc = Accumulator()
    acc.tick([counter(RAPL, "package-0", 0.0, 1000.0)])
    acc.tick([counter(RAPL, "package-0", 1.0, 1150.0)])
    acc.tick([counter(RAPL, "package-0", 2.0, 10.0)])  # reset: starts again from here
    acc.tick([counter(RAPL, "package-0", 3.0, 160.0)])
    got = acc.close(3.0)
    assert got.energy_j == pytest.approx(300.0)
    [reading] = got.readings
    assert reading.avg_power_w == pytest.approx(150.0)


def test_without_a_bmc_the_node_is_the_sum_of_packages_dram_and_gpus_not_sub_zones() -> None:
    acc = Accumulator()
    for t in (0.0, 1.0):
        acc.tick(
            [
                counter(RAPL, "package-0", t, 100.0 * t),
                counter(RAPL, "core-0", t, 60.0 * t),  # inside package-0
                counter(RAPL, "dram-0", t, 20.0 * t),
                watts(NVML, "gpu-0", t, 300.0),
            ]
        )
    got = acc.close(1.0)
    assert got.basis == "components"
    assert got.energy_j == pytest.approx(100.0 + 20.0 + 300.0)
    assert {r.component for r in got.readings} == {"package-0", "core-0", "dram-0", "gpu-0"}


def test_bmc_system_power_wins_over_the_sum_of_components() -> None:
    acc = Accumulator()
    for t in (0.0, 2.0):
        acc.tick([watts(IPMI, "system", t, 1000.0), watts(NVML, "gpu-0", t, 300.0)])
    got = acc.close(2.0)
    assert got.basis == "system"
    assert got.energy_j == pytest.approx(2000.0)


def test_bad_samples_are_dropped_not_integrated() -> None:
    acc = Accumulator()
    acc.tick([watts(IPMI, "system", 1.0, 420.0)])
    acc.tick([watts(IPMI, "system", 0.5, 9999.0)])  # time went backwards
    acc.tick([watts(IPMI, "system", 1.5, float("nan"))])
    acc.tick([watts(IPMI, "system", 1.6, -5.0)])
    acc.tick([watts(IPMI, "system", 2.0, 420.0)])
    got = acc.close(1.0)
    assert acc.dropped == 3
    assert got.energy_j == pytest.approx(420.0)


def test_an_interval_without_samples_is_unknown_not_zero() -> None:
    got = Accumulator().close(1.0)
    assert (got.energy_j, got.avg_power_w, got.readings, got.basis) == (None, None, [], "none")
    assert (got.min_power_w, got.max_power_w, got.uncovered_s) == (None, None, 1.0)


def test_a_gap_longer_than_max_gap_is_not_integrated() -> None:
    """A BMC away for 60 s: the first interval after it covers only what was read after."""
    acc = Accumulator(max_gap_s=2.0)
    for t in range(6):
        acc.tick([watts(IPMI, "system", float(t), 610.0)])
    before = acc.close(5.0)
    assert before.energy_j == pytest.approx(610.0 * 5)
    # Away from t=5 to t=65: ticks without samples; the last value is not restated.
    for t in range(6, 65):
        assert acc.tick([], now=float(t)) in (610.0, None)
        if t - 5 > 2:
            assert acc.tick([], now=float(t)) is None
    during = acc.close(60.0, now=65.0)
    assert (during.energy_j, during.avg_power_w) == (None, None)
    assert (during.min_power_w, during.max_power_w) == (None, None)
    assert during.uncovered_s == 60.0
    for t in range(65, 71):
        acc.tick([watts(IPMI, "system", float(t), 550.0)])
    after = acc.close(5.0, now=70.0)
    assert after.energy_j == pytest.approx(550.0 * 5)  # not 60 s of trapezoid across the gap
    assert after.covered_s == pytest.approx(5.0)
    assert (after.min_power_w, after.max_power_w) == (550.0, 550.0)
    assert after.min_power_w <= after.energy_j / after.covered_s <= after.max_power_w


def test_a_counter_across_a_gap_is_not_counted_either() -> None:
    acc = Accumulator(max_gap_s=2.0)
    acc.tick([counter(RAPL, "package-0", 0.0, 0.0)])
    acc.tick([counter(RAPL, "package-0", 1.0, 100.0)])
    acc.tick([counter(RAPL, "package-0", 30.0, 3000.0)])  # 29 s away
    acc.tick([counter(RAPL, "package-0", 31.0, 3100.0)])
    got = acc.close(31.0)
    assert got.energy_j == pytest.approx(200.0)
    assert got.covered_s == pytest.approx(2.0)
