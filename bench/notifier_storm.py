"""A notify storm through the notifier: N notices on one route, how long until every one is
delivered (one grouped outbox message) and acked. Prints the figures.

    python bench/notifier_storm.py [--notices 3000] [--group-wait 10]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from nodeward.bus import Bus
from nodeward.config import BusSettings, Settings
from nodeward.logs import configure_logging
from nodeward.sim.nats_server import EmbeddedNats
from schemas import make_event
from schemas.notify import Notification, Severity
from services.notifier import build


async def main(notices: int, group_wait: float) -> None:
    configure_logging("warning", "console")
    tmp = Path(tempfile.mkdtemp(prefix="notifier-bench-"))
    server = EmbeddedNats(tmp / "nats")
    await server.start()
    bus = await Bus.connect(BusSettings(url=server.url), source="bench")
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
    daemon = await build(settings, outbox_dir=tmp / "outbox")
    await daemon.start()
    events = [
        make_event(
            Notification(severity=Severity.CRITICAL, topic="bench", title=f"node-{i} quarantined"),
            source="bench",
        )
        for i in range(notices)
    ]
    began = time.monotonic()
    await bus.publish_many(events)
    published = time.monotonic()
    registry = daemon.metrics.registry
    while (registry.get_sample_value("nodeward_notifications_waiting") or 0) < notices:
        if any((tmp / "outbox").glob("*.txt")):
            break  # the group was sent before every notice joined it
        await asyncio.sleep(0.01)
    grouped = time.monotonic()
    while True:
        info = await bus.js.consumer_info("NOTIFY", "notifier")
        if (
            not info.num_pending
            and not info.num_ack_pending
            and any((tmp / "outbox").glob("*.txt"))
        ):
            break
        await asyncio.sleep(0.02)
    done = time.monotonic()
    files = len(list((tmp / "outbox").glob("*.txt")))
    print(f"notices:             {notices}")
    print(f"published in:        {published - began:.2f} s")
    print(f"all in groups after: {grouped - began:.2f} s ({notices / (grouped - began):.0f}/s)")
    print(f"all acked after:     {done - began:.2f} s (group_wait {group_wait:g} s)")
    print(f"over the group wait: {done - began - group_wait:.2f} s")
    print(f"messages sent:       {files}")
    await daemon.stop()
    await bus.close()
    await server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--notices", type=int, default=3000)
    parser.add_argument("--group-wait", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(main(args.notices, args.group_wait))
