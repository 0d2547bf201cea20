"""Classifying one GPU: findings from counters and XIDs, then healthy/degraded/failed.

Pure functions and small value objects, no I/O: the agent feeds them samples and events.
The XID catalog decides each XID's action; application XIDs never fail a GPU; XID 48 is
correlated with 63/64, XID 45 alone with other XIDs, and the driver's recovery action
(XID 154, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) is followed as reported.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agents.gpu.detectors import Incident
from agents.sources.nvml import HealthSample
from agents.sources.nvml_compat import pynvml
from schemas.gpu import HealthReason, HealthState, RecommendedAction
from schemas.xid import XidCatalog

_STATE_RANK = {
    HealthState.HEALTHY: 0,
    HealthState.UNKNOWN: 1,
    HealthState.DEGRADED: 2,
    HealthState.FAILED: 3,
}
_ACTION_RANK = {
    RecommendedAction.NONE: 0,
    RecommendedAction.RESTART_APP: 1,
    RecommendedAction.CHECK_NVLINK: 2,
    RecommendedAction.RESET_GPU: 3,
    RecommendedAction.DRAIN_AND_RESET: 4,
    RecommendedAction.REBOOT_NODE: 5,
    RecommendedAction.DRAIN_AND_RMA: 6,
}
_FAILING_ACTIONS = {
    RecommendedAction.RESET_GPU,
    RecommendedAction.DRAIN_AND_RESET,
    RecommendedAction.REBOOT_NODE,
    RecommendedAction.DRAIN_AND_RMA,
}
_THROTTLE_BITS = {
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}
# NVML_GPU_RECOVERY_ACTION_* -> (name, state, action)
_RECOVERY: dict[int, tuple[str, HealthState, RecommendedAction]] = {
    pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET: (
        "GPU Reset Required",
        HealthState.FAILED,
        RecommendedAction.RESET_GPU,
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT: (
        "Node Reboot Required",
        HealthState.FAILED,
        RecommendedAction.REBOOT_NODE,
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: (
        "Drain P2P",
        HealthState.DEGRADED,
        RecommendedAction.NONE,
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET: (
        "Drain and Reset",
        HealthState.FAILED,
        RecommendedAction.DRAIN_AND_RESET,
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN: (
        "Recover IMEX Domain",
        HealthState.DEGRADED,
        RecommendedAction.NONE,
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET: (
        "Bus Reset Required",
        HealthState.FAILED,
        RecommendedAction.RESET_GPU,
    ),
    pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT: (
        "System Reboot Required",
        HealthState.FAILED,
        RecommendedAction.REBOOT_NODE,
    ),
}


@dataclass(frozen=True)
class Finding:
    """One reason a GPU is not healthy."""

    code: str
    state: HealthState
    action: RecommendedAction
    message: str
    xid: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    variant: str = ""
    """Distinguishes findings of one code whose meaning differs (XID 48 alone or correlated)."""
    detectors: tuple[str, ...] = ()
    """For an XID: the detectors that saw it (not part of the key: a confirmation by a
    second detector is not a change of state)."""

    @property
    def key(self) -> str:
        return f"{self.code}:{self.xid or ''}:{self.variant}"

    def reason(self) -> HealthReason:
        return HealthReason(
            code=self.code,
            message=self.message,
            xid=self.xid,
            evidence=self.evidence,
            action=self.action,
            detectors=list(self.detectors),
        )


@dataclass(frozen=True)
class Limits:
    """Thresholds for counters NVML reports without a verdict."""

    ecc_corrected_volatile: int = 10_000
    retired_pages: int = 60
    nvlink_errors: int = 100
    pcie_replays: int = 1_000


@dataclass(frozen=True)
class Classification:
    state: HealthState
    action: RecommendedAction
    reasons: tuple[HealthReason, ...]
    codes: tuple[str, ...] = ()
    """The findings' keys, sorted: a change here is a change worth publishing."""


def classify(findings: Iterable[Finding]) -> Classification:
    """The worst state among the findings, the strongest action, every reason (worst first)."""
    ordered = sorted(
        findings, key=lambda f: (-_STATE_RANK[f.state], -_ACTION_RANK[f.action], f.code)
    )
    if not ordered:
        return Classification(HealthState.HEALTHY, RecommendedAction.NONE, ())
    action = max((f.action for f in ordered), key=_ACTION_RANK.__getitem__)
    return Classification(
        ordered[0].state,
        action,
        tuple(f.reason() for f in ordered),
        tuple(sorted(f.key for f in ordered)),
    )


