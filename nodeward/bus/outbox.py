"""A node agent's publish queue: its own subjects only, in order, kept while NATS is away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from nodeward.bus.bus import Bus
from nodeward.bus.errors import PublishError
from schemas.base import Event


class Outbox:
    """Events an agent publishes, in order, in batches of whatever queued up meanwhile.

    `allowed(subject)` is the agent's own subject space: anything else is refused at
    `put` (a bug, never a message on another node's subjects). When a publish fails,
    the events `keep(event)` selects are sent again after a back-off (same ids, so
    JetStream stores each once), at most `max_unsent` of them, the oldest dropped first;
    the others (restated by the next heartbeat or sample) are let go.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        owner: str,
        allowed: Callable[[str], bool],
        max_unsent: int,
        keep: Callable[[Event[Any]], bool] = lambda _: True,
    ) -> None:
        self.bus = bus
        self.owner = owner
        self.allowed = allowed
        self.max_unsent = max_unsent
        self.keep = keep
        self.published = 0
        self._queue: asyncio.Queue[Event[Any]] = asyncio.Queue()
        self.log = structlog.get_logger().bind(outbox=owner)

    def put(self, event: Event[Any]) -> None:
        subject = event.nats_subject
        if not self.allowed(subject):
            raise ValueError(f"{self.owner} refuses to publish on {subject}")
        self._queue.put_nowait(event)

    async def run(self) -> None:
        """Publish until cancelled."""
        unsent: list[Event[Any]] = []
        failures = 0
        while True:
            if not unsent:
                unsent.append(await self._queue.get())
            while not self._queue.empty():
                unsent.append(self._queue.get_nowait())
            try:
                await self.bus.publish_many(unsent)
            except PublishError as exc:
                failures += 1
                kept = [e for e in unsent if self.keep(e)]
                let_go = len(unsent) - len(kept)  # restated by the next ones
                dropped = max(len(kept) - self.max_unsent, 0)  # over the limit: lost
                unsent = kept[dropped:]
                self.log.error(
                    "publish failed; keeping events to send again",
                    kept=len(unsent),
                    let_go=let_go,
                    dropped=dropped,
                    error=str(exc),
                )
                # Back off before trying again (a schedule, not a synchronisation).
                await asyncio.sleep(min(0.5 * 2 ** min(failures, 5), 10.0))
            else:
                self.published += len(unsent)
                unsent, failures = [], 0
