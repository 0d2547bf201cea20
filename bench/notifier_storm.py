"""A notify storm through the notifier, against a plain consumer of the same stream.

Each run publishes N notices on one route into a fresh NATS, then measures:
- baseline: a bare `Bus.consume` handler on NOTIFY that only counts (what any nodeward
  consumer costs), time until it has handled all N;
- notifier: time until all N are held in groups (intake), until the one grouped message
  is in the outbox and every notice is acked (end to end, which includes `group_wait`).
Prints medians over the runs and the intake ratio notifier / baseline (1.0 = no overhead).

    python bench/notifier_storm.py [--notices 3000] [--group-wait 2] [--runs 5]
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import options

from nodeward.bus import Bus, ConsumerSpec
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, Settings
from nodeward.logs import configure_logging
from schemas import make_event
from schemas.notify import Notification, Severity
from services.notifier.service import build


def storm(notices: int) -> list[Any]:
    return [
        make_event(
            Notification(severity=Severity.INFO, topic="bench", title=f"node-{i} idle session"),
            source="bench",
        )
        for i in range(notices)
    ]


async def baseline(bus: Bus, notices: int) -> float:
    """A bare consumer of the same notices: the floor any nodeward consumer starts from."""
    done = asyncio.Event()
    count = 0

    async def handler(_event: Any, _delivery: Any) -> None:
        nonlocal count
        count += 1
        if count >= notices:
            done.set()

    spec = ConsumerSpec(
        name="baseline", stream="NOTIFY", subjects=("notify.>",), max_ack_pending=10000
    )
    began = time.monotonic()
    consumer = await bus.consume(spec, handler)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.monotonic() - began
    await consumer.stop()
    bus.consumers.remove(consumer)
    return elapsed


async def one_run(notices: int, group_wait: float) -> tuple[float, float, float, int]:
    tmp = Path(tempfile.mkdtemp(prefix="notifier-bench-"))
    outbox = tmp / "outbox"
    server = EmbeddedNats(tmp / "nats")
    await server.start()
    bus = await Bus.connect(BusSettings(url=server.url), source="bench")
    try:
        await bus.publish_many(storm(notices))
        base = await baseline(bus, notices)
        settings = Settings(
            bus={"url": server.url},
            services={
                "notifier": {
                    "owner_lookup": False,
                    "grouping": {"group_wait": f"{group_wait}s"},
                    "max_in_flight": max(5000, 2 * notices),
                }
            },
        )
        daemon = await build(settings, outbox_dir=outbox)
        began = time.monotonic()
        await daemon.start()
        registry = daemon.metrics.registry
        while (registry.get_sample_value("nodeward_notifications_waiting") or 0) < notices:
            if any(outbox.glob("*.txt")):
                break  # the group was sent before every notice joined it
            await asyncio.sleep(0.005)
        intake = time.monotonic() - began
        while True:
            info = await bus.js.consumer_info("NOTIFY", "notifier")
            if not info.num_pending and not info.num_ack_pending and any(outbox.glob("*.txt")):
                break
            await asyncio.sleep(0.02)
        end_to_end = time.monotonic() - began
        messages = len(list(outbox.glob("*.txt")))
        await daemon.stop()
    finally:
        await bus.close()
        await server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return base, intake, end_to_end, messages


async def main(notices: int, group_wait: float, runs: int) -> None:
    configure_logging("warning", "console")
    results = [await one_run(notices, group_wait) for _ in range(runs)]
    base = statistics.median(r[0] for r in results)
    intake = statistics.median(r[1] for r in results)
    e2e = statistics.median(r[2] for r in results)
    print(f"notices per run:            {notices} (one route), {runs} runs, medians")
    print(f"baseline consumer handled:  {base:.2f} s ({notices / base:.0f}/s)")
    print(f"notifier held in groups:    {intake:.2f} s ({notices / intake:.0f}/s)")
    print(f"intake ratio (baseline/us): {base / intake:.2f}  (1.0 = as fast as a bare consumer)")
    print(f"delivered and acked after:  {e2e:.2f} s (group_wait {group_wait:g} s)")
    print(f"over the group wait:        {e2e - group_wait:.2f} s")
    print(f"messages sent per run:      {sorted({r[3] for r in results})}")


if __name__ == "__main__":
    parser = options(__doc__, notices=3000, group_wait=2.0, runs=5)
    args = parser.parse_args()
    asyncio.run(main(args.notices, args.group_wait, args.runs))
