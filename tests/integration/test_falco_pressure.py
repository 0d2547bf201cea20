"""services.falco under a flood: a Critical alert is never queued behind Notices, and the
ingest pushes back on low priorities while it keeps taking critical ones."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from structlog.testing import capture_logs

from schemas.falco import FalcoAlert, FalcoPriority
from schemas.remediation import Outcome
from services.falco.service import FalcoService
from services.falco.settings import FalcoSettings
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.falco_fixtures import DROP_AND_EXECUTE, EnvFactory, FalcoEnv

NOTICE_RULE = "Terminal shell in container"
BOB = "bob-llm-finetune-6d5f9c7b8d-q8wzr"


def flood(env: FalcoEnv, count: int) -> list[dict[str, Any]]:
    """`count` distinct Notice alerts (a different command each: no duplicate window hits)."""
    out = []
    for i in range(count):
        alert = env.alert(NOTICE_RULE, proc__cmdline=f"bash #{i}")
        alert["output"] = f"{alert['output']} run={i}"
        alert["uuid"] = f"00000000-0000-4000-8000-{i:012d}"
        out.append(alert)
    return out


def hold_notices(service: FalcoService) -> asyncio.Event:
    """Every Notice's handling waits until the returned gate is set."""
    gate = asyncio.Event()
    respond = service.respond

    async def held(event: Any, alert: FalcoAlert, *, sequence: int | None = None) -> Any:
        if alert.priority is FalcoPriority.NOTICE:
            await gate.wait()
        return await respond(event, alert, sequence=sequence)

    service.respond = held  # type: ignore[method-assign]
    return gate


async def backlog(env: FalcoEnv, consumer: str) -> int:
    info = await env.bus.js.consumer_info("SECURITY", consumer)
    return (info.num_pending or 0) + (info.num_ack_pending or 0)


def test_the_lanes_split_by_priority() -> None:
    lanes = FalcoSettings().lanes()
    assert lanes == [
        (
            "falco-urgent",
            [f"falco.{p}.>" for p in ("emergency", "alert", "critical", "error", "warning")],
        ),
        ("falco", ["falco.notice.>", "falco.informational.>", "falco.debug.>"]),
    ]
    assert FalcoSettings(urgent_from="Critical").lanes()[0][1][-1] == "falco.critical.>"
    # Subjects whose priority cannot be told: one consumer, as before.
    assert FalcoSettings(subjects=["falco.*.*.x"]).lanes()[0][0] == "falco-urgent"
    assert FalcoSettings(subjects=["security.>"]).lanes() == [("falco", ["security.>"])]


async def test_a_critical_alert_is_acted_on_while_every_notice_handler_is_busy(
    falco_env: EnvFactory,
) -> None:
    env = await falco_env()
    urgent, bulk = env.consumers()
    # Every Notice handler blocks until the gate opens: the flood is as slow as it can be.
    gate = hold_notices((await env.start()).service)
    for alert in flood(env, 200):
        await env.publish_raw(alert)
    busy = env.settings.services["falco"].get("concurrency", 16)

    async def all_busy() -> bool:
        info = await env.bus.js.consumer_info("SECURITY", bulk)
        return (info.num_ack_pending or 0) >= busy

    await wait_for(all_busy, timeout=30, what="every Notice worker busy")
    began = time.monotonic()
    await env.publish_raw(env.alert(DROP_AND_EXECUTE))
    bob_ns = env.ns("user-bob")

    async def isolated() -> bool:
        return any(r.outcome is Outcome.APPLIED for r in await env.audits(bob_ns, BOB, "isolate"))

    # With one consumer for every priority it would wait for the gate: forever.
    await wait_for(isolated, timeout=30, what="the Critical alert's isolation")
    print(f"isolated {time.monotonic() - began:.2f}s after the Critical alert")
    assert await backlog(env, bulk) == 200  # not one Notice handled meanwhile
    assert await backlog(env, urgent) == 0
    gate.set()
    await wait_for(env.settled, timeout=60, what="the flood handled")
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 201


