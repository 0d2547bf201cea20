"""What the benches share: a NATS server with every stream (and agent KV bucket)
provisioned, measuring each case in a child process that prints one JSON line, and the
memory of processes under load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
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


def rss_mb(pid: int) -> float:
    """A process's resident memory in MiB (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """The RSS of named processes before, at the peak (sampled every `every` s from
    `start()` to `stop()`) and after."""

    def __init__(self, pids: Mapping[str, int], every: float = 0.2) -> None:
        self.pids = dict(pids)
        self.every = every
        self.before = {k: rss_mb(p) for k, p in self.pids.items()}
        self.peak = dict(self.before)
        self.after: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            for k, p in self.pids.items():
                self.peak[k] = max(self.peak[k], rss_mb(p))
            await asyncio.sleep(self.every)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.after = {k: rss_mb(p) for k, p in self.pids.items()}
