"""The cpufreq check on a fake sysfs tree: governors, frequency spread, what is missing."""

from __future__ import annotations

from pathlib import Path

from agents.energy.tuning import CpufreqSettings, judge, read_cpus, sample
from schemas.node import FindingState


def fake_cpus(root: Path, governors: list[str], khz: list[int]) -> None:
    """`root/cpuN/cpufreq/{scaling_governor,scaling_cur_freq}` as Linux lays them out."""
    for i, (governor, freq) in enumerate(zip(governors, khz, strict=True)):
        d = root / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True, exist_ok=True)
        (d / "scaling_governor").write_text(governor + "\n")
        (d / "scaling_cur_freq").write_text(f"{freq}\n")
    (root / "cpuidle").mkdir(exist_ok=True)  # not a CPU
    (root / "online").write_text("0-3\n")


def check(root: Path, **more: object) -> CpufreqSettings:
    return CpufreqSettings.model_validate({"root": str(root), "samples": 1, **more})


def test_all_on_performance_and_steady_is_ok(tmp_path: Path) -> None:
    fake_cpus(tmp_path, ["performance"] * 4, [3_000_000, 2_950_000, 3_000_000, 2_900_000])
    finding = judge("n1", sample(check(tmp_path)), check(tmp_path))
    assert finding is not None
    assert finding.state == FindingState.OK
    assert finding.cpus == 4 and finding.governors == {"performance": 4}
    assert finding.spread_pct == round(100_000 / 3_000_000 * 100, 1)
    assert finding.problems == []


def test_another_governor_is_a_finding_naming_how_many_cpus(tmp_path: Path) -> None:
    fake_cpus(tmp_path, ["performance", "powersave", "powersave", "performance"], [3_000_000] * 4)
    finding = judge("n1", sample(check(tmp_path)), check(tmp_path))
    assert finding is not None and finding.state == FindingState.FINDING
    assert finding.problems == ["2 of 4 CPUs use governor powersave, not performance"]
    assert finding.summary == "n1: 2 of 4 CPUs use governor powersave, not performance"
    assert finding.nats_subject() == "node.finding.n1.cpufreq"


def test_frequencies_spread_beyond_the_bound_is_a_finding(tmp_path: Path) -> None:
    fake_cpus(tmp_path, ["performance"] * 4, [1_200_000, 3_000_000, 3_000_000, 3_000_000])
    settings = check(tmp_path, spread_bound_pct=25)
    finding = judge("n1", sample(settings), settings)
    assert finding is not None and finding.state == FindingState.FINDING
    assert finding.spread_pct == 60.0
    assert finding.problems == ["CPU frequencies spread 60% (1200-3000 MHz), over the 25% bound"]
    # The same spread under a wider bound is fine, and a changed figure is not a new result.
    wide = check(tmp_path, spread_bound_pct=70)
    ok = judge("n1", sample(wide), wide)
    assert ok is not None and ok.state == FindingState.OK
    assert ok.change_key() != finding.change_key()


def test_spread_over_time_counts_across_samples(tmp_path: Path) -> None:
    fake_cpus(tmp_path, ["performance"] * 2, [3_000_000, 3_000_000])
    first = read_cpus(tmp_path)
    fake_cpus(tmp_path, ["performance"] * 2, [1_500_000, 3_000_000])
    finding = judge("n1", [first, read_cpus(tmp_path)], check(tmp_path))
    assert finding is not None and finding.spread_pct == 50.0


def test_a_node_without_cpufreq_gives_no_result(tmp_path: Path) -> None:
    (tmp_path / "cpu0").mkdir()
    assert judge("n1", sample(check(tmp_path)), check(tmp_path)) is None
    assert judge("n1", sample(check(tmp_path / "missing")), check(tmp_path)) is None


def test_an_unreadable_frequency_is_left_out_not_zero(tmp_path: Path) -> None:
    fake_cpus(tmp_path, ["performance"] * 2, [3_000_000, 3_000_000])
    (tmp_path / "cpu1" / "cpufreq" / "scaling_cur_freq").write_text("garbage\n")
    finding = judge("n1", sample(check(tmp_path)), check(tmp_path))
    assert finding is not None
    assert finding.freq_min_khz == finding.freq_max_khz == 3_000_000
    assert finding.state == FindingState.OK
