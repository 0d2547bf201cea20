"""A consumer process whose handler records the event id and then hangs (for SIGKILL tests).

Usage: python -m tests.helpers.hanging_consumer NATS_URL DURABLE SUBJECT MARKER_FILE
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from nodeward.bus import Bus, ConsumerSpec, Delivery
from nodeward.config import BusSettings
from schemas import Event


def crash_spec(durable: str, subject: str) -> ConsumerSpec:
    """The durable this process and the test that kills it share: one at a time, a 1 s ack wait."""
    return ConsumerSpec(
        name=durable,
        stream="GPU",
        subjects=(subject,),
        ack_wait=timedelta(seconds=1),
        concurrency=1,
        batch=1,
        max_ack_pending=8,
    )


async def main(url: str, durable: str, subject: str, marker: Path) -> None:
    bus = await Bus.connect(BusSettings(url=url), source="test/hanging")

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        marker.write_text(f"{event.id} {delivery.attempt}\n")
        await asyncio.Event().wait()  # never returns: the test kills us here

    await bus.consume(crash_spec(durable, subject), handler)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))
