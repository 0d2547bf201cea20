"""One incident per physical GPU, and XID 154's embedded recovery action, without peers.

A MIG-partitioned GPU is published as its GPU (`3`) and each MIG instance (`3-mig1-0`):
cordon groups their failures by the physical GPU. XID 154 names no fault of its own: the
driver embeds the action it calls for ("GPU recovery action changed from 0x0 (None) to 0x1
(GPU Reset Required)"), which the agent reports as the reason's action; cordon's policy and
services.recovery's `decide` follow that action, never the catalog's row for 154."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from agents.gpu.health import classify, recovery_finding
from agents.sources.kmsg import DriverLineParser
from schemas.gpu import GpuHealth, HealthState, MigInstance, RecommendedAction
from schemas.state.cordon import (
    DeviceExclusion,
    GpuRecord,
    NodeRecord,
    Quarantine,
    first_of_gpu,
    physical_gpu,
)
from schemas.xid import XidCatalog, load_catalog
from services.cordon.devices import joined_exclusion
from services.cordon.policy import PolicyAction, load_policy, speaks_for
from services.cordon.service import fault_details
from services.recovery.policy import Kind, decide
from services.recovery.state import Plan

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CATALOG = load_catalog()


def catalog_saying(xid: int, action: RecommendedAction) -> XidCatalog:
    """The shipped catalog with XID `xid`'s row saying `action`."""
    rows = dict(CATALOG.rows)
    rows[xid] = replace(rows[xid], action=action)
    return XidCatalog(rows)


def xid154(to: int, name: str, *, mig: MigInstance | None = None) -> GpuHealth:
    """The health the GPU agent publishes after the driver's XID 154 line (kernel-log
    detector): the line parsed, its recovery action classified."""
    line = (
        f"NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) "
        f"to 0x{to:x} ({name})"
    )
    (found,) = DriverLineParser().feed(line)
    assert found.xid == 154 and found.recovery_action == to
    finding = recovery_finding(found.recovery_action)
    verdict = classify([finding] if finding is not None else [])
    return GpuHealth(
        node="n1",
        gpu_index=3,
        gpu_uuid="GPU-3",
        mig=mig,
        state=verdict.state,
        reasons=list(verdict.reasons),
        recommended_action=verdict.action,
        observed_at=T0,
        agent_boot_id="b1",
        sequence=1,
    )


# NVIDIA's XID 154 recovery actions (NVML_GPU_RECOVERY_ACTION_*), what cordon decides and
# what services.recovery plans.
ACTIONS = [
    (0, "None", HealthState.HEALTHY, RecommendedAction.NONE, PolicyAction.NONE, Kind.NONE, None),
    (
        1,
        "GPU Reset Required",
        HealthState.FAILED,
        RecommendedAction.RESET_GPU,
        PolicyAction.QUARANTINE,
        Kind.RECOVER,
        Plan.RESET,
    ),
    (
        2,
        "Node Reboot Required",
        HealthState.FAILED,
        RecommendedAction.REBOOT_NODE,
        PolicyAction.QUARANTINE,
        Kind.RECOVER,
        Plan.REBOOT,
    ),
    (
        3,
        "Drain P2P",
        HealthState.DEGRADED,
        RecommendedAction.NONE,
        PolicyAction.NONE,
        Kind.NONE,
        None,
    ),
    (
        4,
        "Drain and Reset",
        HealthState.FAILED,
        RecommendedAction.DRAIN_AND_RESET,
        PolicyAction.QUARANTINE,
        Kind.RECOVER,
        Plan.RESET,
    ),
]


