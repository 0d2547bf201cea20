"""The remediation kernel's runner against a real NATS: every decision, acted on or not,
is one audit record on the AUDIT stream, published by the runner; the chain runs in the
kernel's order; `Dedup` agrees across replicas through KV."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodeward.bus import Bus, RetryableError
from nodeward.kube import KubeError
from schemas.common import ObjectRef
from schemas.notify import Notification
from schemas.remediation import Outcome, Remediation
from services.kernel import (
    ActionRunner,
    Auditor,
    Dedup,
    DedupWindow,
    Exemptions,
    Proposal,
    Stage,
    Staleness,
    Verdict,
)
from services.kernel.tally import Tally
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import audits, read_stream


def runner(bus: Bus, *, dry_run: bool = False) -> ActionRunner:
    return ActionRunner(Auditor(bus, actor="service/test", topic="test"), dry_run=dry_run)


def proposal(node: str, **kw: Any) -> Proposal:
    return Proposal(
        action=kw.pop("action", "quarantine"),
        target=ObjectRef(kind="Node", name=node, api_version="v1"),
        reason=kw.pop("reason", f"{node}: GPU 0 fell off the bus"),
        trigger_id=kw.pop("trigger_id", uuid.uuid4().hex),
        trigger_time=kw.pop("trigger_time", datetime.now(UTC)),
        **kw,
    )


async def notices(bus: Bus, node: str) -> list[Notification]:
    events = await read_stream(bus, "NOTIFY", "notify.*.test")
    return [e.data for e in events if any(t.name == node for t in e.data.targets)]


async def exactly_one(bus: Bus, node: str) -> Remediation:
    found = await wait_for(lambda: audits(bus, node), timeout=5, what="an audit record")
    assert len(found) == 1, found
    return found[0]


async def test_skip_is_one_audit_through_the_runner(bus: Bus, node: str) -> None:
    p = proposal(node, action="stop", protective=True)
    returned = await runner(bus).skip(
        p, guard="no_controller", reason="left running: no controller"
    )
    record = await exactly_one(bus, node)
    assert record == returned
    assert (record.action, record.outcome, record.guard) == (
        "stop",
        Outcome.SKIPPED,
        "no_controller",
    )
    assert record.reason == "left running: no controller"
    assert record.actor == "service/test" and record.trigger_event_id == p.trigger_id
    assert len(await notices(bus, node)) == 1  # on-call hears of it, pointing at the audit


async def test_fail_is_one_audit_through_the_runner(bus: Bus, node: str) -> None:
    p = proposal(node, action="renew", protective=False, details={"kind": "oauth2"})
    await runner(bus).fail(p, guard="invalid_grant")
    record = await exactly_one(bus, node)
    assert (record.action, record.outcome, record.guard) == (
        "renew",
        Outcome.FAILED,
        "invalid_grant",
    )
    assert record.reason == p.reason and record.details == {"kind": "oauth2"}


async def test_a_repeated_skip_is_built_not_published(bus: Bus, node: str) -> None:
    r = runner(bus)
    p = proposal(node)
    await r.skip(p, guard="already_quarantined")
    again = await r.skip(p, guard="already_quarantined", repeat=True)
    assert again.outcome == Outcome.SKIPPED
    await exactly_one(bus, node)


async def test_a_flood_of_noisy_skips_is_one_audit_one_notice_and_one_count(
    bus: Bus, node: str
) -> None:
    """200 `stale` skips of one node: the first audited and told, the rest counted, and
    one aggregate record (no notice) for the window."""
    auditor = Auditor(bus, actor="service/test", topic="test")  # a 10 min window
    r = ActionRunner(auditor)
    for _ in range(200):
        await r.skip(proposal(node, action="ignore"), guard="stale")
    first = await exactly_one(bus, node)
    assert first.guard == "stale" and "tally" not in first.details
    assert await auditor.flush(everything=True) == 1
    found = await wait_for(lambda: _two(audits(bus, node)), timeout=10, what="the aggregate")
    aggregate = found[1]
    assert aggregate.details["tally"]["counted"] == 199
    assert aggregate.reason.startswith("199 more like this")
    assert len(aggregate.details["tally"]["triggers"]) == 5
    assert aggregate.outcome == Outcome.SKIPPED and aggregate.guard == "stale"
    assert len(await notices(bus, node)) == 1  # on-call heard once, not 200 times


async def test_a_closed_window_is_audited_by_the_auditors_own_task(bus: Bus, node: str) -> None:
    """No flush called: the window's count is audited when it closes. The window (3 s) is
    far longer than the two skips take, so the second is counted whatever the load."""
    auditor = Auditor(bus, actor="service/test", topic="test", tally=Tally(timedelta(seconds=3)))
    r = ActionRunner(auditor)
    for _ in range(2):
        await r.skip(proposal(node, action="ignore"), guard="too_old")
    assert auditor.tally.counting == 1
    found = await wait_for(lambda: _two(audits(bus, node)), timeout=20, what="the aggregate")
    assert found[1].details["tally"]["counted"] == 1


async def test_closing_the_bus_audits_the_open_windows(bus_settings: Any, node: str) -> None:
    b = await Bus.connect(bus_settings, source="test/closing")
    r = ActionRunner(Auditor(b, actor="service/test", topic="test"))  # a 10 min window
    for _ in range(3):
        await r.skip(proposal(node, action="ignore"), guard="stale")
    await b.close(grace=2)
    async with await Bus.connect(bus_settings, source="test/reader") as reader:
        found = await wait_for(lambda: _two(audits(reader, node)), timeout=5, what="two")
    assert [a.details.get("tally", {}).get("counted") for a in found] == [None, 2]


async def test_a_decision_that_acts_is_never_tallied(bus: Bus, node: str) -> None:
    r = ActionRunner(Auditor(bus, actor="service/test", topic="test"))

    async def act() -> dict[str, Any]:
        return {}

    for _ in range(3):
        await r.run(proposal(node, action="label"), act)
    found = await wait_for(lambda: _n(audits(bus, node), 3), timeout=5, what="3 audits")
    assert [a.outcome for a in found] == [Outcome.APPLIED] * 3


async def _two(pending: Any) -> list[Remediation] | None:
    return await _n(pending, 2)


async def _n(pending: Any, n: int) -> list[Remediation] | None:
    found: list[Remediation] = await pending
    assert len(found) <= n, found
    return found if len(found) == n else None


async def test_run_orders_the_chain_and_audits_the_first_objection(bus: Bus, node: str) -> None:
    asked: list[str] = []

    class Breaker:
        name = "circuit_breaker"
        stage = Stage.BREAKER

        async def check(self, p: Proposal) -> Verdict | None:
            asked.append(self.name)
            return Verdict(self.name, "refused by the circuit breaker")

    acted: list[bool] = []

    async def act() -> dict[str, Any]:
        acted.append(True)
        return {}

    exempt_node = {
        "kind": "Node",
        "metadata": {"name": node, "labels": {"nodeward.io/exempt": "true"}},
    }
    p = proposal(node, obj=exempt_node)
    # The breaker listed first, as an old call might: the exemption still comes first.
    result = await runner(bus).run(p, act, [Breaker(), Exemptions()])
    assert (result.outcome, result.guard) == (Outcome.SKIPPED, "exempt")
    assert asked == [] and acted == []
    record = await exactly_one(bus, node)
    assert record.guard == "exempt"


async def test_screen_audits_a_stale_trigger_once_and_lets_a_fresh_one_through(
    bus: Bus, node: str
) -> None:
    r = runner(bus)
    staleness = Staleness(timedelta(minutes=10))
    old = proposal(node, action="ignore", trigger_time=datetime.now(UTC) - timedelta(hours=1))
    result = await r.screen(old, [staleness])
    assert result is not None and (result.outcome, result.guard) == (Outcome.SKIPPED, "too_old")
    assert await r.screen(proposal(node, action="ignore"), [staleness]) is None
    record = await exactly_one(bus, node)
    assert record.reason.startswith("ignored as stale: ") and record.details["age_s"] >= 3600


async def test_a_failed_act_is_one_audit_raised_or_returned(bus: Bus, node: str) -> None:
    async def act() -> dict[str, Any]:
        raise KubeError("the API server said no")

    r = runner(bus)
    with pytest.raises(RetryableError):
        await r.run(proposal(node), act)
    record = await exactly_one(bus, node)
    assert record.outcome == Outcome.FAILED and "the API server said no" in record.reason
    returned = await r.run(proposal(node, action="isolate"), act, retry=False)
    assert returned.outcome == Outcome.FAILED


async def test_dedup_acts_once_per_window_across_replicas(bus: Bus, node: str) -> None:
    kv = await bus.kv(f"test-dedup-{uuid.uuid4().hex[:8]}", ttl_s=600)
    now = [1000.0]

    def replica() -> Dedup:
        window = DedupWindow(kv, timedelta(minutes=10), clock=lambda: now[0])
        return Dedup(window, key=lambda p: f"{p.action}/{p.target.key()}")

    one = runner(bus)
    two = ActionRunner(one.auditor)  # another replica (its own guard objects, the same KV)
    acted: list[str] = []

    async def act() -> dict[str, Any]:
        acted.append("acted")
        return {}

    first = proposal(node, trigger_id="alert-1")
    assert (await one.run(first, act, [replica()])).outcome == Outcome.APPLIED
    # The same alert again, seen by another replica: a quiet duplicate.
    repeat = await two.run(proposal(node, trigger_id="alert-2"), act, [replica()])
    assert (repeat.outcome, repeat.guard) == (Outcome.SKIPPED, "duplicate")
    assert repeat.details["duplicate_of"] == "alert-1" and repeat.details["repeats"] == 1
    # A redelivery of the first is handled again (acts are idempotent).
    assert (await two.run(first, act, [replica()])).outcome == Outcome.APPLIED
    assert acted == ["acted", "acted"]
    now[0] += 601  # the window is over: the next one acts
    assert (await one.run(proposal(node, trigger_id="alert-3"), act, [replica()])).outcome == (
        Outcome.APPLIED
    )

    async def two_audits() -> list[Remediation]:
        found = await audits(bus, node)
        return found if len(found) >= 2 else []

    # alert-1 (its redelivery re-publishes the same audit id: stored once) and alert-3;
    # the duplicate was not audited.
    found = await wait_for(two_audits, timeout=5, what="two audit records")
    assert [(r.outcome, r.trigger_event_id) for r in found] == [
        (Outcome.APPLIED, "alert-1"),
        (Outcome.APPLIED, "alert-3"),
    ]


async def test_dedup_window_opens_anew_for_new_content_and_marks_only_when_told(
    bus: Bus,
) -> None:
    kv = await bus.kv(f"test-dedup-{uuid.uuid4().hex[:8]}", ttl_s=600)
    now = [1000.0]
    window = DedupWindow(kv, timedelta(minutes=10), prefix="said", clock=lambda: now[0])
    other = DedupWindow(kv, timedelta(minutes=10), prefix="said", clock=lambda: now[0])
    key = "oncall\x1fq/gpu-node-1"  # not a KV key: stored under its hash
    assert window.kv_key(key).startswith("said.") and window.kv_key("said.x") == "said.x"
    assert await window.repeat_of(key, content="quarantined") is None  # read only
    assert await other.repeat_of(key, content="quarantined") is None
    await window.mark(key, "ev-1", content="quarantined")
    seen = await other.repeat_of(key, content="quarantined")
    assert seen is not None and seen.first == "ev-1"
    # Something new about the same thing is not a repeat; first() opens its window.
    assert await other.repeat_of(key, content="released") is None
    first, record = await other.first(key, "ev-2", content="released")
    assert first and record.first == "ev-2"
    first, record = await window.first(key, "ev-3", content="released")
    assert not first and record.repeats == 1
    now[0] += 601
    assert await window.repeat_of(key, content="released") is None


async def test_a_resumed_act_is_audited_once_whatever_the_duplicate_window(
    bus: Bus, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An act a restart cut short after its audit is finished again (`resumed`): its
    audit is not published a second time, however long the restart took (JetStream's
    duplicate window would let it in after 2 minutes); one cut short before its audit
    is audited."""
    p = proposal(node)
    acts: list[str] = []

    async def act() -> dict[str, Any]:
        acts.append("act")
        return {"done": True}

    r = runner(bus)
    await r.run(p, act, resumed=True)  # nothing audited before: published
    first = await exactly_one(bus, node)
    published: list[int] = []
    real = bus.publish_many

    async def counting(events: Any, **kw: Any) -> Any:
        published.append(len(events))
        return await real(events, **kw)

    monkeypatch.setattr(bus, "publish_many", counting)
    again = await r.run(p, act, resumed=True)
    assert acts == ["act", "act"]  # the act itself is redone (it is idempotent)
    assert published == []  # the audit and its notice not sent again
    assert again.outcome == Outcome.APPLIED and await exactly_one(bus, node) == first
    await r.run(p, act)  # not resumed: published (the window dedups it here)
    assert published == [2]