def sample_findings(s: HealthSample, limits: Limits) -> list[Finding]:
    """Findings from one health poll (level-triggered: they last while the counters say so)."""
    out: list[Finding] = []
    ecc = dict(s.ecc)
    if ecc.get("uncorrected_volatile", 0) > 0:
        out.append(
            Finding(
                "ecc_uncorrected",
                HealthState.FAILED,
                RecommendedAction.RESET_GPU,
                f"{ecc['uncorrected_volatile']} uncorrectable ECC errors since the driver loaded",
                evidence=ecc,
            )
        )
    elif ecc.get("corrected_volatile", 0) > limits.ecc_corrected_volatile:
        out.append(
            Finding(
                "ecc_corrected_high",
                HealthState.DEGRADED,
                RecommendedAction.NONE,
                f"{ecc['corrected_volatile']} corrected ECC errors since the driver loaded "
                f"(limit {limits.ecc_corrected_volatile})",
                evidence=ecc,
            )
        )
    if s.retired_pages is not None:
        total = s.retired_pages["sbe"] + s.retired_pages["dbe"]
        evidence = {
            **s.retired_pages,
            "pending": bool(s.retired_pending),
            "limit": limits.retired_pages,
        }
        if total >= limits.retired_pages:
            out.append(
                Finding(
                    "retired_pages_limit",
                    HealthState.FAILED,
                    RecommendedAction.DRAIN_AND_RMA,
                    f"{total} retired pages, at or above the limit of {limits.retired_pages}",
                    evidence=evidence,
                )
            )
        elif s.retired_pending:
            out.append(
                Finding(
                    "retired_pages_pending",
                    HealthState.DEGRADED,
                    RecommendedAction.RESET_GPU,
                    "page retirement pending: reset the GPU to apply it",
                    evidence=evidence,
                )
            )
    rows = s.remapped_rows
    if rows is not None:
        if rows["failure"]:
            out.append(
                Finding(
                    "row_remap_failure",
                    HealthState.FAILED,
                    RecommendedAction.DRAIN_AND_RMA,
                    "row remapping failed: no spare rows left",
                    evidence=rows,
                )
            )
        elif rows["pending"]:
            out.append(
                Finding(
                    "row_remap_pending",
                    HealthState.DEGRADED,
                    RecommendedAction.RESET_GPU,
                    "row remapping pending: reset the GPU to apply it",
                    evidence=rows,
                )
            )
    out += thermal_findings(s.temperature_c, s.slowdown_c, s.shutdown_c)
    if s.clock_reasons:
        active = [name for name, bit in _THROTTLE_BITS.items() if s.clock_reasons & bit]
        if active:
            out.append(
                Finding(
                    "clocks_throttled",
                    HealthState.DEGRADED,
                    RecommendedAction.NONE,
                    "clocks held down by " + ", ".join(active),
                    evidence={"reasons": active, "mask": s.clock_reasons},
                )
            )
    link_total = sum(s.nvlink_errors.values())
    if link_total > limits.nvlink_errors:
        out.append(
            Finding(
                "nvlink_errors",
                HealthState.DEGRADED,
                RecommendedAction.CHECK_NVLINK,
                f"{link_total} NVLink errors (limit {limits.nvlink_errors})",
                evidence=dict(s.nvlink_errors),
            )
        )
    if s.pcie_replay is not None and s.pcie_replay > limits.pcie_replays:
        out.append(
            Finding(
                "pcie_replays",
                HealthState.DEGRADED,
                RecommendedAction.NONE,
                f"{s.pcie_replay} PCIe replays (limit {limits.pcie_replays})",
                evidence={"replay_counter": s.pcie_replay},
            )
        )
    if s.recovery_action is not None:
        found = recovery_finding(s.recovery_action)
        if found is not None:
            out.append(found)
    return out


def thermal_findings(
    temp: float | None,
    slowdown_c: float | None,
    shutdown_c: float | None,
    *,
    sensor: str | None = None,
    names: tuple[str, str] = ("slowdown", "shutdown"),
) -> list[Finding]:
    """A temperature at or above the shutdown threshold fails the GPU (RMA); at or above
    the slowdown threshold it degrades it. `names` are the vendor's words for the two
    thresholds, `sensor` the sensor read (evidence and message)."""
    evidence: dict[str, Any] = {
        "temperature_c": temp,
        "slowdown_c": slowdown_c,
        "shutdown_c": shutdown_c,
    }
    where = ""
    if sensor is not None:
        evidence["sensor"] = sensor
        where = f"{sensor} "
    thresholds = (  # the worse first
        (
            "thermal_shutdown",
            shutdown_c,
            names[1],
            HealthState.FAILED,
            RecommendedAction.DRAIN_AND_RMA,
        ),
        ("thermal_slowdown", slowdown_c, names[0], HealthState.DEGRADED, RecommendedAction.NONE),
    )
    for code, limit_c, name, state, action in thresholds:
        if temp is not None and limit_c is not None and temp >= limit_c:
            message = f"{where}{temp} °C at or above the {name} threshold {limit_c} °C"
            return [Finding(code, state, action, message, evidence=evidence)]
    return []


