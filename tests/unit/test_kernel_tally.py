"""The kernel's tally: the first restatement of a window is audited in full, the rest
counted, and each window's count handed over once when it closes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schemas.common import ObjectRef
from schemas.remediation import Outcome
from services.kernel.proposal import Proposal
from services.kernel.tally import SAMPLE, Tally


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def skip(node: str = "n1", trigger: str = "t", *, action: str = "ignore") -> Proposal:
    return Proposal(
        action=action,
        target=ObjectRef(kind="Node", name=node),
        reason=f"{node}: stale",
        trigger_id=trigger,
    )


def test_the_first_of_a_window_is_admitted_and_the_rest_counted() -> None:
    clock = Clock()
    tally = Tally(timedelta(minutes=10), clock=clock)
    assert tally.admit(skip(trigger="0"), Outcome.SKIPPED, "stale", "stale")
    for i in range(1, 100):
        clock.advance(1)
        assert not tally.admit(skip(trigger=str(i)), Outcome.SKIPPED, "stale", "stale")
    assert tally.counting == 99
    assert tally.closed() == []  # still open
    clock.advance(600)
    [window] = tally.closed()
    assert window.counted == 99
    assert window.triggers == [str(i) for i in range(1, SAMPLE + 1)]
    assert window.first == window.opened + timedelta(seconds=1)
    assert window.last == window.opened + timedelta(seconds=99)
    assert tally.closed() == [] and tally.counting == 0
    # The next one opens a new window, audited in full again.
    assert tally.admit(skip(trigger="x"), Outcome.SKIPPED, "stale", "stale")


def test_keys_are_per_action_guard_and_target() -> None:
    tally = Tally(timedelta(minutes=10), clock=Clock())
    assert tally.admit(skip("n1"), Outcome.SKIPPED, "r", "stale")
    assert tally.admit(skip("n2"), Outcome.SKIPPED, "r", "stale")
    assert tally.admit(skip("n1"), Outcome.SKIPPED, "r", "too_old")
    assert tally.admit(skip("n1", action="quarantine"), Outcome.SKIPPED, "r", "stale")
    assert not tally.admit(skip("n1"), Outcome.SKIPPED, "r", "stale")


def test_a_window_that_counted_nothing_is_dropped_and_next_close_names_only_counting_ones() -> None:
    clock = Clock()
    tally = Tally(timedelta(seconds=30), clock=clock)
    tally.admit(skip("quiet"), Outcome.SKIPPED, "r", "stale")
    assert tally.next_close() is None
    clock.advance(5)
    tally.admit(skip("loud"), Outcome.SKIPPED, "r", "stale")
    tally.admit(skip("loud"), Outcome.SKIPPED, "r", "stale")
    assert tally.next_close() == clock.now + timedelta(seconds=30)
    assert [w.key[3] for w in tally.closed(everything=True)] == ["node/loud"]


def test_what_the_tally_takes() -> None:
    tally = Tally()
    assert tally.applies(skip(), Outcome.SKIPPED, "stale")
    assert not tally.applies(skip(), Outcome.SKIPPED, "already_quarantined")  # read for its fault
    assert not tally.applies(skip(), Outcome.SKIPPED, "no_controller")
    assert not tally.applies(skip(), Outcome.APPLIED, "stale")
    marked = Proposal(
        action="notify", target=ObjectRef(kind="Node", name="n"), reason="r", tally=True
    )
    assert tally.applies(marked, Outcome.APPLIED, None)
    with pytest.raises(ValueError):
        Tally(timedelta(0))


def test_a_marked_proposal_is_counted_under_its_own_key() -> None:
    tally = Tally(clock=Clock())

    def told(pod: str, key: str) -> Proposal:
        return Proposal(
            action="notify", target=ObjectRef(kind="Pod", name=pod), reason="r", tally=key
        )

    assert tally.admit(told("a", "rule@n1"), Outcome.APPLIED, "r", None)
    assert not tally.admit(told("b", "rule@n1"), Outcome.APPLIED, "r", None)  # same node
    assert tally.admit(told("a", "rule@n2"), Outcome.APPLIED, "r", None)


def test_a_first_that_failed_to_act_lets_the_next_act_in_its_place() -> None:
    tally = Tally(clock=Clock())
    assert tally.admit(skip(), Outcome.APPLIED, "r", None)
    tally.reopen(skip(), Outcome.APPLIED, None)
    assert tally.admit(skip(), Outcome.APPLIED, "r", None)
    assert not tally.admit(skip(), Outcome.APPLIED, "r", None)
