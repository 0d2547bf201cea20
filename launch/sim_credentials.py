"""The identity providers `nodeward up` runs beside the sim cluster, so the credentials service
has something to renew: a local OAuth2 provider, and a Kerberos KDC where one is installed.

At start, the local OAuth2 provider (`sim.oauth2`: authlib, refresh-token rotation and
reuse detection) signs in the owner of every opted-in OAuth2 Secret the seed marks with
`sim.nodeward.io/oauth2-due-after: 20s`: it registers the client the Secret names (with the
client secret its `nodeward.io/client-secret` Secret holds), issues a grant, and writes the
token set into the Secret, due for renewal that long after the start. The credentials
service then renews it like any user's, and every renewed access token lives
`TOKEN_LIFETIME`.

Where the KDC packages are installed (`sim.kerberos.missing()` is empty, and the `kerberos`
extra the service needs is built), a local realm (`sim.kerberos`) starts in the background
and each seeded Secret marked `sim.nodeward.io/kerberos-principal: alice` gets a renewable
ticket cache for a new principal (`kinit -l 3m -r 7d`; `sim.nodeward.io/kerberos-ticket-life`
changes the 3m), written with the `nodeward.io/credential=kerberos` label, which opts it in
only then. The realm's krb5.conf becomes the process's `KRB5_CONFIG`, which the service's
renewals read. Elsewhere one warning line says Kerberos is skipped and why.

With a real cluster (`--kubeconfig`) nothing is signed in and neither runs.
"""

from __future__ import annotations

import asyncio
import base64
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from nodeward.config import section
from nodeward.daemon import Daemon
from nodeward.durations import parse_duration
from nodeward.kube import Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.secrets import decode, encode
from nodeward.platform import Component, UpContext
from services.credentials.secret import CCACHE, CLIENT_SECRET, LABEL
from services.credentials.service import NAME as CREDENTIALS
from services.credentials.service import CredentialsSettings
from sim import kerberos as sim_kerberos
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
                log.warning("oauth2.not_signed_in", credential=where, error=str(exc))
                continue
            signed += 1
            log.info("oauth2.signed_in", credential=where, due_at=due.isoformat())
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
    log.info("oauth2.ready", endpoint=running.token_endpoint, signed_in=signed)
    return [daemon]


component = Component(NAME, _build_for_up)
"""Registered in `nodeward.components` (pyproject.toml), beside the services: `up` builds it
with them, before any daemon starts, so the Secrets are signed in before the first scan."""


KDC = "kdc"
KERBEROS_USER = "sim.nodeward.io/kerberos-principal"
"""On a seeded Secret: the user whose renewable ticket `up` writes into it (a new principal
`<user>@NODEWARD.SIM`), opting it in for Kerberos renewal."""
TICKET_LIFE = "sim.nodeward.io/kerberos-ticket-life"
"""How long the seeded ticket (and each renewal of it) lives; 3m if not given."""
DEFAULT_TICKET_LIFE = timedelta(minutes=3)
RENEWABLE = timedelta(days=7)


def kerberos_missing() -> list[str]:
    """What this machine lacks to run Kerberos in `up`: the KDC, k5test, the service's extra."""
    lacking = sim_kerberos.missing()
    for module in ("krb5", "gssapi"):
        try:
            __import__(module)
        except ImportError:
            lacking.append(f"{module} (pip install 'nodeward[kerberos]', needs libkrb5-dev)")
    return lacking


async def give_ticket(admin: Cluster, realm: sim_kerberos.Realm, secret: Obj) -> str:
    """Write a renewable ticket cache for the marked `secret`'s user into it and label it for
    Kerberos renewal; returns the principal."""
    meta = secret["metadata"]
    annotations = meta.get("annotations") or {}
    user = annotations[KERBEROS_USER].strip()
    try:
        raw = annotations.get(TICKET_LIFE)
        life = parse_duration(raw) if raw else DEFAULT_TICKET_LIFE
    except ValueError:
        raise SignInError(f"{TICKET_LIFE}={annotations[TICKET_LIFE]!r} is not a duration") from None
    principal, cache = await asyncio.to_thread(realm.ticket, user, life=life, renewable=RENEWABLE)

    def merged(current: Obj) -> Obj:
        current["data"] = {**(current.get("data") or {}), **encode_cache(cache)}
        current["metadata"].setdefault("labels", {})[LABEL] = "kerberos"
        return current

    await admin.secrets.replace(meta["namespace"], meta["name"], merged)
    return principal


def encode_cache(cache: bytes) -> dict[str, str]:
    return {CCACHE: base64.b64encode(cache).decode()}


async def _build_kdc_for_up(context: UpContext) -> list[Daemon]:
    """The KDC's daemon, which starts the realm and writes the marked Secrets' tickets in the
    background; none without the sim cluster, a marked Secret, or the KDC packages."""
    if context.identities is None:
        return []
    identity = context.identities(None)
    log = structlog.get_logger().bind(component=KDC)
    admin = Cluster.connect(identity)
    try:
        listed = await admin.secrets.list()
    finally:
        await admin.close()
    marked = [s for s in listed if KERBEROS_USER in (s["metadata"].get("annotations") or {})]
    if not marked:
        return []
    lacking = await asyncio.to_thread(kerberos_missing)
    if lacking:
        log.warning(
            "kerberos.skipped",
            reason=f"no local KDC for the seeded Kerberos Secrets: missing {'; '.join(lacking)}",
        )
        return []
    if os.environ.get("KRB5_CONFIG"):
        log.warning("kerberos.skipped", reason="KRB5_CONFIG is set: renewals use those KDCs")
        return []
    daemon = Daemon(KDC, context.settings.daemon)
    realms: list[sim_kerberos.Realm] = []

    async def run() -> None:
        try:
            realm = await asyncio.to_thread(sim_kerberos.Realm.start, RENEWABLE)
        except (sim_kerberos.KdcError, OSError) as exc:
            log.warning("kerberos.skipped", reason=str(exc))
            return
        realms.append(realm)
        os.environ["KRB5_CONFIG"] = realm.krb5_config  # what the service's renewals read
        admin = Cluster.connect(identity)
        try:
            for secret in marked:
                where = f"{secret['metadata']['namespace']}/{secret['metadata']['name']}"
                try:
                    principal = await give_ticket(admin, realm, secret)
                except (SignInError, sim_kerberos.KdcError, KubeError) as exc:
                    log.warning("kerberos.no_ticket", credential=where, error=str(exc))
                    continue
                log.info("kerberos.ticket", credential=where, principal=principal)
        finally:
            await admin.close()

    async def stop() -> None:
        for realm in realms:
            await asyncio.to_thread(realm.stop)

    daemon.add_task(run, name="realm")
    daemon.add_shutdown_hook(stop)
    return [daemon]


kdc_component = Component(KDC, _build_kdc_for_up)
"""Registered in `nodeward.components` beside `component`."""
