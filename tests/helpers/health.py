"""Numbered `gpu.health` events for one node, a consumer of them, and what it handled.

The bus tests publish a node's health events and check which sequence numbers a consumer
handled across crashes, restarts and shutdowns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nodeward.bus import ConsumerSpec, Delivery
from schemas import Event, make_event
from schemas.gpu import GpuHealth


def health_event(node: str, sequence: int) -> Event[GpuHealth]:
    """A `gpu.health` event for `node` numbered `sequence`."""
    data = GpuHealth.example().model_copy(update={"node": node, "sequence": sequence})
    return make_event(data, source="t")


def health_events(node: str, sequences: Iterable[int]) -> list[Event[GpuHealth]]:
    """One `gpu.health` event for `node` per sequence number, in order."""
    return [health_event(node, i) for i in sequences]


def health_spec(name: str, node: str, **options: Any) -> ConsumerSpec:
    """A durable `name` on the GPU stream for `node`'s health events (batch 16, two at once
    and 64 unacknowledged unless `options` say otherwise)."""
    settings: dict[str, Any] = {"batch": 16, "concurrency": 2, "max_ack_pending": 64} | options
    return ConsumerSpec(name=name, stream="GPU", subjects=(f"gpu.health.{node}.>",), **settings)


class Sequences:
    """A handler that records the sequence number of each health event it handles."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    async def __call__(self, event: Event[Any], delivery: Delivery) -> None:
        self.seen.add(event.data.sequence)
