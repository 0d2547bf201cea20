"""How `nodeward up` restarts a daemon that dies: the back-off and the limit per window."""

from __future__ import annotations

import pytest

from nodeward.supervisor import Restart, RestartPolicy, Restarts, decide, ordinal, span

POLICY = RestartPolicy(backoff=1.0, backoff_max=30.0, limit=5, window=600.0)


def test_the_back_off_doubles_to_its_maximum() -> None:
    policy = RestartPolicy(backoff=1.0, backoff_max=30.0, limit=10, window=600.0)
    restarts = Restarts(policy)
    delays = [restarts.died(float(t)).delay for t in range(7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_it_gives_up_after_the_limit_within_the_window() -> None:
    restarts = Restarts(POLICY)
    decisions = [restarts.died(float(t)) for t in range(6)]
    assert [d.restart for d in decisions] == [True] * 5 + [False]
    assert [d.count for d in decisions] == [1, 2, 3, 4, 5, 6]


def test_deaths_older_than_the_window_are_forgotten() -> None:
    restarts = Restarts(POLICY)
    for t in range(5):
        restarts.died(float(t))
    later = restarts.died(603.5)  # the first four have left the window
    assert later.restart and later.count == 2 and later.delay == 2.0


def test_decide_is_pure() -> None:
    assert decide(POLICY, [], 0.0).delay == 1.0
    assert decide(POLICY, [0.0, 1.0], 2.0).count == 3
    assert decide(POLICY, [0.0], 600.0).count == 1  # exactly a window ago: outside it
    assert not decide(RestartPolicy(limit=0), [], 0.0).restart  # 0: never restart


@pytest.mark.parametrize(
    ("n", "text"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (22, "22nd")]
)
def test_ordinals(n: int, text: str) -> None:
    assert ordinal(n) == text


def test_what_up_says() -> None:
    assert span(600) == "10 min" and span(90) == "90 s"
    assert Restart("cordon", "x", 2, 600.0).result == "restarted (2nd time in 10 min)"
    gave_up = Restart("cordon", "x", 6, 600.0, gave_up=True)
    assert gave_up.result == "gave up after 5 restarts in 10 min; the rest keep running"
    audit = gave_up.audit()
    assert audit.outcome.value == "failed" and audit.nats_subject() == "remediation.restart.cordon"
