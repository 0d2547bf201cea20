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
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import launched_up, options

REPO = Path(__file__).resolve().parent.parent


async def one(repo: Path, seconds: float) -> Counter[str]:
    """Consumers created a minute, by stream, while `up` from `repo` ran `seconds` after it
    was ready."""
    async with launched_up(repo, "--quiet") as up:
        nc = await nats.connect(up.endpoints["nats_url"])
        created: Counter[str] = Counter()

        async def advisory(msg: Any) -> None:
            created[msg.subject.split(".")[5]] += 1  # ...CONSUMER.CREATED.<stream>.<name>

        await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>", cb=advisory)
        began = time.monotonic()
        await asyncio.sleep(seconds)  # the measurement window itself
        elapsed = time.monotonic() - began
        await nc.close()
        return Counter({k: round(v * 60 / elapsed) for k, v in created.items()})


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
    parser = options(__doc__.split("\n\n")[0], seconds=60.0, rounds=3)
    parser.add_argument("--baseline", action="append", default=[], help="another checkout")
    asyncio.run(main(parser.parse_args()))
