"""A lease in a KV bucket (`nodeward.bus.kv.Lease`): key `lease.<name>`, one holder at a time.

Services keep theirs in their own bucket: the credentials service one per credential it
renews (`services.credentials.state.LOCKS`), the checkpoint service its workflow's.
"""

from __future__ import annotations

from pydantic import BaseModel


class LeaseRecord(BaseModel):
    holder: str
    expires_at: float  # unix seconds
    acquired_at: float
    # Given back by a holder that stopped its work cleanly (`Lease.release(handover=True)`):
    # whoever takes it next need not wait for work the holder left out.
    released: bool = False


def lease_key(name: str) -> str:
    return f"lease.{name}"
