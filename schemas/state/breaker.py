"""The circuit breaker's shared state (`services.kernel.breaker`), one key in the bucket of
the service it guards (`breaker`; cordon's: `schemas.state.cordon.BREAKER`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

BREAKER_KEY = "breaker"


class BreakerState(BaseModel):
    admitted: dict[str, float] = Field(
        default_factory=dict, description="target -> unix time admitted, within the window"
    )
    tripped_at: float | None = None
    trip_reason: str | None = None
    trips: int = 0


def breaker_key() -> str:
    """The breaker's one key."""
    return BREAKER_KEY
