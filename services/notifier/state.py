"""What the notifier keeps in KV: per event and route, which channels have sent (or
dead-lettered) the notice (`SETTLED`: bucket `notifier`, key `ev.<event id>.<route>`), so a
redelivered notice is not sent twice."""

from __future__ import annotations

import hashlib
import re

from pydantic import RootModel

from schemas.state import Bucket

BUCKET = "notifier"
SAFE_KEY = re.compile(r"^[A-Za-z0-9_=-]{1,128}$")


class Settled(RootModel[dict[str, str]]):
    """Channel name -> outcome (`sent`, `dead-lettered`, `suppressed`, `dry-run`)."""


def settled_key(event_id: str, route: str) -> str:
    """`ev.<id>.<route>`; an id with characters KV keys cannot hold is hashed."""
    if not SAFE_KEY.match(event_id):
        event_id = "h-" + hashlib.sha256(event_id.encode()).hexdigest()
    return f"ev.{event_id}.{route}"


SETTLED: Bucket[Settled] = Bucket(
    BUCKET, Settled, prefix="ev.", key=settled_key, description="per event and route"
)
