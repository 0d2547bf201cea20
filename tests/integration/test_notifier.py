"""services.notifier against real peers: SMTP (aiosmtpd, STARTTLS + AUTH), Alertmanager, HTTP
receivers for the chat and JSON webhooks, and the file outbox. What on-call would check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from nodeward.platform import UpContext
from schemas.notify import Severity
from services.notifier.service import _build_for_up
from tests.conftest import wait_for
from tests.integration.notifier_peers import (
    SMTP_PASSWORD,
    SMTP_USER,
    EnvFactory,
    NotifierEnv,
    Receiver,
    SmtpServer,
    oncall,
)


async def test_email_over_starttls_with_auth_reaches_oncall(
    notifier_env: EnvFactory,
    smtp_server: SmtpServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    password_file = tmp_path / "smtp-password"
    password_file.write_text(SMTP_PASSWORD + "\n")
    env = await notifier_env(
        channels={
            "mail": smtp_server.channel(
                tls="starttls",
                password_file=str(password_file),
                sender="nodeward <nodeward@example.org>",
                reply_to="ml-platform@example.org",
                to=["oncall@example.org"],
            )
        },
        routes=oncall("mail"),
    )
    await env.start()
    event = env.notice(
        "gpu-node-07 quarantined: GPU 3 fell off the bus (XID 79)",
        node="gpu-node-07",
        body="Tainted nodeward.io/gpu-unhealthy:NoSchedule and cordoned.",
    )
    await env.publish(event)
    await wait_for(lambda: smtp_server.mails, timeout=10, what="the mail")
    mail = smtp_server.mails[0]
    assert mail.recipients == ["oncall@example.org"]
    assert mail.sender == "nodeward@example.org"
    assert mail.message["Reply-To"] == "ml-platform@example.org"
    assert "gpu-node-07 quarantined: GPU 3 fell off the bus (XID 79)" in mail.subject
    assert "[nodeward critical]" in mail.subject
    assert "Tainted nodeward.io/gpu-unhealthy:NoSchedule and cordoned." in mail.body
    assert "node: gpu-node-07" in mail.body
    assert event.id in mail.body
    assert smtp_server.logins == [SMTP_USER]
    await wait_for(env.settled, timeout=5, what="the notice acked")
    assert env.metric("nodeward_notifications_sent_total", channel="mail", route="oncall") == 1
    await env.stop()  # its loggers write to the captured stderr
    assert SMTP_PASSWORD not in capsys.readouterr().err


async def test_alertmanager_shows_the_alert_with_labels(
    notifier_env: EnvFactory, alertmanager: str
) -> None:
    env = await notifier_env(
        channels={"am": {"type": "alertmanager", "url": alertmanager, "labels": {"team": "ml"}}},
        routes=[{"name": "page", "channels": ["am"]}],
    )
    await env.start()
    event = env.notice(
        "gpu-node-09 quarantined",
        node="gpu-node-09",
        body="GPU 0 failed: XID 79",
        dedup_key="quarantine/node/gpu-node-09",
    )
    await env.publish(event)

    async def shown() -> list[dict[str, Any]]:
        async with httpx.AsyncClient() as client:
            alerts = (await client.get(f"{alertmanager}/api/v2/alerts")).json()
        return [a for a in alerts if a["labels"].get("topic") == env.topic]

    alerts = await wait_for(shown, timeout=10, what="the alert in Alertmanager")
    assert len(alerts) == 1
    got = alerts[0]
    assert got["labels"] == {
        "alertname": "NodewardT" + env.topic.removeprefix("t-").capitalize(),
        "severity": "critical",
        "topic": env.topic,
        "node": "gpu-node-09",
        "route": "page",
        "source": "test/notifier",
        "dedup_key": "quarantine/node/gpu-node-09",
        "team": "ml",
    }
    assert got["annotations"]["summary"] == "gpu-node-09 quarantined"
    assert got["annotations"]["description"] == "GPU 0 failed: XID 79"
    assert got["annotations"]["event_id"] == event.id
    assert got["status"]["state"] == "active"
    assert got["startsAt"] < got["endsAt"]


async def test_chat_and_json_webhooks_receive_the_notice(
    notifier_env: EnvFactory, receiver: Receiver
) -> None:
    env = await notifier_env(
        channels={
            "chat": receiver.chat("/hooks/chat"),
            "hook": receiver.webhook("/hooks/json"),
        },
        routes=oncall("chat", "hook"),
    )
    await env.start()
    event = env.notice("gpu-node-11 quarantined", node="gpu-node-11", severity=Severity.WARNING)
    await env.publish(event)
    await wait_for(
        lambda: receiver.at("/hooks/chat") and receiver.at("/hooks/json"),
        timeout=10,
        what="both webhooks",
    )
    [chat] = receiver.at("/hooks/chat")
    assert set(chat) == {"text"}
    assert "gpu-node-11 quarantined" in chat["text"]
    assert ":warning:" in chat["text"]
    [hook] = receiver.at("/hooks/json")
    assert hook["route"] == "oncall"
    assert hook["count"] == 1
    assert hook["severity"] == "warning"
    [notice] = hook["notifications"]
    assert notice["id"] == event.id
    assert notice["type"] == "notify.v1"
    assert notice["data"]["title"] == "gpu-node-11 quarantined"
    assert notice["data"]["targets"][0]["name"] == "gpu-node-11"


async def test_replaced_template_is_used_and_outbox_file_appears(
    notifier_env: EnvFactory, tmp_path: Path
) -> None:
    templates = tmp_path / "my-templates"
    templates.mkdir()
    (templates / "subject.txt.j2").write_text("ACME GPU desk: {{ items[0].note.title }}\n")
    (templates / "oncall.txt.j2").write_text(
        "Dear on-call,\n{% for item in items %}* {{ item.note.title }}\n{% endfor %}-- ACME\n"
    )
    env = await notifier_env(templates_dir=str(templates))
    await env.start()
    await env.publish(env.notice("gpu-node-12 quarantined", node="gpu-node-12"))
    [path] = await wait_for(env.outbox_files, timeout=10, what="the outbox file")
    text = path.read_text()
    assert "Subject: ACME GPU desk: gpu-node-12 quarantined\n" in text
    assert "Dear on-call,\n* gpu-node-12 quarantined\n-- ACME\n" in text
    assert not list(env.outbox.glob(".tmp-*"))


async def test_nodeward_up_writes_the_outbox_under_the_state_dir(
    notifier_env: EnvFactory, tmp_path: Path
) -> None:
    env = await notifier_env()  # the default channels: the outbox without a dir
    state = tmp_path / "state"
    [daemon] = await _build_for_up(UpContext(env.settings, state, None, None))
    env.daemons.append(daemon)
    await daemon.start()
    first = env.notice("gpu-node-13 quarantined", node="gpu-node-13")
    await env.publish(first)
    [path] = await wait_for(
        lambda: sorted((state / "outbox").glob("*.txt")), timeout=10, what="outbox file"
    )
    text = path.read_text()
    assert "To: on-call" in text
    assert "gpu-node-13 quarantined" in text
    assert first.id in text
    second = env.notice("gpu-node-13 released", node="gpu-node-13")
    await env.publish(second)
    files = await wait_for(
        lambda: (f := sorted((state / "outbox").glob("*.txt"))) and len(f) == 2 and f,
        timeout=10,
        what="a second outbox file",
    )
    assert "released" in files[1].read_text()  # names sort by time


async def test_dry_run_writes_the_outbox_and_sends_nothing_external(
    notifier_env: EnvFactory, receiver: Receiver
) -> None:
    env = await notifier_env(
        channels={
            "chat": receiver.chat(),
            "outbox": {"type": "outbox"},
        },
        routes=oncall("chat", "outbox"),
        dry_run=True,
    )
    await env.start()
    await env.publish(env.notice("gpu-node-14 quarantined"))
    [path] = await wait_for(env.outbox_files, timeout=10, what="the outbox file")
    assert "Dry-Run: true" in path.read_text()
    await wait_for(env.settled, timeout=5, what="acked")
    assert receiver.at("/chat") == []
    assert env.metric("nodeward_notifications_sent_total", channel="chat", route="oncall") == 0


async def _repeat_suppressed(env: NotifierEnv, what: str) -> None:
    """One repeat recorded as suppressed on the oncall route, and everything acked."""
    await wait_for(
        lambda: env.metric("nodeward_notifications_suppressed_total", route="oncall") == 1,
        timeout=10,
        what=what,
    )
    await wait_for(env.settled, timeout=5, what="acked")


async def test_identical_repeat_within_the_dedup_window_is_recorded_not_resent(
    chat_env: NotifierEnv, receiver: Receiver
) -> None:
    env = chat_env
    await env.start()
    await env.first_chat(receiver, env.notice("gpu-node-15 quarantined", dedup_key="q/gpu-node-15"))
    await env.publish(env.notice("gpu-node-15 quarantined", dedup_key="q/gpu-node-15"))
    await _repeat_suppressed(env, "the repeat recorded")
    # Something new about the same node is sent.
    await env.publish(env.notice("gpu-node-15 released", dedup_key="q/gpu-node-15"))
    await wait_for(lambda: len(receiver.at("/chat")) == 2, timeout=10, what="the release")
    assert "released" in receiver.at("/chat")[1]["text"]


async def test_another_replica_knows_what_was_sent_within_the_dedup_window(
    chat_env: NotifierEnv, receiver: Receiver
) -> None:
    env = chat_env
    first = await env.start()
    await env.first_chat(receiver, env.notice("gpu-node-17 quarantined", dedup_key="q/gpu-node-17"))
    await wait_for(env.settled, timeout=5, what="acked")
    # Another replica (or this one restarted): its memory is empty, KV is not.
    await first.stop()
    env.daemons.remove(first)
    await env.start()
    await env.publish(env.notice("gpu-node-17 quarantined", dedup_key="q/gpu-node-17"))
    await _repeat_suppressed(env, "the repeat recognised by the other replica")
    assert len(receiver.at("/chat")) == 1


async def test_stopping_sends_open_groups_before_acking(notifier_env: EnvFactory) -> None:
    env = await notifier_env(grouping={"group_wait": "1h"})
    daemon = await env.start()
    # A warning waits for its digest (a critical notice would go out at once).
    await env.publish(env.notice("gpu-node-16 quarantined", severity=Severity.WARNING))

    async def held() -> bool:
        info = await env.bus.js.consumer_info("NOTIFY", env.consumer)
        return (info.num_ack_pending or 0) == 1

    await wait_for(held, timeout=10, what="the notice delivered, not acked")
    await wait_for(
        lambda: env.metric("nodeward_notifications_waiting") == 1,
        timeout=10,
        what="the notice waiting in its group",
    )
    assert env.outbox_files() == []
    await daemon.stop()
    [path] = env.outbox_files()
    assert "gpu-node-16 quarantined" in path.read_text()
    await wait_for(env.settled, timeout=5, what="acked before the connection closed")
