"""Local network peers for the tests: an aiohttp app served on a port of its own, and a
peer process stopped politely. (A free port: `nodeward.bus.server.free_port`.)"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


@asynccontextmanager
async def served(app: web.Application, **runner: Any) -> AsyncIterator[str]:
    """`app` served on 127.0.0.1 on a port of its own; its base URL (`runner`: the
    `web.AppRunner` options). Cleaned up on the way out."""
    run = web.AppRunner(app, **runner)
    await run.setup()
    site = web.TCPSite(run, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{run.addresses[0][1]}"
    finally:
        await run.cleanup()


async def terminate(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM `proc` and wait `timeout` seconds for it to exit; SIGKILL it if it does not."""
    proc.terminate()
    try:
        await asyncio.to_thread(proc.wait, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
