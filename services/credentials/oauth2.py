"""OAuth2: read a token set from a Secret and refresh it with authlib (refresh-token grant).

The rotated refresh token comes back with the access token; the caller writes both in one
Secret update. Errors are sorted into what the owner must fix (`NeedsUser`: the grant is
gone or the client is refused) and what may pass (`Transient`: the IdP is down or slow).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx

with warnings.catch_warnings():
    # authlib 1.7 announces a move to `httpx2` on import (its own filter says "always",
    # set when authlib.deprecate loads); its httpx client works as it is.
    import authlib.deprecate  # noqa: F401 - loaded first, so the filter below wins

    warnings.simplefilter("ignore")
    from authlib.integrations.base_client.errors import OAuthError
    from authlib.integrations.httpx_client import AsyncOAuth2Client

from services.credentials.secret import Credential, Invalid, NeedsUser, Transient, parse_time

# Errors of the token endpoint that only the owner can mend (RFC 6749 section 5.2).
_USER_ERRORS = {"invalid_grant", "invalid_client", "unauthorized_client", "invalid_scope"}


@dataclass(frozen=True)
class TokenSet:
    """An OAuth2 credential as the Secret holds it."""

    token_endpoint: str
    client_id: str
    refresh_token: str
    expires_at: datetime
    issued_at: datetime | None
    client_secret_ref: tuple[str, str] | None

    @property
    def principal(self) -> str:
        return self.client_id


def token_set(cred: Credential, client_secret_annotation: str) -> TokenSet:
    """The token set in `cred`, or `Invalid` with what is wrong."""
    endpoint = cred.text("token_endpoint")
    if not endpoint.startswith(("https://", "http://")):
        raise Invalid("the 'token_endpoint' entry is not an http(s) URL")
    cred.text("access_token")
    issued = cred.data.get("issued_at")
    ref = None
    raw_ref = cred.annotations.get(client_secret_annotation)
    if raw_ref:
        name, _, key = raw_ref.partition("/")
        ref = (name.strip(), key.strip() or "client_secret")
    return TokenSet(
        token_endpoint=endpoint,
        client_id=cred.text("client_id"),
        refresh_token=cred.text("refresh_token"),
        expires_at=parse_time(cred.text("expires_at"), "expires_at"),
        issued_at=parse_time(issued.decode(errors="replace"), "issued_at") if issued else None,
        client_secret_ref=ref,
    )


@dataclass(frozen=True)
class Refreshed:
    data: dict[str, bytes]
    expires_at: datetime
    rotated: bool


async def refresh(
    tokens: TokenSet,
    client_secret: str | None,
    *,
    timeout: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Refreshed:
    """One refresh-token grant through authlib. Raises `NeedsUser` or `Transient`; never
    returns a partial set. Error texts carry the server's error code, never a token.

    `transport`: one connection pool shared by every refresh (the caller closes it); a
    client of its own per refresh otherwise.
    """
    client = AsyncOAuth2Client(
        client_id=tokens.client_id,
        client_secret=client_secret,
        token_endpoint_auth_method="client_secret_basic" if client_secret else "none",
        timeout=timeout,
        transport=transport,
    )
    try:
        token = await client.refresh_token(
            tokens.token_endpoint, refresh_token=tokens.refresh_token
        )
    except OAuthError as exc:
        code = str(exc.error or "error")
        if code in _USER_ERRORS:
            raise NeedsUser(code, f"the token endpoint refused the refresh: {code}") from None
        raise Transient(f"the token endpoint answered {code}") from None
    except httpx.HTTPStatusError as exc:
        raise Transient(f"the token endpoint answered HTTP {exc.response.status_code}") from None
    except httpx.HTTPError as exc:
        raise Transient(f"the token endpoint is unreachable ({type(exc).__name__})") from None
    except ValueError:
        raise Transient("the token endpoint answered something that is not a token") from None
    finally:
        if transport is None:
            await client.aclose()
    access = token.get("access_token")
    if not access:
        raise Transient("the token endpoint answered without an access_token")
    now = datetime.now(UTC)
    if token.get("expires_in"):
        expires_at = now + timedelta(seconds=float(token["expires_in"]))
    elif token.get("expires_at"):
        expires_at = datetime.fromtimestamp(float(token["expires_at"]), UTC)
    else:
        raise Transient("the token endpoint answered without expires_in")
    new_refresh = str(token.get("refresh_token") or tokens.refresh_token)
    data = {
        "access_token": str(access).encode(),
        "refresh_token": new_refresh.encode(),
        "expires_at": expires_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode(),
        "issued_at": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode(),
    }
    return Refreshed(data, expires_at, rotated=new_refresh != tokens.refresh_token)
