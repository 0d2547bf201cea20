"""What the agent benches share: a NATS server with every stream (and agent KV bucket)
provisioned, and measuring each case in a child process that prints one JSON line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_child(script: str, argv: list[str]) -> dict[str, float]:
    """Run `script` with `argv` in a fresh interpreter; its last stdout line is JSON."""
    out = subprocess.run(
        [sys.executable, script, *argv], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def with_server(fn: Callable[[str], Any]) -> Any:
    """`fn(nats_url)` in a thread while an embedded, provisioned nats-server runs."""
    from nodeward.bus import Bus
    from nodeward.bus.server import EmbeddedNats
    from nodeward.config import BusSettings

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp))
        await server.start()
        try:
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/provision")
            await bus.close(grace=1)
            return await asyncio.to_thread(fn, server.url)
        finally:
            await server.stop()
