"""The NATS auth callout: a connection's Kubernetes ServiceAccount token becomes its NATS
user, with exactly its component's grants.

nats-server (2.10+, `authorization { auth_callout { ... } }`) sends every connection it
cannot place itself to `$SYS.REQ.USER.AUTH` as an authorization request (a JWT it signs,
carrying the client's `auth_token` and a fresh user nkey). The callout asks the API server
what the token is (TokenReview, audience `auth_callout.audience`), maps its ServiceAccount
to grants (`nodeward.callout.identities`), binds a node agent's token to the node its pod
runs on (the pod read back: same uid, not terminated), and answers with a user JWT for that
nkey, signed by the issuer account key, placed in `auth_callout.account`, ending when the
token ends (the daemon reconnects with its rotated token before then: `nodeward.bus.token`).
A refusal is an answer too: one line in `nats.error`, which the server logs; the token is
never logged or echoed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import nkeys
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from prometheus_client import Counter, Histogram

from nodeward.bus.connection import connect_nats
from nodeward.bus.token import expiry
from nodeward.callout import jwt, xkey
from nodeward.callout.access import ACCESS
from nodeward.callout.identities import (
    Grant,
    PermissionsDocument,
    Refused,
    Reviewed,
    Rules,
    bound_pod,
    node_of,
)
from nodeward.config import AuthCalloutSettings, Settings
from nodeward.daemon import Daemon, DaemonError
from nodeward.kube import Cluster
from nodeward.kube.errors import KubeError, NotFound
from nodeward.metrics import at_zero

SUBJECT = "$SYS.REQ.USER.AUTH"
REQUEST_AUDIENCE = "nats-authorization-request"
NAME = "auth-callout"
AGENT, COMPONENT = "agent", "component"
"""The kinds of component the callout allows: a node's agents, a fixed account."""
UNKNOWN = "unknown"
"""The kind counted for a request refused or failed."""


def load_signer(path: Path | None) -> nkeys.KeyPair:
    """The issuer's key pair from its seed file (an account seed, SA...)."""
    if path is None:
        raise DaemonError("auth_callout.issuer_seed_file is not set")
    try:
        seed = path.read_bytes().strip()
    except OSError as exc:
        raise DaemonError(
            f"cannot read auth_callout.issuer_seed_file {path}: {exc.strerror}"
        ) from None
    try:
        signer = nkeys.from_seed(bytearray(seed))
    except (nkeys.NkeysError, ValueError, IndexError):
        raise DaemonError(f"{path} holds no nkey seed") from None
    if not signer.public_key.startswith(b"A"):
        raise DaemonError(f"{path}: the issuer must be an account key (SA...), not {seed[:2]!r}...")
    return signer


def load_xkey(path: Path | None) -> bytes | None:
    """The callout's curve private key, if requests are sealed (`auth_callout.xkey_seed_file`)."""
    if path is None:
        return None
    try:
        return xkey.decode_seed(path.read_text())
    except OSError as exc:
        raise DaemonError(
            f"cannot read auth_callout.xkey_seed_file {path}: {exc.strerror}"
        ) from None
    except xkey.XkeyError as exc:
        raise DaemonError(f"{path}: {exc}") from None


def load_rules(config: AuthCalloutSettings) -> Rules:
    path = config.permissions_file
    if path is None:
        raise DaemonError("auth_callout.permissions_file is not set")
    try:
        document = PermissionsDocument.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise DaemonError(
            f"cannot read auth_callout.permissions_file {path}: {exc.strerror}"
        ) from None
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise DaemonError(f"{path} is not a nodeward permissions document: {first}") from None
    return Rules(document, config.namespace, config.release)


class Callout:
    """Answers authorization requests (pure but for the two API calls)."""

    def __init__(
        self, config: AuthCalloutSettings, signer: nkeys.KeyPair, rules: Rules, cluster: Cluster
    ) -> None:
        self.config = config
        self.signer = signer
        self.rules = rules
        self.cluster = cluster

    async def grant(self, token: str) -> tuple[Grant, str, float | None]:
        """The grant of a token, the kind of component it is, and when the token expires."""
        if not token:
            raise Refused("no token: connect with a ServiceAccount token (bus.token_file)")
        try:
            status = await self.cluster.token_reviews.review(token, [self.config.audience])
        except KubeError as exc:
            raise Refused(f"TokenReview failed: {exc}") from None
        if not status.get("authenticated"):
            raise Refused(f"token not authenticated: {status.get('error') or 'no reason given'}")
        user = status.get("user") or {}
        reviewed = Reviewed(
            str(user.get("username") or ""),
            {str(k): [str(v) for v in vs] for k, vs in (user.get("extra") or {}).items()},
        )
        account = self.rules.account(reviewed)
        if self.rules.is_agent(account):
            name, uid = bound_pod(reviewed)
            try:
                pod = await self.cluster.pods.get_own(self.rules.namespace, name)
            except NotFound:
                raise Refused(f"pod {name} no longer exists") from None
            except KubeError as exc:
                raise Refused(f"cannot read pod {name}: {exc}") from None
            grant, kind = self.rules.agent(node_of(pod, uid, reviewed)), AGENT
        else:
            grant, kind = self.rules.fixed(account), COMPONENT
        return grant, kind, expiry(token)  # None: a token that does not end (user_ttl)

    def user_jwt(self, grant: Grant, user_nkey: str, token_expires: float | None) -> str:
        now = time.time()
        expires = token_expires or now + self.config.user_ttl.total_seconds()
        claims: dict[str, Any] = {
            "sub": user_nkey,
            "name": grant.user,
            "exp": int(expires),
            "nats": grant.user_claims(),
        }
        account = self.config.account
        if account.startswith("A") and len(account) == 56:  # operator mode
            if self.signer.public_key.decode() != account:
                claims["nats"]["issuer_account"] = account
        else:
            claims["aud"] = account  # server config mode: the account, by name
        return jwt.encode(claims, self.signer, now=now)

    def response(self, user_nkey: str, server_id: str, *, user: str = "", error: str = "") -> bytes:
        nats: dict[str, Any] = {"type": "authorization_response"}
        if user:
            nats["jwt"] = user
        if error:
            nats["error"] = error
        claims = {"sub": user_nkey, "aud": server_id, "nats": nats}
        return jwt.encode(claims, self.signer).encode()


