"""AMD RAS errors in nodeward's GPU health model: pure functions, no I/O.

An `AmdHealthSample` (AMD SMI's ECC counts per RAS block, bad pages, hotspot thermals)
and the KFD SMI events (ring hang, GPU reset, thermal throttle) become the same
`Finding`s, reason codes, states and recommended actions as NVML's, so the cordon policy
quarantines an AMD GPU as it does an NVIDIA one. The table is in docs/agents/gpu.md
("AMD GPUs").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agents.gpu.health import Finding, thermal_findings
from agents.sources.amdsmi import AmdEvent, AmdHealthSample
from schemas.gpu import HealthState, RecommendedAction


@dataclass(frozen=True)
class AmdLimits:
    """Thresholds AMD SMI reports without a verdict."""

    ecc_corrected: int = 10_000
    bad_pages: int = 128
    """Retired pages that make the GPU an RMA case (set it to the fleet's amdgpu
    `bad_page_threshold`; past it the driver stops retiring and the GPU is at its end)."""
    resets: int = 3
    """GPU resets within the hold window after which a reset is no longer a fix."""


def sample_findings(s: AmdHealthSample, limits: AmdLimits) -> list[Finding]:
    """Findings from one poll (level-triggered: they last while the counters say so)."""
    out: list[Finding] = []
    total = s.ecc_total or {}
    blocks = {name: c for name, c in s.ecc_blocks.items()}
    uncorrected = total.get("uncorrectable", 0)
    if uncorrected > 0:
        where = sorted(n for n, c in blocks.items() if c.get("uncorrectable", 0)) or ["?"]
        out.append(
            Finding(
                "ecc_uncorrected",
                HealthState.FAILED,
                RecommendedAction.RESET_GPU,
                f"{uncorrected} uncorrectable ECC errors since the driver loaded "
                f"(RAS blocks: {', '.join(where)})",
                evidence={**total, "blocks": blocks, "vendor": "amd"},
            )
        )
    elif total.get("correctable", 0) > limits.ecc_corrected:
        out.append(
            Finding(
                "ecc_corrected_high",
                HealthState.DEGRADED,
                RecommendedAction.NONE,
                f"{total['correctable']} corrected ECC errors since the driver loaded "
                f"(limit {limits.ecc_corrected})",
                evidence={**total, "blocks": blocks, "vendor": "amd"},
            )
        )
    if total.get("deferred", 0) > 0 and uncorrected == 0:
        out.append(
            Finding(
                "ecc_deferred",
                HealthState.DEGRADED,
                RecommendedAction.NONE,
                f"{total['deferred']} deferred (poisoned, not yet consumed) ECC errors",
                evidence={**total, "blocks": blocks, "vendor": "amd"},
            )
        )
    pages = s.bad_pages
    if pages is not None:
        retired = pages.get("reserved", 0) + pages.get("pending", 0)
        evidence = {**pages, "limit": limits.bad_pages, "vendor": "amd"}
        if pages.get("unreservable", 0):
            out.append(
                Finding(
                    "retired_pages_failure",
                    HealthState.FAILED,
                    RecommendedAction.DRAIN_AND_RMA,
                    f"{pages['unreservable']} bad pages the driver could not retire",
                    evidence=evidence,
                )
            )
        if retired >= limits.bad_pages:
            out.append(
                Finding(
                    "retired_pages_limit",
                    HealthState.FAILED,
                    RecommendedAction.DRAIN_AND_RMA,
                    f"{retired} retired pages, at or above the limit of {limits.bad_pages}",
                    evidence=evidence,
                )
            )
        elif pages.get("pending", 0):
            out.append(
                Finding(
                    "retired_pages_pending",
                    HealthState.DEGRADED,
                    RecommendedAction.RESET_GPU,
                    f"{pages['pending']} bad pages pending retirement: reset the GPU to apply",
                    evidence=evidence,
                )
            )
    out += thermal_findings(
        s.temperature_c,
        s.slowdown_c,
        s.shutdown_c,
        sensor="hotspot",
        names=("critical", "emergency"),
    )
    return out


@dataclass(frozen=True)
class EventSeen:
    """A KFD SMI event and when (monotonic seconds) it arrived."""

    event: str
    message: str
    at: float


def event_findings(history: Iterable[EventSeen], limits: AmdLimits) -> list[Finding]:
    """Findings from the events held (the agent drops them after its `xid_hold`).

    RING_HANG fails the GPU until a GPU_POST_RESET follows it; GPU_PRE_RESET without its
    POST_RESET is a reset in progress; `limits.resets` completed resets in the window
    mean resets no longer help. THERMAL_THROTTLE and VMFAULT give no finding here
    (thermals are polled; a VM fault is the application's).
    """
    seen = sorted(history, key=lambda e: e.at)
    last_post = max((e.at for e in seen if e.event == "GPU_POST_RESET"), default=None)
    after = [e for e in seen if last_post is None or e.at > last_post]
    out: list[Finding] = []
    hangs = [e for e in after if e.event == "RING_HANG"]
    if hangs:
        out.append(
            Finding(
                "ring_hang",
                HealthState.FAILED,
                RecommendedAction.RESET_GPU,
                f"ring hang on {hangs[-1].message or '?'}, no completed GPU reset since",
                evidence={
                    "rings": sorted({e.message for e in hangs}),
                    "count": len(hangs),
                    "vendor": "amd",
                },
            )
        )
    if any(e.event == "GPU_PRE_RESET" for e in after):
        out.append(
            Finding(
                "gpu_reset_pending",
                HealthState.DEGRADED,
                RecommendedAction.NONE,
                "the driver is resetting the GPU",
                evidence={"vendor": "amd"},
            )
        )
    resets = sum(1 for e in seen if e.event == "GPU_POST_RESET")
    if resets >= limits.resets:
        out.append(
            Finding(
                "gpu_resets_repeated",
                HealthState.FAILED,
                RecommendedAction.REBOOT_NODE,
                f"{resets} GPU resets in the hold window (limit {limits.resets})",
                evidence={"resets": resets, "limit": limits.resets, "vendor": "amd"},
            )
        )
    return out


def is_refresh(event: AmdEvent) -> bool:
    """Events after which the counters are read again at once."""
    return event.event in ("GPU_POST_RESET", "THERMAL_THROTTLE", "RING_HANG")
