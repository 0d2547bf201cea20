"""What a node's energy agent keeps in KV: its cumulative energy and CO2e (`TOTALS`: bucket
`energy`, key `node.<node token>`), so a restarted agent continues the totals."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from schemas.state import Bucket
from schemas.tokens import token

BUCKET = "energy"


class EnergyTotals(BaseModel):
    """What KV keeps for a node: its cumulative energy and CO2e, and the time they miss."""

    energy_j: float = 0.0
    co2e_g: float = 0.0
    uncovered_s: float = 0.0
    """Seconds of intervals with no reading (unknown energy, left out of `energy_j`)."""
    updated_at: datetime | None = None


def totals_key(node: str) -> str:
    return f"node.{token(node)}"


TOTALS: Bucket[EnergyTotals] = Bucket(
    BUCKET,
    EnergyTotals,
    prefix="node.",
    key=totals_key,
    description="energy agents' cumulative totals, key node.<node>",
)
