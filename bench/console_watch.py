"""How many consumers the server makes while `nodeward up` runs with its console, against a
baseline checkout in the same run (issue 31: "the console churns the bus when nobody looks";
the console drew its picture with a dozen ephemeral consumers after every change, about
every 0.6 s; it now watches its streams and buckets through long-lived mirrors).

For this checkout and each `--baseline` checkout: start `nodeward up` (default scenario: a
GPU fails and is recovered, sessions are warned and culled, credentials renewed) with nobody
looking at the console, wait until every daemon is ready, then count the server's
`CONSUMER.CREATED` advisories for `--seconds`, by stream, and print them per minute.
Every daemon's durable consumers exist by then; what is counted is made while it runs.

    python bench/console_watch.py [--seconds 60] [--rounds 3] [--baseline /old/checkout]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import nats

REPO = Path(__file__).resolve().parent.parent


async def ready(endpoints: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        while True:
            states = []
            for url in endpoints["metrics"].values():
                try:
                    states.append((await client.get(f"{url}/readyz", timeout=2)).status_code)
                except httpx.HTTPError:
                    states.append(0)
            if all(s == 200 for s in states):
                return
            await asyncio.sleep(0.5)


async def one(repo: Path, seconds: float) -> Counter[str]:
    """Consumers created by stream while `up` from `repo` ran `seconds` after it was ready."""
    tmp = Path(tempfile.mkdtemp(prefix="console-watch-"))
    state = tmp / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env["PYTHONPATH"] = str(repo)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "launch", "up", "--state-dir", str(state), "--quiet",
        cwd=tmp, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        endpoints_file = state / "endpoints.json"
        async with asyncio.timeout(180):
            while not endpoints_file.exists():  # noqa: ASYNC110 - another process writes it
                await asyncio.sleep(0.2)
            endpoints = json.loads(endpoints_file.read_text())
            await ready(endpoints)
        nc = await nats.connect(endpoints["nats_url"])
        created: Counter[str] = Counter()

        async def advisory(msg: Any) -> None:
            created[msg.subject.split(".")[5]] += 1  # ...CONSUMER.CREATED.<stream>.<name>

        await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>", cb=advisory)
        began = time.monotonic()
        await asyncio.sleep(seconds)  # the measurement window itself
        elapsed = time.monotonic() - began
        await nc.close()
        return Counter({k: round(v * 60 / elapsed) for k, v in created.items()})
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(60):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


async def main(args: argparse.Namespace) -> None:
    runs = [("this checkout", REPO)] + [(f"baseline {b}", Path(b)) for b in args.baseline]
    totals: dict[str, list[int]] = {name: [] for name, _ in runs}
    for r in range(args.rounds):
        for name, repo in runs:  # interleaved: a machine that slows down slows both
            per_minute = await one(repo, args.seconds)
            totals[name].append(sum(per_minute.values()))
            top = ", ".join(f"{s} {n}" for s, n in per_minute.most_common(6))
            print(f"round {r + 1} {name}: {totals[name][-1]} a minute ({top or 'none'})")
    for name, counts in totals.items():
        print(f"{name}: median {statistics.median(counts):g} consumers created a minute")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", action="append", default=[], help="another checkout")
    asyncio.run(main(parser.parse_args()))
