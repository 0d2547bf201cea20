"""Kerberos: read a ticket cache's lifetime, renew its TGT (pykrb5), or get a fresh one from a
keytab, and check the new ticket with a GSSAPI context before anyone writes it.

Blocking (the KDC is called synchronously): the service runs these in a thread. Ticket
caches and keytabs touch the disk only in a private temporary directory, removed at once.
The krb5 configuration is the process's (`KRB5_CONFIG`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import gssapi
import krb5

from services.credentials.schedule import Timing
from services.credentials.secret import (
    CCACHE,
    KEYTAB,
    PRINCIPAL,
    Credential,
    Invalid,
    NeedsUser,
    Transient,
)

# Failures a retry may mend (the KDC down, slow or unreachable); matched on MIT's messages.
_TRANSIENT = (
    "cannot contact any kdc",
    "cannot resolve network address",
    "timed out",
    "connection refused",
    "resource temporarily unavailable",
)
_SKEW = "clock skew"
_KEYTAB_REFUSED = (
    "preauthentication failed",
    "key table entry not found",
    "decrypt integrity check failed",
    "not found in kerberos database",
    "no key table entry",
    "password incorrect",
)


@dataclass(frozen=True)
class Renewal:
    data: dict[str, bytes]
    expires_at: datetime
    renewable_until: datetime | None
    principal: str


@contextmanager
def _private_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="nodeward-krb-") as name:
        os.chmod(name, 0o700)
        yield Path(name)


def _when(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _tgt(ctx: krb5.Context, path: Path) -> tuple[krb5.Principal, krb5.Creds]:
    """The cache's principal and its TGT; `Invalid` when it is not a ticket cache."""
    try:
        ccache = krb5.cc_resolve(ctx, f"FILE:{path}".encode())
        principal = krb5.cc_get_principal(ctx, ccache)
        for creds in ccache:
            if (creds.server.name or b"").startswith(b"krbtgt/") and creds.times.endtime:
                return principal, creds
    except krb5.Krb5Error:
        raise Invalid(f"the {CCACHE!r} entry is not a Kerberos ticket cache") from None
    raise Invalid(f"the {CCACHE!r} ticket cache holds no ticket-granting ticket")


def _renewable_until(creds: krb5.Creds) -> datetime | None:
    renewable = bool(creds.ticket_flags & krb5.TicketFlags.renewable)
    return _when(creds.times.renew_till) if renewable and creds.times.renew_till else None


def timing(cred: Credential) -> Timing:
    """The lifetime of the Secret's ticket; a keytab-only Secret is due at once."""
    if CCACHE not in cred.data:
        if KEYTAB in cred.data:
            return Timing(datetime.now(UTC), None, None, cred.text(PRINCIPAL))
        raise Invalid(f"the Secret has neither a {CCACHE!r} ticket cache nor a {KEYTAB!r}")
    ctx = krb5.init_context()
    with _private_dir() as tmp:
        path = tmp / "cc"
        path.write_bytes(cred.data[CCACHE])
        principal, creds = _tgt(ctx, path)
    times = creds.times
    return Timing(
        expires_at=_when(times.endtime),
        issued_at=_when(times.starttime or times.authtime),
        renewable_until=_renewable_until(creds),
        principal=(principal.name or b"").decode(errors="replace"),
    )


