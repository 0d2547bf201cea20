"""What the credentials service keeps in KV: one lock per credential being renewed (`LOCKS`:
bucket `credentials`, key `lease.<namespace>.<secret>`), so two replicas never renew the
same credential at once."""

from __future__ import annotations

from schemas.state import Bucket
from schemas.state.lease import LeaseRecord, lease_key

BUCKET = "credentials"


def lock_name(namespace: str, secret: str) -> str:
    """The lease name of a credential's renewal lock."""
    return f"{namespace}.{secret}"


def lock_key(namespace: str, secret: str) -> str:
    return lease_key(lock_name(namespace, secret))


LOCKS: Bucket[LeaseRecord] = Bucket(
    BUCKET,
    LeaseRecord,
    prefix="lease.",
    key=lock_key,
    description="per credential: its renewal lock",
)
