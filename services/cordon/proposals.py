"""The proposals that end what the cordon service holds: a quarantine, or one GPU's
exclusion (not protective: they take nothing out of service)."""

from __future__ import annotations

from typing import Any

from schemas.state.cordon import DeviceExclusion, Quarantine
from services.kernel.proposal import Proposal, node_ref


def ending(
    action: str,
    node: str,
    held: Quarantine | DeviceExclusion,
    reason: str,
    details: dict[str, Any],
    *,
    resolves: bool = True,
) -> Proposal:
    """A proposal that ends `held` on `node`, under its rule and incident; `resolves`: done,
    it ends the incident."""
    return Proposal(
        action=action,
        reason=reason,
        policy=held.rule,
        target=node_ref(node),
        trigger_id=held.incident,
        trigger_time=held.started_at,
        protective=False,
        resolves=resolves,
        details=details,
    )