async def test_over_the_backlog_the_ingest_answers_429_to_low_priorities_and_stores_critical(
    falco_env: EnvFactory,
) -> None:
    env = await falco_env()
    _, bulk = env.consumers()
    with capture_logs() as logs:
        ingest = env.settings.services["falco"]["ingest"]
        bounded = {**ingest, "max_backlog": 20, "backlog_check": "50ms", "retry_after": "7s"}
        gate = hold_notices((await env.start(ingest=bounded)).service)
        answers = []
        for alert in flood(env, 60):
            answers.append(await env.post(alert))
        codes = [a.status_code for a in answers]
        assert codes[:20] == [200] * 20  # under the bound: stored
        first = codes.index(429)
        assert first <= 25, codes  # the bound, and what was stored while it was asked
        assert set(codes[first:]) == {429}  # high water: no flapping per request
        refused = answers[first]
        assert refused.headers["Retry-After"] == "7"
        assert "lower-priority alerts wait to be acted on (bound 20)" in refused.json()["error"]
        assert env.metric("nodeward_falco_ingest_backpressure") == 1
        assert (
            env.metric("nodeward_falco_ingest_alerts_total", outcome="refused_backlog")
            == 60 - first
        )
        # A Critical alert is stored and acted on all the same.
        critical = await env.post(env.alert(DROP_AND_EXECUTE))
        assert critical.status_code == 200, critical.text
        bob_ns = env.ns("user-bob")

        async def isolated() -> bool:
            audits = await env.audits(bob_ns, BOB, "isolate")
            return any(r.outcome is Outcome.APPLIED for r in audits)

        await wait_for(isolated, timeout=30, what="the Critical alert's isolation")
        # The flood is handled; under the low water the ingest takes Notices again.
        gate.set()
        await wait_for(env.settled, timeout=60, what="the stored Notices handled")

        async def episode_over() -> bool:  # without a POST: the ingest asks on its own
            return env.metric("nodeward_falco_ingest_backpressure") == 0

        await wait_for(episode_over, timeout=10, what="the episode's end")
        again = await env.post(flood(env, 61)[-1])
        assert again.status_code == 200, again.text
    assert await backlog(env, bulk) <= 1
    episodes = [e for e in logs if e["event"].startswith("falco.ingest_backpressure")]
    assert [e["event"] for e in episodes] == [
        "falco.ingest_backpressure",
        "falco.ingest_backpressure_over",
    ]
    assert episodes[1]["refused"] == 60 - first


async def test_a_notice_flood_is_told_once_and_counted_per_rule_and_node(
    falco_env: EnvFactory,
) -> None:
    """200 distinct Notice alerts of one rule on one node: one notify audit, one notice for
    on-call and one for the owner; the rest counted, and audited as one record when the
    window closes (here: when the service stops)."""
    env = await falco_env(tally={"window": "10m"})
    running = await env.start()
    alerts = flood(env, 200)
    for alert in alerts:
        await env.publish_raw(alert)
    await wait_for(env.settled, timeout=60, what="the flood handled")
    tallied = env.metric(
        "nodeward_remediations_tallied_total", action="notify", outcome="applied", guard=""
    )
    assert tallied == 199
    await running.daemon.stop()
    fields = alerts[0]["output_fields"]
    ns, pod = fields["k8s.ns.name"], fields["k8s.pod.name"]

    async def both() -> list[Any] | None:
        found = await env.audits(ns, pod, "notify")
        return found if len(found) >= 2 else None

    first, aggregate, *more = await wait_for(both, timeout=15, what="the window's count")
    assert more == []
    assert first.outcome is Outcome.APPLIED and "tally" not in first.details
    assert aggregate.details["tally"]["counted"] == 199
    notices = await read_stream(env.bus, "NOTIFY", f"notify.*.t-{env.uid}")
    assert len([n for n in notices if n.data.audit_event_id]) == 1  # on-call's
    assert len([n for n in notices if not n.data.audit_event_id]) == 1  # the owner's
