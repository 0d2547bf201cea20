"""The Falco HTTP ingest: Falco's `http_output` and Falcosidekick's webhook, onto the bus.

`POST /` (or `/falco`) takes one alert as a JSON object (or several: a JSON array, or JSON
lines) and publishes each on `falco.<priority>.<rule>`, the subject Falcosidekick's NATS
output uses, so the SECURITY stream and the response consumer see one kind of message
whichever way an alert came. The event id is derived from the alert (`FalcoAlert.stable_id`): the same alert
arriving twice, or both over HTTP and from Falcosidekick, is stored once.

Answers: 200 with the ids published (Falcosidekick's `Test rule` is recognised, counted and
dropped); 400 for a body that is not a Falco alert (one line saying why); 401 without
credentials, 403 with wrong ones; 413 over `max_body_bytes` (gzip bodies, which Falco's
`compress_uploads` sends, are counted inflated); 429 with `Retry-After` for alerts below
the urgent lane's priority while the backlog is over `max_backlog` (below); 503 when NATS
does not acknowledge. Credentials are checked before the body is read:

- a bearer token (`Authorization: Bearer <token>`, which Falcosidekick's
  `webhook.customheaders` sends), or the same token as the password of HTTP Basic
  authentication, which is what Falco's `http_output` sends for a URL such as
  `https://falco:<token>@nodeward-falco:2803/` (it has no header option);
- and/or mTLS: with `client_ca_file` the TLS handshake requires a client certificate that
  CA signed (Falco's `http_output.mtls`, Sidekick's `webhook.mutualtls`).

An ingest with neither a token nor mTLS does not start.

Back-pressure: what the ingest has stored and the response has not yet acted on is bounded.
The backlog is the low-priority lane's (`falco`) pending and unacknowledged alerts, as the
server counts them (read at most every `backlog_check`, plus what this ingest stored since).
Once it is over `max_backlog`, alerts below `urgent_from` are answered 429 until it is back
under `resume_below` of the bound (high and low water: no answer flaps per request);
urgent ones are always stored. A body that mixes both stores the urgent ones and answers
429 for the rest: sent again, the urgent ones are stored once (their `Nats-Msg-Id`). One
log line starts an episode and one ends it, with what was refused; the metric
`nodeward_falco_ingest_backpressure` is 1 meanwhile (while it lasts the ingest asks the
server every `backlog_check`, so the episode ends when the backlog drains). Falcosidekick (`outputs/client.go`) logs and
counts a 429 and does not send that alert again; Falco's `http_output`
(`outputs_http.cpp`) retries only a timeout and neither logs nor resends an HTTP error. Under
a flood the lowest priorities are shed at the edge, counted here, rather than queued ahead
of what matters.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field, ValidationError

from nodeward.bus.lanes import UrgentFirst
from nodeward.config import Section
from nodeward.daemon import listen
from nodeward.durations import Duration
from nodeward.metrics import at_zero
from schemas.base import Event, make_event
from schemas.cloudevents import one_line
from schemas.falco import FalcoAlert

Publish = Callable[[list[Event[FalcoAlert]]], Awaitable[None]]
Count = Callable[[], Awaitable[int]]


class IngestError(ValueError):
    """The ingest cannot start as configured (one line)."""


class IngestSettings(Section):
    """`services.falco.ingest` in the config file."""

    enabled: bool = True
    host: str = "0.0.0.0"  # Falco runs on every node; the NetworkPolicy narrows who reaches it
    port: int = Field(default=2803, ge=0, le=65535, description="0 picks a free port")
    token_file: Path | None = None
    """the bearer token (one line); `nodeward up` generates one"""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    client_ca_file: Path | None = None
    """mTLS: clients must present a certificate this CA signed"""
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    max_alerts: int = Field(default=100, ge=1, description="alerts in one JSON array body")
    max_backlog: int = Field(
        default=2000,
        ge=1,
        description="low-priority alerts stored and not yet acted on over which the ingest "
        "answers 429 to alerts below urgent_from",
    )
    resume_below: float = Field(
        default=0.8, gt=0, le=1, description="... until the backlog is under this share of it"
    )
    retry_after: Duration = timedelta(seconds=10)
    """the 429's Retry-After"""
    backlog_check: Duration = timedelta(milliseconds=500)
    """how often the server is asked"""