def renew(cred: Credential, *, verify_service: str | None) -> Renewal:
    """A fresh TGT for `cred`, checked; raises `NeedsUser`, `Transient` or `Invalid`.

    With a keytab: new initial tickets from it. Otherwise: the cache's TGT renewed, while
    it is valid and inside its renewable life.
    """
    ctx = krb5.init_context()
    with _private_dir() as tmp:
        out = tmp / "new"
        if KEYTAB in cred.data:
            principal_name = cred.text(PRINCIPAL)
            keytab = tmp / "kt"
            keytab.write_bytes(cred.data[KEYTAB])
            try:
                principal = krb5.parse_name_flags(ctx, principal_name.encode())
            except krb5.Krb5Error:
                raise Invalid(f"principal {principal_name!r} is not a Kerberos name") from None
            try:
                kt = krb5.kt_resolve(ctx, f"FILE:{keytab}".encode())
                opt = krb5.get_init_creds_opt_alloc(ctx)
                creds = krb5.get_init_creds_keytab(ctx, principal, opt, kt)
            except krb5.Krb5Error as exc:
                raise _classify(exc, refused="keytab_rejected") from None
        else:
            path = tmp / "cc"
            path.write_bytes(cred.data[CCACHE])
            principal, old = _tgt(ctx, path)
            _check_renewable(old)
            try:
                ccache = krb5.cc_resolve(ctx, f"FILE:{path}".encode())
                creds = krb5.get_renewed_creds(ctx, principal, ccache, None)
            except krb5.Krb5Error as exc:
                raise _classify(exc, refused="not_renewable") from None
        new_cache = krb5.cc_resolve(ctx, f"FILE:{out}".encode())
        krb5.cc_initialize(ctx, new_cache, principal)
        krb5.cc_store_cred(ctx, new_cache, creds)
        _verify(out, verify_service)
        data = {CCACHE: out.read_bytes()}
    return Renewal(
        data=data,
        expires_at=_when(creds.times.endtime),
        renewable_until=_renewable_until(creds),
        principal=(principal.name or b"").decode(errors="replace"),
    )


def _check_renewable(creds: krb5.Creds) -> None:
    now = datetime.now(UTC)
    end = _when(creds.times.endtime)
    until = _renewable_until(creds)
    if end <= now:
        raise NeedsUser("expired", f"the ticket expired at {end:%Y-%m-%d %H:%M:%S UTC}")
    if until is None:
        raise NeedsUser("not_renewable", "the ticket is not renewable (kinit without -r)")
    if until <= end or until <= now:
        raise NeedsUser(
            "renewable_life_ended",
            f"the ticket's renewable life ends at {until:%Y-%m-%d %H:%M:%S UTC}; it cannot be "
            "renewed again",
        )


def _classify(exc: krb5.Krb5Error, *, refused: str) -> Exception:
    message = str(exc.message if hasattr(exc, "message") else exc).splitlines()[0][:200]
    low = message.lower()
    if _SKEW in low:
        return NeedsUser("clock_skew", f"the KDC refused the request: {message}")
    if any(t in low for t in _TRANSIENT):
        return Transient(f"the KDC is unreachable: {message}")
    if refused == "keytab_rejected" and any(t in low for t in _KEYTAB_REFUSED):
        return NeedsUser("keytab_rejected", f"the KDC refused the keytab: {message}")
    if "expired" in low:
        return NeedsUser("expired", f"the KDC refused the ticket: {message}")
    return NeedsUser(refused, f"the KDC refused the request: {message}")


def _verify(ccache: Path, service: str | None) -> None:
    """Acquire the new ticket through GSSAPI; with `service` (host@name), also start a
    security context to it, which asks the KDC for a service ticket with the new TGT."""
    try:
        creds = gssapi.Credentials(usage="initiate", store={b"ccache": f"FILE:{ccache}".encode()})
        if creds.lifetime is not None and creds.lifetime <= 0:
            raise Transient("the renewed ticket is already expired")
        if service:
            name = gssapi.Name(service, gssapi.NameType.hostbased_service)
            context = gssapi.SecurityContext(name=name, creds=creds, usage="initiate")
            context.step()
    except gssapi.raw.misc.GSSError as exc:
        text = str(exc).splitlines()[0][:200]
        if any(t in text.lower() for t in _TRANSIENT):
            raise Transient(f"the renewed ticket could not be checked: {text}") from None
        raise Transient(f"the renewed ticket did not authenticate: {text}") from None
