"""What the credentials service adds to `nodeward status`: each credential's newest outcome
from the CREDENTIALS stream, and the renewals in progress from the renewers' locks in KV.

Light to import (`nodeward status` loads it): the schemas and the runtime's views only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import Reads
from nodeward.config import Settings
from nodeward.durations import format_age
from nodeward.views import BucketView, Row, Shown, decoded, records
from schemas.credentials import CredentialFailed, CredentialRenewed
from schemas.state.lease import LeaseRecord
from services.credentials.state import LOCKS

SECTION = "credentials"
LISTED = 10
"""At most this many failed credentials are named; the count says the rest."""
OUTCOMES = ("credentials.renewed.>", "credentials.failed.>")


class Credential(BaseModel):
    """One credential as the picture reads it."""

    credential: str = Field(description="namespace/secret")
    kind: str | None = None
    outcome: Literal["renewed", "failed"] | None = None
    at: datetime | None = None
    expires_at: datetime | None = None
    error: str | None = None
    renewing: bool = Field(default=False, description="a renewer holds its lock now")
    holder: str | None = None


async def credentials(
    reads: Reads, bucket: str, now: datetime
) -> tuple[list[Credential], list[str]]:
    """Every credential with an outcome on the stream or a live lock, by name; with the
    streams and buckets not found."""
    missing = []
    views: dict[str, Credential] = {}
    stored = await reads.last("CREDENTIALS", OUTCOMES)
    if stored is None:
        missing.append("stream CREDENTIALS")
    for _, event in decoded(stored or []):
        data = event.data
        if not isinstance(data, CredentialRenewed | CredentialFailed):
            continue
        key = f"{data.namespace}/{data.secret}"
        known = views.get(key)
        if known is not None and known.at is not None and known.at >= event.time:
            continue
        views[key] = Credential(
            credential=key,
            kind=data.kind.value,
            outcome="renewed" if isinstance(data, CredentialRenewed) else "failed",
            at=event.time,
            expires_at=data.expires_at,
            error=data.error if isinstance(data, CredentialFailed) else None,
        )
    locks: dict[str, LeaseRecord] = records(LOCKS, await reads.kv(bucket, [LOCKS.prefix]) or {})
    for name, lease in locks.items():
        if lease.expires_at < now.timestamp() or "." not in name:
            continue
        ns, secret = name.split(".", 1)
        key = f"{ns}/{secret}"
        view = views.get(key) or Credential(credential=key)
        views[key] = view.model_copy(update={"renewing": True, "holder": lease.holder})
    return sorted(views.values(), key=lambda c: c.credential), missing


def rows(creds: list[Credential], now: datetime) -> list[Row]:
    """One line of counts, then each failed credential (at most `LISTED`)."""
    if not creds:
        return []
    failed = [c for c in creds if c.outcome == "failed"]
    renewing = [c for c in creds if c.renewing]
    renewed = [c for c in creds if c.outcome == "renewed"]
    out = [
        Row(
            section=SECTION,
            text=f"{len(renewed)} renewed, {len(failed)} failed, {len(renewing)} renewing now",
            severity="critical" if failed else "ok",
        )
    ]
    for c in failed[:LISTED]:
        ago = "-" if c.at is None else f"{format_age((now - c.at).total_seconds())} ago"
        out.append(
            Row(
                section=SECTION,
                text=f"{c.credential}: failed {ago}: {c.error}",
                severity="critical",
            )
        )
    return out


async def read(reads: Reads, bucket: str, node: str | None, now: datetime) -> Shown:
    """Fleet rows only (a credential belongs to no node)."""
    if node is not None:
        return Shown()
    creds, missing = await credentials(reads, bucket, now.astimezone(UTC))
    return Shown(rows=rows(creds, now), missing=missing)


def view(settings: Settings) -> BucketView:
    """Its view, reading the locks bucket the service is configured with."""
    outcomes = Watched("CREDENTIALS", OUTCOMES)
    return BucketView.of(settings, "credentials", LOCKS.name, read, also=(outcomes,))
