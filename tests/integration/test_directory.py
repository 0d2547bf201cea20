"""The directory service against a real OpenLDAP slapd, the sim cluster and real NATS:
namespaces learn their owner from LDAP (on creation and on schedule), paged past the
server's sizelimit, over StartTLS and ldaps; a refused bind, a server down and a bad entry
each said in one line; an owner gone is flagged once and cleared on return; nobody else's
labels are touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from schemas.directory import (
    EXPERIMENT,
    GROUP,
    KUBEFLOW_OWNER,
    OWNER,
    OWNER_EMAIL,
    OWNER_GID,
    OWNER_GROUPS,
    OWNER_LEFT,
    OWNER_NAME,
    OWNER_UID,
    SYNCED_AT,
    NamespaceOwner,
)
from sim.cluster.tls import make_serving_cert
from sim.ldap import User
from tests.conftest import wait_for
from tests.integration.ldap_peer import USERS, EnvFactory

pytestmark = [pytest.mark.timeout(90)]


def said_as(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in logs if line.get("event") == event]


async def test_a_namespace_created_with_an_owner_gets_its_labels_and_keeps_others(
    directory_env: EnvFactory,
) -> None:
    env = await directory_env(interval="1h")  # only the watch can sync what is created later
    daemon = await env.start()
    await wait_for(lambda: env.ready(daemon), what="the first sync")
    ns = env.ns("user-alice")
    await env.create(
        ns,
        labels={OWNER: "alice", "team": "vision", EXPERIMENT: "stale"},
        annotations={"note": "keep me"},
    )
    await wait_for(lambda: env.labelled(ns, OWNER_UID), what="the owner's labels")
    labels, annotations = await env.meta(ns)
    owner = NamespaceOwner.of(labels, annotations)
    assert owner.login == "alice" and owner.uid == 10001 and owner.gid == 5000
    assert owner.group == "physics"
    assert owner.experiment == "atlas-tile-cal"
    assert owner.email == "alice@example.org" and owner.name == "Alice Liddell"
    assert owner.groups == {"physics": 5000, "gpu-users": 5100}
    assert labels["team"] == "vision" and annotations["note"] == "keep me"
    assert SYNCED_AT in annotations and OWNER_LEFT not in annotations


async def test_a_kubeflow_profile_namespace_is_found_by_mail(directory_env: EnvFactory) -> None:
    env = await directory_env(interval="1h")
    daemon = await env.start()
    await wait_for(lambda: env.ready(daemon), what="the first sync")
    ns = env.ns("kubeflow-carol")
    await env.create(ns, annotations={KUBEFLOW_OWNER: "Carol@Example.org"})
    await wait_for(lambda: env.labelled(ns, OWNER, "carol"), what="the login written back")
    labels, annotations = await env.meta(ns)
    assert labels[OWNER_UID] == "10003" and labels[OWNER_GID] == "5001"
    assert labels[GROUP] == "computing"
    # carol has no departmentNumber: her experiment is her first e-group by name.
    assert labels[EXPERIMENT] == "atlas-ml"
    assert annotations[KUBEFLOW_OWNER] == "Carol@Example.org"
    assert annotations[OWNER_EMAIL] == "carol@example.org"


async def test_more_owners_than_the_sizelimit_are_read_page_by_page(
    directory_env: EnvFactory,
) -> None:
    """Seven owners, a server sizelimit of 5: one unpaged search would be refused
    (sizeLimitExceeded); the paged one (3 a page) reads them all on the scheduled sync."""
    env = await directory_env()
    names = {u.login: env.ns(f"user-{u.login}") for u in USERS}
    for login, ns in names.items():
        await env.create(ns, labels={OWNER: login})
    plain = env.slapd.search_as_bind(env.slapd.people, "(objectClass=posixAccount)")
    assert plain.returncode == 4, "the server should refuse an unpaged search of 7 entries"
    daemon = await env.start()
    await wait_for(lambda: env.ready(daemon), what="the first sync")
    for user in USERS:
        labels, _ = await env.meta(names[user.login])
        assert labels[OWNER_UID] == str(user.uid), user.login


@pytest.mark.parametrize("tls", ["starttls", "ldaps"])
async def test_tls_with_the_ca(directory_env: EnvFactory, tls: str) -> None:
    env = await directory_env()
    ns = env.ns("user-bob")
    await env.create(ns, labels={OWNER: "bob"})
    url = env.slapd.ldaps_url if tls == "ldaps" else env.slapd.url
    daemon = await env.start(url=url, starttls=tls == "starttls")
    await wait_for(lambda: env.labelled(ns, OWNER_UID, "10002"), what="bob's labels over TLS")
    labels, annotations = await env.meta(ns)
    assert labels[EXPERIMENT] == "cms"
    assert annotations[OWNER_GROUPS] == "admins=5200,gpu-users=5100,physics=5000"
    assert await env.ready(daemon)


async def test_a_server_certificate_from_another_ca_is_refused(
    directory_env: EnvFactory, tmp_path: Path
) -> None:
    other = tmp_path / "other-ca.crt"
    other.write_bytes(make_serving_cert("127.0.0.1").ca_pem)
    env = await directory_env()
    ns = env.ns("user-bob")
    await env.create(ns, labels={OWNER: "bob"})
    with capture_logs() as logs:
        daemon = await env.start(url=env.slapd.ldaps_url, ca_file=str(other))
        await env.more_syncs(3, outcome="failed")
        assert not await env.ready(daemon)
    assert not await env.labelled(ns, OWNER_UID)
    said = said_as(logs, "directory.unavailable")
    assert len(said) == 1, said
    assert env.slapd.ldaps_url in said[0]["error"]


async def test_a_wrong_bind_password_is_one_clear_line_then_recovers(
    directory_env: EnvFactory, tmp_path: Path
) -> None:
    password = tmp_path / "wrong-password"
    password.write_text("not-the-password\n")
    env = await directory_env(bind_password_file=str(password))
    ns = env.ns("user-erin")
    await env.create(ns, labels={OWNER: "erin"})
    with capture_logs() as logs:
        daemon = await env.start()
        await env.more_syncs(4, outcome="failed")
        assert not await env.ready(daemon), "readiness must say the directory cannot be read"
    assert not await env.labelled(ns, OWNER_UID)
    said = said_as(logs, "directory.unavailable")
    assert len(said) == 1, said
    assert said[0]["cause"] == "bind" and "Invalid credentials" in said[0]["error"]
    assert env.slapd.bind_dn in said[0]["error"]
    assert env.slapd.bind_password not in str(logs)
    # The Secret is fixed (the file is re-read at each bind): synced, ready.
    password.write_text(env.slapd.bind_password)
    await wait_for(lambda: env.labelled(ns, OWNER_UID, "10005"), what="erin's labels")
    await wait_for(lambda: env.ready(daemon), what="ready again")


async def test_server_down_keeps_the_labels_and_recovers(directory_env: EnvFactory) -> None:
    env = await directory_env()
    ns = env.ns("user-frank")
    await env.create(ns, labels={OWNER: "frank"})
    daemon = await env.start()
    await wait_for(lambda: env.labelled(ns, OWNER_UID, "10006"), what="frank's labels")
    before = await env.meta(ns)
    with capture_logs() as logs:
        env.slapd.stop()
        await env.more_syncs(3, outcome="failed")
        assert not await env.ready(daemon)
    assert daemon.started, "the daemon keeps running"
    assert await env.meta(ns) == before, "the last known labels stay, nothing is flagged"
    said = said_as(logs, "directory.unavailable")
    assert len(said) == 1 and said[0]["cause"] == "unreachable", said
    env.slapd.restart()
    await wait_for(lambda: env.ready(daemon), timeout=15, what="ready again")
    assert not await env.annotated(ns, OWNER_LEFT)


async def test_a_bad_entry_is_one_line_and_the_others_go_on(directory_env: EnvFactory) -> None:
    """uidNumber read from a text attribute (employeeNumber): one entry says "ten"."""
    env = await directory_env(attributes={"uid": "employeeNumber"})
    env.slapd.add_users(
        [
            User("henry", 10008, 5000, extra=(("employeeNumber", "ten"),)),
            User("ivy", 10009, 5000, extra=(("employeeNumber", "10009"),)),
        ]
    )
    bad, good = env.ns("user-henry"), env.ns("user-ivy")
    await env.create(bad, labels={OWNER: "henry", OWNER_UID: "10008"})
    await env.create(good, labels={OWNER: "ivy"})
    with capture_logs() as logs:
        daemon = await env.start()
        await wait_for(lambda: env.labelled(good, OWNER_UID, "10009"), what="ivy's labels")
        await env.more_syncs(3)
        assert await env.ready(daemon)
    labels, annotations = await env.meta(bad)
    assert labels[OWNER_UID] == "10008" and OWNER_LEFT not in annotations
    said = said_as(logs, "directory.bad_entry")
    assert len(said) == 1, said
    assert "employeeNumber 'ten' is not a number" in said[0]["error"]
    assert "uid=henry" in said[0]["error"] and said[0]["namespace"] == bad


async def test_an_owner_who_left_is_flagged_once_and_cleared_on_return(
    directory_env: EnvFactory,
) -> None:
    env = await directory_env()
    ns, other = env.ns("user-grace"), env.ns("user-alice")
    await env.create(ns, labels={OWNER: "grace", "team": "compilers"}, annotations={"n": "1"})
    await env.create(other, labels={OWNER: "alice"})
    daemon = await env.start()
    await wait_for(lambda: env.labelled(ns, OWNER_UID, "10007"), what="grace's labels")
    synced = await env.meta(ns)

    env.slapd.delete(env.slapd.user_dn("grace"))
    await wait_for(lambda: env.annotated(ns, OWNER_LEFT), what="the flag")
    notices = await wait_for(lambda: env.oncall(ns), what="on-call's notice")
    await env.more_syncs(5)
    # A restart (the flag is the record; the audit is found stored): still told once.
    await env.stop(daemon)
    daemon = await env.start()
    await env.more_syncs(3)
    notices = await env.oncall(ns)
    assert len(notices) == 1, [n.title for n in notices]
    told = notices[0]
    assert told.severity == "warning" and not told.resolves
    assert "grace" in told.title and "no longer in the directory" in told.body
    assert "left as they are" in told.body
    labels, annotations = await env.meta(ns)
    assert {k: v for k, v in labels.items()} == synced[0], "nothing removed while flagged"
    assert annotations[OWNER_EMAIL] == "grace@example.org" and annotations["n"] == "1"
    assert not await env.annotated(other, OWNER_LEFT), "only grace's namespace is flagged"
    assert await env.oncall(other) == []

    env.slapd.add_users([next(u for u in USERS if u.login == "grace")])
    await wait_for(lambda: env.annotated(ns, OWNER_LEFT, present=False), what="the flag cleared")

    async def returned() -> bool:
        return any(n.resolves for n in await env.oncall(ns))

    await wait_for(returned, what="the return told")
    await env.more_syncs(3)
    notices = await env.oncall(ns)
    assert len(notices) == 2 and notices[1].resolves and notices[1].severity == "info"
    labels, annotations = await env.meta(ns)
    assert labels["team"] == "compilers" and labels[OWNER_UID] == "10007"
    assert annotations[OWNER_NAME] == "Grace Hopper"


async def test_without_a_url_it_idles_ready(directory_env: EnvFactory) -> None:
    """As `nodeward up` runs it until it is given a directory: ready, touching nothing."""
    env = await directory_env(url=None, bind_dn=None, bind_password_file=None)
    ns = env.ns("user-alice")
    await env.create(ns, labels={OWNER: "alice"})
    daemon = await env.start()
    await wait_for(lambda: env.ready(daemon), what="ready")
    assert not await env.labelled(ns, OWNER_UID)
    # No sync yet, none failed: each scope's and outcome's series is there, at 0.
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(f"{daemon.url}/metrics")).text
    for scope in ("full", "new"):
        for outcome in ("ok", "failed"):
            series = f'{{outcome="{outcome}",scope="{scope}"}}'
            assert f"nodeward_directory_syncs_total{series} 0.0" in scraped


async def test_dry_run_writes_nothing_and_tells_no_one(directory_env: EnvFactory) -> None:
    env = await directory_env(interval="0.3s", dry_run=True)
    known, gone = env.ns("user-alice"), env.ns("user-nobody")
    await env.create(known, labels={OWNER: "alice"})
    await env.create(gone, labels={OWNER: "nobody-at-all"})
    with capture_logs() as logs:
        daemon = await env.start()
        await wait_for(lambda: env.ready(daemon), what="the first sync")
        await env.more_syncs(2)
    labels, annotations = await env.meta(known)
    assert OWNER_UID not in labels and SYNCED_AT not in annotations
    assert OWNER_LEFT not in (await env.meta(gone))[1]
    assert await env.oncall(gone) == []
    would = said_as(logs, "directory.would_write")
    assert any(e["labels"].get(OWNER_UID) == "10001" for e in would), would
    assert [e["namespace"] for e in said_as(logs, "directory.would_flag")][:1] == [gone]
