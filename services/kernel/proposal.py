"""What a policy proposes, and a guard's objection to it: the kernel's vocabulary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from typing import Any, Protocol

from schemas.common import ObjectRef
from schemas.notify import Severity
from schemas.remediation import Outcome


def node_ref(name: str) -> ObjectRef:
    """The target of an action on node `name`."""
    return ObjectRef(kind="Node", name=name, api_version="v1")


@dataclass(frozen=True)
class Proposal:
    """What a policy wants done, to what, and why."""

    action: str
    target: ObjectRef
    reason: str
    policy: str | None = None
    trigger_id: str | None = None
    trigger_time: datetime | None = None
    protective: bool = True
    """Quarantine-like (guarded by breaker and rate limits); False for undoing our own action."""
    obj: dict[str, Any] | None = None
    """The target as last read, for guards that look at labels."""
    details: dict[str, Any] = field(default_factory=dict)
    severity: Severity | None = None
    """The notice's severity, instead of the auditor's per action and outcome."""
    title: str | None = None
    """What the notice's title starts with, instead of the target's name."""
    observed_at: datetime | None = None
    """When what the trigger reports was observed; staleness counts from it (else from
    `trigger_time`)."""
    resolves: bool = False
    """Done (applied or undone), this ends the target's incident (a release, a
    cancellation): its notice says so, and Alertmanager resolves the incident's alerts."""
    tally: str | None = None
    """A restatement at the rate of its input (a Notice alert that only tells), counted
    under this key (with its action, outcome and guard): the first of a window is audited
    in full, the rest counted and audited once (`Tally`)."""


@dataclass(frozen=True)
class Verdict:
    """A guard's objection: the action is refused (blocked by a limit) or skipped (not ours to do)."""

    guard: str
    reason: str
    outcome: Outcome = Outcome.REFUSED
    retry_after: float | None = None
    """Set when the action should be tried again later (the message is redelivered)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Added to the audit record's details."""
    quiet: bool = False
    """The objection restates a decision already audited (a duplicate): logged, not published."""


class Stage(IntEnum):
    """Where a guard stands in the chain. The kernel's order, not a service's: the runner
    sorts guards by stage (keeping a service's order within one stage); dry-run is the
    runner's last step, after every guard."""

    EXEMPTIONS = 10
    STALENESS = 20
    DEDUP = 30
    COOLDOWN = 40
    RATE_LIMIT = 50
    BREAKER = 60
    OWNERSHIP = 70


class Guard(Protocol):
    name: str
    stage: Stage

    async def check(self, proposal: Proposal) -> Verdict | None:
        """None to allow, or why not."""
        ...
