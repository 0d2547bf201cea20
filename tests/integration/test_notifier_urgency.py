"""Routing by urgency through a running notifier on NATS: a page during a storm of info
notices reaches on-call at once, users' notices reach each user apart and never on-call,
and the end of an incident resolves its alerts in a real Alertmanager."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from schemas.notify import Severity
from tests.conftest import wait_for
from tests.integration.notifier_peers import EnvFactory

ROUTES = [
    {"name": "users", "match": {"audience": ["user"]}, "to_owner": True, "channels": ["outbox"]},
    {"name": "oncall", "channels": ["outbox"]},
]


def headed(files: list[Path], line: str) -> list[str]:
    texts = [p.read_text() for p in files]
    return [t for t in texts if line in t.splitlines()]


async def test_a_page_during_a_storm_of_info_notices_goes_out_at_once(
    notifier_env: EnvFactory,
) -> None:
    env = await notifier_env(
        routes=ROUTES,
        grouping={"group_wait": "3s", "group_interval": "2m", "dedup_window": "10m"},
    )
    await env.start()
    storm = [
        env.notice(f"ml-{i:03d}/explore-0 idle", severity=Severity.INFO, dedup_key=f"idle/{i}")
        for i in range(500)
    ]
    await env.publish(*storm)
    page = env.notice(
        "gpu-h100-03: quarantine applied",
        node="gpu-h100-03",
        incident="gpu-health/node/gpu-h100-03",
    )
    published = time.monotonic()
    await env.publish(page)
    [path] = await wait_for(env.outbox_files, timeout=5, interval=0.01, what="the page")
    took = time.monotonic() - published
    text = path.read_text()
    assert "Subject: [nodeward critical] gpu-h100-03: quarantine applied" in text
    assert "To: on-call" in text and "Notices: 1" in text
    # The first mail out, alone: not held for the storm's 3 s group_wait.
    print(f"the page took {took:.2f}s (group_wait 3s)")
    # The storm is still one digest, later.
    await wait_for(lambda: len(env.outbox_files()) == 2, timeout=15, what="the digest")
    [digest] = [p.read_text() for p in env.outbox_files() if p != path]
    assert "Notices: 500" in digest and "Severity: info" in digest
    await wait_for(env.settled, timeout=10, what="everything acked")


async def test_each_users_notice_reaches_that_user_alone(notifier_env: EnvFactory) -> None:
    env = await notifier_env(
        routes=[
            # On-call's route first, continuing: a user's notice still never takes it.
            {"name": "oncall-first", "channels": ["outbox"], "continue": True},
            *ROUTES,
        ],
        grouping={"group_wait": "0.5s", "group_interval": "2m", "dedup_window": "10m"},
    )
    await env.start()
    users = [f"ml-{n}/{n}-explore-0" for n in ("alice", "bob", "carol", "dave", "erin", "frank")]
    await env.publish(
        *[
            env.notice(
                f"Your notebook {u.split('/')[1]} will be stopped",
                severity=Severity.WARNING,
                audience=f"user:{u}",
            )
            for u in users
        ]
    )
    await wait_for(lambda: len(env.outbox_files()) >= 6, timeout=10, what="six messages")
    await wait_for(env.settled, timeout=5, what="acked")
    files = env.outbox_files()
    assert len(files) == 6
    assert headed(files, "To: on-call") == []
    for user in users:
        [mine] = headed(files, f"To: the owner of {user} (no address on record)")
        assert "Notices: 1" in mine and f"Your notebook {user.split('/')[1]}" in mine
    # A critical one for a user who was just told something goes out at once as well.
    started = time.monotonic()
    await env.publish(
        env.notice(
            "Security alert on your pod bob-explore-0",
            audience="user:ml-bob/bob-explore-0",
            incident="security/pod/ml-bob/bob-explore-0",
        )
    )
    # Within the 2 m group_interval of bob's digest: not held by it.
    await wait_for(lambda: len(env.outbox_files()) == 7, timeout=20, what="bob's page")
    print(f"bob's page took {time.monotonic() - started:.2f}s (group_interval 2m)")
    [page] = headed(env.outbox_files(), "Subject: Security alert on your pod bob-explore-0")
    assert "To: the owner of ml-bob/bob-explore-0 (no address on record)" in page


async def _active(alertmanager: str, topic: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient() as client:
        alerts = (await client.get(f"{alertmanager}/api/v2/alerts")).json()
    return [a for a in alerts if a["labels"].get("topic") == topic]


async def test_release_resolves_the_quarantines_alerts_and_only_those(
    notifier_env: EnvFactory, alertmanager: str
) -> None:
    env = await notifier_env(
        channels={"am": {"type": "alertmanager", "url": alertmanager, "labels": {"team": "ml"}}},
        routes=[
            {"name": "page", "match": {"severity": ["critical"]}, "channels": ["am"]},
            {"name": "ends", "match": {"resolves": True}, "channels": ["am"]},
            {"name": "rest", "channels": ["am"]},
        ],
    )
    await env.start()

    def am(node: str, action: str, severity: Severity = Severity.CRITICAL, **fields: Any) -> Any:
        """A notice as the kernel's auditor makes one: `<node>: <action> ...`, keyed."""
        outcome = "pending" if severity == Severity.WARNING else "applied"
        return env.notice(
            f"{node}: {action} {outcome}",
            severity=severity,
            node=node,
            dedup_key=f"{action}/node/{node}",
            **fields,
        )

    one, two = "gpu-health/node/gpu-am-01", "gpu-health/node/gpu-am-02"
    await env.publish(
        am("gpu-am-01", "quarantine", incident=one),
        am("gpu-am-01", "drain", incident=one),
        am("gpu-am-02", "quarantine", incident=two),
    )

    async def firing() -> dict[str, list[dict[str, Any]]]:
        alerts = await _active(alertmanager, env.topic)
        by: dict[str, list[dict[str, Any]]] = {}
        for a in alerts:
            by.setdefault(a["labels"]["incident"], []).append(a)
        return by

    await wait_for(lambda: _len(firing(), {one: 2, two: 1}), timeout=10, what="three alerts firing")
    fired = {a["fingerprint"]: a["labels"] for a in (await firing())[one]}
    # Neither a notice that ends another incident nor a plain one about this node resolves it.
    await env.publish(
        am(
            "gpu-am-09",
            "release",
            Severity.INFO,
            incident="gpu-health/node/gpu-am-09",
            resolves=True,
        ),
        am("gpu-am-01", "release", Severity.WARNING, incident=one),
    )
    await wait_for(lambda: _len(firing(), {one: 3, two: 1}), timeout=10, what="the warning")
    await wait_for(env.settled, timeout=5, what="acked")
    assert {a["fingerprint"] for a in (await firing())[one]} >= set(fired)
    # The release of gpu-am-01 resolves its three alerts, and fires none of its own.
    await env.publish(am("gpu-am-01", "release", Severity.INFO, incident=one, resolves=True))
    await wait_for(lambda: _len(firing(), {two: 1}), timeout=10, what="gpu-am-01's alerts resolved")
    await wait_for(env.settled, timeout=5, what="acked")
    assert [a["labels"]["node"] for a in await _active(alertmanager, env.topic)] == ["gpu-am-02"]
    # Resolved under the same labels: Alertmanager ended the same alerts (by fingerprint).
    async with httpx.AsyncClient() as client:
        groups = (await client.get(f"{alertmanager}/api/v2/alerts/groups")).json()
    listed = {a["fingerprint"] for g in groups for a in g["alerts"]}
    assert not set(fired) & listed


async def _len(found: Any, want: dict[str, int]) -> bool:
    got = await found
    return {k: len(v) for k, v in got.items()} == want
