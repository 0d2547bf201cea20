"""Asyncio helpers the whole runtime shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`await awaitable`, raising `TimeoutError` after `timeout` seconds (None: no limit).

    Use it instead of `asyncio.wait_for`: on Python 3.11, `wait_for` loses a cancellation
    that arrives as its timeout fires (CPython gh-86296), so a loop around it can survive
    `task.cancel()` and hang a shutdown. `asyncio.timeout` tells the two apart.
    """
    async with asyncio.timeout(timeout):
        return await awaitable
