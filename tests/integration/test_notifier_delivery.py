"""services.notifier delivery semantics: a storm becomes one message per route, a dead channel
dead-letters with the reason while the others deliver (each channel's failures counted from
0), bad input goes to the DLQ, a redelivered notice is not sent twice, and a user's notice
reaches its owner."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from nats.js.errors import NotFoundError

from nodeward.bus.server import free_port
from nodeward.config import ClusterSettings
from nodeward.kube import Cluster
from nodeward.kube.client import MERGE_PATCH, KubeClient
from schemas import encode
from schemas.dlq import DeadLetter
from schemas.notify import Severity
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, PodSeed, Seed
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.notifier_peers import (
    SMTP_PASSWORD,
    EnvFactory,
    NotifierEnv,
    Receiver,
    SmtpServer,
    oncall,
)


async def dead_letters(env: Any) -> list[DeadLetter]:
    """What the notifier dead-lettered: from either of its consumers."""
    found = []
    for consumer in env.consumers:
        found += await read_stream(env.bus, "DLQ", f"dlq.NOTIFY.{consumer}")
    return [e.data for e in found]


async def test_storm_of_300_sends_one_digest_per_route_and_pages_over_the_limit_together(
    notifier_env: EnvFactory, receiver: Receiver
) -> None:
    env = await notifier_env(
        channels={
            "outbox": {"type": "outbox"},
            "chat": receiver.chat(),
            "hook": receiver.webhook("/hook"),
        },
        routes=[
            {"name": "critical", "match": {"severity": ["critical"]}, "channels": ["chat"]},
            {"name": "rest", "channels": ["hook", "outbox"]},
        ],
        grouping={"group_wait": "3s", "group_interval": "1m", "dedup_window": "10m"},
        # Three pages at once, then one a second: the 197 others wait together.
        rate_limit={"per_hour": 3600, "burst": 3},
    )
    await env.start()
    storm = [
        env.notice(
            f"gpu-storm-{i:03d} quarantined",
            node=f"gpu-storm-{i:03d}",
            severity=Severity.CRITICAL if i < 200 else Severity.WARNING,
            dedup_key=f"quarantine/node/gpu-storm-{i:03d}",
        )
        for i in range(300)
    ]
    await env.publish(*storm)
    await wait_for(
        lambda: receiver.at("/chat") and receiver.at("/hook") and env.outbox_files(),
        timeout=20,
        what="the pages and the digest",
    )
    await wait_for(env.settled, timeout=10, what="all 300 notices acked")
    # The pages are one storm of one topic: grouped as they come (within critical_wait),
    # three messages at most on the burst, the rest together once a token is free.
    chats = receiver.at("/chat")
    assert 1 <= len(chats) <= 4, [c["text"][:80] for c in chats]
    grouped = env.metric("nodeward_notifications_grouped_total", route="critical")
    assert grouped + len(chats) == 200  # every page in exactly one message
    assert all(": gpu-storm-" in c["text"].splitlines()[0] for c in chats), chats[0]["text"]
    assert len(receiver.at("/hook")) == 1
    assert len(env.outbox_files()) == 1
    [hook] = receiver.at("/hook")
    assert hook["count"] == 100
    assert {n["id"] for n in hook["notifications"]} == {e.id for e in storm[200:]}
    text = env.outbox_files()[0].read_text()
    assert "Notices: 100" in text
    assert "... and 75 more" in text
    assert env.metric("nodeward_notifications_grouped_total", route="rest") == 99
    sent = env.metric("nodeward_notifications_sent_total", channel="chat", route="critical")
    assert sent == len(chats)


async def test_dead_channel_dead_letters_with_reason_and_others_deliver(
    notifier_env: EnvFactory, receiver: Receiver
) -> None:
    env = await notifier_env(
        channels={
            # A port bound, then released: nothing listens on it.
            "pager": {"type": "webhook", "url": f"http://127.0.0.1:{free_port()}/hook"},
            "chat": receiver.chat(),
            "outbox": {"type": "outbox"},
        },
        routes=oncall("pager", "chat", "outbox"),
    )
    daemon = await env.start()
    # Before anything failed, each channel's failures and dead letters are scraped at 0:
    # the first failure is an increase Prometheus sees.
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(f"{daemon.url}/metrics")).text
    for channel in ("pager", "chat", "outbox"):
        for family in ("failed", "dead_lettered"):
            assert f'nodeward_notifications_{family}_total{{channel="{channel}"}} 0.0' in scraped
    incident = "gpu-health/rack/r-dead"  # one incident: one message
    events = [
        env.notice(f"gpu-dead-{i} quarantined", node=f"gpu-dead-{i}", incident=incident)
        for i in range(2)
    ]
    await env.publish(*events)
    await wait_for(lambda: receiver.at("/chat") and env.outbox_files(), timeout=10, what="sent")
    letters = await wait_for(
        lambda: _at_least(dead_letters(env), 2), timeout=10, what="two dead letters"
    )
    assert sorted(d.original_headers["ce-id"] for d in letters) == sorted(e.id for e in events)
    for letter in letters:
        assert letter.consumer == env.consumer
        assert letter.stream == "NOTIFY"
        assert letter.error.startswith("channel pager: not delivered after 3 attempt(s): ")
        assert letter.reason.value == "exhausted"
        assert "ConnectError" in letter.error
        assert letter.original_subject == f"notify.critical.{env.topic}"
    await wait_for(env.settled, timeout=5, what="the notices acked")
    assert "gpu-dead-0 quarantined" in receiver.at("/chat")[0]["text"]
    assert env.metric("nodeward_notifications_failed_total", channel="pager") == 3
    assert env.metric("nodeward_notifications_dead_lettered_total", channel="pager") == 2
    assert env.metric("nodeward_notifications_sent_total", channel="chat", route="oncall") == 1
    # Later notices still go out on the live channels.
    await env.publish(env.notice("gpu-dead-9 quarantined", node="gpu-dead-9"))
    await wait_for(lambda: len(receiver.at("/chat")) == 2, timeout=10, what="a later notice")


async def _at_least(found: Any, n: int) -> Any:
    items = await found
    return items if len(items) >= n else None


async def test_bad_input_goes_to_the_dlq_and_the_notifier_keeps_going(
    notifier_env: EnvFactory,
) -> None:
    env = await notifier_env()
    await env.start()
    good = env.notice("gpu-ok quarantined")
    wire = encode(good)
    # No title: fails validation at the edge.
    await env.bus.js.publish(
        wire.subject,
        b'{"severity": "critical", "topic": "' + env.topic.encode() + b'"}',
        headers={**wire.headers, "ce-id": "bad-1", "Nats-Msg-Id": "bad-1"},
    )
    bad_audience = env.notice("for nobody", audience="user:no-slash")
    await env.publish(bad_audience, good)
    letters = await wait_for(
        lambda: _at_least(dead_letters(env), 2), timeout=10, what="two dead letters"
    )
    by_id = {d.original_headers["ce-id"]: d for d in letters}
    assert by_id["bad-1"].reason.value == "invalid"
    assert "title" in by_id["bad-1"].error
    assert by_id[bad_audience.id].reason.value == "permanent"
    assert "user:no-slash" in by_id[bad_audience.id].error
    [path] = await wait_for(env.outbox_files, timeout=10, what="the good notice delivered")
    assert "gpu-ok quarantined" in path.read_text()


async def test_redelivered_notice_is_not_sent_twice(
    chat_env: NotifierEnv, receiver: Receiver
) -> None:
    env = chat_env
    await env.start()
    event = env.notice("gpu-once quarantined")
    await env.first_chat(receiver, event)
    await wait_for(env.settled, timeout=5, what="acked")
    # The same event again as JetStream would redeliver it (a new message id gets past the
    # stream's duplicate window, as a redelivery after a lost ack would).
    critical = env.consumer + "-critical"  # a critical notice's consumer
    info = await env.bus.js.consumer_info("NOTIFY", critical)
    delivered = info.delivered.stream_seq
    wire = encode(event)
    await env.bus.js.publish(
        wire.subject, wire.body, headers={**wire.headers, "Nats-Msg-Id": "again-" + event.id}
    )

    async def handled_again() -> bool:
        now = await env.bus.js.consumer_info("NOTIFY", critical)
        return now.delivered.stream_seq > delivered and await env.settled()

    # A notice is acked only once every channel has settled it, so once the repeat is
    # acked any second send would already have reached the receiver.
    await wait_for(handled_again, timeout=10, what="the repeat handled and acked")
    assert len(receiver.at("/chat")) == 1


async def test_users_notice_is_mailed_to_the_owner_kindly(
    notifier_env: EnvFactory, smtp_server: SmtpServer, tmp_path: Path
) -> None:
    seed = Seed(
        namespaces=["nodeward"],
        nodes=[NodeSeed(name="gpu-u-01")],
        pods=[
            PodSeed(
                name="jupyter-alice-0",
                namespace="ml-alice",
                node="gpu-u-01",
                role="notebook",
                annotations={"nodeward.io/owner-email": "alice@example.org"},
            ),
            PodSeed(name="jupyter-bob-0", namespace="ml-bob", node="gpu-u-01", role="notebook"),
        ],
    )
    async with SimCluster(seed, port=0) as sim:
        admin_config = ClusterSettings(kubeconfig=sim.write_kubeconfig(tmp_path / "admin"))
        admin = Cluster(KubeClient.from_settings(admin_config))
        await admin.client.request(
            "PATCH",
            "/api/v1/namespaces/ml-bob",
            body={"metadata": {"annotations": {"nodeward.io/owner-email": "bob@example.org"}}},
            content_type=MERGE_PATCH,
        )
        await admin.close()
        password = tmp_path / "pw"
        password.write_text(SMTP_PASSWORD)
        env = await notifier_env(
            channels={
                "mail": smtp_server.channel(password_file=str(password)),
                "outbox": {"type": "outbox"},
            },
            routes=[
                {
                    "name": "users",
                    "match": {"audience": ["user"]},
                    "to_owner": True,
                    "channels": ["mail", "outbox"],
                }
            ],
            cluster={
                "kubeconfig": str(sim.write_kubeconfig(tmp_path / "nk", identity="notifier")),
                "retries": 1,
            },
        )
        await env.start()
        deadline = datetime.now(UTC) + timedelta(minutes=30)
        alice = env.notice(
            "Your notebook jupyter-alice-0 has been idle for 2 hours",
            severity=Severity.WARNING,
            audience="user:ml-alice/jupyter-alice-0",
            why="It holds an H100 GPU that other people are waiting for.",
            what_you_can_do=["Run a cell or open the notebook to keep it.", "Save your work."],
            deadline=deadline,
        )
        bob = env.notice(
            "Your notebook jupyter-bob-0 is idle",
            severity=Severity.WARNING,
            audience="user:ml-bob/jupyter-bob-0",
        )
        await env.publish(alice, bob)
        await wait_for(lambda: len(smtp_server.mails) >= 2, timeout=10, what="two mails")
        await wait_for(env.settled, timeout=5, what="acked")
    mails = {m.recipients[0]: m for m in smtp_server.mails}
    assert set(mails) == {"alice@example.org", "bob@example.org"}  # pod, then namespace
    body = mails["alice@example.org"].body
    assert mails["alice@example.org"].subject == (
        "Your notebook jupyter-alice-0 has been idle for 2 hours"
    )
    assert "What happened\n  Your notebook jupyter-alice-0 has been idle for 2 hours" in body
    assert "Why\n  It holds an H100 GPU that other people are waiting for." in body
    assert "What you can do\n  - Run a cell or open the notebook to keep it.\n" in body
    assert "  - Save your work.\n" in body
    assert f"this will happen at {deadline:%Y-%m-%d %H:%M:%S} UTC (in 30 minutes)" in body
    assert "Opting out or asking for an exemption" in body
    assert "nodeward.io/exempt=true" in body
    assert "jupyter-alice-0 in namespace ml-alice" in body
    bob_body = mails["bob@example.org"].body
    assert "Nothing further will happen automatically." in bob_body
    outbox = "\n".join(p.read_text() for p in env.outbox_files())
    assert "To: alice@example.org" in outbox and "To: bob@example.org" in outbox


async def test_owner_from_the_directory_and_nobody_on_record_dead_letters_the_mail_only(
    notifier_env: EnvFactory, smtp_server: SmtpServer, tmp_path: Path
) -> None:
    directory = tmp_path / "owners.yaml"
    directory.write_text("ml-carol: carol@example.org\n")
    env = await notifier_env(
        channels={
            "mail": smtp_server.channel(password=SMTP_PASSWORD),
            "outbox": {"type": "outbox"},
        },
        routes=[{"name": "users", "to_owner": True, "channels": ["mail", "outbox"]}],
        owner_directory=str(directory),
    )
    await env.start()
    carol = env.notice("idle", audience="user:ml-carol/pod-0")
    nobody = env.notice("idle too", audience="user:ml-nobody/pod-0")
    oncall = env.notice("for on-call, on the same route")  # no owner: the channel's `to`
    await env.publish(carol, nobody, oncall)
    letters = await wait_for(lambda: dead_letters(env), timeout=10, what="a dead letter")
    await wait_for(lambda: _at_least(dead_letters(env), 2), timeout=10, what="two dead letters")
    letters = await dead_letters(env)
    errors = {d.original_headers["ce-id"]: d.error for d in letters}
    assert set(errors) == {nobody.id, oncall.id}
    assert "has no `to` addresses" in errors[oncall.id]  # not mixed up with nobody's group
    letters = [d for d in letters if d.original_headers["ce-id"] == nobody.id]
    assert letters[0].error.startswith("channel mail: not delivered after 1 attempt(s): no owner")
    assert letters[0].reason.value == "permanent"
    await wait_for(lambda: smtp_server.mails, timeout=10, what="carol's mail")
    assert smtp_server.mails[0].recipients == ["carol@example.org"]
    await wait_for(lambda: len(env.outbox_files()) == 3, timeout=5, what="all in the outbox")
    await wait_for(env.settled, timeout=5, what="acked")
    assert env.metric("nodeward_notifications_failed_total", channel="mail") == 2


async def test_a_notice_held_by_a_killed_notifier_is_delivered_after_restart(
    notifier_env: EnvFactory, nats_url: str, tmp_path: Path
) -> None:
    """At-least-once across a crash: the notice waits unacked in its group, the process is
    killed (no shutdown hooks), and the next notifier gets it again after ack_wait."""
    import json
    import os
    import signal
    import subprocess
    import sys

    env = await notifier_env(ack_wait="1s")
    service = dict(env.settings.services["notifier"])
    service["grouping"] = {"group_wait": "1h"}
    config = tmp_path / "crash.yaml"
    config.write_text(json.dumps({"services": {"notifier": service}}))  # JSON is YAML
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch", "service", "notifier", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ | {"NODEWARD_NATS_URL": nats_url},
        cwd=tmp_path,
    )
    try:

        async def held() -> bool:
            info = await env.bus.js.consumer_info("NOTIFY", env.consumer)
            return (info.num_ack_pending or 0) == 1

        async def bound() -> bool:
            try:
                await env.bus.js.consumer_info("NOTIFY", env.consumer)
            except NotFoundError:
                return False
            return True

        await wait_for(bound, timeout=30, interval=0.1, what="the notifier's consumer")
        # A warning: it waits for its digest (a critical one would go out at once).
        event = env.notice("gpu-crash quarantine pending", severity=Severity.WARNING)
        await env.publish(event)
        await wait_for(held, timeout=10, what="the notice held in its group")
    finally:
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait, 10)
    assert env.outbox_files() == []
    await env.start()  # group_wait 0.2s
    [path] = await wait_for(env.outbox_files, timeout=15, what="the notice after the crash")
    assert event.id in path.read_text()
    await wait_for(env.settled, timeout=5, what="acked")
