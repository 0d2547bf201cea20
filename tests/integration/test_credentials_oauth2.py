"""OAuth2 renewal against a real authlib authorization server (rotation, reuse detection),
the sim cluster and real NATS."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from schemas.base import make_event
from schemas.credentials import CredentialDue, CredentialKind
from services.credentials.secret import CLIENT_SECRET, STATUS
from sim.oauth2 import IdP
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.credentials_fixtures import CredsEnv, EnvFactory

pytestmark = [pytest.mark.timeout(90)]

CLIENT = "kubeflow-notebooks"


async def put_tokens(env: CredsEnv, idp: IdP, name: str, expires_in: int = 3) -> dict[str, bytes]:
    """A token set as a user stores it after signing in, and the client secret it refers to."""
    client = idp.client(CLIENT)
    token = idp.issue(CLIENT, expires_in=expires_in)
    now = datetime.now(UTC)
    await env.put_secret(f"{name}-client", None, {"client_secret": client.client_secret.encode()})
    data = {
        "access_token": token.access_token.encode(),
        "refresh_token": token.refresh_token.encode(),
        "expires_at": (now + timedelta(seconds=expires_in)).isoformat().encode(),
        "issued_at": now.isoformat().encode(),
        "token_endpoint": f"{idp.url}/token".encode(),
        "client_id": CLIENT.encode(),
    }
    await env.put_secret(name, "oauth2", data, {CLIENT_SECRET: f"{name}-client"})
    return data


async def test_refresh_rotates_never_reuses_with_two_replicas_racing(
    creds_env: EnvFactory, oauth2_idp: IdP, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two renewer replicas, due events sent again and again on top of the scheduler's: every
    refresh token is presented once, the grant is never revoked, and a workload reading the
    Secret stays authenticated across three access-token lifetimes."""
    env = await creds_env(renew_when_left=0.5, concurrency=4)
    first = await put_tokens(env, oauth2_idp, "tok")
    await env.start()
    await env.start()

    async def hammer() -> None:  # duplicates, as a redelivery or a second scheduler sends them
        while True:
            due = CredentialDue(
                namespace=env.ns,
                secret="tok",
                kind=CredentialKind.OAUTH2,
                expires_at=datetime.now(UTC),
                renew_by=datetime.now(UTC),
            )
            await env.bus.publish_many([make_event(due, source="test/dup") for _ in range(2)])
            await asyncio.sleep(0.2)

    hammering = asyncio.create_task(hammer())
    seen: list[bytes] = []
    try:
        async with httpx.AsyncClient(base_url=oauth2_idp.url) as http:
            loop = asyncio.get_running_loop()
            end = loop.time() + 3 * 3 + 0.5
            while loop.time() < end:  # the workload
                data = await env.data("tok")
                seen += [data["access_token"], data["refresh_token"]]
                answer = await http.get(
                    "/whoami", headers={"Authorization": f"Bearer {data['access_token'].decode()}"}
                )
                assert answer.status_code == 200, answer.text
                await asyncio.sleep(0.3)
    finally:
        hammering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hammering
    # Stopped first: a renewal in flight as the window closed finishes (its refresh, its
    # write and its event) before the books are compared; nothing renews after.
    await env.stop_all()
    renewed = await env.renewed("tok")
    assert len(renewed) >= 3
    assert all(r.rotated and r.principal == CLIENT for r in renewed)
    assert oauth2_idp.reuse_detected == 0
    assert max(oauth2_idp.presented.values()) == 1, "a refresh token was used twice"
    assert oauth2_idp.refreshes == len(renewed)
    assert (await env.annotations("tok"))[STATUS] == "ok"
    captured = capsys.readouterr()
    leaks = await env.leaked(
        [first["access_token"], first["refresh_token"], *set(seen)], captured.err + captured.out
    )
    assert leaks == [], f"a token found in {leaks}"


async def test_invalid_grant_notifies_owner(creds_env: EnvFactory, oauth2_idp: IdP) -> None:
    env = await creds_env(renew_when_left=0.9)
    data = await put_tokens(env, oauth2_idp, "revoked", expires_in=30)
    oauth2_idp.revoke_grant(data["refresh_token"].decode())  # the user logged out everywhere
    await env.start()
    notices = await wait_for(lambda: env.user_notices("revoked"), timeout=15, what="notice")
    assert "cannot be renewed" in notices[0].title
    assert "invalid_grant" in notices[0].body
    assert any("Sign in again" in step for step in notices[0].what_you_can_do)
    assert (await env.annotations("revoked"))[STATUS].startswith("needs-user: ")
    assert (await env.data("revoked"))["refresh_token"] == data["refresh_token"]
    failed = await env.failed("revoked")
    assert failed and not failed[0].retryable and "invalid_grant" in failed[0].error


