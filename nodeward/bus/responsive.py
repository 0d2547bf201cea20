"""Whether the bus is answering, for a daemon's `/readyz`.

A connection can look up while the server behind it is hung (SIGSTOPped, its disk stalled,
a cluster without quorum): the TCP session stays open and `is_connected` stays true. So
readiness asks three things of the recent past instead, each bounded by one `deadline`:

- the server answered a ping (`watch` pings every `interval`);
- publishes are acknowledged: they have not been failing (and still tried) for longer
  than the deadline;
- every consumer's pull requests hear from the server (a message, a heartbeat or a status)
  while they are open.

`problem()` names the first that fails, in one line. `watch` keeps a ping outstanding,
logs one line when the bus stops answering and one when it answers again, and keeps
`nodeward_bus_responsive` (1/0).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol


class Listening(Protocol):
    """A consumer whose pull requests should hear from the server."""

    @property
    def name(self) -> str: ...

    def silent_for(self) -> float: ...


class Responsiveness:
    def __init__(
        self,
        deadline: float,
        consumers: Callable[[], Iterable[Listening]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline = deadline
        self._consumers = consumers
        self._clock = clock
        self._answered = clock()
        self._publish_failing: tuple[float, float, str] | None = None  # since, last, error
        self.last_problem: str | None = None

    def answered(self) -> None:
        """The server answered (a ping's pong)."""
        self._answered = self._clock()

    def published(self) -> None:
        """A publish was acknowledged."""
        self._publish_failing = None

    def publish_failed(self, error: str) -> None:
        """An attempt to publish got no acknowledgement."""
        now = self._clock()
        since = self._publish_failing[0] if self._publish_failing else now
        self._publish_failing = (since, now, error)

    def problem(self, *, connected: bool) -> str | None:
        """Why the bus counts as not answering now, in one line; None while it answers."""
        if not connected:
            return "not connected to NATS"
        now = self._clock()
        if (quiet := now - self._answered) > self.deadline:
            return f"the NATS server has not answered a ping for {quiet:.0f}s"
        if self._publish_failing is not None:
            since, last, error = self._publish_failing
            # Failing for longer than the deadline, and still being tried: a publisher that
            # gave up and has not published since says nothing about the bus now.
            if (failing := now - since) > self.deadline and now - last <= self.deadline:
                return f"publishes have not been acknowledged for {failing:.0f}s: {error}"
        for consumer in self._consumers():
            if (silent := consumer.silent_for()) > self.deadline:
                return (
                    f"consumer {consumer.name} has heard nothing from the server for {silent:.0f}s"
                )
        return None

    async def watch(
        self,
        ping: Callable[[], Awaitable[Any]],
        *,
        connected: Callable[[], bool],
        reconnects: Callable[[], int],
        interval: float,
        log: Any,
        gauge: Any = None,
    ) -> None:
        """Keep one ping outstanding, a new one `interval` after the last was answered, and
        log each change between answering and not. Runs until cancelled.

        A ping still waiting on its connection is never cancelled: nats-py stops reading a
        connection on a pong whose wait was cancelled. One sent before a reconnect is
        dropped, as nats-py forgets it (it would never be answered).
        """
        pinging: asyncio.Future[None] | None = None
        sent_on = reconnects()
        while True:
            if pinging is not None and not pinging.done() and reconnects() != sent_on:
                pinging.cancel()
            if connected() and (pinging is None or pinging.done()):
                sent_on = reconnects()
                pinging = asyncio.ensure_future(self._ping(ping))
            problem = self.problem(connected=connected())
            if problem != self.last_problem:
                if problem is None:
                    log.info("bus.answering", was=self.last_problem)
                elif self.last_problem is None:
                    log.warning("bus.not_answering", problem=problem, deadline_s=self.deadline)
                self.last_problem = problem
                if gauge is not None:
                    gauge.set(0 if problem else 1)
            await asyncio.sleep(interval)  # the probe's period, not a synchronisation

    async def _ping(self, ping: Callable[[], Awaitable[Any]]) -> None:
        with contextlib.suppress(Exception):  # unanswered or disconnected: `problem` says so
            await ping()
            self.answered()
