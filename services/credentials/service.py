"""services.credentials: renew users' Kerberos tickets and OAuth2 tokens held in opted-in Secrets.

A Secret opts in with the label `nodeward.io/credential=kerberos|oauth2` (what it holds:
services/credentials/secret.py). Two roles run in every replica:

- the scheduler (services/credentials/schedule.py), active in the one replica holding the
  Lease, lists opted-in Secrets and publishes `credentials.due.v1` once a credential is
  due (a configurable share of its lifetime left, with jitter);
- the renewer consumes them, shared by every replica: it takes a per-credential lock in
  KV (one refresh at a time across replicas: a rotated OAuth2 refresh token used twice
  revokes the grant), re-reads the Secret, renews (Kerberos: pykrb5 renews the TGT, or a
  keytab gives a fresh one, checked through GSSAPI; OAuth2: authlib's refresh-token
  grant), and writes the new credential at the resourceVersion it read. A 409 re-reads:
  if the credential itself changed meanwhile (the owner uploaded a new one) that one
  stands; otherwise the renewal is written onto the newer version.

Annotations `nodeward.io/credential-*` record status, expiry and last renewal, and so does
each credential's record in KV (`services.credentials.state.CREDENTIALS`, for `nodeward
status`). Outcomes are `credentials.renewed.v1` / `credentials.failed.v1` events and audit
records. What only
the owner can mend (renewable life ending, `invalid_grant`, a refused keytab, clock skew,
garbage in the Secret) is told to them once, in plain words, and the Secret is left as it
is; a KDC or IdP down is retried with back-off and pages on-call only near expiry.
Credential values never leave: not in logs, events, notices or metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import structlog
from pydantic import Field

from nodeward.bus import ConsumerSpec, Delivery, RetryableError
from nodeward.bus.kv import Lease, TypedKV
from nodeward.durations import Duration
from nodeward.handlers import Consuming, Runtime, Service, setting
from nodeward.kube import (
    Conflict,
    NotFound,
    ServerError,
    TooManyRequests,
    Unavailable,
)
from nodeward.kube.base import Obj, copied
from nodeward.kube.secrets import decode
from schemas.base import Event, make_event
from schemas.credentials import (
    CredentialDue,
    CredentialFailed,
    CredentialKind,
    CredentialRenewed,
)
from schemas.ids import stable_id
from schemas.notify import Severity
from schemas.remediation import Outcome
from services.credentials import oauth2
from services.credentials.access import ACCESS
from services.credentials.schedule import Scheduler, Timing, due_at
from services.credentials.secret import (
    CHECKED,
    CLIENT_SECRET,
    EXPIRES,
    KEYTAB,
    RENEWABLE_UNTIL,
    RENEWED_AT,
    STATUS,
    WARNED,
    Credential,
    Invalid,
    InvalidSecret,
    NeedsUser,
    Transient,
    encode,
    read,
    stamp,
)
from services.credentials.state import CREDENTIALS, LOCKS, CredentialRecord, Status, lock_name
from services.kernel import (
    ActingSettings,
    OwnerNotice,
    Proposal,
    acting_for,
    per_action,
    table,
    tell_owner,
)
from services.kernel.access import PUBLISHES
from services.kernel.severities import FAILURE_WARNS, QUIET

NAME = "credentials"
ACTOR = "service/credentials"
TOPIC = "credentials"
# On-call hears of every renewal; a failed one is retried or handed to its owner: a warning.
SEVERITIES = per_action((table(QUIET, FAILURE_WARNS), ("renew",)))

# What the owner reads, per reason a credential needs them.
_STEPS: dict[str, list[str]] = {
    "renewable_life_ended": [
        "Run kinit -r 7d in a notebook terminal and upload the new ticket cache to the Secret "
        "(kubectl create secret generic <name> --from-file=krb5cc=/tmp/krb5cc_$(id -u) "
        "--dry-run=client -o yaml | kubectl apply -f -).",
        "For a job that runs longer than a week, store a keytab and principal in the Secret "
        "instead: nodeward then gets fresh tickets from it.",
    ],
    "not_renewable": [
        "Get a renewable ticket (kinit -r 7d) and upload its cache to the Secret.",
    ],
    "expired": [
        "Get a new ticket (kinit -r 7d) and upload its cache to the Secret; nodeward renews "
        "it from then on.",
    ],
    "keytab_rejected": [
        "The KDC refused the keytab: its key may have changed (a password change or a new "
        "kvno). Export a current keytab and store it in the Secret.",
    ],
    "clock_skew": [
        "The KDC and this cluster disagree about the time; tell the platform team. Nothing "
        "is wrong with your credential.",
    ],
    "invalid_grant": [
        "Your refresh token was refused (revoked, expired, or used elsewhere). Sign in again "
        "and store the new token set in the Secret.",
    ],
    "invalid_client": [
        "The identity provider refused the client id or secret: check the client secret the "
        "Secret refers to.",
    ],
    "invalid": [
        "Fix the Secret as the message says (see docs/services/credentials.md in nodeward); "
        "nodeward reads it again as soon as it changes.",
    ],
}


def _kerberos() -> Any:
    """`services.credentials.kerberos`, which needs the `kerberos` extra (pykrb5, gssapi:
    built against MIT Kerberos). Without it a Kerberos credential fails as transient, and
    on-call is paged as its expiry nears: an operator must install it."""
    try:
        from services.credentials import kerberos as credentials_kerberos
    except ImportError as exc:
        raise Transient(
            f"Kerberos support is not installed here ({exc.name}): pip install 'nodeward[kerberos]'"
        ) from None
    return credentials_kerberos


class CredentialsSettings(ActingSettings, Consuming):
    """`services.credentials` in the config file."""

    subjects: list[str] = Field(default_factory=lambda: ["credentials.due.>"], min_length=1)
    bucket: str = LOCKS.name
    concurrency: int = Field(default=16, ge=1)
    lease: str = "nodeward-credentials-scheduler"
    lease_duration: Duration = timedelta(seconds=15)
    scan_interval: Duration = timedelta(seconds=30)
    """how often the scheduler lists Secrets"""
    republish_after: Duration = timedelta(minutes=5)
    """a credential still due this long after its announcement is announced again"""
    renew_when_left: float = Field(
        default=0.3, gt=0, lt=1, description="renew once this share of the lifetime is left"
    )
    jitter: float = Field(
        default=0.1, ge=0, lt=0.5, description="renew up to this share of the lifetime earlier"
    )
    default_lead: Duration = timedelta(minutes=10)
    """how long before expiry to renew when the lifetime is unknown"""
    user_notice_before: Duration = timedelta(days=1)
    """warn the owner this long before a ticket's renewable life ends"""
    page_when_left: Duration = timedelta(minutes=30)
    """a failing renewal pages on-call only when expiry is this close"""
    lock_ttl: Duration = timedelta(seconds=60)
    retry_delays: list[float] = Field(default_factory=lambda: [2.0, 5.0, 15.0, 30.0, 60.0])
    max_deliver: int = Field(default=30, ge=1)
    http_timeout: Duration = timedelta(seconds=10)
    verify_service: str | None = None
    """GSSAPI host-based name (service@host) a renewed ticket must reach"""
    krb5_config: str | None = None
    """krb5.conf for the KDCs (KRB5_CONFIG); the system's if unset"""


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def scrub(text: str, cred: Credential) -> str:
    """`text` with every credential value in `cred` blanked out: a last line of defence."""
    for value in cred.values():
        text = text.replace(value, "[redacted]")
    return text


