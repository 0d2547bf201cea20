"""`launch sim inject` run as a user runs it: a child process against a NATS URL."""

from __future__ import annotations

import asyncio
import sys


async def sim_inject(nats_url: str, *args: str) -> tuple[int, str, str]:
    """Run `python -m launch sim inject --nats URL ARGS…`: its exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "launch",
        "sim",
        "inject",
        "--nats",
        nats_url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()