def recovery_finding(action: int) -> Finding | None:
    """The driver's recovery action (XID 154) as a finding; None when it is NONE."""
    known = _RECOVERY.get(action)
    if action == pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
        return None
    if known is None:
        return Finding(
            "recovery_action",
            HealthState.DEGRADED,
            RecommendedAction.NONE,
            f"driver recovery action {action} (unknown)",
            xid=154,
            evidence={"recovery_action": action},
        )
    name, state, ours = known
    return Finding(
        "recovery_action",
        state,
        ours,
        f"driver recovery action: {name}",
        xid=154,
        evidence={"recovery_action": action, "nvidia_action": name},
    )


def lost_finding(where: str) -> Finding:
    return Finding(
        "gpu_lost",
        HealthState.FAILED,
        RecommendedAction.REBOOT_NODE,
        "GPU has fallen off the bus (NVML: GPU is lost)",
        evidence={"call": where},
    )


def hang_finding(call: str, seconds: float) -> Finding:
    return Finding(
        "nvml_hang",
        HealthState.DEGRADED,
        RecommendedAction.RESET_GPU,
        f"NVML call {call or '?'} has not returned for {seconds:.1f}s",
        evidence={"call": call, "seconds": round(seconds, 3)},
    )


@dataclass(frozen=True)
class XidSeen:
    xid: int
    at: float
    data: dict[str, Any]
    incident: Incident | None = None
    """The incident it opened: which detectors saw it so far."""

    @property
    def detectors(self) -> tuple[str, ...]:
        return tuple(self.incident.detectors) if self.incident else ()


def xid_findings(history: list[XidSeen], catalog: XidCatalog, window: float) -> list[Finding]:
    """Findings from the XIDs seen (one per XID), with the catalog's correlation rules."""
    latest: dict[int, tuple[XidSeen, int]] = {}
    for seen in history:
        count = latest.get(seen.xid, (seen, 0))[1] + 1
        latest[seen.xid] = (seen, count)

    def near(seen: XidSeen, xids: set[int] | None = None) -> list[int]:
        return sorted(
            {
                o.xid
                for o in history
                if o.xid != seen.xid
                and abs(o.at - seen.at) <= window
                and (xids is None or o.xid in xids)
            }
        )

    out: list[Finding] = []
    for xid, (seen, count) in sorted(latest.items()):
        info = catalog.get(xid)
        found = functools.partial(Finding, "xid", xid=xid, detectors=seen.detectors)
        evidence = {
            **seen.data,
            "count": count,
            "category": info.category,
            "catalog_action": info.action.value,
        }
        if xid == 154:
            continue  # followed through the recovery action it announces
        if xid == 48:
            if remap := near(seen, {63, 64}):
                with_remap = f"with XID {', '.join(map(str, remap))}: drain, then reset the GPU"
                out.append(
                    found(
                        HealthState.FAILED,
                        RecommendedAction.DRAIN_AND_RESET,
                        f"XID 48 {info.name} {with_remap}",
                        evidence={
                            **evidence,
                            "correlated_xids": remap,
                            "nvidia_action": "DRAIN_AND_RESET",
                        },
                        variant="with_remap",
                    )
                )
            else:
                out.append(
                    found(
                        HealthState.FAILED,
                        RecommendedAction.RESET_GPU,
                        f"XID 48 {info.name} alone: reset the GPU",
                        evidence={**evidence, "nvidia_action": "RESET_GPU"},
                    )
                )
            continue
        if xid == 45:
            if not near(seen):
                out.append(
                    found(
                        HealthState.DEGRADED,
                        RecommendedAction.NONE,
                        f"XID 45 {info.name} alone: restart Fabric Manager",
                        evidence={**evidence, "nvidia_action": "RESTART_FM"},
                        variant="solo",
                    )
                )
            continue  # with other XIDs: sympathetic, follow those
        if info.is_application or info.action not in (
            _FAILING_ACTIONS | {RecommendedAction.CHECK_NVLINK}
        ):
            continue
        state = HealthState.FAILED if info.action in _FAILING_ACTIONS else HealthState.DEGRADED
        out.append(found(state, info.action, f"XID {xid} {info.name}", evidence=evidence))
    return out