def read_token(path: Path) -> str:
    """The token in `path` (surrounding whitespace removed); IngestError when unusable."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise IngestError(
            f"cannot read the Falco ingest token file {path}: {exc.strerror}"
        ) from None
    if len(token) < 16:
        raise IngestError(f"the Falco ingest token in {path} is shorter than 16 characters")
    return token


class BadAlert(ValueError):
    """A body that is not one Falco alert, or a list of them (the 400's one line)."""


def parse_body(body: bytes, max_alerts: int) -> list[FalcoAlert]:
    """The alerts in a request body: one JSON object, an array of them, or JSON lines."""
    if not body.strip():
        raise BadAlert("empty body: expected a Falco alert as JSON")
    stripped = body.lstrip()
    lines = [line for line in body.splitlines() if line.strip()]
    if stripped[:1] == b"{" and len(lines) > 1 and lines[0].rstrip().endswith(b"}"):
        if len(lines) > max_alerts:
            raise BadAlert(f"{len(lines)} alerts in one body; at most {max_alerts}")
        try:  # JSON lines (a file of alerts as Falco's file_output writes them)
            return [FalcoAlert.parse(line) for line in lines]
        except (ValidationError, ValueError):
            pass  # one pretty-printed object, or garbage: judged whole below
    try:
        if stripped[:1] == b"[":
            items = json.loads(body)
            if not isinstance(items, list):  # pragma: no cover - '[' starts a list
                raise BadAlert("expected a JSON object or array")
            if len(items) > max_alerts:
                raise BadAlert(f"{len(items)} alerts in one body; at most {max_alerts}")
            return [FalcoAlert.parse(json.dumps(i, ensure_ascii=False)) for i in items]
        return [FalcoAlert.parse(body)]
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors(include_url=False)):
            raise BadAlert(f"body is not JSON: {one_line(exc)}") from None
        raise BadAlert(f"not a Falco alert: {one_line(exc)}") from None
    except ValueError as exc:
        if isinstance(exc, BadAlert):
            raise
        raise BadAlert(f"body is not JSON: {' '.join(str(exc).split())}") from None


def alert_event(alert: FalcoAlert) -> Event[FalcoAlert]:
    """The event the ingest publishes: what the native decoder makes of the same alert."""
    return make_event(
        alert,
        source=f"falco/{alert.hostname or 'unknown'}",
        id=alert.stable_id(),
        time=alert.time,
    )


