"""When a credential is due, and the scheduler that says so (one active replica, a Lease).

A credential is due once only `renew_when_left` of its lifetime is left (the owner's
`nodeward.io/renew-before` annotation instead, when set), moved earlier by a jitter that is
the same on every scan, so 2,000 tokens issued together are not renewed in one burst.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter

from nodeward.bus import Bus
from nodeward.kube import Cluster, KubeError
from schemas.base import Event, make_event
from schemas.credentials import CredentialDue, CredentialKind
from services.credentials.secret import LABEL, Credential, Invalid, InvalidSecret, read


@dataclass(frozen=True)
class Timing:
    """A credential's lifetime, read from its data; never the credential itself."""

    expires_at: datetime
    issued_at: datetime | None
    renewable_until: datetime | None
    principal: str | None


def due_at(
    cred: Credential,
    timing: Timing,
    *,
    left: float,
    jitter: float,
    default_lead: timedelta,
) -> datetime:
    """When `cred` should be renewed (may be in the past)."""
    expires = timing.expires_at
    lifetime = (
        expires - timing.issued_at
        if timing.issued_at is not None and timing.issued_at < expires
        else None
    )
    before = cred.renew_before()
    if before is not None:
        at = expires - before
    elif lifetime is not None:
        at = expires - lifetime * left
    else:
        at = expires - default_lead
    if lifetime is not None and jitter > 0:
        key = f"{cred.namespace}/{cred.name}/{expires.isoformat()}".encode()
        fraction = int.from_bytes(hashlib.sha256(key).digest()[:4], "big") / 2**32
        at -= lifetime * jitter * fraction
    return at


class Scheduler:
    """Lists opted-in Secrets while holding the Lease, and publishes `credentials.due.v1`
    for each one due. A credential already announced for the same expiry is announced again
    only after `republish_after` (its event may have been dead-lettered)."""

    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        *,
        holder: str,
        lease: str,
        lease_s: int,
        interval: float,
        republish_after: float,
        source: str,
        timing_of: Callable[[Credential], Awaitable[Timing]],
        due_of: Callable[[Credential, Timing], datetime],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.holder = holder
        self.lease = lease
        self.lease_s = lease_s
        self.interval = interval
        self.republish_after = republish_after
        self.source = source
        self.timing_of = timing_of
        self.due_of = due_of
        self.sent: dict[tuple[str, str], tuple[str, float]] = {}
        self.scans = Counter(
            "nodeward_credential_scans",
            "Passes of the scheduler over the opted-in Secrets (only the lease holder scans)",
            registry=registry or CollectorRegistry(),
        )
        self.log = structlog.get_logger().bind(service="credentials", role="scheduler")

    async def run(self) -> None:
        """Forever: scan while this replica holds the Lease."""
        leading = False
        while True:
            try:
                held = await self.cluster.leases.try_acquire(self.lease, self.holder, self.lease_s)
                if held != leading:
                    self.log.info("credentials.scheduler_lease", held=held)
                    leading = held
                    self.sent.clear()
                if held:
                    await self.scan()
            except KubeError as exc:
                self.log.warning("credentials.scan_failed", error=str(exc))
            except Exception as exc:  # noqa: BLE001 - one bad pass must not end the scheduler
                self.log.error("credentials.scan_crashed", error_type=type(exc).__name__)
            await asyncio.sleep(self.interval)

    async def release(self) -> None:
        try:
            await self.cluster.leases.release(self.lease, self.holder)
        except KubeError as exc:
            self.log.info("credentials.lease_release_failed", error=str(exc))

    async def scan(self) -> int:
        """One pass over the opted-in Secrets; the number of due events published."""
        secrets = await self.cluster.secrets.list(label_selector=LABEL)
        now = datetime.now(UTC)
        events: list[Event[Any]] = []
        seen: set[tuple[str, str]] = set()
        for secret in secrets:
            event = await self._due_event(secret, now)
            meta = secret.get("metadata") or {}
            key = (str(meta.get("namespace")), str(meta.get("name")))
            seen.add(key)
            if event is None:
                continue
            mark = f"{event.data.expires_at.isoformat()}/{meta.get('resourceVersion')}"
            last = self.sent.get(key)
            if last and last[0] == mark and time.monotonic() - last[1] < self.republish_after:
                continue
            self.sent[key] = (mark, time.monotonic())
            events.append(event)
        for gone in set(self.sent) - seen:
            del self.sent[gone]
        for start in range(0, len(events), 500):
            await self.bus.publish_many(events[start : start + 500])
        if events:
            self.log.info("credentials.due_published", count=len(events), opted_in=len(secrets))
        self.scans.inc()
        return len(events)

    async def _due_event(
        self, secret: dict[str, Any], now: datetime
    ) -> Event[CredentialDue] | None:
        try:
            cred = read(secret)
        except InvalidSecret as exc:
            if exc.credential.needs_user():
                return None
            return self._event(exc.credential, None, now, now)
        if cred.needs_user():
            return None
        try:
            timing = await self.timing_of(cred)
            when = self.due_of(cred, timing)
        except Invalid:
            return self._event(cred, None, now, now)  # the renewer says what is wrong
        except Exception as exc:  # noqa: BLE001 - one odd Secret must not stop the scan
            self.log.warning(
                "credentials.unreadable",
                namespace=cred.namespace,
                name=cred.name,
                error_type=type(exc).__name__,
            )
            return self._event(cred, None, now, now)
        if when > now:
            return None
        return self._event(cred, timing, when, now)

    def _event(
        self, cred: Credential, timing: Timing | None, when: datetime, now: datetime
    ) -> Event[CredentialDue]:
        data = CredentialDue(
            namespace=cred.namespace,
            secret=cred.name,
            kind=cred.kind if cred.kind else CredentialKind.OAUTH2,
            principal=timing.principal if timing else None,
            expires_at=timing.expires_at if timing else now,
            renew_by=timing.expires_at if timing else now,
            renewable_until=timing.renewable_until if timing else None,
        )
        return make_event(data, source=self.source)
