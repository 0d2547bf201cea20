"""The notifier's channels: email (SMTP), chat and JSON webhooks, Alertmanager, a file outbox.

Each channel sends one rendered group (`Outgoing`) or raises `ChannelError`; `deliver`
retries with exponential back-off. A `PermanentChannelError` (nobody to send to, a 4xx
answer) is not retried. Secrets (SMTP password, webhook URLs, tokens) are `SecretStr` or
files and never appear in logs or errors.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, Protocol, TypeVar

import aiosmtplib
import httpx
from pydantic import Field, SecretStr

from nodeward.config import Section
from nodeward.durations import Duration
from schemas.notify import Severity
from services.notifier.grouping import Item
from services.notifier.render import Rendered

ALERTNAME_PREFIX = "Nodeward"


class ChannelError(Exception):
    """A send failed; `str()` is one line without secrets."""


class PermanentChannelError(ChannelError):
    """Retrying cannot help (no recipient, the peer refuses the request)."""


class RetrySettings(Section):
    """Per channel: `attempts` tries, waiting `initial`, then twice as long each time up to `max`."""

    attempts: int = Field(default=5, ge=1)
    initial: Duration = timedelta(seconds=1)
    max: Duration = timedelta(seconds=30)
    timeout: Duration = timedelta(seconds=10)
    """per attempt"""

    def delay(self, attempt: int) -> float:
        return float(
            min(self.initial.total_seconds() * 2 ** (attempt - 1), self.max.total_seconds())
        )


class _Channel(Section):
    retry: RetrySettings | None = None
    """None: the notifier's `retry`"""


class OutboxSettings(_Channel):
    """One text file per message in `dir` (`<state-dir>/outbox` under `nodeward up`)."""

    type: Literal["outbox"] = "outbox"
    dir: Path | None = None
    """None: <state-dir>/outbox or .nodeward/outbox"""


class EmailSettings(_Channel):
    type: Literal["email"] = "email"
    host: str = "127.0.0.1"
    port: int = Field(default=587, ge=1, le=65535)
    tls: Literal["starttls", "implicit", "none"] = "starttls"
    tls_ca_file: Path | None = None
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    sender: str = "nodeward <nodeward@localhost>"
    reply_to: str | None = None
    """e.g. the platform team's address"""
    to: list[str] = Field(default_factory=list, description="on-call addresses")


class ChatSettings(_Channel):
    """A Mattermost or Slack incoming webhook (`{"text": ...}`)."""

    type: Literal["chat"] = "chat"
    url: SecretStr


class WebhookSettings(_Channel):
    """Any HTTP endpoint: the group's notices as JSON."""

    type: Literal["webhook"] = "webhook"
    url: SecretStr
    bearer_token_file: Path | None = None


class AlertmanagerSettings(_Channel):
    type: Literal["alertmanager"] = "alertmanager"
    url: str = Field(description="base URL, e.g. http://alertmanager:9093")
    resolve_after: Duration = timedelta(hours=1)
    """endsAt: how long an alert stays active"""
    labels: dict[str, str] = Field(default_factory=dict, description="added to every alert")


ChannelSettings = Annotated[
    OutboxSettings | EmailSettings | ChatSettings | WebhookSettings | AlertmanagerSettings,
    Field(discriminator="type"),
]


S = TypeVar("S", bound=_Channel)


@dataclass(frozen=True)
class Outgoing:
    """One group, rendered: what every channel sends."""

    route: str
    recipient: str | None  # the owner's address of a user's notice on a `to_owner` route
    to_owner: bool
    severity: Severity
    items: list[Item]
    rendered: Rendered
    chat: str
    dry_run: bool
    addressee: str = "on-call"  # whom it is for, in words (the outbox's `To:`)

    @property
    def event_ids(self) -> list[str]:
        return [e.event.id for i in self.items for e in i.entries]


class Channel(Protocol):
    name: str
    external: bool

    async def send(self, out: Outgoing) -> None: ...