class Backlog:
    """Whether low-priority alerts are over the bound: the server's count of the lane's
    backlog, asked at most every `backlog_check` (one question at a time), plus what was
    stored since; high and low water."""

    def __init__(self, settings: IngestSettings, count: Count, log: Any) -> None:
        self.settings = settings
        self.count = count
        self.log = log
        self.known = 0  # the server's last answer, plus what was stored since
        self.asked_at = -float("inf")
        self.over = False
        self.refused = 0  # in this episode
        self._asking: asyncio.Future[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    async def full(self) -> bool:
        """True while alerts below the urgent lane's priority are refused."""
        if time.monotonic() - self.asked_at >= self.settings.backlog_check.total_seconds():
            await self._ask()
        bound = self.settings.max_backlog
        if not self.over and self.known > bound:
            self.over = True
            self.refused = 0
            self.log.warning("falco.ingest_backpressure", backlog=self.known, bound=bound)
            # The episode ends when the backlog drains, whether or not anyone posts then.
            self._watch = asyncio.get_running_loop().create_task(self._until_drained())
        elif self.over and self.known < bound * self.settings.resume_below:
            self.over = False
            self.log.info(
                "falco.ingest_backpressure_over", backlog=self.known, refused=self.refused
            )
        return self.over

    def stored(self, n: int) -> None:
        self.known += n

    async def _until_drained(self) -> None:
        while self.over:
            await asyncio.sleep(self.settings.backlog_check.total_seconds())
            await self.full()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def _ask(self) -> None:
        if self._asking is not None:  # someone else is asking: their answer is ours
            await asyncio.shield(self._asking)
            return
        self._asking = asyncio.get_running_loop().create_future()
        try:
            self.known = await self.count()
            self.asked_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - unknown: the last count stands
            self.log.debug("falco.ingest_backlog_unknown", error=" ".join(str(exc).split()))
            self.asked_at = time.monotonic()
        finally:
            self._asking.set_result(None)
            self._asking = None


class Ingest:
    """The ingest's HTTP server. `start()` binds it; `url` says where.

    `backlog` counts the low-priority lane's alerts not yet acted on; `urgent` tells the
    alerts that are always stored. Without `backlog` nothing is refused."""

    def __init__(
        self,
        settings: IngestSettings,
        publish: Publish,
        *,
        registry: CollectorRegistry | None = None,
        backlog: Count | None = None,
        urgent: Callable[[FalcoAlert], bool] = lambda _: True,
        gate: UrgentFirst | None = None,
    ) -> None:
        self.settings = settings
        self.publish = publish
        self.urgent = urgent
        self.gate = gate or UrgentFirst()
        self.log = structlog.get_logger().bind(component="falco-ingest")
        self.backlog = Backlog(settings, backlog, self.log) if backlog is not None else None
        self.token, self.ssl = self.check(settings)
        self.requests = Counter(
            "nodeward_falco_ingest_requests",
            "HTTP requests to the Falco ingest, by status code",
            ["code"],
            registry=registry,
        )
        # What `_post` answers: accepted, malformed, too big, the bus did not acknowledge;
        # no or wrong credentials when a token is asked; refused for the backlog.
        codes = [200, 400, 413, 503]
        codes += [401, 403] if self.token is not None else []
        codes += [429] if self.backlog is not None else []
        at_zero(self.requests, code=[str(c) for c in sorted(codes)])
        self.alerts = Counter(
            "nodeward_falco_ingest_alerts",
            "Alerts received over HTTP, by outcome (published, test_dropped, refused_backlog)",
            ["outcome"],
            registry=registry,
        )
        self.pressure = Gauge(
            "nodeward_falco_ingest_backpressure",
            "1 while alerts below the urgent priority are answered 429 (backlog over the bound)",
            registry=registry,
        )
        backlogged = self.backlog
        if backlogged is not None:
            self.pressure.set_function(lambda: float(backlogged.over))
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @classmethod
    def check(cls, settings: IngestSettings) -> tuple[str | None, ssl.SSLContext | None]:
        """The token and TLS context `settings` name; IngestError (one line) if unusable."""
        token = read_token(settings.token_file) if settings.token_file else None
        context = cls._ssl_context(settings)
        if token is None and settings.client_ca_file is None:
            raise IngestError(
                "the Falco ingest needs services.falco.ingest.token_file or client_ca_file "
                "(mTLS): it never accepts alerts from anyone"
            )
        return token, context

    @staticmethod
    def _ssl_context(s: IngestSettings) -> ssl.SSLContext | None:
        if s.tls_cert_file is None and s.client_ca_file is None:
            return None
        if s.tls_cert_file is None or s.tls_key_file is None:
            raise IngestError(
                "the Falco ingest's mTLS (client_ca_file) needs tls_cert_file and tls_key_file"
            )
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(s.tls_cert_file, s.tls_key_file)
            if s.client_ca_file is not None:
                ctx.load_verify_locations(cafile=s.client_ca_file)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise IngestError(f"the Falco ingest's TLS files cannot be used: {exc}") from None
        return ctx

    @property
    def url(self) -> str:
        if self._port is None:
            raise IngestError("the Falco ingest is not started")
        host = self.settings.host
        if host in ("", "0.0.0.0"):  # a wildcard bind is reached on loopback
            host = "127.0.0.1"
        scheme = "https" if self.ssl else "http"
        return f"{scheme}://{host}:{self._port}/"

    async def start(self) -> None:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_post("/", self._post)
        app.router.add_post("/falco", self._post)
        self._runner, self._port = await listen(
            app,
            self.settings.host,
            self.settings.port,
            lambda why: IngestError(f"the Falco ingest {why}"),
            ssl_context=self.ssl,
        )
        self.log.info(
            "falco.ingest_listening", url=self.url, mtls=self.settings.client_ca_file is not None
        )

    async def stop(self) -> None:
        if self.backlog is not None:
            await self.backlog.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # request handling -------------------------------------------------------------------
    def _answer(
        self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> web.Response:
        self.requests.labels(str(status)).inc()
        if status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="nodeward-falco"'}
        return web.json_response(body, status=status, headers=headers)

    def _authorised(self, request: web.Request) -> int | None:
        """None when the caller may post, else 401 (no credentials) or 403 (wrong ones)."""
        if self.token is None:
            return None  # mTLS alone: the handshake already required a trusted certificate
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        offered: str | None = None
        if scheme.lower() == "bearer":
            offered = value.strip()
        elif scheme.lower() == "basic":
            try:
                offered = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                return 403
        if not offered:
            return 401
        return None if hmac.compare_digest(offered.encode(), self.token.encode()) else 403

    async def _post(self, request: web.Request) -> web.Response:
        refused = self._authorised(request)
        if refused is not None:
            self.log.warning("falco.ingest_refused", status=refused, peer=request.remote)
            why = "credentials required" if refused == 401 else "credentials not accepted"
            return self._answer(refused, {"error": why})
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._answer(413, {"error": f"body over {limit} bytes"})
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._answer(413, {"error": f"body over {limit} bytes"})
        try:
            alerts = parse_body(body, self.settings.max_alerts)
        except BadAlert as exc:
            self.log.info("falco.ingest_bad_alert", error=str(exc)[:300])
            return self._answer(400, {"error": str(exc)[:500]})
        real = [a for a in alerts if not a.is_test]
        dropped = len(alerts) - len(real)
        if dropped:
            self.alerts.labels("test_dropped").inc(dropped)
        refused = 0
        low = any(not self.urgent(a) for a in real)
        if low and self.backlog is not None and await self.backlog.full():
            kept = [a for a in real if self.urgent(a)]
            refused = len(real) - len(kept)
            real = kept
        events = [alert_event(a) for a in real]
        if events:
            try:
                await self._publish(events, urgent=any(self.urgent(a) for a in real))
            except Exception as exc:  # noqa: BLE001 - NATS away: Falco is told to send again
                self.log.warning("falco.ingest_publish_failed", error=" ".join(str(exc).split()))
                return self._answer(503, {"error": "the bus did not acknowledge; try again"})
            self.alerts.labels("published").inc(len(events))
            if self.backlog is not None:
                self.backlog.stored(sum(1 for a in real if not self.urgent(a)))
        answer: dict[str, Any] = {
            "published": [e.id for e in events],
            "subjects": [e.nats_subject for e in events],
            "dropped_test_events": dropped,
        }
        if refused:
            return self._refuse(refused, answer)
        return self._answer(200, answer)

    async def _publish(self, events: list[Event[FalcoAlert]], *, urgent: bool) -> None:
        """Urgent alerts first: a body of low ones waits while urgent work is in hand, a
        second at most (an HTTP client is not held for the length of a checkpoint)."""
        if urgent:
            async with self.gate.urgent():
                await self.publish(events)
        else:
            await self.gate.clear(at_most=1.0)
            await self.publish(events)

    def _refuse(self, refused: int, body: dict[str, Any]) -> web.Response:
        assert self.backlog is not None
        self.backlog.refused += refused
        self.alerts.labels("refused_backlog").inc(refused)
        retry = max(1, round(self.settings.retry_after.total_seconds()))
        body["refused"] = refused
        body["error"] = (
            f"{self.backlog.known} lower-priority alerts wait to be acted on (bound "
            f"{self.settings.max_backlog}); {refused} not stored, retry after {retry}s"
        )
        return self._answer(429, body, headers={"Retry-After": str(retry)})
