"""The recovery policy, pure: which faults nodeward recovers and how, the per-node retry
limit, and what a failed validation leads to."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from schemas.gpu import RecommendedAction
from schemas.xid import RECOVERY_ACTION_XID, XidCatalog
from services.recovery.state import Plan

RESET_ACTIONS = frozenset({RecommendedAction.RESET_GPU, RecommendedAction.DRAIN_AND_RESET})
REBOOT_ACTIONS = frozenset({RecommendedAction.REBOOT_NODE})
RMA_ACTIONS = frozenset({RecommendedAction.DRAIN_AND_RMA})


class Kind(StrEnum):
    RECOVER = "recover"  # drain, then the plan's remediator, validate, release
    ESCALATE = "escalate"  # no automatic cure (the catalog says RMA): on-call decides
    NONE = "none"  # not a fault recovery handles (the passive release path applies)


@dataclass(frozen=True)
class Decision:
    kind: Kind
    plan: Plan | None = None
    why: str = ""


def decide(
    actions: Iterable[RecommendedAction | str], xids: Iterable[int], catalog: XidCatalog
) -> Decision:
    """What the quarantine's fault needs: the trigger's recommended actions and each XID's
    catalog action, the strongest winning (RMA > reboot > reset).

    XID 154 (GPU recovery action changed) is no fault of its own: the driver embeds the
    action it calls for (None, GPU Reset Required, Node Reboot Required, Drain P2P, Drain
    and Reset), which the GPU agent reports as its reason's action, so among `actions`. Its
    catalog row is never added: the embedded action is the one honoured."""
    found: set[RecommendedAction] = set()
    for action in actions:
        try:
            found.add(RecommendedAction(action))
        except ValueError:
            continue
    named = sorted(set(xids))
    found |= {catalog.get(x).action for x in named if x != RECOVERY_ACTION_XID}
    said = ", ".join(a.value for a in sorted(found)) or "none"
    on = f" (XID {', '.join(map(str, named))})" if named else ""
    who = "the fault says" if RECOVERY_ACTION_XID in named else "the catalog says"
    if found & RMA_ACTIONS:
        return Decision(Kind.ESCALATE, why=f"{who} {said}{on}: RMA, no automatic cure")
    if found & REBOOT_ACTIONS:
        return Decision(Kind.RECOVER, Plan.REBOOT, f"{who} {said}{on}: reboot")
    if found & RESET_ACTIONS:
        return Decision(Kind.RECOVER, Plan.RESET, f"{who} {said}{on}: GPU reset")
    return Decision(Kind.NONE, why=f"recommended {said}{on}: no reset or reboot needed")


MOVABLE_CATEGORIES = frozenset({"application", "nvlink", "thermal"})
"""Faults after which the GPU still answers and its memory holds what the program wrote:
an application's error, an NVLink error, a thermal event."""
MOVABLE_XIDS = frozenset({63, 92})
"""Memory events whose data was corrected: a page retirement recorded (63), many corrected
single-bit errors (92)."""


def allows_move(xids: Iterable[int], catalog: XidCatalog) -> tuple[bool, str]:
    """Whether the fault leaves the GPU's memory readable and sound, so that its stateful
    sessions may be checkpointed (CUDA checkpoint copies device memory to the host) and moved
    before the drain; and why. Never for a GPU off the bus (79), an uncorrectable memory
    error (48, 64, 94, 95), a hung engine, driver or GSP (46, 62, 109, 119, 120), hardware,
    or a fault no XID names."""
    named = sorted(set(xids) - {RECOVERY_ACTION_XID})
    if not named:
        return False, "no XID says the GPU's memory is sound"
    for xid in named:
        info = catalog.get(xid)
        if xid not in MOVABLE_XIDS and info.category not in MOVABLE_CATEGORIES:
            return False, f"XID {xid} ({info.category}): the GPU's memory cannot be trusted"
    return True, f"XID {', '.join(map(str, named))}: the GPU's memory is sound"


def within_limit(started: Iterable[float], now: float, *, limit: int, window_s: float) -> bool:
    """True if a node that started recoveries at `started` (unix times) may start another:
    fewer than `limit` within the last `window_s`."""
    recent = [t for t in started if now - t < window_s]
    return len(recent) < limit


class AfterFailure(StrEnum):
    RETRY = "retry"  # remediate again (another reset or reboot), then validate again
    ESCALATE = "escalate"  # on-call: RMA suggested; the node stays quarantined


def after_validation_failure(failures: int, *, max_failures: int = 2) -> AfterFailure:
    """`failures`: validations failed in this recovery, this one included."""
    return AfterFailure.ESCALATE if failures >= max_failures else AfterFailure.RETRY


def gpu_indices(keys: Iterable[str]) -> list[int]:
    """GPU indices from cordon's GPU keys (`3`, `3-mig1-0`)."""
    out: set[int] = set()
    for key in keys:
        head = str(key).split("-", 1)[0]
        if head.isdigit():
            out.add(int(head))
    return sorted(out)
