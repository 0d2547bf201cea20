"""What an opted-in Secret holds, read without trusting it, and the annotations nodeward keeps.

A Secret opts in with the label `nodeward.io/credential=kerberos|oauth2`:

- kerberos: `krb5cc` (a renewable TGT ccache), or `keytab` and `principal` (a service
  account; `krb5cc` is then written by nodeward);
- oauth2: `access_token`, `refresh_token`, `expires_at` (RFC 3339 or Unix seconds),
  `token_endpoint`, `client_id`; a confidential client's secret by reference, the
  annotation `nodeward.io/client-secret: <secret>[/<key>]` (same namespace, key
  `client_secret` by default).

Anything else is garbage: `Invalid` with one line a user can act on, never the values.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from nodeward.durations import parse_duration
from nodeward.kube.base import Obj
from schemas.common import ObjectRef
from schemas.credentials import CredentialKind

LABEL = "nodeward.io/credential"
PREFIX = "nodeward.io/credential-"
STATUS = PREFIX + "status"
EXPIRES = PREFIX + "expires"
RENEWABLE_UNTIL = PREFIX + "renewable-until"
RENEWED_AT = PREFIX + "renewed-at"
CHECKED = PREFIX + "checked"
"""A digest of the data a `needs-user` or `invalid` status is about: new data clears it."""
WARNED = PREFIX + "warned"
"""The end (renewable life) the owner was last warned about, so it is said once."""
RENEW_BEFORE = "nodeward.io/renew-before"
CLIENT_SECRET = "nodeward.io/client-secret"  # noqa: S105 - an annotation name, not a secret
CCACHE = "krb5cc"  # the Secret's key holding a Kerberos ticket cache
KEYTAB = "keytab"  # ... or a keytab (with PRINCIPAL)
PRINCIPAL = "principal"

OAUTH2_KEYS = ("access_token", "refresh_token", "expires_at", "token_endpoint", "client_id")


class NeedsUser(Exception):
    """The credential cannot be renewed without its owner; `code` is a short reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Transient(Exception):
    """Renewal failed for now (a peer down or slow); trying again later may work."""


class Invalid(Exception):
    """The Secret cannot be used as it is; `str()` is one line for its owner (no values)."""


@dataclass(frozen=True)
class Credential:
    """One opted-in Secret, as read: kind, raw data (bytes), annotations, version."""

    namespace: str
    name: str
    kind: CredentialKind
    data: dict[str, bytes]
    annotations: dict[str, str]
    resource_version: str
    secret: Obj = field(repr=False)

    @property
    def digest(self) -> str:
        """A short digest of the data: tells whether the credential changed, reveals nothing."""
        h = hashlib.sha256()
        for key in sorted(self.data):
            h.update(key.encode() + b"\0" + hashlib.sha256(self.data[key]).digest())
        return h.hexdigest()[:16]

    def ref(self) -> ObjectRef:
        return ObjectRef(kind="Secret", name=self.name, namespace=self.namespace, api_version="v1")

    def text(self, key: str) -> str:
        """A required text value, or `Invalid` naming the key."""
        raw = self.data.get(key)
        if raw is None or not raw.strip():
            raise Invalid(f"the Secret has no {key!r} entry")
        try:
            return raw.decode().strip()
        except UnicodeDecodeError:
            raise Invalid(f"the {key!r} entry is not text") from None

    def renew_before(self) -> timedelta | None:
        raw = self.annotations.get(RENEW_BEFORE)
        if not raw:
            return None
        try:
            return parse_duration(raw)
        except ValueError:
            raise Invalid(f"annotation {RENEW_BEFORE}={raw!r} is not a duration like 15m") from None

    def needs_user(self) -> bool:
        """True when nodeward already told the owner this very data cannot be renewed."""
        status = self.annotations.get(STATUS, "")
        return status.startswith(("needs-user", "invalid")) and self.annotations.get(CHECKED) == (
            self.digest
        )

    def values(self) -> list[str]:
        """Every value long enough to be a secret, to scrub from text that leaves."""
        out: list[str] = []
        for key, raw in self.data.items():
            if key in ("token_endpoint", "client_id", "principal", "expires_at"):
                continue
            out.append(base64.b64encode(raw).decode())
            try:
                out.append(raw.decode())
            except UnicodeDecodeError:
                continue
        return [v for v in out if len(v) >= 8]


def read(secret: Obj) -> Credential:
    """The opted-in Secret as a `Credential`; `Invalid` when its label or data is unusable."""
    meta = secret.get("metadata") or {}
    kind_text = (meta.get("labels") or {}).get(LABEL, "")
    data: dict[str, bytes] = {}
    problem: str | None = None
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            problem = f"entry {key!r} is not base64"
    try:
        kind = CredentialKind(kind_text)
    except ValueError:
        kind = CredentialKind.OAUTH2
        problem = f"label {LABEL}={kind_text!r} is neither 'kerberos' nor 'oauth2'"
    cred = Credential(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        kind=kind,
        data=data,
        annotations=dict(meta.get("annotations") or {}),
        resource_version=str(meta.get("resourceVersion", "")),
        secret=secret,
    )
    if problem:
        raise InvalidSecret(cred, problem)
    return cred


class InvalidSecret(Invalid):
    """`Invalid`, with the credential as far as it could be read."""

    def __init__(self, credential: Credential, problem: str) -> None:
        super().__init__(problem)
        self.credential = credential


def parse_time(raw: str, what: str) -> datetime:
    """RFC 3339 or Unix seconds, as an aware UTC time; `Invalid` otherwise."""
    text = raw.strip()
    try:
        if text.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(text), UTC)
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise Invalid(f"{what} {text[:40]!r} is not a time (RFC 3339 or Unix seconds)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode(values: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in values.items()}
