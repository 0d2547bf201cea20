"""Kerberos renewal against a real MIT KDC (k5test), the sim cluster and real NATS."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from schemas.notify import Severity
from services.credentials.secret import CHECKED, EXPIRES, RENEWED_AT, STATUS
from tests.conftest import wait_for
from tests.integration.credentials_fixtures import EnvFactory, authenticates, kinit

pytestmark = [pytest.mark.xdist_group("credentials-kdc"), pytest.mark.timeout(120)]


def _settings(kdc: Any, **extra: Any) -> dict[str, Any]:
    return {
        "krb5_config": kdc.env["KRB5_CONFIG"],
        "verify_service": f"host@{kdc.hostname}",
        "renew_when_left": 0.5,
    } | extra


async def test_ticket_renewed_before_expiry_workload_authenticates_three_lifetimes(
    kdc: Any, creds_env: EnvFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's done-when: a workload reading the Secret keeps authenticating across
    three ticket lifetimes, because nodeward renews the TGT in the Secret before it expires."""
    env = await creds_env(**_settings(kdc, renew_when_left=0.6))
    original = kinit(kdc, tmp_path / "cc", life="5s", renew="1h")
    await env.put_secret("krb", "kerberos", {"krb5cc": original})
    await env.start()
    loop = asyncio.get_running_loop()
    end = loop.time() + 3 * 5 + 1
    checks = 0
    seen: set[bytes] = set()
    while loop.time() < end:  # the workload: reads the mounted Secret, authenticates
        ccache = (await env.data("krb"))["krb5cc"]
        seen.add(ccache)
        assert authenticates(kdc, ccache, tmp_path) == kdc.user_princ
        checks += 1
        await asyncio.sleep(0.5)  # the workload's own pace
    assert checks >= 15
    renewed = await env.renewed("krb")
    assert len(renewed) >= 3, renewed
    assert len(seen) >= 4  # the original and at least three renewals
    assert all(r.principal == kdc.user_princ and r.renewable_until for r in renewed)
    # Its renewable life (1 h) ends within user_notice_before (1 day): the owner is told,
    # once, well before, while the renewals go on.
    notices = await env.user_notices("krb")
    assert len(notices) == 1, notices
    assert "stops being renewable" in notices[0].title
    assert notices[0].deadline == renewed[-1].renewable_until
    annotations = await env.annotations("krb")
    assert annotations[STATUS] == "ok"
    assert EXPIRES in annotations and RENEWED_AT in annotations
    audits = await env.audits()
    assert any(a.outcome.value == "applied" for a in audits)
    await env.stop_all()  # its loggers write to the captured stderr
    captured = capsys.readouterr()
    leaks = await env.leaked([original, *seen], captured.err + captured.out)
    assert leaks == [], f"credential found in {leaks}"


async def test_keytab_credential_acquired(kdc: Any, creds_env: EnvFactory, tmp_path: Path) -> None:
    """A service account's keytab and principal: nodeward writes a fresh ticket cache."""
    principal = f"batch@{kdc.realm}"
    kdc.addprinc(principal)
    keytab = tmp_path / "batch.keytab"
    kdc.extract_keytab(principal, str(keytab))
    env = await creds_env(**_settings(kdc))
    await env.put_secret(
        "svc", "kerberos", {"keytab": keytab.read_bytes(), "principal": principal.encode()}
    )
    await env.start()

    async def cache() -> bytes | None:
        return (await env.data("svc")).get("krb5cc")

    ccache = await wait_for(cache, timeout=20, what="a ticket cache from the keytab")
    assert authenticates(kdc, ccache, tmp_path) == principal
    assert (await env.data("svc"))["keytab"] == keytab.read_bytes()
    # The outcome event follows the Secret's write.
    renewed = await wait_for(lambda: env.renewed("svc"), what="credentials.renewed for svc")
    assert renewed[0].principal == principal


async def test_rejected_keytab_notifies_owner(
    kdc: Any, creds_env: EnvFactory, tmp_path: Path
) -> None:
    principal = f"stale@{kdc.realm}"
    kdc.addprinc(principal)
    keytab = tmp_path / "stale.keytab"
    kdc.extract_keytab(principal, str(keytab))
    kdc.run_kadminl(f"cpw -randkey {principal}")  # the key changed: the keytab is stale
    env = await creds_env(**_settings(kdc))
    await env.put_secret(
        "stale", "kerberos", {"keytab": keytab.read_bytes(), "principal": principal.encode()}
    )
    await env.start()
    notices = await wait_for(lambda: env.user_notices("stale"), timeout=20, what="notice")
    assert "keytab" in " ".join(notices[0].what_you_can_do)
    assert (await env.annotations("stale"))[STATUS].startswith("needs-user")
    assert "krb5cc" not in await env.data("stale")