def request_of(data: bytes) -> dict[str, Any]:
    """The `nats` part of a server's authorization request, checked."""
    claims = jwt.decode(data.decode(errors="replace"))
    if claims.get("aud") != REQUEST_AUDIENCE:
        raise jwt.JwtError(f"not an authorization request (aud {claims.get('aud')!r})")
    request = claims.get("nats") or {}
    if request.get("type") != "authorization_request" or not request.get("user_nkey"):
        raise jwt.JwtError("not an authorization request")
    return dict(request)


async def build(settings: Settings) -> Daemon:
    """The auth callout daemon (`nodeward auth-callout`): one subscription in the auth
    account, each request answered in its own task."""
    config = settings.auth_callout
    signer = load_signer(config.issuer_seed_file)
    rules = load_rules(config)
    curve = load_xkey(config.xkey_seed_file)
    daemon = Daemon(NAME, settings.daemon)
    log = daemon.log
    answered = Counter(
        "nodeward_auth_callout_answers_total",
        "Authorization requests answered, by outcome and kind of component",
        ["outcome", "kind"],
        registry=daemon.metrics.registry,
    )
    # What `answer` counts: a component allowed as what it is, any refusal or failure as
    # of an unknown kind.
    at_zero(answered, outcome=("allowed",), kind=(AGENT, COMPONENT))
    at_zero(answered, outcome=("refused", "failed"), kind=(UNKNOWN,))
    seconds = Histogram(
        "nodeward_auth_callout_seconds",
        "From an authorization request to its answer",
        registry=daemon.metrics.registry,
    )
    cluster = Cluster.connect(settings.cluster, ACCESS)
    callout = Callout(config, signer, rules, cluster)
    nc: NATS | None = None
    subscribed = asyncio.Event()
    pending: set[asyncio.Task[None]] = set()

    async def answer(msg: Msg) -> None:
        began = time.monotonic()
        server_xkey = (msg.headers or {}).get(xkey.HEADER) if curve else None
        try:
            data = (
                xkey.open_sealed(msg.data, curve, server_xkey)
                if curve and server_xkey
                else msg.data
            )
            request = request_of(data)
        except (jwt.JwtError, xkey.XkeyError) as exc:
            log.warning("callout.bad_request", error=str(exc))
            answered.labels("refused", UNKNOWN).inc()
            return  # not the server's: nothing to answer
        user_nkey = str(request["user_nkey"])
        server_id = str((request.get("server_id") or {}).get("id") or "")
        client = request.get("client_info") or {}
        opts = request.get("connect_opts") or {}
        bound = log.bind(client_host=client.get("host"), client_name=opts.get("name"))
        try:
            grant, kind, expires = await callout.grant(str(opts.get("auth_token") or ""))
        except Refused as exc:
            bound.warning("callout.refused", reason=str(exc))
            answered.labels("refused", UNKNOWN).inc()
            reply = callout.response(user_nkey, server_id, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must refuse, not leave the server waiting
            bound.exception("callout.failed", error=type(exc).__name__)
            answered.labels("failed", UNKNOWN).inc()
            reply = callout.response(user_nkey, server_id, error="internal error in the callout")
        else:
            bound.info("callout.allowed", user=grant.user)
            answered.labels("allowed", kind).inc()
            user = callout.user_jwt(grant, user_nkey, expires)
            reply = callout.response(user_nkey, server_id, user=user)
        if curve and server_xkey:
            reply = xkey.seal(reply, curve, server_xkey)
        if msg.reply and nc is not None:
            await nc.publish(msg.reply, reply)
        seconds.observe(time.monotonic() - began)

    async def on_request(msg: Msg) -> None:
        task = asyncio.ensure_future(answer(msg))
        pending.add(task)
        task.add_done_callback(pending.discard)

    async def serve() -> None:
        nonlocal nc
        nc, _ = await connect_nats(settings.bus, name=NAME, metrics=daemon.metrics)
        try:
            await nc.subscribe(SUBJECT, queue=config.queue, cb=on_request)
            await nc.flush()
            subscribed.set()
            log.info("callout.serving", account=config.account, issuer=signer.public_key.decode())
            await daemon.stopping.wait()
        finally:
            await nc.drain()
            await cluster.close()

    daemon.add_task(serve, name="serve", graceful=True)
    daemon.add_readiness_check(
        "nats", lambda: subscribed.is_set() and nc is not None and nc.is_connected
    )
    return daemon
