"""What the credentials service keeps in KV (bucket `credentials`): one lock per credential
being renewed (`LOCKS`: key `lease.<namespace>.<secret>`), so two replicas never renew the
same credential at once, and each credential's last outcome (`CREDENTIALS`: key
`secret.<namespace>.<secret>`), for `nodeward status`. No credential value is ever kept."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from schemas.credentials import CredentialKind
from schemas.state import Bucket
from schemas.state.lease import LeaseRecord, lease_key
from schemas.tokens import token

BUCKET = "credentials"


def lock_name(namespace: str, secret: str) -> str:
    """The lease name of a credential's renewal lock."""
    return f"{namespace}.{secret}"


def lock_key(namespace: str, secret: str) -> str:
    return lease_key(lock_name(namespace, secret))


LOCKS: Bucket[LeaseRecord] = Bucket(
    BUCKET, LeaseRecord, prefix="lease.", key=lock_key, description="a credential's renewal lock"
)

Status = Literal["ok", "needs-user", "invalid", "retrying"]


class CredentialRecord(BaseModel):
    """A credential's last renewal and outcome, as `nodeward status` shows it."""

    namespace: str
    secret: str
    kind: CredentialKind
    principal: str | None = None
    status: Status
    """ok: renewed; needs-user / invalid: waiting for the owner; retrying: a peer is down."""
    expires_at: datetime | None = None
    renewable_until: datetime | None = None
    renewed_at: datetime | None = None
    """When it was last renewed (kept when a later renewal fails)."""
    renewals: int = Field(default=0, ge=0, description="renewals recorded in this record")
    error: str | None = Field(default=None, description="the last failure, without any value")
    updated_at: datetime


def record_key(namespace: str, secret: str) -> str:
    return f"secret.{token(namespace)}.{token(secret)}"


CREDENTIALS: Bucket[CredentialRecord] = Bucket(
    BUCKET, CredentialRecord, prefix="secret.", key=record_key, description="a credential's outcome"
)
