"""How long `nodeward up` takes to stop, and what it prints while it stops (issue 31: ~20 s
and 13 JSON lines: `shutdown hook timed out`, `nats: unexpected EOF`, `Connect call
failed`; NATS went down before the services).

Each round starts `nodeward up` (the default scenario: a GPU fails 10 s in, recovery drains,
reboots, validates and releases it) with one core kept busy, waits until every daemon is
ready and `--after` seconds more (by default 12 s: recovery is under way), sends SIGINT and
times the exit. Prints each round's seconds and the lines printed after the signal, then the
median.

    python bench/up_stop.py [--rounds 3] [--after 12] [--no-load]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import launched_up, options

REPO = Path(__file__).resolve().parent.parent


async def one_round(after: float) -> tuple[float, list[str]]:
    async with launched_up(REPO) as up:
        await asyncio.sleep(after)  # the platform at work: the moment the stop comes
        before = up.output.read_text().splitlines()
        began = time.monotonic()
        up.proc.send_signal(signal.SIGINT)
        await up.proc.wait()
        took = time.monotonic() - began
        return took, up.output.read_text().splitlines()[len(before) :]


async def main(args: argparse.Namespace) -> None:
    spin = None
    if not args.no_load:
        spin = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    try:
        times = []
        for r in range(args.rounds):
            took, said = await one_round(args.after)
            times.append(took)
            print(f"round {r + 1}: stopped in {took:.2f} s; {len(said)} line(s) after SIGINT")
            for line in said:
                print(f"    {line[:160]}")
        print(f"median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    finally:
        if spin is not None:
            spin.kill()
            await spin.wait()


if __name__ == "__main__":
    parser = options(__doc__.split("\n\n")[0], rounds=3, after=12.0)
    parser.add_argument("--no-load", action="store_true")
    asyncio.run(main(parser.parse_args()))
