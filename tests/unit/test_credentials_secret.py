"""Reading opted-in Secrets without trusting them, and when a credential is due."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.credentials.oauth2 import token_set
from services.credentials.schedule import Timing, due_at
from services.credentials.secret import (
    CHECKED,
    CLIENT_SECRET,
    STATUS,
    Invalid,
    InvalidSecret,
    read,
)
from services.credentials.service import scrub

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def secret(
    kind: str, data: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "s",
            "namespace": "user-a",
            "resourceVersion": "7",
            "labels": {"nodeward.io/credential": kind},
            "annotations": annotations or {},
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def oauth(**extra: str) -> dict[str, Any]:
    data = {
        "access_token": "A" * 30,
        "refresh_token": "R" * 30,
        "expires_at": "2026-11-29T13:00:00Z",
        "issued_at": "2026-11-29T12:00:00Z",
        "token_endpoint": "https://idp.example/token",
        "client_id": "nb",
    } | extra
    return secret("oauth2", data, {CLIENT_SECRET: "client-s/key"})


def test_token_set_reads_what_the_user_stored() -> None:
    tokens = token_set(read(oauth()), CLIENT_SECRET)
    assert tokens.expires_at == datetime(2026, 11, 29, 13, tzinfo=UTC)
    assert tokens.client_secret_ref == ("client-s", "key")
    assert token_set(read(oauth(expires_at="1795996800")), CLIENT_SECRET).expires_at.year == 2026


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"token_endpoint": "ftp://x"}, r"not an http\(s\) URL"),
        ({"expires_at": "tomorrow"}, "is not a time"),
        ({"refresh_token": ""}, "no 'refresh_token' entry"),
    ],
)
def test_bad_token_sets_say_what_is_wrong_without_values(
    change: dict[str, str], message: str
) -> None:
    with pytest.raises(Invalid, match=message) as caught:
        token_set(read(oauth(**change)), CLIENT_SECRET)
    assert "A" * 30 not in str(caught.value) and "R" * 30 not in str(caught.value)


def test_not_base64_and_unknown_kind_are_invalid() -> None:
    raw = oauth()
    raw["data"]["access_token"] = "@@not base64@@"
    with pytest.raises(InvalidSecret, match="not base64"):
        read(raw)
    with pytest.raises(InvalidSecret, match="neither 'kerberos' nor 'oauth2'"):
        read(secret("ldap", {"x": "y"}))


def test_needs_user_holds_only_for_the_same_data() -> None:
    cred = read(oauth())
    marked = oauth()
    marked["metadata"]["annotations"] |= {STATUS: "needs-user: x", CHECKED: cred.digest}
    assert read(marked).needs_user()
    changed = oauth(refresh_token="N" * 30)
    changed["metadata"]["annotations"] |= {STATUS: "needs-user: x", CHECKED: cred.digest}
    assert not read(changed).needs_user()


def test_due_at_share_of_lifetime_renew_before_and_jitter() -> None:
    cred = read(oauth())
    timing = Timing(NOW + timedelta(hours=1), NOW, None, "nb")
    lead = timedelta(minutes=10)
    assert due_at(cred, timing, left=0.25, jitter=0, default_lead=lead) == NOW + timedelta(
        minutes=45
    )
    jittered = due_at(cred, timing, left=0.25, jitter=0.1, default_lead=lead)
    assert NOW + timedelta(minutes=39) <= jittered <= NOW + timedelta(minutes=45)
    assert jittered == due_at(cred, timing, left=0.25, jitter=0.1, default_lead=lead)  # stable
    unknown = Timing(NOW + timedelta(hours=1), None, None, "nb")
    assert due_at(cred, unknown, left=0.25, jitter=0.1, default_lead=lead) == NOW + timedelta(
        minutes=50
    )
    before = read(secret("oauth2", {"a": "b"}, {"nodeward.io/renew-before": "15m"}))
    assert due_at(before, unknown, left=0.25, jitter=0, default_lead=lead) == NOW + timedelta(
        minutes=45
    )


def test_scrub_blanks_every_value() -> None:
    cred = read(oauth())
    text = f"oops {'R' * 30} and {base64.b64encode(b'A' * 30).decode()}"
    assert scrub(text, cred) == "oops [redacted] and [redacted]"