async def test_concurrent_writer_409_reread_and_renewal_kept(
    creds_env: EnvFactory, oauth2_idp: IdP
) -> None:
    """Someone annotates the Secret while the refresh is in flight: the write at the old
    resourceVersion gets 409; the renewer re-reads, sees the token unchanged, writes the
    rotated token onto the newer version; both changes stand."""
    env = await creds_env(renew_when_left=0.9)
    await put_tokens(env, oauth2_idp, "busy", expires_in=30)
    loop = asyncio.get_running_loop()
    writes = 0

    def concurrent_writer() -> None:
        nonlocal writes
        writes += 1
        patch = env.admin.secrets.patch(
            env.ns,
            "busy",
            lambda s: {"metadata": {"annotations": {"team": f"vision-{writes}"}}},
        )
        asyncio.run_coroutine_threadsafe(patch, loop).result(timeout=10)

    oauth2_idp.on_refresh = concurrent_writer
    await env.start()
    renewed = await wait_for(lambda: env.renewed("busy"), timeout=15, what="renewal")
    oauth2_idp.on_refresh = None
    secret = await env.secret("busy")
    assert secret["metadata"]["annotations"]["team"].startswith("vision-")
    assert secret["metadata"]["resourceVersion"] == renewed[0].resource_version or writes > 1
    assert oauth2_idp.authenticates((await env.data("busy"))["access_token"].decode())
    assert oauth2_idp.reuse_detected == 0


async def test_owner_upload_during_refresh_wins(
    creds_env: EnvFactory, oauth2_idp: IdP, tmp_path: Path
) -> None:
    """The owner stores a new token set while nodeward refreshes the old one: on 409 the
    renewer sees the credential changed and leaves the owner's in place."""
    env = await creds_env(renew_when_left=0.9)
    await put_tokens(env, oauth2_idp, "mine", expires_in=30)
    fresh = oauth2_idp.issue(CLIENT, expires_in=3600)
    loop = asyncio.get_running_loop()

    def owner_uploads() -> None:
        oauth2_idp.on_refresh = None
        patch = env.admin.secrets.patch(
            env.ns,
            "mine",
            lambda s: {
                "data": {
                    "access_token": _b64(fresh.access_token),
                    "refresh_token": _b64(fresh.refresh_token),
                    "expires_at": _b64((datetime.now(UTC) + timedelta(hours=1)).isoformat()),
                }
            },
        )
        asyncio.run_coroutine_threadsafe(patch, loop).result(timeout=10)

    oauth2_idp.on_refresh = owner_uploads
    await env.start()
    await wait_for(lambda: oauth2_idp.refreshes >= 1, timeout=15, what="a refresh")
    await wait_for(env.consumer_idle, timeout=10, what="the renewer done")
    data = await env.data("mine")
    assert data["refresh_token"] == fresh.refresh_token.encode()
    assert await env.renewed("mine") == []


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


async def test_idp_down_retries_then_renews_without_losing_the_grant(
    creds_env: EnvFactory, oauth2_idp: IdP
) -> None:
    env = await creds_env(renew_when_left=0.9, page_when_left="1s")
    data = await put_tokens(env, oauth2_idp, "later", expires_in=60)
    oauth2_idp.down = True
    await env.start()

    async def retried() -> bool:
        return len(await env.failed("later")) >= 2

    await wait_for(retried, timeout=15, what="retries while the IdP is down")
    failed = await env.failed("later")
    assert all(f.retryable and "HTTP 503" in f.error for f in failed)
    assert await env.user_notices("later") == []
    assert all(n.severity.value != "critical" for n in await env.oncall_notices("later"))
    assert (await env.data("later"))["refresh_token"] == data["refresh_token"]
    oauth2_idp.down = False
    await wait_for(lambda: env.renewed("later"), timeout=15, what="renewed once the IdP is back")
    assert oauth2_idp.authenticates((await env.data("later"))["access_token"].decode())
    assert oauth2_idp.reuse_detected == 0


async def test_one_scheduler_among_replicas_announces_each_due_credential_once(
    creds_env: EnvFactory, oauth2_idp: IdP
) -> None:
    """Two replicas, one Lease: every due credential is announced once and refreshed once."""
    env = await creds_env(renew_when_left=0.9, republish_after="60s")
    names = [f"tok-{i}" for i in range(5)]
    for name in names:
        await put_tokens(env, oauth2_idp, name, expires_in=30)
    oauth2_idp.expires_in = 3600  # renewed tokens are not due again during the test
    await env.start()
    await env.start()

    async def all_renewed() -> bool:
        return all([await env.renewed(n) for n in names])

    await wait_for(all_renewed, timeout=20, what="every credential renewed")
    await env.more_scans(3)  # by whichever replica leads
    dues = await read_stream(env.bus, "CREDENTIALS", f"credentials.due.{env.ns}.>")
    assert sorted(e.data.secret for e in dues) == sorted(names)
    assert oauth2_idp.refreshes == len(names)
    lease = await env.client.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/nodeward/leases/{env.lease}"
    )
    assert lease["spec"]["holderIdentity"]
