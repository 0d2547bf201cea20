"""The culler against real NATS and the sim cluster, driven by the idle agent's events."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from nodeward.bus import Bus
from schemas.cloudevents import encode
from schemas.dlq import DeadLetter
from schemas.remediation import Outcome
from schemas.session import ActivityState
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.culler_fixtures import EnvFactory, ago

pytestmark = pytest.mark.xdist_group("culler")


async def test_idle_notebook_is_warned_once_then_stopped_like_kubeflow(
    culler_env: EnvFactory,
) -> None:
    env = await culler_env()
    await env.start()
    since = ago(2.5)  # past warn_after (2s), short of cull_after (3s)
    await env.publish(env.idle("nb-a-0", since))
    notices = await wait_for(lambda: env.user_notices("nb-a-0"), what="the warning")
    warning = notices[0]
    assert warning.severity.value == "warning"
    assert "will be stopped" in warning.title
    assert warning.deadline is not None
    assert any("keep-until" in step for step in warning.what_you_can_do)
    assert any("Kubeflow" in step for step in warning.what_you_can_do)
    assert await env.stopped("nb-a") is None  # warned, not stopped

    stamp = await env.idle_until("nb-a-0", since, lambda: env.stopped("nb-a"))
    stopped_at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    # Never before the deadline the warning announced (stamp has whole seconds).
    assert stopped_at >= warning.deadline.replace(microsecond=0)
    notebook = await env.notebook("nb-a")
    assert "nodeward.io/culled" in notebook["metadata"]["annotations"]

    notices = await wait_for(
        lambda: _at_least(env.user_notices("nb-a-0"), 2), what="the stop notice"
    )
    assert [n.severity.value for n in notices] == ["warning", "info"]
    assert "was stopped" in notices[1].title
    # More idle events after the stop change nothing: still one warning, one stop.
    await env.publish(env.idle("nb-a-0", since))
    audits = await wait_for(lambda: _at_least(env.audits("stop"), 1), what="stop audit")
    assert [a.outcome for a in audits] == [Outcome.APPLIED]
    assert len(await env.user_notices("nb-a-0")) == 2


async def _at_least(listing, n: int):  # type: ignore[no-untyped-def]
    got = await listing
    return got if len(got) >= n else None


async def test_activity_after_the_warning_cancels_and_is_recorded(culler_env: EnvFactory) -> None:
    env = await culler_env(warn_after="1s", cull_after="2s")
    await env.start()
    await env.publish(env.idle("nb-b-0", ago(1.2)))
    await wait_for(lambda: env.user_notices("nb-b-0"), what="the warning")
    await env.publish(env.activity("nb-b-0", ActivityState.ACTIVE))
    cancels = await wait_for(lambda: env.audits("cancel"), what="cancel audit")
    assert "used again" in cancels[0].reason
    notices = await wait_for(lambda: _at_least(env.user_notices("nb-b-0"), 2), what="all clear")
    assert "will not be stopped" in notices[1].title
    # A late event about the idle period before the activity warns nobody again.
    await env.publish(env.idle("nb-b-0", ago(600)))
    await wait_for(env.settled, what="the culler to handle the late event")
    assert len(await env.user_notices("nb-b-0")) == 2
    # Idle again from now: the clock restarts, so nothing is stopped at the old deadline.
    fresh = datetime.now(UTC)
    for _ in range(4):
        await env.publish(env.idle("nb-b-0", fresh))
        await asyncio.sleep(0.3)  # the agent's interval
    await wait_for(env.settled, what="the culler to handle them")
    assert await env.stopped("nb-b") is None


async def test_keep_until_defers_the_warning(culler_env: EnvFactory) -> None:
    env = await culler_env(warn_after="1s", cull_after="2s")
    until = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await env.admin.notebooks.set_annotations(env.ns, "nb-c", {"nodeward.io/keep-until": until})
    await env.start()
    await env.publish(env.idle("nb-c-0", ago(600)))
    await env.publish(env.idle("nb-b-0", ago(600)))  # a witness without keep-until
    await wait_for(lambda: env.user_notices("nb-b-0"), what="the witness's warning")
    assert await env.user_notices("nb-c-0") == []


async def test_exempt_session_and_dry_run_do_nothing(culler_env: EnvFactory) -> None:
    env = await culler_env(warn_after="1s", cull_after="2s")
    await env.start()
    await env.publish(env.idle("nb-exempt-0", ago(600)))
    skipped = await wait_for(lambda: env.audits("warn"), what="exempt audit")
    assert skipped[0].outcome == Outcome.SKIPPED and skipped[0].guard == "exempt"
    assert await env.user_notices("nb-exempt-0") == []
    assert await env.stopped("nb-exempt") is None

    dry = await culler_env(warn_after="1s", cull_after="2s", dry_run=True)
    await dry.start()
    since = ago(1.1)

    async def dry_stop() -> bool:
        return any(a.outcome == Outcome.DRY_RUN for a in await dry.audits("stop"))

    await dry.idle_until("nb-a-0", since, dry_stop)
    assert await dry.user_notices("nb-a-0") == []
    assert await dry.stopped("nb-a") is None
    warns = await dry.audits("warn")
    assert [a.outcome for a in warns] == [Outcome.DRY_RUN]


async def test_restart_between_warning_and_stop_neither_repeats_nor_forgets(
    culler_env: EnvFactory,
) -> None:
    env = await culler_env(warn_after="1s", cull_after="3s")
    first = await env.start()
    since = ago(1.1)
    await env.publish(env.idle("nb-a-0", since))
    [warning] = await wait_for(lambda: env.user_notices("nb-a-0"), what="the warning")
    await env.stop(first)
    await env.start()
    stamp = await env.idle_until("nb-a-0", since, lambda: env.stopped("nb-a"))
    stopped_at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert warning.deadline is not None
    assert stopped_at >= warning.deadline.replace(microsecond=0)
    notices = await wait_for(lambda: _at_least(env.user_notices("nb-a-0"), 2), what="stop notice")
    assert sum(1 for n in notices if n.severity.value == "warning") == 1


async def test_plain_pods_are_deleted_only_under_a_controller(culler_env: EnvFactory) -> None:
    env = await culler_env(warn_after="1s", cull_after="2s")
    await env.start()
    since = ago(1.1)

    kept = (await env.admin.pods.get(env.ns, "ssh-kept-0"))["metadata"]["uid"]

    async def gone() -> bool:  # deleted; its StatefulSet then makes a fresh ssh-kept-0
        return kept not in {p["metadata"]["uid"] for p in await env.admin.pods.list(env.ns)}

    await env.idle_until("ssh-kept-0", since, gone)

    async def left() -> bool:
        return any(a.guard == "no_controller" for a in await env.audits("stop"))

    await env.idle_until("ssh-bare", since, left)
    names = {p["metadata"]["name"] for p in await env.admin.pods.list(env.ns)}
    assert "ssh-bare" in names


async def test_event_about_another_pod_of_the_same_name_changes_nothing(
    culler_env: EnvFactory,
) -> None:
    env = await culler_env(warn_after="1s", cull_after="2s")
    await env.start()
    await env.publish(env.idle("nb-a-0", ago(600), uid="00000000-0000-4000-8000-000000000000"))
    await env.publish(env.idle("nb-b-0", ago(600)))  # a witness
    await wait_for(lambda: env.user_notices("nb-b-0"), what="the witness's warning")
    assert await env.user_notices("nb-a-0") == []


async def test_malformed_session_idle_is_dead_lettered(culler_env: EnvFactory, bus: Bus) -> None:
    env = await culler_env()
    await env.start()
    consumer = env.settings.services["culler"]["consumer"]
    headers = {
        "ce-specversion": "1.0",
        "ce-type": "session.idle.v1",
        "ce-source": f"agent/idle/{env.node}",
        "ce-id": "01930000-0000-7000-8000-00000000beef",
        "ce-time": datetime.now(UTC).isoformat(),
        "Nats-Msg-Id": "01930000-0000-7000-8000-00000000beef",
        "content-type": "application/json",
    }
    await bus.js.publish(
        f"session.idle.{env.node}.{env.ns}.nb-a-0",
        b'{"namespace": "x", "idle_for_s": -4}',
        headers=headers,
    )

    async def letters() -> list[DeadLetter]:
        return [e.data for e in await read_stream(bus, "DLQ", f"dlq.SESSIONS.{consumer}")]

    [letter] = await wait_for(letters, what="the dead letter")
    assert "session.idle" in letter.original_subject
    assert letter.error
    # The daemon carries on: a good event after it is handled.
    await env.publish(env.idle("nb-b-0", ago(600)))
    await wait_for(lambda: env.user_notices("nb-b-0"), what="a warning after the bad event")


async def test_stops_are_rate_limited_and_the_refusal_is_audited(culler_env: EnvFactory) -> None:
    env = await culler_env(
        warn_after="1s",
        cull_after="2s",
        rate_limit={"per_minute": 1, "burst": 1, "max_wait": "0s"},
    )
    await env.start()
    since = ago(1.1)

    async def one_stopped_one_refused() -> bool:
        await env.publish(env.idle("nb-b-0", since))
        stops = await env.audits("stop")
        return {a.outcome for a in stops} >= {Outcome.APPLIED, Outcome.REFUSED}

    await env.idle_until("nb-a-0", since, one_stopped_one_refused)
    stopped = [nb for nb in ("nb-a", "nb-b") if await env.stopped(nb)]
    assert len(stopped) == 1
    refused = [a for a in await env.audits("stop") if a.outcome == Outcome.REFUSED]
    assert refused[0].guard == "rate_limit"
    # It names the limit that refused it: the burst of 1, refilling at 1 a minute.
    assert "the burst of 1 stop actions is spent, refilling at 1 a minute" in refused[0].reason


async def test_a_session_past_its_maximum_age_is_warned_then_stopped_even_if_active(
    culler_env: EnvFactory,
) -> None:
    env = await culler_env(warn_after="1s", cull_after="2s", max_age="3s")
    await env.start()
    loop = asyncio.get_running_loop()
    end = loop.time() + 20

    async def stopped() -> str | None:
        return await env.stopped("nb-a")

    while not await stopped():
        assert loop.time() < end, "nb-a was not stopped at its maximum age"
        await env.publish(env.activity("nb-a-0", ActivityState.ACTIVE))
        await asyncio.sleep(0.3)  # the agent's interval
    [warning, *_] = await env.user_notices("nb-a-0")
    assert "maximum age" in warning.title
    assert [a.action for a in await env.audits() if a.action in ("warn", "cancel", "stop")] == [
        "warn",
        "stop",
    ]


async def test_a_stale_idle_event_is_audited_as_stale_like_cordon_and_not_acted_on(
    culler_env: EnvFactory,
) -> None:
    env = await culler_env(max_event_age="1m")
    await env.start()
    since = ago(3600)
    # A replay after a cold start: two samples of one idle period, sampled 10 minutes ago.
    replayed = [env.idle("nb-a-0", since, at=ago(600)), env.idle("nb-a-0", since, at=ago(590))]
    await env.publish(*replayed)
    await wait_for(lambda: env.audits("ignore"), what="the stale audit")
    await wait_for(env.settled, what="the culler to handle the replay")
    records = await env.audits()
    # Audited the way cordon audits a stale failure, once for the idle period; not acted on.
    assert [(r.action, r.outcome, r.guard) for r in records] == [
        ("ignore", Outcome.SKIPPED, "too_old")
    ]
    stale = records[0]
    assert stale.reason.startswith(f"ignored as stale: session.idle of {env.ns}/nb-a-0")
    assert stale.reason.endswith("more than max_event_age 1m")
    assert stale.trigger_event_id == replayed[0].id and stale.details["age_s"] >= 590
    assert stale.actor == "service/culler"
    assert not await env.user_notices("nb-a-0")
    assert await env.stopped("nb-a") is None
    # A fresh sample of the same idle period is acted on: the owner is warned.
    await env.publish(env.idle("nb-a-0", since))
    await wait_for(lambda: env.user_notices("nb-a-0"), what="the warning")


async def test_idle_event_about_another_pod_than_its_subject_is_refused(
    culler_env: EnvFactory,
) -> None:
    """On `session.idle.<node>.<ns>.nb-a-0`, data naming nb-b-0 (long idle) stops nothing:
    dead-lettered as `identity_mismatch`, audited, one on-call notice for the burst."""
    env = await culler_env()
    await env.start()
    consumer = env.settings.services["culler"]["consumer"]
    forged = [env.idle("nb-b-0", ago(60)) for _ in range(3)]
    for event in forged:
        wire = encode(event)
        await env.bus.js.publish(
            f"session.idle.{env.node}.{env.ns}.nb-a-0", wire.body, headers=wire.headers
        )

    async def dead() -> list[DeadLetter] | None:
        events = await read_stream(env.bus, "DLQ", f"dlq.SESSIONS.{consumer}")
        return [e.data for e in events] if len(events) == len(forged) else None

    letters = await wait_for(dead, what="dead letters")
    await wait_for(env.settled, what="all acked")
    assert {d.reason for d in letters} == {"identity_mismatch"}
    assert all("data.pod 'nb-b-0'" in d.error and "'nb-a-0'" in d.error for d in letters)
    refused = await env.audits("identity_mismatch")
    assert len(refused) == len(forged) and {r.outcome for r in refused} == {Outcome.REFUSED}
    notices = await read_stream(env.bus, "NOTIFY", "notify.critical.security")
    assert len([n for n in notices if n.data.targets[0].name == env.node]) == 1
    assert await env.stopped("nb-b") is None
    assert await env.user_notices("nb-b-0") == []
