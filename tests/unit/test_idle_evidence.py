"""Judging a session from its signals: any activity wins, unknown is never idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agents.idle.evidence import (
    SessionTracker,
    cpu_reading,
    gpu_reading,
    kernel_reading,
)
from agents.sources.activity import DeviceUtilization, KernelsReading
from schemas.session import ActivityState, KernelActivity

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def kernel(state: str, last: datetime | None = None) -> KernelActivity:
    return KernelActivity(id="k1", name="python3", execution_state=state, last_activity=last)


def test_busy_kernel_is_activity_even_with_an_idle_gpu() -> None:
    tracker = SessionTracker("uid")
    gpu = gpu_reading([DeviceUtilization("GPU-1", 0.0)], 5.0, "ignore")
    assert gpu is not None and gpu.state == ActivityState.IDLE
    verdict = tracker.judge(
        [gpu, cpu_reading(0.0, 0.1), kernel_reading(KernelsReading([kernel("busy")]))], at(0)
    )
    assert verdict.state == ActivityState.ACTIVE


def test_unreachable_jupyter_is_unknown_never_idle() -> None:
    tracker = SessionTracker("uid")
    unknown = kernel_reading(KernelsReading(None, "connection refused"))
    for t in range(0, 3600, 60):
        verdict = tracker.judge([cpu_reading(0.0, 0.1), unknown], at(t))
        assert verdict.state == ActivityState.UNKNOWN
        assert "connection refused" in verdict.unknown[0]


def test_gpu_above_the_floor_is_activity_and_below_is_idle() -> None:
    busy = gpu_reading([DeviceUtilization("GPU-1", 40.0)], 5.0, "ignore")
    quiet = gpu_reading([DeviceUtilization("GPU-1", 3.0)], 5.0, "ignore")
    assert busy is not None and busy.state == ActivityState.ACTIVE and busy.value == 40.0
    assert quiet is not None and quiet.state == ActivityState.IDLE


def test_unmeasurable_gpu_is_ignored_or_unknown_as_configured() -> None:
    mig = DeviceUtilization("MIG-1", None, "MIG 1g.10gb: no GPM")
    assert gpu_reading([mig], 5.0, "ignore") is None
    blocked = gpu_reading([mig], 5.0, "unknown")
    assert blocked is not None and blocked.state == ActivityState.UNKNOWN


def test_idle_time_starts_when_the_last_signal_went_quiet() -> None:
    tracker = SessionTracker("uid")
    tracker.judge([cpu_reading(2.0, 0.1)], at(0))  # active at 0
    tracker.judge([cpu_reading(0.0, 0.1)], at(30))
    verdict = tracker.judge([cpu_reading(0.0, 0.1)], at(60))
    assert verdict.state == ActivityState.IDLE
    assert verdict.idle_since == at(0)
    # The kernel's own record can only make the idle time shorter, never longer.
    later = kernel_reading(KernelsReading([kernel("idle", at(45))]))
    verdict = tracker.judge([cpu_reading(0.0, 0.1), later], at(90))
    assert verdict.idle_since == at(90)  # the kernel track starts now: not seen before
    verdict = tracker.judge([cpu_reading(0.0, 0.1), later], at(120))
    assert verdict.idle_since == at(90)


def test_idle_time_never_starts_before_the_agent_first_looked() -> None:
    tracker = SessionTracker("uid")
    reading = kernel_reading(KernelsReading([kernel("idle", at(-600))]))
    tracker.judge([reading], at(0))
    verdict = tracker.judge([reading], at(30))
    assert verdict.state == ActivityState.IDLE
    assert verdict.idle_since == at(0)  # first observation bounds it: no claim before we looked


def test_no_signal_at_all_is_unknown() -> None:
    assert SessionTracker("uid").judge([], at(0)).state == ActivityState.UNKNOWN


def test_first_cpu_interval_is_unknown() -> None:
    reading = cpu_reading(None, 0.1, "first CPU sample (a rate needs two)")
    verdict = SessionTracker("uid").judge([reading], at(0))
    assert verdict.state == ActivityState.UNKNOWN


def test_a_kernel_starting_for_long_is_not_activity() -> None:
    fresh = kernel_reading(KernelsReading([kernel("starting", at(-30))]), at(0))
    stuck = kernel_reading(KernelsReading([kernel("starting", at(-3600))]), at(0))
    assert fresh.state == ActivityState.ACTIVE
    assert stuck.state == ActivityState.IDLE and stuck.idle_since == at(-3600)
