"""Blocking calls with a deadline: a `Lane` is one daemon thread that runs calls in order.

A call that does not return within its timeout raises `CallTimeout` in the caller; the
thread stays stuck in it, so the lane reports itself `busy` and refuses new calls until
the stuck call returns. Give each device its own lane: a hung device then stalls only
its own lane. The threads are daemon threads, so a call that never returns cannot keep
the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from nodeward.aio import within

T = TypeVar("T")


class CallTimeout(TimeoutError):
    """A call did not return in time; `what` names the call it was in (if it said)."""

    def __init__(self, lane: str, what: str, timeout: float) -> None:
        super().__init__(f"{lane}: {what or 'call'} did not return within {timeout:g}s")
        self.lane = lane
        self.what = what
        self.timeout = timeout


class LaneBusy(RuntimeError):
    """The lane is still stuck in an earlier call."""


class Lane:
    """One worker thread running blocking calls for one device, each with a deadline."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.current = ""
        """What the running call says it is doing now (set with `mark`); '' when idle."""
        self.last = ""
        """The step the last call marked, kept after it returns (e.g. the call that raised)."""
        self.late_error: str | None = None
        """How the last call that outlived its deadline ended, if it raised (one line)."""
        self._turn: asyncio.Lock | None = None
        self._since: float | None = None
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], Any], Callable[[bool, Any], None]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=f"lane:{name}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """True while a call runs (a stuck one included)."""
        return self._since is not None

    @property
    def busy_for(self) -> float:
        """Seconds the current call has been running; 0 when idle."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

    def mark(self, what: str) -> None:
        """Called from inside a call: name the step it is in, for timeout reports."""
        self.current = what
        self.last = what

    async def call(self, fn: Callable[[], T], timeout: float) -> T:
        """Run `fn()` on the lane's thread; `CallTimeout` after `timeout`, `LaneBusy` if stuck.

        Calls from the loop take turns: one waits for another that is still within its
        deadline; one that finds the lane stuck past a deadline gets `LaneBusy` at once.
        """
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            return await self._call(fn, timeout)

    async def _call(self, fn: Callable[[], T], timeout: float) -> T:
        if self._since is not None:
            raise LaneBusy(
                f"{self.name}: still in {self.current or 'a call'} after {self.busy_for:.1f}s"
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def deliver(ok: bool, value: Any) -> None:
            def settle() -> None:
                if future.done():
                    return
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

            with contextlib.suppress(RuntimeError):  # the loop closed while the call ran
                loop.call_soon_threadsafe(settle)

        self._since = time.monotonic()
        self._queue.put((fn, deliver))
        try:
            return await within(asyncio.shield(future), timeout)
        except TimeoutError:
            # Nobody awaits the call now: keep how it ends (never an unretrieved exception).
            future.add_done_callback(self._late)
            raise CallTimeout(self.name, self.current, timeout) from None

    def _late(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        self.late_error = None if exc is None else " ".join(f"{type(exc).__name__}: {exc}".split())

    def close(self) -> None:
        """Let the thread end after its current call."""
        self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, deliver = item
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self._done()
                deliver(False, exc)
            else:
                self._done()
                deliver(True, result)

    def _done(self) -> None:
        self._since = None
        self.current = ""