@pytest.mark.parametrize(
    ("to", "name", "state", "action", "policy", "kind", "plan"),
    ACTIONS,
    ids=[a[1] for a in ACTIONS],
)
@pytest.mark.parametrize(
    "row",
    [RecommendedAction.NONE, RecommendedAction.DRAIN_AND_RMA],
    ids=["catalog-none", "catalog-rma"],
)
def test_xid_154_is_decided_by_the_action_the_driver_embedded(
    to: int,
    name: str,
    state: HealthState,
    action: RecommendedAction,
    policy: PolicyAction,
    kind: Kind,
    plan: Plan | None,
    row: RecommendedAction,
) -> None:
    health = xid154(to, name)
    assert (health.state, health.recommended_action) == (state, action)
    assert load_policy().decide(health).action == policy
    if policy != PolicyAction.QUARANTINE:
        return  # recorded, not quarantined: services.recovery never hears of it
    details = fault_details(health)
    assert details == {"recommended_actions": [action.value], "xids": [154]}
    # Whatever the catalog's row for 154 says (drain_and_rma here), the embedded action wins.
    decision = decide(details["recommended_actions"], details["xids"], catalog_saying(154, row))
    assert (decision.kind, decision.plan) == (kind, plan), decision.why
    assert "154" in decision.why


def test_xid_154_with_no_embedded_action_is_no_recovery_whatever_the_catalog_says() -> None:
    rma = catalog_saying(154, RecommendedAction.DRAIN_AND_RMA)
    assert decide([], [154], rma).kind == Kind.NONE
    # Another XID beside it still has its catalog row applied.
    assert decide([], [154, 79], rma).plan == Plan.REBOOT
    assert decide(["reset_gpu"], [154, 79], rma).plan == Plan.REBOOT


def test_keys_of_one_physical_gpu() -> None:
    assert physical_gpu("3") == physical_gpu("3-mig1-0") == physical_gpu("3-mig7-0") == "3"
    assert physical_gpu("13") == "13" and physical_gpu("13-mig2-1") == "13"
    keys = ["0", "3-mig1-0", "3", "13"]
    assert first_of_gpu("3-mig2-0", keys) == "3-mig1-0"
    assert first_of_gpu("3", keys) == "3-mig1-0"
    assert first_of_gpu("1", keys) is None
    assert speaks_for("3-mig1-0", keys) and not speaks_for("3", keys)
    assert speaks_for("13", keys) and speaks_for("1", keys)
    q = Quarantine(incident="e1", rule="r", reason="x", gpus=["3"], started_at=T0)
    assert q.holds("3") and q.holds("3-mig4-0") and not q.holds("13") and not q.holds("0")


def _record(states: dict[str, HealthState]) -> NodeRecord:
    return NodeRecord(
        gpus={
            key: GpuRecord(state=state, observed_at=T0, event_id=f"e-{key}")
            for key, state in states.items()
        }
    )


def test_failed_gpus_are_counted_per_physical_gpu() -> None:
    failed = HealthState.FAILED
    record = _record(
        {"3": failed, "3-mig1-0": failed, "3-mig2-0": failed, "0": HealthState.HEALTHY}
    )
    assert record.failed_gpus() == {"3"}
    assert record.sibling_failed("3-mig3-0") and record.sibling_failed("3")
    assert not record.sibling_failed("0") and not record.sibling_failed("5")
    record = _record({"3": failed, "5-mig1-0": failed})
    assert record.failed_gpus() == {"3", "5"}
    assert not record.sibling_failed("3") and not record.sibling_failed("5-mig1-0")


def test_a_mig_instance_joins_its_gpus_exclusion_not_a_device_taint() -> None:
    def ex(gpu: str, kind: str, phase: str = "applied") -> DeviceExclusion:
        return DeviceExclusion.model_validate(
            {
                "gpu": gpu,
                "gpu_uuid": "GPU-3",
                "kind": kind,
                "incident": "e1",
                "rule": "failed-gpu",
                "reason": "x",
                "started_at": T0,
                "phase": phase,
            }
        )

    record = NodeRecord(devices={"3": ex("3", "excluded")})
    assert joined_exclusion(record, "3-mig1-0") == record.devices["3"]
    assert joined_exclusion(record, "3") is None  # its own, not joined
    assert joined_exclusion(record, "4-mig1-0") is None
    # Written ahead but not applied yet: the change path finishes it, nothing joins it.
    assert (
        joined_exclusion(NodeRecord(devices={"3": ex("3", "excluded", "pending")}), "3-mig1-0")
        is None
    )
    # A DeviceTaintRule selects the GPU's DRA device alone: a MIG instance takes the node path.
    assert joined_exclusion(NodeRecord(devices={"3": ex("3", "device_taint")}), "3-mig1-0") is None
