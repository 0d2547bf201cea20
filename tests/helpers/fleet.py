"""One fleet picture assembled from what a test says was read, and nothing else."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from nodeward.fleet_status import FleetStatus, assemble


def fleet_of(now: datetime, **read: Any) -> FleetStatus:
    """`assemble` at `now` with what `read` names; the rest read nothing (no breaker, health,
    telemetry, DLQ or actions) with agents timing out after 90 s."""
    nothing: dict[str, Any] = {
        "nats_url": "nats://x:4222",
        "breaker": None,
        "health": [],
        "telemetry": {},
        "dlq": {},
        "actions": [],
        "agent_timeout": timedelta(seconds=90),
    }
    return assemble(now=now, **(nothing | read))
