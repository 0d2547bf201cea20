"""The release hold: a quarantine another service is driving, or has handed to a human,
is not released automatically.

Recovery puts the annotation `nodeward.io/release-hold` (JSON: by, incident, reason) on a
node once it asked for its reset or reboot, and after it escalated it. `ReleaseHold`, a guard on every
automatic release (cordon's healthy period), refuses to release such a node: recovery
releases it through cordon's release control once validated, and an operator through
`nodeward quarantine release`; neither passes this guard. The holder takes the hold back
when its recovery is over or the operator released the node.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from nodeward.kube.base import Obj
from schemas.remediation import Outcome
from services.kernel.proposal import Proposal, Stage, Verdict

HOLD_ANNOTATION = "nodeward.io/release-hold"

GetNode = Callable[[str], Awaitable[Obj]]


def hold_note(by: str, incident: str, reason: str) -> str:
    """The annotation's value: who handed the node over, for which incident, and why."""
    return json.dumps(
        {"by": by, "incident": incident, "reason": reason[:600]}, separators=(",", ":")
    )


def hold_of(node: Obj | None) -> dict[str, Any] | None:
    """The node's release hold, or None. A value that is not nodeward's JSON still holds."""
    raw = ((node or {}).get("metadata") or {}).get("annotations", {}).get(HOLD_ANNOTATION)
    if raw is None:
        return None
    try:
        note = json.loads(raw)
    except ValueError:
        note = None
    return note if isinstance(note, dict) else {"by": "?", "reason": str(raw)[:200]}


def release_command(node: str) -> str:
    """The command that ends `node`'s quarantine, in backquotes, as it works when typed
    (`--reason` is required: it is audited)."""
    return f'`nodeward quarantine release {node} --reason "..."`'


class ReleaseHold:
    """A guard: refuses an automatic release of a node under a release hold. The refusal is
    audited once per hold and process; a release proposed again is refused quietly."""

    name = "release_hold"
    stage = Stage.OWNERSHIP

    def __init__(self, get_node: GetNode) -> None:
        self.get_node = get_node
        self._audited: set[tuple[str, str]] = set()

    async def check(self, proposal: Proposal) -> Verdict | None:
        if proposal.action != "release" or proposal.target.kind != "Node":
            return None
        node = (
            proposal.obj if proposal.obj is not None else await self.get_node(proposal.target.name)
        )
        hold = hold_of(node)
        if hold is None:
            return None
        seen = (proposal.target.name, str(hold.get("incident")))
        quiet = seen in self._audited
        self._audited.add(seen)
        return Verdict(
            self.name,
            f"refused: {proposal.target.name} is held by {hold.get('by')} "
            f"({hold.get('reason', '')}); only an operator's release ends it "
            f"({release_command(proposal.target.name)})",
            Outcome.REFUSED,
            details={"hold": hold},
            quiet=quiet,
        )


class Flapping:
    """A guard: refuses an automatic release of a quarantine whose GPU flaps (its
    proposal's `details["flapping"]` says why). Audited once per incident and process."""

    name = "flapping"
    stage = Stage.COOLDOWN

    def __init__(self) -> None:
        self._audited: set[tuple[str, str]] = set()

    async def check(self, proposal: Proposal) -> Verdict | None:
        flap = proposal.details.get("flapping")
        if proposal.action != "release" or not flap:
            return None
        seen = (proposal.target.name, str(proposal.details.get("incident")))
        quiet = seen in self._audited
        self._audited.add(seen)
        return Verdict(
            self.name,
            f"refused: {flap}; a flapping GPU's quarantine ends only by an operator's release "
            f"({release_command(proposal.target.name)})",
            Outcome.REFUSED,
            quiet=quiet,
        )
