"""The circuit breaker's state (`services.kernel.breaker`): one window for every action that
removes a node from service, whichever service proposes it (`SHARED`: bucket `breaker`,
key `breaker`). Before that it was a key in the cordon service's bucket
(`schemas.state.cordon.BREAKER`), which `nodeward status` still reads as a fallback."""

from __future__ import annotations

from pydantic import BaseModel, Field

from schemas.state import Bucket

BREAKER_KEY = "breaker"
BUCKET = "breaker"


class BreakerState(BaseModel):
    admitted: dict[str, float] = Field(
        default_factory=dict, description="target -> unix time admitted, within the window"
    )
    tripped_at: float | None = None
    trip_reason: str | None = None
    trips: int = 0


SHARED: Bucket[BreakerState] = Bucket.one(
    BUCKET,
    BreakerState,
    BREAKER_KEY,
    "the circuit breaker every service that removes nodes from service shares",
)