app = Service(
    NAME,
    settings=CredentialsSettings,
    access=ACCESS,
    buckets=(LOCKS.name,),
    publishes=("credentials.>", *PUBLISHES),
)


class CredentialsService:
    """One replica: the renewer (handle) and the scheduler (run_scheduler)."""

    def __init__(
        self, rt: Runtime[CredentialsSettings], locks: Any, *, holder: str | None = None
    ) -> None:
        bus, cluster, settings = rt.bus, rt.acting, rt.config
        self.bus, self.cluster, self.settings, self.locks = bus, cluster, settings, locks
        self.records: TypedKV[CredentialRecord] = TypedKV(locks, CredentialRecord)
        self.holder = holder or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        # Every decision is audited through the runner: the service never calls the auditor.
        self.runner = acting_for(rt, topic=TOPIC, severities=SEVERITIES).runner
        self.log = structlog.get_logger().bind(service=NAME, replica=self.holder)
        self.http = httpx.AsyncHTTPTransport(retries=1)
        self.scheduler = Scheduler(
            bus,
            cluster,
            holder=self.holder,
            lease=settings.lease,
            lease_s=max(int(settings.lease_duration.total_seconds()), 1),
            interval=settings.scan_interval.total_seconds(),
            republish_after=settings.republish_after.total_seconds(),
            source=ACTOR,
            timing_of=self.timing,
            due_of=self.due_at,
            registry=rt.daemon.metrics.registry,
        )

    # timing -----------------------------------------------------------------------------
    async def timing(self, cred: Credential) -> Timing:
        if cred.kind == CredentialKind.KERBEROS:
            return await asyncio.to_thread(_kerberos().timing, cred)
        tokens = oauth2.token_set(cred, CLIENT_SECRET)
        issued = tokens.issued_at
        if issued is None and cred.annotations.get(RENEWED_AT):
            try:
                issued = datetime.fromisoformat(cred.annotations[RENEWED_AT].replace("Z", "+00:00"))
            except ValueError:
                issued = None
        return Timing(tokens.expires_at, issued, None, tokens.client_id)

    def due_at(self, cred: Credential, timing: Timing) -> datetime:
        return due_at(
            cred,
            timing,
            left=self.settings.renew_when_left,
            jitter=self.settings.jitter,
            default_lead=self.settings.default_lead,
        )

    # the renewer ------------------------------------------------------------------------
    @app.consumes(
        "CREDENTIALS",
        subjects=setting("subjects"),
        types=(CredentialDue,),
        concurrency=setting("concurrency"),
        retry_delays=setting("retry_delays"),
        max_deliver=setting("max_deliver"),
        ack_wait=timedelta(seconds=60),
        # credentials.due.<ns>.<secret>: the secret named in its subject.
        identity=(ConsumerSpec.bind(CredentialDue, "namespace", "secret"),),
    )
    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        due: CredentialDue = event.data
        with structlog.contextvars.bound_contextvars(
            namespace=due.namespace, credential=due.secret, kind=due.kind.value, event_id=event.id
        ):
            # One holder per attempt: two handlers of this replica exclude each other too.
            lock = Lease(
                self.locks,
                lock_name(due.namespace, due.secret),
                f"{self.holder}/{uuid.uuid4().hex[:8]}",
                ttl=self.settings.lock_ttl.total_seconds(),
            )
            if not await lock.try_acquire():
                self.log.info("credentials.locked_elsewhere")
                raise RetryableError("another replica is renewing this credential", delay=1.0)
            try:
                await self._renew(event, due, delivery.attempt)
            finally:
                await lock.release()

    async def _renew(self, event: Event[Any], due: CredentialDue, attempt: int) -> None:
        try:
            secret = await self.cluster.secrets.get(due.namespace, due.secret)
        except NotFound:
            self.log.info("credentials.secret_gone")
            return
        try:
            cred = read(secret)
        except InvalidSecret as exc:
            await self._needs_user(event, exc.credential, None, "invalid", str(exc))
            return
        if cred.needs_user():
            self.log.info("credentials.waiting_for_owner")
            return
        try:
            timing = await self.timing(cred)
        except Invalid as exc:
            await self._needs_user(event, cred, None, "invalid", str(exc))
            return
        if datetime.now(UTC) < self.due_at(cred, timing):
            self.log.info("credentials.not_due", expires_at=timing.expires_at.isoformat())
            return
        proposal = Proposal(
            action="renew",
            target=cred.ref(),
            reason=f"{cred.kind.value} credential of {timing.principal or 'unknown'} due: it "
            f"would expire at {_when(timing.expires_at)}",
            trigger_id=event.id,
            trigger_time=event.time,
            protective=False,
            obj=secret,
            details={"kind": cred.kind.value, "principal": timing.principal},
        )

        async def act() -> dict[str, Any]:
            return await self._renew_and_write(cred, timing)

        try:
            result = await self.runner.run(proposal, act, [])
        except NeedsUser as exc:
            await self._needs_user(event, cred, timing, exc.code, scrub(str(exc), cred))
            return
        except Invalid as exc:
            await self._needs_user(event, cred, timing, "invalid", scrub(str(exc), cred))
            return
        except Transient as exc:
            await self._transient(
                event,
                cred=cred,
                timing=timing,
                proposal=proposal,
                message=scrub(str(exc), cred),
                attempt=attempt,
            )
            return
        if result.outcome == Outcome.APPLIED and result.details.get("written"):
            expires_at = datetime.fromisoformat(result.details["expires_at"])
            until = result.details.get("renewable_until")
            renewable_until = datetime.fromisoformat(until) if until else None
            await self._publish(
                CredentialRenewed,
                cred,
                principal=result.details.get("principal"),
                expires_at=expires_at,
                renewable_until=renewable_until,
                resource_version=result.details.get("resource_version"),
                rotated=bool(result.details.get("rotated")),
            )
            # The status record last: the outcome event is the fact, the record its summary.
            await self._record(
                cred,
                "ok",
                principal=result.details.get("principal"),
                expires_at=expires_at,
                renewable_until=renewable_until,
                renewed=True,
            )

    async def _publish(
        self,
        outcome: type[CredentialRenewed] | type[CredentialFailed],
        cred: Credential,
        **fields: Any,
    ) -> None:
        """Publish a renewal's outcome event for `cred` (its namespace, secret and kind)."""
        data = outcome(namespace=cred.namespace, secret=cred.name, kind=cred.kind, **fields)
        await self.bus.publish(make_event(data, source=ACTOR))

    async def _renew_and_write(self, cred: Credential, timing: Timing) -> dict[str, Any]:
        now = datetime.now(UTC)
        rotated = False
        if cred.kind == CredentialKind.KERBEROS:
            renewal = await asyncio.to_thread(
                _kerberos().renew, cred, verify_service=self.settings.verify_service
            )
            data, expires_at = renewal.data, renewal.expires_at
            renewable_until, principal = renewal.renewable_until, renewal.principal
        else:
            tokens = oauth2.token_set(cred, CLIENT_SECRET)
            client_secret = await self._client_secret(cred, tokens)
            refreshed = await oauth2.refresh(
                tokens,
                client_secret,
                timeout=self.settings.http_timeout.total_seconds(),
                transport=self.http,
            )
            data, expires_at, rotated = refreshed.data, refreshed.expires_at, refreshed.rotated
            renewable_until, principal = None, tokens.client_id
        warn = (
            renewable_until is not None
            and KEYTAB not in cred.data
            and renewable_until - now < self.settings.user_notice_before
            and cred.annotations.get(WARNED) != stamp(renewable_until)
        )
        annotations: dict[str, str | None] = {
            STATUS: "ok",
            EXPIRES: stamp(expires_at),
            RENEWED_AT: stamp(now),
            RENEWABLE_UNTIL: stamp(renewable_until) if renewable_until else None,
            CHECKED: None,
        }
        if warn and renewable_until is not None:
            annotations[WARNED] = stamp(renewable_until)
        written = await self._write(cred, data, annotations)
        if written is not None and warn and renewable_until is not None:
            await self._warn_renewable_end(cred, renewable_until)
        return {
            "written": written is not None,
            "expires_at": expires_at.isoformat(),
            "renewable_until": renewable_until.isoformat() if renewable_until else None,
            "resource_version": (written or {}).get("metadata", {}).get("resourceVersion"),
            "rotated": rotated,
            "principal": principal,
        }

    async def _client_secret(self, cred: Credential, tokens: oauth2.TokenSet) -> str | None:
        if tokens.client_secret_ref is None:
            return None
        name, key = tokens.client_secret_ref
        try:
            values = decode(await self.cluster.secrets.get(cred.namespace, name))
        except NotFound:
            raise Invalid(f"the client secret Secret {name!r} does not exist") from None
        if key not in values:
            raise Invalid(f"the client secret Secret {name!r} has no {key!r} entry")
        return values[key]

    async def _write(
        self, cred: Credential, data: dict[str, bytes], annotations: dict[str, str | None]
    ) -> Obj | None:
        """The new credential and its annotations in one update at the version read.

        On 409: re-read. If the credential entries are as we read them, apply the renewal to
        the newer version; if someone replaced them (the owner uploaded a new credential),
        theirs stands and ours is dropped (None).
        """
        base = cred
        for _ in range(8):
            body = copied(base.secret)
            body["data"] = {**(body.get("data") or {}), **encode(data)}
            meta = body["metadata"]
            merged = {**(meta.get("annotations") or {}), **annotations}
            meta["annotations"] = {k: v for k, v in merged.items() if v is not None}
            try:
                return await self._persist(functools.partial(self.cluster.secrets.write, body))
            except Conflict:
                self.log.info("credentials.write_conflict")
            try:
                latest = read(
                    await self._persist(lambda: self.cluster.secrets.get(cred.namespace, cred.name))
                )
            except (InvalidSecret, NotFound):
                self.log.info("credentials.replaced_meanwhile")
                return None
            if any(latest.data.get(k) != cred.data.get(k) for k in (*data, *cred.data)):
                self.log.info("credentials.replaced_meanwhile")
                return None
            base = latest
        raise Transient("the Secret kept changing under every write")

    async def _persist(self, call: Callable[[], Awaitable[Obj]]) -> Obj:
        """`call()`, outlasting an API server outage of about 15 s more than the client's
        own retries: a renewed credential (a rotated refresh token) exists only in memory
        until it is written, and the old one may already be revoked."""
        for delay in (0.5, 1.0, 2.0, 4.0, 8.0):
            try:
                return await call()
            except (Unavailable, ServerError, TooManyRequests) as exc:
                self.log.warning("credentials.write_retry", error=str(exc), delay_s=delay)
                await asyncio.sleep(delay)
        return await call()

    async def _record(
        self,
        cred: Credential,
        status: Status,
        *,
        principal: str | None,
        expires_at: datetime | None,
        renewable_until: datetime | None = None,
        renewed: bool = False,
        error: str | None = None,
    ) -> None:
        """The credential's last outcome in KV, for `nodeward status` (no value in it). A
        failure to write it is logged: the renewal stands either way."""
        now = datetime.now(UTC)

        def change(old: CredentialRecord | None) -> CredentialRecord:
            return CredentialRecord(
                namespace=cred.namespace,
                secret=cred.name,
                kind=cred.kind,
                principal=principal or (old.principal if old else None),
                status=status,
                expires_at=expires_at,
                renewable_until=renewable_until or (old.renewable_until if old else None),
                renewed_at=now if renewed else (old.renewed_at if old else None),
                renewals=(old.renewals if old else 0) + int(renewed),
                error=None if error is None else scrub(error, cred)[:500],
                updated_at=now,
            )

        try:
            await self.records.update(CREDENTIALS.key(cred.namespace, cred.name), change)
        except Exception as exc:  # noqa: BLE001 - a status record never undoes a renewal
            self.log.warning("credentials.record_failed", error=str(exc))

    # telling people ---------------------------------------------------------------------
    async def _needs_user(
        self,
        event: Event[Any],
        cred: Credential,
        timing: Timing | None,
        code: str,
        message: str,
    ) -> None:
        """Leave the credential as it is, mark it, tell the owner once, record the failure."""
        status = f"{'invalid' if code == 'invalid' else 'needs-user'}: {message}"[:250]
        digest = cred.digest

        def mark(current: Obj) -> Obj | None:
            try:
                now_digest = read(current).digest
            except InvalidSecret as exc:
                now_digest = exc.credential.digest
            if now_digest != digest:
                return None  # the owner changed it meanwhile: nothing to mark
            return {"metadata": {"annotations": {STATUS: status, CHECKED: digest}}}

        try:
            await self.cluster.secrets.patch(cred.namespace, cred.name, mark)
        except NotFound:
            return
        expires = timing.expires_at if timing else None
        await self._record(
            cred,
            "invalid" if code == "invalid" else "needs-user",
            principal=timing.principal if timing else None,
            expires_at=expires,
            error=f"{code}: {message}",
        )
        await self._publish(
            CredentialFailed,
            cred,
            principal=timing.principal if timing else None,
            error=f"{code}: {message}"[:500],
            retryable=False,
            expires_at=expires,
        )
        proposal = Proposal(
            action="renew",
            target=cred.ref(),
            reason=f"not renewed, the owner must act: {message}",
            trigger_id=event.id,
            trigger_time=event.time,
            protective=False,
            details={"kind": cred.kind.value, "cause": code},
        )
        await self.runner.fail(proposal, guard=code)
        what = "Kerberos ticket" if cred.kind == CredentialKind.KERBEROS else "OAuth2 token"
        if code == "invalid":
            title = f"nodeward cannot read the credential in Secret {cred.namespace}/{cred.name}"
            body = f"The Secret is opted in for renewal but {message}. Nothing was changed in it."
        else:
            title = f"Your {what} in Secret {cred.namespace}/{cred.name} cannot be renewed"
            body = f"nodeward could not renew it: {message}. The Secret was left as it is"
            body += f"; it stops working at {_when(expires)}." if expires else "."
        await self._notify_user(
            cred,
            stable_id(
                datetime.fromtimestamp(0, UTC),
                "needs-user",
                cred.namespace,
                cred.name,
                digest,
                code,
            ),
            OwnerNotice(
                severity=Severity.WARNING,
                title=title,
                body=body,
                why=f"Jobs that mount this Secret lose their {what} when it expires.",
                steps=_STEPS.get(code, _STEPS["invalid"]),
                deadline=expires,
            ),
        )
        self.log.info("credentials.needs_user", cause=code)

    async def _warn_renewable_end(self, cred: Credential, until: datetime) -> None:
        await self._notify_user(
            cred,
            stable_id(until, "renewable-end", cred.namespace, cred.name),
            OwnerNotice(
                severity=Severity.WARNING,
                title=f"Your Kerberos ticket in Secret {cred.namespace}/{cred.name} stops being "
                f"renewable at {_when(until)}",
                body="nodeward renewed it, but Kerberos allows renewals only until "
                f"{_when(until)}. After that, jobs using the Secret lose access.",
                why="A ticket can be renewed only within the renewable life it was issued with.",
                steps=_STEPS["renewable_life_ended"],
                deadline=until,
            ),
        )

    async def _transient(
        self,
        event: Event[Any],
        *,
        cred: Credential,
        timing: Timing,
        proposal: Proposal,
        message: str,
        attempt: int,
    ) -> None:
        """Record the failure, page on-call only if expiry is close, retry with back-off."""
        left = timing.expires_at - datetime.now(UTC)
        near = left <= self.settings.page_when_left
        await self._record(
            cred,
            "retrying",
            principal=timing.principal,
            expires_at=timing.expires_at,
            error=message,
        )
        await self._publish(
            CredentialFailed,
            cred,
            principal=timing.principal,
            error=message[:500],
            retryable=True,
            attempt=attempt,
            expires_at=timing.expires_at,
        )
        if near or attempt == 1:
            paged = Proposal(
                action=proposal.action,
                target=proposal.target,
                reason=f"{proposal.reason}; renewal failed ({message}), retrying"
                + (
                    f"; it expires in {max(int(left.total_seconds() // 60), 0)} min" if near else ""
                ),
                trigger_id=proposal.trigger_id,
                trigger_time=proposal.trigger_time,
                protective=False,
                details=proposal.details,
                severity=Severity.CRITICAL if near else Severity.INFO,
            )
            guard = "expiring" if near else "unavailable"
            await self.runner.fail(paged, guard=guard)
        delays = self.settings.retry_delays or [5.0]
        delay = delays[min(attempt, len(delays)) - 1]
        self.log.warning("credentials.retrying", error=message, attempt=attempt, delay_s=delay)
        raise RetryableError(message, delay=delay)

    async def _notify_user(self, cred: Credential, notice_id: str, notice: OwnerNotice) -> None:
        """Tell the Secret's owner; the body is scrubbed of the credential's values."""
        await tell_owner(
            self.bus,
            dataclasses.replace(notice, body=scrub(notice.body, cred)),
            actor=ACTOR,
            topic=TOPIC,
            namespace=cred.namespace,
            name=cred.name,
            targets=[cred.ref()],
            notice_id=notice_id,
        )


@app.setup
async def setup(rt: Runtime[CredentialsSettings]) -> CredentialsService:
    """The renewer over its locks; `settings.cluster` must authenticate as its
    ServiceAccount."""
    if rt.config.krb5_config:
        os.environ["KRB5_CONFIG"] = rt.config.krb5_config
    locks = await rt.kv(rt.config.bucket, history=1)
    service = CredentialsService(rt, locks)
    rt.daemon.add_shutdown_hook(service.http.aclose)
    return service


@app.task("schedule")
async def schedule(service: CredentialsService) -> None:
    """The scheduler, while this replica holds its lease; the lease is given back on stop."""
    try:
        await service.scheduler.run()
    finally:
        await service.scheduler.release()


build = app.build
component, standalone = app.daemon()
