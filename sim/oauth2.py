"""A local OAuth2 authorization server, built with authlib (Flask integration): the identity
provider `nodeward up` runs for the seeded opted-in Secrets, and the tests' real peer.

Refresh-token grant with rotation (every refresh issues a new refresh token and retires
the old one; the old access token stays valid until it expires, as Keycloak's does) and
reuse detection (presenting a revoked refresh token revokes the whole
grant, RFC 9700), a bearer-protected `/whoami` a workload calls, a switch that makes the
token endpoint answer 503 (the IdP down), and counts of how often each refresh token was
presented. Served by werkzeug on a free loopback port in a thread (`serve`). A simulator:
`/issue` mints grants without authentication, for the benchmark's seed.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from flask import Flask, g, jsonify, request
from werkzeug.serving import WSGIRequestHandler, make_server


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        """No access log: the tests read the server's counters instead."""


@dataclass
class Client(ClientMixin):  # type: ignore[misc]
    client_id: str
    client_secret: str

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None

    def get_allowed_scope(self, scope: str) -> str:
        return scope or ""

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return False

    def check_client_secret(self, client_secret: str) -> bool:
        return hmac.compare_digest(client_secret, self.client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == "client_secret_basic"

    def check_response_type(self, response_type: str) -> bool:
        return False

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "refresh_token"


@dataclass
class Token(TokenMixin):  # type: ignore[misc]
    client_id: str
    access_token: str
    refresh_token: str
    family: str
    expires_in: int
    issued_at: float = field(default_factory=time.time)
    revoked: bool = False
    """The grant was revoked: neither token works any more."""
    rotated: bool = False
    """Its refresh token was used: presenting it again is reuse."""
    scope: str = ""

    def check_client(self, client: Client) -> bool:
        return bool(client.get_client_id() == self.client_id)

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return self.expires_in

    def is_expired(self) -> bool:
        return False  # refresh tokens live until rotated or revoked

    def is_revoked(self) -> bool:
        return self.revoked or self.rotated

    def access_valid(self) -> bool:
        return not self.revoked and time.time() < self.issued_at + self.expires_in


class IdP:
    """The server's state, shared by its request threads under one lock."""

    def __init__(self, expires_in: int = 3600) -> None:
        self.expires_in = expires_in
        self.lock = threading.Lock()
        self.clients: dict[str, Client] = {}
        self.by_refresh: dict[str, Token] = {}
        self.by_access: dict[str, Token] = {}
        self.presented: Counter[str] = Counter()
        self.reuse_detected = 0
        self.refreshes = 0
        self.down = False
        self.url = ""
        self.on_refresh: Callable[[], None] | None = None
        """Called (in the server's thread) before a refresh is answered."""

    def client(self, client_id: str, client_secret: str | None = None) -> Client:
        """The client `client_id`, registered on first use (with `client_secret`, or a new
        one); `ValueError` if it is registered with another secret."""
        with self.lock:
            client = self.clients.setdefault(
                client_id, Client(client_id, client_secret or secrets.token_urlsafe(24))
            )
        if client_secret is not None and not client.check_client_secret(client_secret):
            raise ValueError(f"client {client_id!r} is registered with another secret")
        return client

    def issue(self, client_id: str, expires_in: int | None = None) -> Token:
        """A fresh grant for `client_id`, as an authorization-code flow would end."""
        self.client(client_id)
        token = Token(
            client_id=client_id,
            access_token=secrets.token_urlsafe(32),
            refresh_token=secrets.token_urlsafe(32),
            family=secrets.token_hex(8),
            expires_in=expires_in or self.expires_in,
        )
        self._store(token)
        return token

    def _store(self, token: Token) -> None:
        with self.lock:
            self.by_refresh[token.refresh_token] = token
            self.by_access[token.access_token] = token

    def lookup_refresh(self, refresh_token: str) -> Token | None:
        with self.lock:
            self.presented[refresh_token] += 1
            token = self.by_refresh.get(refresh_token)
            if token is None:
                return None
            if token.is_revoked():  # a rotated-away token used again: revoke the whole grant
                self.reuse_detected += 1
                for other in self.by_refresh.values():
                    if other.family == token.family:
                        other.revoked = True
                return None
            return token

    def revoke_grant(self, refresh_token: str) -> None:
        """What a user's logout or an admin's revocation does."""
        with self.lock:
            family = self.by_refresh[refresh_token].family
            for other in self.by_refresh.values():
                if other.family == family:
                    other.revoked = True

    def authenticates(self, access_token: str) -> bool:
        with self.lock:
            token = self.by_access.get(access_token)
            return token is not None and token.access_valid()


def make_app(idp: IdP) -> Flask:
    app = Flask("nodeward-test-idp")

    def query_client(client_id: str) -> Client | None:
        with idp.lock:
            return idp.clients.get(client_id)

    def save_token(token: dict[str, Any], req: Any) -> None:
        idp.refreshes += 1
        idp._store(
            Token(
                client_id=req.client.get_client_id(),
                access_token=token["access_token"],
                refresh_token=token["refresh_token"],
                family=g.family,
                expires_in=int(token["expires_in"]),
            )
        )

    class Refresh(grants.RefreshTokenGrant):  # type: ignore[misc]
        INCLUDE_NEW_REFRESH_TOKEN = True

        def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
            return idp.lookup_refresh(refresh_token)

        def authenticate_user(self, credential: Token) -> str:
            g.family = credential.family
            return credential.client_id

        def revoke_old_credential(self, credential: Token) -> None:
            with idp.lock:
                credential.rotated = True

    server = AuthorizationServer(app, query_client=query_client, save_token=save_token)
    server.register_grant(Refresh)

    def random_token(**_: Any) -> str:
        return secrets.token_urlsafe(32)

    def lifetime(client: Any, grant_type: str) -> int:
        return idp.expires_in  # read per refresh: a test may change it

    server.register_token_generator(
        "default", BearerTokenGenerator(random_token, random_token, lifetime)
    )

    @app.post("/token")
    def issue_token() -> Any:
        if idp.down:
            return jsonify(error="temporarily_unavailable"), 503
        hook = idp.on_refresh
        if hook is not None:
            hook()
        return server.create_token_response()

    @app.get("/stats")
    def stats() -> Any:
        with idp.lock:
            return jsonify(
                refreshes=idp.refreshes,
                reuse_detected=idp.reuse_detected,
                max_presented=max(idp.presented.values(), default=0),
            )

    @app.post("/issue")
    def issue() -> Any:
        """Grants for the benchmark's seed (a test server: no authentication)."""
        body = request.get_json(force=True)
        client = idp.client(str(body["client_id"]))
        tokens = [
            idp.issue(client.client_id, int(body.get("expires_in", 3600)))
            for _ in range(int(body["count"]))
        ]
        return jsonify(
            client_secret=client.client_secret,
            tokens=[[t.access_token, t.refresh_token] for t in tokens],
        )

    @app.get("/whoami")
    def whoami() -> Any:
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not idp.authenticates(bearer):
            return jsonify(error="invalid_token"), 401
        return jsonify(ok=True)

    return app


@dataclass
class Served:
    """A running server: its state, and `stop()`."""

    idp: IdP
    server: Any
    thread: threading.Thread

    @property
    def token_endpoint(self) -> str:
        return f"{self.idp.url}/token"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(expires_in: int = 3600, host: str = "127.0.0.1", port: int = 0) -> Served:
    """Start the server in a thread on `host:port` (0: a free port); access tokens live
    `expires_in` seconds."""
    idp = IdP(expires_in)
    server = make_server(host, port, make_app(idp), threaded=True, request_handler=_Quiet)
    idp.url = f"http://{host}:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, name="sim-oauth2", daemon=True)
    thread.start()
    return Served(idp, server, thread)


def serve_forever(urls: Any) -> None:
    """Run the server in this (child) process; its URL goes into the `urls` queue."""
    idp = IdP()
    server = make_server("127.0.0.1", 0, make_app(idp), threaded=True, request_handler=_Quiet)
    urls.put(f"http://127.0.0.1:{server.server_port}")
    server.serve_forever()