async def test_past_renewable_life_notifies_owner_and_keeps_secret(
    kdc: Any, creds_env: EnvFactory, tmp_path: Path
) -> None:
    """A ticket whose renewable life ends with it: not overwritten, the owner is told once,
    in plain words, before it expires."""
    ticket = kinit(kdc, tmp_path / "cc", life="30s", renew="30s")
    env = await creds_env(**_settings(kdc, renew_when_left=0.95))
    await env.put_secret("old", "kerberos", {"krb5cc": ticket})
    await env.start()
    notices = await wait_for(lambda: env.user_notices("old"), timeout=15, what="owner notice")
    note = notices[0]
    assert note.severity == Severity.WARNING
    assert "cannot be renewed" in note.title and note.deadline is not None
    assert any("kinit" in step for step in note.what_you_can_do)
    annotations = await env.annotations("old")
    assert annotations[STATUS].startswith("needs-user: ")
    assert CHECKED in annotations
    assert (await env.data("old"))["krb5cc"] == ticket  # not overwritten
    failed = await env.failed("old")
    assert failed and not failed[0].retryable
    await env.more_scans(3)  # told once, not again for the same ticket
    assert len(await env.user_notices("old")) == 1
    assert await env.renewed("old") == []


async def test_kdc_down_retries_and_pages_only_near_expiry(
    kdc: Any, creds_env: EnvFactory, tmp_path: Path
) -> None:
    ticket = kinit(kdc, tmp_path / "cc", life="14s", renew="1h")
    env = await creds_env(**_settings(kdc, renew_when_left=0.9, page_when_left="7s"))
    kdc.stop_kdc()
    try:
        await env.put_secret("flaky", "kerberos", {"krb5cc": ticket})
        await env.start()
        await wait_for(lambda: env.failed("flaky"), timeout=15, what="a failed attempt")
        first = await env.failed("flaky")
        assert first[0].retryable and "KDC" in first[0].error
        assert await env.oncall_notices("flaky") == [] or all(
            n.severity != Severity.CRITICAL for n in await env.oncall_notices("flaky")
        )

        async def paged() -> bool:
            return any(n.severity == Severity.CRITICAL for n in await env.oncall_notices("flaky"))

        await wait_for(paged, timeout=15, interval=0.2, what="on-call paged near expiry")
        assert len(await env.failed("flaky")) >= 3  # retried with back-off meanwhile
        assert (await env.data("flaky"))["krb5cc"] == ticket  # nothing lost
        assert await env.user_notices("flaky") == []  # the owner cannot mend a KDC outage
    finally:
        kdc.start_kdc()
    await wait_for(lambda: env.renewed("flaky"), timeout=15, what="renewed once the KDC is back")
    assert authenticates(kdc, (await env.data("flaky"))["krb5cc"], tmp_path) == kdc.user_princ


async def test_garbage_secret_status_and_notice_no_crash(
    kdc: Any, creds_env: EnvFactory, tmp_path: Path
) -> None:
    env = await creds_env(**_settings(kdc))
    await env.put_secret("junk", "kerberos", {"krb5cc": b"\x00\x01 not a ticket cache"})
    await env.put_secret("empty", "kerberos", {"something": b"else"})
    await env.put_secret("oauth-junk", "oauth2", {"access_token": b"x" * 20})
    await env.put_secret("wrong-kind", "ldap", {"password": b"y" * 20})
    good = kinit(kdc, tmp_path / "cc", life="4s", renew="1h")
    await env.put_secret("good", "kerberos", {"krb5cc": good})
    await env.start()
    for name in ("junk", "empty", "oauth-junk", "wrong-kind"):
        notices = await wait_for(lambda n=name: env.user_notices(n), timeout=15, what=name)
        assert "cannot read" in notices[0].title
        status = (await env.annotations(name))[STATUS]
        assert status.startswith("invalid: "), status
    assert "not a Kerberos ticket cache" in (await env.annotations("junk"))[STATUS]
    assert "token_endpoint" in (await env.annotations("oauth-junk"))[STATUS]
    assert "neither 'kerberos' nor 'oauth2'" in (await env.annotations("wrong-kind"))[STATUS]
    await wait_for(lambda: env.renewed("good"), timeout=15, what="the good one still renewed")
    assert env.daemons[0].started and env.daemons[0].failure is None