def _read_secret(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise PermanentChannelError(f"cannot read {what} {path}: {exc.strerror}") from None


def _http_error(exc: httpx.HTTPError, url: str) -> ChannelError:
    """One line without the URL: webhook URLs carry their secret."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        text = " ".join(exc.response.text.split())[:200]
        permanent = 400 <= status < 500 and status not in (408, 429)
        cls = PermanentChannelError if permanent else ChannelError
        return cls(f"HTTP {status}: {text}")
    text = " ".join(str(exc).split()).replace(url, "<url>") or "no answer"
    return ChannelError(f"{type(exc).__name__}: {text}")


class OutboxChannel:
    external = False

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.directory = directory

    def _write(self, out: Outgoing) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC)
        safe_route = re.sub(r"[^A-Za-z0-9_-]", "_", out.route)
        who = "oncall" if not out.to_owner else out.recipient or out.addressee
        safe_who = re.sub(r"[^A-Za-z0-9_.@-]", "_", who)[:80]
        name = f"{now:%Y%m%dT%H%M%S.%fZ}-{safe_route}-{safe_who}-{uuid.uuid4().hex[:8]}.txt"
        headers = [
            f"Date: {now:%Y-%m-%d %H:%M:%S} UTC",
            f"To: {out.addressee}",
            f"Subject: {out.rendered.subject}",
            f"Route: {out.route}",
            f"Severity: {out.severity.value}",
            f"Notices: {len(out.event_ids)}",
        ]
        if out.dry_run:
            headers.append("Dry-Run: true (nothing was sent to external channels)")
        content = "\n".join(headers) + "\n\n" + out.rendered.text
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            final = self.directory / name
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return final

    async def send(self, out: Outgoing) -> None:
        try:
            await asyncio.to_thread(self._write, out)
        except OSError as exc:
            raise ChannelError(f"cannot write outbox {self.directory}: {exc.strerror}") from None


class EmailChannel:
    external = True

    def __init__(self, name: str, settings: EmailSettings) -> None:
        self.name = name
        self.settings = settings

    def _password(self) -> str | None:
        s = self.settings
        if s.password_file is not None:
            return _read_secret(s.password_file, "SMTP password file")
        return s.password.get_secret_value() if s.password is not None else None

    def _tls_context(self) -> ssl.SSLContext | None:
        s = self.settings
        if s.tls == "none":
            return None
        return ssl.create_default_context(
            cafile=str(s.tls_ca_file) if s.tls_ca_file is not None else None
        )

    def recipients(self, out: Outgoing) -> list[str]:
        if out.to_owner:
            if not out.recipient:
                raise PermanentChannelError(
                    "no owner address (annotation nodeward.io/owner-email on the pod or its "
                    "namespace, or the owner directory)"
                )
            return [out.recipient]
        if not self.settings.to:
            raise PermanentChannelError(f"email channel {self.name} has no `to` addresses")
        return list(self.settings.to)

    async def send(self, out: Outgoing) -> None:
        s = self.settings
        to = self.recipients(out)
        msg = EmailMessage()
        msg["From"] = s.sender
        msg["To"] = ", ".join(to)
        msg["Subject"] = out.rendered.subject
        msg["Date"] = format_datetime(datetime.now(UTC))
        msg["Message-ID"] = make_msgid(domain="nodeward")
        msg["X-Nodeward-Route"] = out.route
        if s.reply_to:
            msg["Reply-To"] = s.reply_to
        msg.set_content(out.rendered.text)
        tls = self._tls_context()
        try:
            await aiosmtplib.send(
                msg,
                hostname=s.host,
                port=s.port,
                username=s.username,
                password=self._password() if s.username else None,
                use_tls=s.tls == "implicit",
                start_tls=s.tls == "starttls",
                tls_context=tls,
                timeout=(s.retry or RetrySettings()).timeout.total_seconds(),
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise PermanentChannelError(f"SMTP refused the recipients: {exc}") from None
        except aiosmtplib.SMTPAuthenticationError as exc:
            raise PermanentChannelError(f"SMTP authentication failed ({exc.code})") from None
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise ChannelError(
                f"SMTP {s.host}:{s.port}: {type(exc).__name__}: {' '.join(str(exc).split())}"
            ) from None


class _HttpChannel(Generic[S]):
    """A channel that posts to an external service over the notifier's HTTP client."""

    external = True

    def __init__(self, name: str, settings: S, http: httpx.AsyncClient) -> None:
        self.name = name
        self.settings = settings
        self.http = http


class ChatChannel(_HttpChannel[ChatSettings]):
    async def send(self, out: Outgoing) -> None:
        try:
            url = self.settings.url.get_secret_value()
            answer = await self.http.post(url, json={"text": out.chat})
            answer.raise_for_status()
        except httpx.HTTPError as exc:
            raise _http_error(exc, self.settings.url.get_secret_value()) from None


def notice_json(item: Item) -> list[dict[str, Any]]:
    return [e.event.model_dump(mode="json") for e in item.entries]


class WebhookChannel(_HttpChannel[WebhookSettings]):
    async def send(self, out: Outgoing) -> None:
        s = self.settings
        headers = {}
        if s.bearer_token_file is not None:
            token = _read_secret(s.bearer_token_file, "webhook token file")
            headers["Authorization"] = f"Bearer {token}"
        body = {
            "route": out.route,
            "channel": self.name,
            "recipient": out.recipient if out.to_owner else None,
            "severity": out.severity.value,
            "subject": out.rendered.subject,
            "count": len(out.event_ids),
            "dry_run": out.dry_run,
            "notifications": [n for item in out.items for n in notice_json(item)],
        }
        try:
            answer = await self.http.post(s.url.get_secret_value(), json=body, headers=headers)
            answer.raise_for_status()
        except httpx.HTTPError as exc:
            raise _http_error(exc, s.url.get_secret_value()) from None


def _label_value(value: str) -> str:
    return value[:1024]


def alertname(topic: str) -> str:
    """`gpu-health` -> `NodewardGpuHealth`."""
    return ALERTNAME_PREFIX + "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", topic))


