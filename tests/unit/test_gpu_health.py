"""Classification rules: the catalog decides XIDs; correlation; counters; recovery action."""

from __future__ import annotations

import pynvml

from agents.gpu.health import (
    Limits,
    XidSeen,
    classify,
    recovery_finding,
    sample_findings,
    xid_findings,
)
from agents.sources.nvml import HealthSample
from schemas.gpu import HealthState, RecommendedAction
from schemas.xid import load_catalog

CATALOG = load_catalog()


def verdict(*xids: tuple[int, float]):  # type: ignore[no-untyped-def]
    return classify(xid_findings([XidSeen(x, t, {}) for x, t in xids], CATALOG, window=10))


def test_application_xids_never_fail() -> None:
    for xid in (13, 31, 43, 68, 69, 94):
        assert verdict((xid, 0)).state == HealthState.HEALTHY, xid


def test_catalog_actions() -> None:
    assert verdict((79, 0)).action == RecommendedAction.REBOOT_NODE
    assert verdict((79, 0)).state == HealthState.FAILED
    assert verdict((119, 0)).action == RecommendedAction.RESET_GPU
    assert verdict((74, 0)).state == HealthState.DEGRADED
    assert verdict((74, 0)).action == RecommendedAction.CHECK_NVLINK


def test_48_alone_and_with_63() -> None:
    alone = verdict((48, 0))
    assert alone.state == HealthState.FAILED and alone.action == RecommendedAction.RESET_GPU
    assert alone.reasons[0].evidence["nvidia_action"] == "RESET_GPU"
    both = verdict((48, 0), (63, 3))
    assert both.reasons[0].evidence["nvidia_action"] == "DRAIN_AND_RESET"
    assert both.action == RecommendedAction.DRAIN_AND_RESET
    assert both.codes != alone.codes
    apart = verdict((48, 0), (64, 60))
    assert any(r.evidence.get("nvidia_action") == "RESET_GPU" for r in apart.reasons)


def test_45_alone_vs_with_others() -> None:
    alone = verdict((45, 0))
    assert alone.state == HealthState.DEGRADED
    assert alone.reasons[0].evidence["nvidia_action"] == "RESTART_FM"
    assert verdict((94, 0), (45, 1)).state == HealthState.HEALTHY  # 94 restart_app, 45 sympathetic
    assert verdict((95, 0), (45, 1)).action == RecommendedAction.RESET_GPU


def test_recovery_action() -> None:
    assert recovery_finding(pynvml.NVML_GPU_RECOVERY_ACTION_NONE) is None
    reboot = recovery_finding(pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    assert reboot is not None and reboot.action == RecommendedAction.REBOOT_NODE
    p2p = recovery_finding(pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P)
    assert p2p is not None and p2p.state == HealthState.DEGRADED


def test_counter_findings() -> None:
    limits = Limits()
    healthy = HealthSample(
        ecc={"uncorrected_volatile": 0, "uncorrected_aggregate": 3},
        temperature_c=50,
        slowdown_c=87,
        shutdown_c=92,
    )
    assert sample_findings(healthy, limits) == []
    sick = HealthSample(
        ecc={"uncorrected_volatile": 2},
        remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": 1, "failure": 1},
        retired_pages={"sbe": 10, "dbe": 55},
        retired_pending=True,
        temperature_c=93,
        slowdown_c=87,
        shutdown_c=92,
        clock_reasons=pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
        | pynvml.nvmlClocksEventReasonGpuIdle,
        nvlink_errors={"crc_flit": 500},
        pcie_replay=5000,
    )
    codes = {f.code for f in sample_findings(sick, limits)}
    assert codes == {
        "ecc_uncorrected",
        "row_remap_failure",
        "retired_pages_limit",
        "thermal_shutdown",
        "clocks_throttled",
        "nvlink_errors",
        "pcie_replays",
    }
    assert classify(sample_findings(sick, limits)).action == RecommendedAction.DRAIN_AND_RMA
    idle_only = HealthSample(clock_reasons=pynvml.nvmlClocksEventReasonGpuIdle)
    assert sample_findings(idle_only, limits) == []
