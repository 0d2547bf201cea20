"""The shared guards and the cordon policy, without peers: breaker, rate limit, staleness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schemas.gpu import GpuHealth, HealthReason, HealthState, RecommendedAction
from schemas.state.cordon import GpuRecord, NodeRecord
from services.cordon.policy import PolicyAction, PolicyError, is_stale, load_policy, restates
from services.kernel import BreakerSettings, Cooldown, RateLimiter, RateLimitSettings, is_exempt
from services.kernel.breaker import decide, limit_for
from tests.helpers.records import gpu_health

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def gpu(
    state: HealthState, *, seq: int = 1, boot: str | None = "b1", at: datetime = T0, **kw: object
) -> GpuHealth:
    return gpu_health("n1", 0, "GPU-1", state, at, agent_boot_id=boot, sequence=seq, **kw)


@pytest.mark.parametrize(
    ("population", "percent", "max_nodes", "limit"),
    [(10, 30, 10, 3), (10, 30, 2, 2), (1, 20, 5, 1), (100, 20, 5, 5), (7, 50, 10, 4)],
)
def test_breaker_limit_is_lower_of_percent_and_count(
    population: int, percent: float, max_nodes: int, limit: int
) -> None:
    assert limit_for(BreakerSettings(max_percent=percent, max_nodes=max_nodes), population) == limit


def test_breaker_trips_stays_tripped_and_calms_down() -> None:
    s = BreakerSettings(max_percent=30, max_nodes=10, window="10m", calm_period="30m")  # type: ignore[arg-type]
    state = None
    admitted = []
    for i in range(5):
        state, ok = decide(state, s, f"n{i}", 10, 1000.0 + i)
        admitted.append(ok)
    assert admitted == [True, True, True, False, False]
    assert state is not None and state.tripped_at == 1003.0 and state.trips == 1
    # an admitted node is admitted again (a redelivery), even while tripped
    state, ok = decide(state, s, "n0", 10, 1010.0)
    assert ok
    # window passed but still tripped until the calm period is over
    state, ok = decide(state, s, "n9", 10, 1003.0 + 600 + 1)
    assert not ok
    state, ok = decide(state, s, "n9", 10, 1003.0 + 1800)
    assert ok and state.tripped_at is None


def test_breaker_without_calm_period_needs_reset() -> None:
    s = BreakerSettings(max_percent=10, max_nodes=1, calm_period=None)
    state, _ = decide(None, s, "a", 10, 0.0)
    state, ok = decide(state, s, "b", 10, 1.0)
    assert not ok
    state, ok = decide(state, s, "b", 10, 10_000_000.0)
    assert not ok


async def test_rate_limiter_refuses_beyond_burst_and_refills() -> None:
    now = [0.0]
    limiter = RateLimiter(
        RateLimitSettings(per_minute=60, burst=2, max_wait="0s"),  # type: ignore[arg-type]
        clock=lambda: now[0],
    )
    assert await limiter.acquire(0) and await limiter.acquire(0)
    assert not await limiter.acquire(0)
    assert limiter.wait_time() == pytest.approx(1.0)
    now[0] = 1.0
    assert await limiter.acquire(0)


def test_cooldown() -> None:
    c = Cooldown(timedelta(seconds=60))
    assert c.remaining(None, 100.0) == 0
    assert c.remaining(100.0, 130.0) == 30
    assert c.remaining(100.0, 200.0) == 0


def test_exempt_label() -> None:
    assert is_exempt({"metadata": {"labels": {"nodeward.io/exempt": "true"}}})
    assert not is_exempt({"metadata": {"labels": {"nodeward.io/exempt": "false"}}})
    assert not is_exempt({"metadata": {}})


def test_staleness_by_sequence_within_a_boot_and_by_time_across_boots() -> None:
    accepted = GpuRecord.after(None, gpu(HealthState.FAILED, seq=5), "e5")
    assert is_stale(accepted, gpu(HealthState.HEALTHY, seq=4, at=T0 + timedelta(hours=1)), "e4")
    assert not is_stale(accepted, gpu(HealthState.HEALTHY, seq=6), "e6")
    assert not is_stale(accepted, gpu(HealthState.FAILED, seq=5), "e5")  # redelivery
    # The same state said again, observed earlier (the change a heartbeat restated first).
    late = gpu(HealthState.FAILED, seq=5, at=T0 - timedelta(seconds=40))
    assert restates(accepted, late) and not is_stale(accepted, late, "e5-change")
    assert not restates(accepted, gpu(HealthState.FAILED, seq=5, boot="b2"))
    assert is_stale(
        accepted, gpu(HealthState.HEALTHY, seq=99, boot="b0", at=T0 - timedelta(seconds=1)), "x"
    )
    assert not is_stale(
        accepted, gpu(HealthState.HEALTHY, seq=0, boot="b2", at=T0 + timedelta(seconds=1)), "y"
    )
    assert not is_stale(None, gpu(HealthState.HEALTHY), "z")
    # Across boots, two clocks may disagree by the bus's max_clock_skew: within it the bus's
    # order decides (a rebooted agent whose old clock ran 3 s fast is heard); beyond it not.
    rebooted = gpu(HealthState.FAILED, seq=1, boot="b2", at=T0 - timedelta(seconds=3))
    assert is_stale(accepted, rebooted, "r") and not is_stale(accepted, rebooted, "r", skew_s=5)
    older = gpu(HealthState.HEALTHY, seq=1, boot="b0", at=T0 - timedelta(seconds=6))
    assert is_stale(accepted, older, "o", skew_s=5)
    # Within one boot the sequence decides, whatever the clocks say.
    assert is_stale(accepted, gpu(HealthState.HEALTHY, seq=4), "s", skew_s=5)


def test_healthy_for_needs_every_gpu_healthy() -> None:
    healthy = GpuRecord.after(None, gpu(HealthState.HEALTHY), "a")
    still = GpuRecord.after(
        healthy, gpu(HealthState.HEALTHY, seq=2, at=T0 + timedelta(seconds=30)), "b"
    )
    assert still.healthy_since == T0
    record = NodeRecord(gpus={"0": still})
    assert record.healthy_for(T0 + timedelta(seconds=90)) == 90
    bad = GpuRecord.after(None, gpu(HealthState.DEGRADED), "c")
    assert NodeRecord(gpus={"0": still, "1": bad}).healthy_for(T0) is None


def test_default_policy() -> None:
    policy = load_policy()
    xid79 = HealthReason(
        code="xid", xid=79, message="fell off the bus", action=RecommendedAction.REBOOT_NODE
    )
    failed = gpu(
        HealthState.FAILED, reasons=[xid79], recommended_action=RecommendedAction.REBOOT_NODE
    )
    assert policy.decide(failed).action == PolicyAction.QUARANTINE
    assert policy.decide(failed).rule == "xid-node-action"
    assert policy.decide(gpu(HealthState.DEGRADED)).action == PolicyAction.NONE
    assert policy.decide(gpu(HealthState.HEALTHY)).action == PolicyAction.NONE
    assert policy.decide(gpu(HealthState.UNKNOWN)).action == PolicyAction.NONE


def test_bad_policy_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: x\n    action: reboot\n")
    with pytest.raises(PolicyError) as exc:
        load_policy(path)
    assert "\n" not in str(exc.value) and "rules.0.action" in str(exc.value)


def test_turns_to_failed_are_counted_within_the_flap_window() -> None:
    window = 600.0
    record = None
    for i, state in enumerate([HealthState.FAILED, HealthState.FAILED, HealthState.HEALTHY]):
        record = GpuRecord.after(
            record,
            gpu(state, seq=i + 1, at=T0 + timedelta(seconds=i)),
            f"e{i}",
            flap_window_s=window,
        )
    assert record is not None and record.failures == [T0.timestamp()]  # failed twice: one turn
    again = GpuRecord.after(
        record,
        gpu(HealthState.FAILED, seq=4, at=T0 + timedelta(seconds=5)),
        "e4",
        flap_window_s=window,
    )
    assert len(again.failures) == 2
    # An hour later the old turns are forgotten; without a window nothing is counted.
    late = GpuRecord.after(
        again,
        gpu(HealthState.HEALTHY, seq=5, at=T0 + timedelta(hours=1)),
        "e5",
        flap_window_s=window,
    )
    assert late.failures == []
    assert GpuRecord.after(None, gpu(HealthState.FAILED), "x").failures == []
