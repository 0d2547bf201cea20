"""services.recovery's policy: which faults lead to a reset, a reboot, RMA or nothing; the
per-node retry limit; escalation after the second failed validation."""

from __future__ import annotations

import pytest

from schemas.gpu import RecommendedAction
from schemas.xid import load_catalog
from services.recovery.policy import (
    AfterFailure,
    Kind,
    after_validation_failure,
    allows_move,
    decide,
    gpu_indices,
    within_limit,
)
from services.recovery.state import Plan

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("actions", "xids", "kind", "plan"),
    [
        ([], [79], Kind.RECOVER, Plan.REBOOT),  # fallen off the bus: the catalog says reboot
        (["reboot_node"], [79], Kind.RECOVER, Plan.REBOOT),
        (["reset_gpu"], [], Kind.RECOVER, Plan.RESET),
        (["drain_and_reset"], [], Kind.RECOVER, Plan.RESET),
        (["reset_gpu", "reboot_node"], [], Kind.RECOVER, Plan.REBOOT),  # the stronger wins
        (["drain_and_rma"], [], Kind.ESCALATE, None),
        (["reboot_node", "drain_and_rma"], [79], Kind.ESCALATE, None),
        (["restart_app"], [13], Kind.NONE, None),  # an application's fault: no recovery
        ([], [], Kind.NONE, None),
        (["not-an-action"], [], Kind.NONE, None),
    ],
)
def test_the_fault_decides_reset_reboot_rma_or_nothing(
    actions: list[str], xids: list[int], kind: Kind, plan: Plan | None
) -> None:
    decision = decide(actions, xids, CATALOG)
    assert (decision.kind, decision.plan) == (kind, plan)
    assert decision.why


def test_every_catalog_xid_with_a_reset_or_reboot_action_is_recovered() -> None:
    for xid, info in CATALOG.rows.items():
        decision = decide([], [xid], CATALOG)
        if info.action == RecommendedAction.REBOOT_NODE:
            assert decision.plan == Plan.REBOOT, xid
        elif info.action in (RecommendedAction.RESET_GPU, RecommendedAction.DRAIN_AND_RESET):
            assert decision.plan == Plan.RESET, xid
        elif info.action == RecommendedAction.DRAIN_AND_RMA:
            assert decision.kind == Kind.ESCALATE, xid
        else:
            assert decision.kind == Kind.NONE, xid


def test_the_retry_limit_counts_only_recoveries_within_the_window() -> None:
    now = 10_000.0
    assert within_limit([], now, limit=3, window_s=3600)
    assert within_limit([now - 10, now - 20], now, limit=3, window_s=3600)
    assert not within_limit([now - 10, now - 20, now - 30], now, limit=3, window_s=3600)
    assert within_limit([now - 4000, now - 20, now - 30], now, limit=3, window_s=3600)


def test_the_second_failed_validation_escalates() -> None:
    assert after_validation_failure(1) == AfterFailure.RETRY
    assert after_validation_failure(2) == AfterFailure.ESCALATE
    assert after_validation_failure(3) == AfterFailure.ESCALATE
    assert after_validation_failure(1, max_failures=1) == AfterFailure.ESCALATE


def test_gpu_indices_from_cordon_keys() -> None:
    assert gpu_indices(["3", "3-mig1-0", "0", "", "x"]) == [0, 3]


@pytest.mark.parametrize(
    ("xids", "allowed"),
    [
        ([13], True),  # an application's error: the memory is sound
        ([136], True),  # NVLink training failed
        ([92], True),  # corrected single-bit errors
        ([13, 154], True),  # XID 154 only names the action
        ([79], False),  # fallen off the bus: nothing to read
        ([48], False),  # an uncorrectable double-bit error
        ([95], False),  # an uncontained memory error
        ([119], False),  # the GSP does not answer
        ([13, 48], False),  # one bad fault is enough
        ([], False),  # no XID says the memory is sound
        ([9999], False),  # not in the catalog
    ],
)
def test_a_move_before_the_drain_only_when_the_gpus_memory_is_sound(
    xids: list[int], allowed: bool
) -> None:
    ok, why = allows_move(xids, load_catalog())
    assert ok is allowed, why
    assert why
