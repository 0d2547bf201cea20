"""Noise that scales with decisions, not with input: repeated non-decisions counted per
window and audited once in aggregate.

A flood of events that lead nowhere (a flapping GPU's stale restatements, failures of a GPU
already quarantined, Notice alerts that only tell) would otherwise write one audit record
and one notice each. The auditor asks the `Tally` first: the first decision of a key
(actor's action, guard, target) in a window is audited and notified in full, as any other;
the rest of that window are counted; when the window closes, one aggregate record says how
many there were, first and last, with a sample of their triggers, and notifies no one.

What is counted is only ever a restatement: a SIGKILL loses at most the counts of the open
windows, never the first of any (it was audited before its message was acked), and never
an act.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import Field

from nodeward.config import Section
from nodeward.durations import Duration
from schemas.base import utcnow
from schemas.remediation import Outcome
from services.kernel.proposal import Proposal

NOISY_GUARDS = frozenset({"stale", "too_old"})
"""Skips of input older than what was decided on, at the rate of that input: tallied per
target in every service. A skip another service reads for what it says (cordon's
`already_quarantined`, with the fault that grew) is tallied only under a key that holds
what it says (`Proposal.tally`), so a new fault is never counted away."""
SAMPLE = 5
"""Trigger ids an aggregate record keeps (the first ones of its window)."""


class TallySettings(Section):
    """How restatements are counted (`services.<name>.tally`)."""

    window: Duration = Field(
        default=timedelta(minutes=10),
        gt=timedelta(0),
        description="a noisy skip (stale, too_old, already_quarantined, ...) is audited in full"
        " once per action, guard, target and window; the rest are counted, and audited as one"
        " record when the window closes",
    )


TallyKey = tuple[str, str, str, str]
"""(action, outcome, guard, the proposal's `tally`, else its target's key)."""


@dataclass
class Window:
    """The decisions of one key since its window opened with one audited in full."""

    key: TallyKey
    opened: datetime
    closes: datetime
    proposal: Proposal
    reason: str
    guard: str | None
    counted: int = 0
    reopened: bool = False
    """Its first failed to act: the next is admitted in full (and acts) in its place."""
    first: datetime | None = None
    last: datetime | None = None
    triggers: list[str] = field(default_factory=list)

    def count(self, proposal: Proposal, reason: str, at: datetime) -> None:
        self.counted += 1
        self.first = self.first or at
        self.last = at
        self.proposal, self.reason = proposal, reason
        if proposal.trigger_id is not None and len(self.triggers) < SAMPLE:
            self.triggers.append(proposal.trigger_id)


class Tally:
    """Windows per key: `admit` says whether a decision is audited in full; `closed` hands
    over the windows that ended with something counted."""

    @classmethod
    def of(cls, settings: TallySettings) -> Tally:
        return cls(settings.window)

    def __init__(
        self,
        window: timedelta = timedelta(minutes=10),
        *,
        guards: frozenset[str] = NOISY_GUARDS,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if window <= timedelta(0):
            raise ValueError("a tally window is longer than zero")
        self.window = window
        self.guards = guards
        self.clock = clock
        self._open: dict[TallyKey, Window] = {}

    def applies(self, proposal: Proposal, outcome: Outcome, guard: str | None) -> bool:
        """A decision that restates: a skip by a noisy guard, or one the service marked."""
        return proposal.tally is not None or (outcome == Outcome.SKIPPED and guard in self.guards)

    def admit(self, proposal: Proposal, outcome: Outcome, reason: str, guard: str | None) -> bool:
        """True: the first of its key's window (audit it in full; the window opens). False:
        counted in the open window."""
        now = self.clock()
        key = self._key(proposal, outcome, guard)
        window = self._open.get(key)
        if window is not None and window.reopened:
            window.reopened = False
            return True
        if window is not None and now < window.closes:
            window.count(proposal, reason, now)
            return False
        # A window past its close is handed over by `closed()`; one left here (nothing
        # counted, or not collected yet) is replaced only when empty.
        if window is None or window.counted == 0:
            self._open[key] = Window(key, now, now + self.window, proposal, reason, guard)
            return True
        window.count(proposal, reason, now)
        return False

    def reopen(self, proposal: Proposal, outcome: Outcome, guard: str | None) -> None:
        """The first of this key's window did not get done (its act failed): the next one
        is admitted in full."""
        window = self._open.get(self._key(proposal, outcome, guard))
        if window is not None:
            window.reopened = True

    @staticmethod
    def _key(proposal: Proposal, outcome: Outcome, guard: str | None) -> TallyKey:
        return (
            proposal.action,
            outcome.value,
            guard or "",
            proposal.tally or proposal.target.key(),
        )

    def closed(self, *, everything: bool = False) -> list[Window]:
        """Windows that have ended (all, with `everything`) and counted something; ended
        ones that counted nothing are dropped."""
        now = self.clock()
        out: list[Window] = []
        for key, window in list(self._open.items()):
            if everything or now >= window.closes:
                del self._open[key]
                if window.counted:
                    out.append(window)
        return out

    def next_close(self) -> datetime | None:
        """When the first open window that counted something ends."""
        return min((w.closes for w in self._open.values() if w.counted), default=None)

    @property
    def counting(self) -> int:
        """Decisions counted and not yet audited."""
        return sum(w.counted for w in self._open.values())
