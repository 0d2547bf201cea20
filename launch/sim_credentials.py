"""The identity provider `nodeward up` runs beside the sim cluster, so the credentials service
has something to renew.

At start, the local OAuth2 provider (`sim.oauth2`: authlib, refresh-token rotation and
reuse detection) signs in the owner of every opted-in OAuth2 Secret the seed marks with
`sim.nodeward.io/oauth2-due-after: 20s`: it registers the client the Secret names (with the
client secret its `nodeward.io/client-secret` Secret holds), issues a grant, and writes the
token set into the Secret, due for renewal that long after the start. The credentials
service then renews it like any user's, and every renewed access token lives
`TOKEN_LIFETIME`. With a real cluster (`--kubeconfig`) nothing is signed in.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from nodeward.config import section
from nodeward.daemon import Daemon
from nodeward.durations import parse_duration
from nodeward.kube import Cluster, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.secrets import decode, encode
from nodeward.platform import Component, UpContext
from services.credentials.secret import CLIENT_SECRET, LABEL
from services.credentials.service import NAME as CREDENTIALS
from services.credentials.service import CredentialsSettings
from sim.oauth2 import Served, serve

NAME = "oauth2-provider"
DUE_AFTER = "sim.nodeward.io/oauth2-due-after"
"""On a seeded OAuth2 Secret: sign its owner in when `up` starts, due for renewal this
long after (a duration: `20s`)."""
TOKEN_LIFETIME = timedelta(minutes=10)
"""How long the provider's access tokens live once renewed."""


class SignInError(ValueError):
    """A marked Secret the provider cannot sign in; `str()` is one line (no values)."""


async def sign_in(
    admin: Cluster, served: Served, secret: Obj, *, lead: timedelta, now: datetime
) -> datetime:
    """Sign the owner of the marked `secret` in and write the token set into it; returns
    when it falls due. The token set's lifetime is left unknown (no `issued_at`), so the
    service renews it `lead` (its `default_lead`) before it expires."""
    meta = secret["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    annotations = meta.get("annotations") or {}
    try:
        due_after = parse_duration(annotations[DUE_AFTER])
    except ValueError:
        raise SignInError(f"{DUE_AFTER}={annotations[DUE_AFTER]!r} is not a duration") from None
    client_id = decode(secret).get("client_id", "").strip()
    if not client_id:
        raise SignInError("it has no client_id entry")
    ref = annotations.get(CLIENT_SECRET, "")
    holder, _, key = ref.partition("/")
    if not holder:
        raise SignInError(f"it has no {CLIENT_SECRET} annotation")
    try:
        client_secret = decode(await admin.secrets.get(namespace, holder.strip())).get(
            key.strip() or "client_secret", ""
        )
    except NotFound:
        raise SignInError(f"its client secret Secret {holder!r} does not exist") from None
    if not client_secret:
        raise SignInError(f"its client secret Secret {holder!r} has no value")
    try:
        served.idp.client(client_id, client_secret)
    except ValueError as exc:
        raise SignInError(str(exc)) from None
    life = lead + due_after
    grant = served.idp.issue(client_id, expires_in=int(life.total_seconds()))
    values = {
        "access_token": grant.access_token,
        "refresh_token": grant.refresh_token,
        "expires_at": (now + life).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "token_endpoint": served.token_endpoint,
    }

    def merged(current: Obj) -> Obj:
        data: dict[str, Any] = {**(current.get("data") or {}), **encode(values)}
        data.pop("issued_at", None)
        current["data"] = data
        return current

    await admin.secrets.replace(namespace, name, merged)
    return now + due_after


async def _build_for_up(context: UpContext) -> list[Daemon]:
    """The provider, once the marked seeded Secrets are signed in at it; none without the
    sim cluster or without a marked Secret."""
    if context.identities is None:
        return []
    log = structlog.get_logger().bind(component=NAME)
    config: CredentialsSettings = section(
        context.settings, "services", CREDENTIALS, CredentialsSettings
    )
    admin = Cluster.connect(context.identities(None))
    served: Served | None = None
    signed = 0
    try:
        opted_in = await admin.secrets.list(label_selector=f"{LABEL}=oauth2")
        marked = [s for s in opted_in if DUE_AFTER in (s["metadata"].get("annotations") or {})]
        if not marked:
            return []
        served = await asyncio.to_thread(serve, int(TOKEN_LIFETIME.total_seconds()))
        now = datetime.now(UTC)
        for secret in marked:
            where = f"{secret['metadata']['namespace']}/{secret['metadata']['name']}"
            try:
                due = await sign_in(admin, served, secret, lead=config.default_lead, now=now)
            except SignInError as exc:
                log.warning("oauth2.not_signed_in", secret=where, error=str(exc))
                continue
            signed += 1
            log.info("oauth2.signed_in", secret=where, due_at=due.isoformat())
    except BaseException:
        if served is not None:
            await asyncio.to_thread(served.stop)
        raise
    finally:
        await admin.close()
    daemon = Daemon(NAME, context.settings.daemon)
    running = served

    async def stop() -> None:
        await asyncio.to_thread(running.stop)

    daemon.add_readiness_check("server", running.thread.is_alive)
    daemon.add_shutdown_hook(stop)
    context.endpoints["oauth2_token_url"] = running.token_endpoint
    log.info("oauth2.ready", token_endpoint=running.token_endpoint, signed_in=signed)
    return [daemon]


component = Component(NAME, _build_for_up)
"""Registered in `nodeward.components` (pyproject.toml) like the services: `up` builds it
with them, before any daemon starts, so the Secrets are signed in before the first scan."""
