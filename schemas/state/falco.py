"""What the falco service keeps in KV (bucket `falco`): the duplicate window of each alert."""

from __future__ import annotations

from pydantic import BaseModel

BUCKET = "falco"


class DedupRecord(BaseModel):
    """The first alert of a window, and how many identical ones followed it (key `dedup.<hash>`)."""

    event_id: str
    stream_sequence: int | None = None
    first_seen: float
    last_seen: float
    repeats: int = 0
