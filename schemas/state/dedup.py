"""What the remediation kernel's `Dedup` keeps per key: the first of a window and its repeats.

One KV key per deduplicated key, updated with revision checks, so every replica agrees on
which one came first.
"""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field


class DedupRecord(BaseModel):
    """The first occurrence of a key within the window, and how many followed it.

    Reads the Falco service's own `dedup.<hash>` records too (`event_id` for `first`), so
    that service can move onto the kernel's `Dedup` on the same bucket and keys.
    """

    first: str = Field(
        validation_alias=AliasChoices("first", "event_id"),
        description="what came first: a trigger event id, or the caller's instance",
    )
    first_seen: float = Field(description="unix time")
    last_seen: float = Field(description="unix time")
    repeats: int = Field(default=0, ge=0)
    content: str | None = Field(
        default=None, description="a digest of what was said: something new opens a new window"
    )