def _time(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def alert(item: Item, out: Outgoing, settings: AlertmanagerSettings) -> dict[str, Any]:
    """One Alertmanager alert for one item (Alertmanager groups and routes them further)."""
    entry = item.latest
    note = item.note
    labels = {
        "alertname": alertname(note.topic),
        "severity": note.severity.value,
        "topic": note.topic,
        "route": out.route,
        "source": entry.event.source,
    }
    if note.dedup_key:
        labels["dedup_key"] = note.dedup_key
    if note.incident:
        labels["incident"] = note.incident
    for target in note.targets:
        labels.setdefault(target.kind.lower(), target.name)
        if target.namespace:
            labels.setdefault("namespace", target.namespace)
    if entry.audience.kind == "user":
        labels["namespace"] = labels.get("namespace") or entry.audience.namespace or ""
        labels["audience"] = "user"
    labels |= settings.labels
    annotations = {
        "summary": note.title,
        "description": note.body or note.title,
        "event_id": entry.event.id,
        "count": str(item.count),
    }
    if note.audit_event_id:
        annotations["audit_event_id"] = note.audit_event_id
    if note.why:
        annotations["why"] = note.why
    starts = item.first_time
    now = datetime.now(UTC)
    ends = max(starts, now) + settings.resolve_after
    return {
        "labels": {k: _label_value(v) for k, v in labels.items() if v},
        "annotations": {k: _label_value(v) for k, v in annotations.items()},
        "startsAt": _time(starts),
        "endsAt": _time(ends),
        **({"generatorURL": note.links["url"]} if "url" in note.links else {}),
    }


def matcher(name: str, value: str) -> str:
    """An Alertmanager label matcher, `name="value"`, quoted."""
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}="{quoted}"'


