"""A node agent run in a task for the length of a test, and stopped after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, Protocol


class _Runs(Protocol):
    async def run(self) -> None: ...


class _Closes(Protocol):
    def close(self) -> None: ...


@asynccontextmanager
async def agent_running(agent: _Runs, device: _Closes, subs: Iterable[Any]) -> AsyncIterator[None]:
    """`agent.run()` in a task; on the way out `device` (the sim it reads) is closed, the
    task cancelled and waited for, and each of `subs` unsubscribed."""
    task = asyncio.create_task(agent.run())
    try:
        yield
    finally:
        device.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for sub in subs:
            await sub.unsubscribe()
