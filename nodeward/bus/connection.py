"""Connecting to NATS: reconnect forever, log every state change, count it in metrics."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from nodeward.bus.errors import BusError
from nodeward.bus.token import TokenFile
from nodeward.config import BusSettings
from nodeward.metrics import Metrics


def _redact_url(url: str) -> str:
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def _check_readable(path: Path, what: str) -> None:
    """Fail at once, in one line, on a credentials file that is not there: retrying won't help."""
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise BusError(f"cannot read the {what} {path}: {exc.strerror}") from None


def _tls_context(settings: BusSettings) -> ssl.SSLContext:
    """TLS to NATS: the CA (the system's without one) and, for a server that verifies
    clients, this daemon's certificate."""
    ca = settings.tls_ca_file
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if settings.tls_cert_file:
        _check_readable(settings.tls_cert_file, "TLS certificate")
        key = settings.tls_key_file
        if key:
            _check_readable(key, "TLS key")
        try:
            context.load_cert_chain(str(settings.tls_cert_file), str(key) if key else None)
        except (OSError, ssl.SSLError) as exc:
            raise BusError(
                f"cannot load the TLS certificate {settings.tls_cert_file}: {exc}"
            ) from None
    return context


async def connect_nats(
    settings: BusSettings,
    *,
    name: str,
    metrics: Metrics | None = None,
    wait: bool = True,
) -> tuple[NATS, JetStreamContext]:
    """A connected client and its JetStream context.

    With `wait` the first connection is retried forever (a daemon started before NATS
    waits for it); without, one failed attempt raises `BusError` (CLI commands).
    Once connected, the client reconnects forever.
    """
    log = structlog.get_logger().bind(component="bus", client=name)
    servers = [s.strip() for s in settings.url.split(",") if s.strip()]
    shown = ", ".join(_redact_url(s) for s in servers)

    async def on_error(exc: Exception) -> None:
        # Without `wait` a failure to connect is raised to the caller, which says it once.
        report = log.warning if (wait or nc.is_connected) else log.debug
        report("nats.error", error=str(exc) or type(exc).__name__, servers=shown)

    async def on_disconnected() -> None:
        if metrics:
            metrics.bus_connected.set(0)
        if nc.is_draining or nc.is_closed:  # our own shutdown, not an outage
            log.debug("nats.disconnected", servers=shown, reason="closing")
        else:
            log.warning("nats.disconnected", servers=shown)

    async def on_reconnected() -> None:
        if metrics:
            metrics.bus_connected.set(1)
            metrics.bus_reconnects.inc()
        log.info(
            "nats.reconnected",
            server=_redact_url(str(nc.connected_url.geturl() if nc.connected_url else "")),
        )

    renewals: set[asyncio.Future[None]] = set()

    async def on_closed() -> None:
        for renewing in list(renewals):
            renewing.cancel()
        if metrics:
            metrics.bus_connected.set(0)
        log.info("nats.closed")

    options: dict[str, Any] = {
        "servers": servers,
        "name": settings.name or name,
        "connect_timeout": settings.connect_timeout.total_seconds(),
        "reconnect_time_wait": min(2.0, settings.reconnect_wait_max.total_seconds())
        if wait
        else 0.1,
        "max_reconnect_attempts": -1 if wait else 1,
        "allow_reconnect": wait,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed,
        "pending_size": 64 * 1024 * 1024,
        "drain_timeout": 10,
    }
    if settings.user:
        options["user"] = settings.user
    if settings.password:
        options["password"] = settings.password.get_secret_value()
    if settings.token:
        options["token"] = settings.token.get_secret_value()
    token_file: TokenFile | None = None
    if settings.token_file:
        _check_readable(settings.token_file, "token file")
        token_file = TokenFile(settings.token_file, settings.token_refresh_before.total_seconds())
        options["token"] = token_file.read
    if settings.creds_file:
        options["user_credentials"] = str(settings.creds_file)
    if settings.nkey_seed_file:
        _check_readable(settings.nkey_seed_file, "nkey seed file")
        options["nkeys_seed"] = str(settings.nkey_seed_file)
    if settings.inbox_prefix:
        options["inbox_prefix"] = settings.inbox_prefix
    if settings.tls_ca_file or settings.tls_cert_file:
        options["tls"] = _tls_context(settings)

    nc = NATS()
    try:
        await nc.connect(**options)
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        await nc.close()
        raise BusError(f"cannot connect to NATS at {shown}: {exc or type(exc).__name__}") from None
    if metrics:
        metrics.bus_connected.set(1)
    if token_file is not None:
        renewing = asyncio.ensure_future(token_file.keep_fresh(nc, log))
        renewals.add(renewing)
        renewing.add_done_callback(renewals.discard)
    log.info(
        "nats.connected",
        server=_redact_url(nc.connected_url.geturl() if nc.connected_url else shown),
    )
    return nc, nc.jetstream(timeout=settings.publish_timeout.total_seconds())