def resolved(active: dict[str, Any], now: datetime) -> dict[str, Any]:
    """An active alert as Alertmanager listed it, ended now (same labels, so the same alert)."""
    return {
        "labels": active["labels"],
        "annotations": active.get("annotations", {}),
        "startsAt": active["startsAt"],
        "endsAt": _time(now),
        **({"generatorURL": active["generatorURL"]} if active.get("generatorURL") else {}),
    }


class AlertmanagerChannel(_HttpChannel[AlertmanagerSettings]):
    """Fires an alert per notice; a notice that ends its incident (`resolves`) fires none
    and ends every active alert of that incident instead (labels as Alertmanager lists them,
    `endsAt` now)."""

    @property
    def api(self) -> str:
        return self.settings.url.rstrip("/") + "/api/v2/alerts"

    async def _active(self, incident: str) -> list[dict[str, Any]]:
        """The incident's active alerts this notifier fired (its `labels` among theirs)."""
        matchers = [matcher("incident", incident)]
        matchers += [matcher(k, v) for k, v in self.settings.labels.items()]
        params = httpx.QueryParams({"active": "true", "filter": matchers})
        answer = await self.http.get(self.api, params=params)
        answer.raise_for_status()
        found = answer.json()
        return [a for a in found if a.get("labels", {}).get("incident") == incident]

    async def send(self, out: Outgoing) -> None:
        ending: set[str] = set()
        alerts = []
        for item in out.items:
            if item.note.resolves and item.note.incident:
                ending.add(item.note.incident)
            else:
                alerts.append(alert(item, out, self.settings))
        try:
            now = datetime.now(UTC)
            for incident in sorted(ending):
                alerts += [resolved(a, now) for a in await self._active(incident)]
            if not alerts:
                return
            answer = await self.http.post(self.api, json=alerts)
            answer.raise_for_status()
        except httpx.HTTPError as exc:
            raise _http_error(exc, self.settings.url) from None


def make_channel(name: str, settings: Any, *, http: httpx.AsyncClient, outbox_dir: Path) -> Channel:
    if isinstance(settings, OutboxSettings):
        return OutboxChannel(name, settings.dir or outbox_dir)
    if isinstance(settings, EmailSettings):
        return EmailChannel(name, settings)
    if isinstance(settings, ChatSettings):
        return ChatChannel(name, settings, http)
    if isinstance(settings, WebhookSettings):
        return WebhookChannel(name, settings, http)
    if isinstance(settings, AlertmanagerSettings):
        return AlertmanagerChannel(name, settings, http)
    raise TypeError(f"unknown channel settings {type(settings).__name__}")


@dataclass(frozen=True)
class Attempted:
    ok: bool
    attempts: int
    error: str | None = None
    permanent: bool = False


async def deliver(
    channel: Channel,
    out: Outgoing,
    retry: RetrySettings,
    *,
    on_failure: Any = None,
    sleep: Any = asyncio.sleep,
) -> Attempted:
    """Send with retries and exponential back-off. `on_failure(attempt, error)` after each
    failed attempt."""
    error = "not attempted"
    for attempt in range(1, retry.attempts + 1):
        try:
            async with asyncio.timeout(retry.timeout.total_seconds()):
                await channel.send(out)
            return Attempted(True, attempt)
        except PermanentChannelError as exc:
            error = str(exc)
            if on_failure is not None:
                on_failure(attempt, error, True)
            return Attempted(False, attempt, error, permanent=True)
        except (ChannelError, TimeoutError) as exc:
            error = str(exc) or f"timed out after {retry.timeout.total_seconds():g}s"
            if on_failure is not None:
                on_failure(attempt, error, False)
        except Exception as exc:  # noqa: BLE001 - an unexpected failure is a failed attempt too
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
            if on_failure is not None:
                on_failure(attempt, error, False)
        if attempt < retry.attempts:
            await sleep(retry.delay(attempt))
    return Attempted(False, retry.attempts, error)
