"""What a recovery drains, pure: for a GPU reset only the pods holding the failed GPUs
(whole, through a MIG instance, or time-sliced), as their agent named them in cordon's
quarantine audit; for a reboot, or where the holders are not known, the whole node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nodeward.kube.base import Obj
from schemas.xid import RECOVERY_ACTION_XID, XidCatalog
from services.recovery.policy import Kind, decide
from services.recovery.state import Plan

DrainScope = Literal["gpu", "node"]
RESET_DRAINS_LABEL = "nodeward.io/reset-drains"
"""On a node: `gpu` or `node`, what a GPU reset of it drains (over the setting)."""


@dataclass(frozen=True)
class Scope:
    """The pods a recovery's drain empties (`namespace/name`; None: every pod), and why."""

    pods: list[str] | None
    why: str


def reset_drains(node: Obj, default: DrainScope) -> tuple[DrainScope, str]:
    """What a GPU reset of `node` drains: its label's word, else the setting; and who said.
    A label that says neither `gpu` nor `node` drains the node (never a guess)."""
    said = str(((node.get("metadata") or {}).get("labels") or {}).get(RESET_DRAINS_LABEL, ""))
    if said == "gpu":
        return "gpu", f"label {RESET_DRAINS_LABEL}=gpu"
    if said == "node":
        return "node", f"label {RESET_DRAINS_LABEL}=node"
    if said:
        return "node", f"label {RESET_DRAINS_LABEL}={said!r} (neither gpu nor node)"
    return default, f"reset_drains: {default}"


def drain_scope(
    plan: Plan, gpus: Iterable[int], holders: Any, drains: DrainScope, said: str
) -> Scope:
    """The scope of a recovery's drain. `holders`: the quarantine audit's details (GPU
    index -> `namespace/name` of each pod holding it), anything else when it has none."""
    if plan != Plan.RESET:
        return Scope(None, f"a {plan.value} drains the whole node")
    if drains == "node":
        return Scope(None, f"{said}: a GPU reset drains the whole node here")
    failed = sorted(set(gpus))
    named = ", ".join(map(str, failed))
    if not failed:
        return Scope(None, "the failed GPU is not named: the whole node is drained")
    known = _holders(holders, failed)
    if known is None:
        return Scope(
            None,
            f"the pods holding GPU {named} are not known (the quarantine does not name them: "
            "an older cordon, or no pod-resources answer on the node): the whole node is "
            "drained",
        )
    listed = f": {', '.join(known)}" if known else ""
    return Scope(known, f"GPU {named} reset: only its {len(known)} pod(s) are drained{listed}")


def _holders(holders: Any, gpus: list[int]) -> list[str] | None:
    """The pods holding any of `gpus`, or None unless every one of them is named."""
    if not isinstance(holders, Mapping):
        return None
    pods: set[str] = set()
    for gpu in gpus:
        held = holders.get(str(gpu))
        if not isinstance(held, list) or not all(isinstance(p, str) and "/" in p for p in held):
            return None
        pods.update(held)
    return sorted(pods)


def drain_table(catalog: XidCatalog) -> str:
    """The docs' table (`docs/services/recovery.md`, Partial drain): each catalog XID by
    what its recovery drains, as `policy.decide` judges it alone."""
    rows = {
        Plan.RESET: "GPU reset | the failed GPU's pods only (partial)",
        Plan.REBOOT: "reboot | the whole node",
        None: "none: on-call (RMA suggested) | nothing (escalated)",
    }
    xids: dict[Plan | None, list[int]] = {key: [] for key in rows}
    actions: dict[Plan | None, set[str]] = {key: set() for key in rows}
    for xid, info in sorted(catalog.rows.items()):
        decision = decide([], [xid], catalog)
        if xid == RECOVERY_ACTION_XID or decision.kind == Kind.NONE:
            continue
        xids[decision.plan].append(xid)
        actions[decision.plan].add(f"`{info.action.value}`")
    lines = ["| catalog action | recovery | drains | XIDs |", "|---|---|---|---|"]
    lines += [
        f"| {', '.join(sorted(actions[key]))} | {what} | {', '.join(map(str, xids[key]))} |"
        for key, what in rows.items()
    ]
    return "\n".join(lines)
