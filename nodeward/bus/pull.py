"""A continuous pull from a durable JetStream consumer.

nats-py's `fetch()` issues one request per call and waits for each message through
`next_msg` (a task and a timer per message). This keeps messages flowing instead, the way
nats.go's `Consume` does: one inbox subscription receives everything; a pull request asks
for `batch` messages, and the next goes out once half of what was asked for has arrived.
Requests expire after `expires`; the server's idle heartbeats tell a live request from
one lost in a reconnect, which is then simply asked for again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from nodeward.aio import within

STATUS = "Status"
PENDING_MESSAGES = "Nats-Pending-Messages"
HEARTBEAT, NO_MESSAGES, REQUEST_TIMEOUT, CONFLICT = "100", "404", "408", "409"
NO_RESPONDERS = "503"
GONE = "consumer gone: no responders to its pull requests"
"""What `conflict` says when no server answers a pull request: the consumer (or its stream)
does not exist, for example after a nats-server restarted on a store that lost it."""


class Puller:
    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        *,
        batch: int,
        expires: float = 10.0,
        heartbeat: float = 1.0,
        api_prefix: str = "$JS.API",
        log: Any = None,
    ) -> None:
        self.nc = nc
        self.batch = batch
        self.expires = expires
        self.heartbeat = heartbeat
        self.log = log
        self.next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._request = json.dumps(
            {"batch": batch, "expires": int(expires * 1e9), "idle_heartbeat": int(heartbeat * 1e9)}
        ).encode()
        self._inbox = ""
        self._sub: Subscription | None = None
        self._buffer: deque[Msg] = deque()
        self._arrived = asyncio.Event()
        self._outstanding = 0  # messages asked for that have not arrived yet
        self._last_seen = time.monotonic()
        self._heard = time.monotonic()  # the server's last message, heartbeat or status
        self.conflict: str | None = None  # the last 409 description (consumer deleted, ...)

    async def start(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._on_msg)
        self._heard = time.monotonic()

    def silent_for(self) -> float:
        """Seconds the server has said nothing while requests are open (0 when none is)."""
        return time.monotonic() - self._heard if self._outstanding else 0.0

    async def _on_msg(self, msg: Msg) -> None:
        self._last_seen = self._heard = time.monotonic()
        status = msg.headers.get(STATUS) if msg.headers else None
        if status is None:
            self._outstanding = max(self._outstanding - 1, 0)
            self._buffer.append(msg)
            self._arrived.set()
            return
        if status == HEARTBEAT:
            return
        # 404/408/409 end a request; what it did not deliver is no longer outstanding.
        headers = msg.headers or {}
        try:
            undelivered = int(headers.get(PENDING_MESSAGES, self._outstanding))
        except ValueError:
            undelivered = self._outstanding
        self._outstanding = max(self._outstanding - undelivered, 0)
        if status == CONFLICT:
            self.conflict = headers.get("Description", "conflict")
            if self.log is not None:
                self.log.warning("consumer.pull_conflict", description=self.conflict)
        elif status == NO_RESPONDERS:
            self.conflict = GONE

    async def _top_up(self) -> None:
        if self._outstanding > self.batch // 2 or len(self._buffer) > self.batch:
            if self._outstanding and time.monotonic() - self._last_seen > 2.5 * self.heartbeat:
                # No message and no heartbeat: the requests died with a connection. Ask again.
                if self.log is not None:
                    self.log.info("consumer.pull_requests_lost", outstanding=self._outstanding)
                self._outstanding = 0
            else:
                return
        await self.nc.publish(self.next_subject, self._request, reply=self._inbox)
        self._outstanding += self.batch
        self._last_seen = time.monotonic()

    async def get(self, max_n: int, timeout: float) -> list[Msg]:
        """Up to `max_n` messages; waits at most `timeout` for the first, else returns []."""
        await self._top_up()
        if not self._buffer:
            self._arrived.clear()
            try:
                await within(self._arrived.wait(), timeout)
            except TimeoutError:
                return []
        buffer = self._buffer
        out = [buffer.popleft() for _ in range(min(max_n, len(buffer)))]
        return out

    async def stop(self, linger: float = 0.0) -> list[Msg]:
        """Stop receiving; returns the messages that arrived but were never handed out.
        `linger`: first wait up to that long for the open pull requests to end (their
        `expires`), so nothing the server sends for them goes to a closed inbox and waits
        out `ack_wait` (a partition handed to another replica)."""
        deadline = time.monotonic() + linger
        while self._sub is not None and self._outstanding and time.monotonic() < deadline:  # noqa: ASYNC110 - counted down by the subscription's callback
            await asyncio.sleep(0.05)
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        left = list(self._buffer)
        self._buffer.clear()
        return left
