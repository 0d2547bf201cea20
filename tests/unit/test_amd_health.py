"""AMD RAS errors and KFD events mapped into the GPU health model (docs/agents/gpu.md)."""

from __future__ import annotations

import pytest

from agents.gpu.amd_health import AmdLimits, EventSeen, event_findings, sample_findings
from agents.gpu.health import classify
from agents.sources.amdsmi import AmdHealthSample
from schemas.gpu import HealthState, RecommendedAction

LIMITS = AmdLimits(ecc_corrected=100, bad_pages=10, resets=3)
NONE = {"correctable": 0, "uncorrectable": 0, "deferred": 0}


def sample(**kw: object) -> AmdHealthSample:
    base: dict[str, object] = {
        "ecc_total": dict(NONE),
        "bad_pages": {"reserved": 0, "pending": 0, "unreservable": 0},
        "temperature_c": 50,
        "slowdown_c": 100,
        "shutdown_c": 105,
    }
    return AmdHealthSample(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("s", "code", "state", "action"),
    [
        (
            sample(
                ecc_total=NONE | {"uncorrectable": 2},
                ecc_blocks={"UMC": NONE | {"uncorrectable": 2}},
            ),
            "ecc_uncorrected",
            HealthState.FAILED,
            RecommendedAction.RESET_GPU,
        ),
        (
            sample(ecc_total=NONE | {"correctable": 101}),
            "ecc_corrected_high",
            HealthState.DEGRADED,
            RecommendedAction.NONE,
        ),
        (
            sample(ecc_total=NONE | {"deferred": 1}),
            "ecc_deferred",
            HealthState.DEGRADED,
            RecommendedAction.NONE,
        ),
        (
            sample(bad_pages={"reserved": 3, "pending": 1, "unreservable": 0}),
            "retired_pages_pending",
            HealthState.DEGRADED,
            RecommendedAction.RESET_GPU,
        ),
        (
            sample(bad_pages={"reserved": 10, "pending": 0, "unreservable": 0}),
            "retired_pages_limit",
            HealthState.FAILED,
            RecommendedAction.DRAIN_AND_RMA,
        ),
        (
            sample(bad_pages={"reserved": 0, "pending": 0, "unreservable": 1}),
            "retired_pages_failure",
            HealthState.FAILED,
            RecommendedAction.DRAIN_AND_RMA,
        ),
        (
            sample(temperature_c=101),
            "thermal_slowdown",
            HealthState.DEGRADED,
            RecommendedAction.NONE,
        ),
        (
            sample(temperature_c=105),
            "thermal_shutdown",
            HealthState.FAILED,
            RecommendedAction.DRAIN_AND_RMA,
        ),
    ],
)
def test_polled_ras_counters_map_to_the_nvidia_reason_codes(
    s: AmdHealthSample, code: str, state: HealthState, action: RecommendedAction
) -> None:
    verdict = classify(sample_findings(s, LIMITS))
    assert verdict.state == state
    assert verdict.action == action
    assert verdict.reasons[0].code == code


def test_a_healthy_gpu_and_missing_reads_give_no_finding() -> None:
    assert sample_findings(sample(), LIMITS) == []
    assert sample_findings(AmdHealthSample(), LIMITS) == []
    # at the limit, not past it
    assert sample_findings(sample(ecc_total=NONE | {"correctable": 100}), LIMITS) == []


def test_uncorrectable_names_the_ras_blocks() -> None:
    found = sample_findings(
        sample(
            ecc_total=NONE | {"uncorrectable": 3},
            ecc_blocks={"UMC": NONE | {"uncorrectable": 2}, "GFX": NONE | {"uncorrectable": 1}},
        ),
        LIMITS,
    )
    assert "RAS blocks: GFX, UMC" in found[0].message
    assert found[0].evidence["vendor"] == "amd"


def seen(*events: tuple[str, float]) -> list[EventSeen]:
    return [EventSeen(name, "gfx_0.0.0" if name == "RING_HANG" else "1", at) for name, at in events]


def test_ring_hang_fails_until_a_post_reset_follows() -> None:
    hung = classify(event_findings(seen(("RING_HANG", 1), ("GPU_PRE_RESET", 2)), LIMITS))
    assert hung.state == HealthState.FAILED
    assert hung.action == RecommendedAction.RESET_GPU
    assert [r.code for r in hung.reasons] == ["ring_hang", "gpu_reset_pending"]
    back = event_findings(
        seen(("RING_HANG", 1), ("GPU_PRE_RESET", 2), ("GPU_POST_RESET", 3)), LIMITS
    )
    assert back == []


def test_repeated_resets_recommend_a_reboot() -> None:
    two = seen(
        *[(e, t) for i in range(2) for e, t in (("GPU_PRE_RESET", i), ("GPU_POST_RESET", i + 0.5))]
    )
    assert event_findings(two, LIMITS) == []
    three = seen(
        *[(e, t) for i in range(3) for e, t in (("GPU_PRE_RESET", i), ("GPU_POST_RESET", i + 0.5))]
    )
    verdict = classify(event_findings(three, LIMITS))
    assert verdict.state == HealthState.FAILED
    assert verdict.action == RecommendedAction.REBOOT_NODE
    assert verdict.reasons[0].code == "gpu_resets_repeated"


def test_thermal_throttle_and_vm_faults_are_not_findings_by_themselves() -> None:
    assert event_findings(seen(("THERMAL_THROTTLE", 1), ("VMFAULT", 2)), LIMITS) == []
