"""When a daemon's bus counts as not answering: each sign bounded by one deadline."""

from __future__ import annotations

from dataclasses import dataclass

from nodeward.bus.responsive import Responsiveness


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Quiet:
    name: str
    silent: float = 0.0

    def silent_for(self) -> float:
        return self.silent


def test_each_sign_counts_only_past_the_deadline_and_clears_when_it_ends() -> None:
    clock = Clock()
    consumer = Quiet("cordon")
    r = Responsiveness(5.0, lambda: [consumer], clock=clock)
    assert r.problem(connected=True) is None
    assert r.problem(connected=False) == "not connected to NATS"

    clock.now += 5.0  # no pong for exactly the deadline: still within it
    assert r.problem(connected=True) is None
    clock.now += 1.0
    assert r.problem(connected=True) == "the NATS server has not answered a ping for 6s"
    r.answered()
    assert r.problem(connected=True) is None

    r.publish_failed("no ack")
    clock.now += 3.0
    r.publish_failed("nats: timeout")
    assert r.problem(connected=True) is None
    clock.now += 2.5
    r.publish_failed("nats: timeout")
    r.answered()
    assert r.problem(connected=True) == (
        "publishes have not been acknowledged for 6s: nats: timeout"
    )
    r.published()
    assert r.problem(connected=True) is None

    # A publisher that gave up long ago and has published nothing since proves nothing.
    r.publish_failed("no ack")
    clock.now += 4.0
    r.publish_failed("no ack")
    clock.now += 6.0
    r.answered()
    assert r.problem(connected=True) is None

    consumer.silent = 7.0
    assert r.problem(connected=True) == "consumer cordon has heard nothing from the server for 7s"
    consumer.silent = 0.0
    assert r.problem(connected=True) is None
