"""Asyncio helpers the whole runtime shares."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`await awaitable`, raising `TimeoutError` after `timeout` seconds (None: no limit).

    Use it instead of `asyncio.wait_for`: on Python 3.11, `wait_for` loses a cancellation
    that arrives as its timeout fires (CPython gh-86296), so a loop around it can survive
    `task.cancel()` and hang a shutdown. `asyncio.timeout` tells the two apart.
    """
    async with asyncio.timeout(timeout):
        return await awaitable


async def cancel_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one has ended (how, it does not say)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def any_set(events: Iterable[asyncio.Event]) -> None:
    """Return once any of `events` is set (at once if one is already)."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_all(waiters)


class KeyedLocks:
    """One `asyncio.Lock` per key (a node, a pod), made when first wanted and forgotten when
    nobody holds or waits for it, so a fleet's churn leaves nothing behind."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    def __len__(self) -> int:
        """Keys held or waited for now."""
        return len(self._locks)
