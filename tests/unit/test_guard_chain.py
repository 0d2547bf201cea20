"""The guard chain: the kernel's order whatever order a service lists guards in, and the
guards that need no peer (staleness, cooldown, ownership)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from schemas.common import ObjectRef
from schemas.remediation import Outcome
from schemas.state.dedup import DedupRecord
from services.kernel import (
    CircuitBreaker,
    Cooldown,
    Dedup,
    Exemptions,
    GuardChain,
    KeyedRateLimiter,
    Ownership,
    Proposal,
    RateLimiter,
    SkippedNamespaces,
    Stage,
    Staleness,
    Verdict,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
KERNEL_ORDER = [
    Stage.EXEMPTIONS,
    Stage.STALENESS,
    Stage.DEDUP,
    Stage.COOLDOWN,
    Stage.RATE_LIMIT,
    Stage.BREAKER,
    Stage.OWNERSHIP,
]


def proposal(**kw: object) -> Proposal:
    base = Proposal(
        action="quarantine",
        target=ObjectRef(kind="Node", name="gpu-1", api_version="v1"),
        reason="gpu-1: GPU 0 fell off the bus",
        trigger_id="ev-1",
        trigger_time=T0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@dataclass
class Probe:
    """A guard that notes when it was asked, and objects if told to."""

    name: str
    stage: Stage
    calls: list[str] = field(default_factory=list)
    objects: bool = False

    async def check(self, proposal: Proposal) -> Verdict | None:
        self.calls.append(self.name)
        return Verdict(self.name, f"refused by {self.name}") if self.objects else None


def test_kernel_guards_declare_the_kernel_order() -> None:
    stages = {
        Exemptions: Stage.EXEMPTIONS,
        SkippedNamespaces: Stage.EXEMPTIONS,
        Staleness: Stage.STALENESS,
        Dedup: Stage.DEDUP,
        Cooldown: Stage.COOLDOWN,
        RateLimiter: Stage.RATE_LIMIT,
        KeyedRateLimiter: Stage.RATE_LIMIT,
        CircuitBreaker: Stage.BREAKER,
        Ownership: Stage.OWNERSHIP,
    }
    for cls, stage in stages.items():
        assert cls.stage is stage, cls
    assert sorted(Stage) == KERNEL_ORDER


@pytest.mark.parametrize("seed", range(5))
async def test_guards_given_in_any_order_run_in_the_kernel_order(seed: int) -> None:
    calls: list[str] = []
    probes = [Probe(stage.name.lower(), stage, calls) for stage in KERNEL_ORDER]
    random.Random(seed).shuffle(probes)
    chain = GuardChain(probes)
    assert [g.stage for g in chain] == KERNEL_ORDER
    assert await chain.check(proposal()) is None
    assert calls == [stage.name.lower() for stage in KERNEL_ORDER]


async def test_a_service_cannot_put_the_breaker_before_the_exemption() -> None:
    calls: list[str] = []
    breaker = Probe("circuit_breaker", Stage.BREAKER, calls, objects=True)
    exempt = Probe("exempt", Stage.EXEMPTIONS, calls, objects=True)
    verdict = await GuardChain([breaker, exempt]).check(proposal())
    assert verdict is not None and verdict.guard == "exempt"
    assert calls == ["exempt"]  # the breaker was never asked (it would have used a slot)


async def test_order_within_a_stage_is_the_services() -> None:
    calls: list[str] = []
    a, b = Probe("a", Stage.RATE_LIMIT, calls), Probe("b", Stage.RATE_LIMIT, calls)
    first = Probe("exempt", Stage.EXEMPTIONS, calls)
    await GuardChain([a, b, first]).check(proposal())
    assert calls == ["exempt", "a", "b"]


def test_a_guard_without_a_stage_has_no_place_in_the_chain() -> None:
    class Stageless:
        name = "mine"

        async def check(self, proposal: Proposal) -> Verdict | None:
            return None

    with pytest.raises(TypeError, match="declares no Stage"):
        GuardChain([Stageless()])  # type: ignore[list-item]


async def test_staleness_skips_an_old_trigger_as_too_old() -> None:
    now = T0 + timedelta(minutes=30)
    guard = Staleness(timedelta(minutes=10), clock=lambda: now)
    verdict = await guard.check(proposal())
    assert verdict is not None
    assert (verdict.guard, verdict.outcome) == ("too_old", Outcome.SKIPPED)
    assert verdict.reason == (
        "ignored as stale: gpu-1: GPU 0 fell off the bus was observed 1800s ago, "
        "more than max_event_age 10m"
    )
    assert verdict.details == {"age_s": 1800.0}
    assert verdict.retry_after is None and not verdict.quiet
    # fresh, observed recently (observed_at wins over the event's time), or no time at all
    assert await guard.check(proposal(trigger_time=now - timedelta(minutes=9))) is None
    assert await guard.check(proposal(observed_at=now - timedelta(seconds=5))) is None
    assert await guard.check(proposal(trigger_time=None)) is None
    only_quarantine = Staleness(
        timedelta(minutes=10), clock=lambda: now, applies=lambda p: p.action == "quarantine"
    )
    assert await only_quarantine.check(proposal(action="release")) is None


async def test_cooldown_refuses_within_the_period_and_retries_after_it() -> None:
    now = [1000.0]
    last: dict[str, float] = {"Node/gpu-1": 950.0}

    async def last_action(p: Proposal) -> float | None:
        return last.get(f"{p.target.kind}/{p.target.name}")

    guard = Cooldown(timedelta(minutes=5), last=last_action, clock=lambda: now[0])
    verdict = await guard.check(proposal())
    assert verdict is not None
    assert (verdict.guard, verdict.outcome) == ("cooldown", Outcome.REFUSED)
    assert verdict.retry_after == pytest.approx(250.0)
    assert "within the cooldown of 5m; 250s left" in verdict.reason
    other = proposal(target=ObjectRef(kind="Node", name="gpu-2", api_version="v1"))
    assert await guard.check(other) is None  # never acted on
    now[0] = 1250.0
    assert await guard.check(proposal()) is None
    # the arithmetic alone, as before it was a guard
    assert Cooldown(timedelta(minutes=5)).remaining(950.0, 1000.0) == 250.0
    assert await Cooldown(timedelta(minutes=5)).check(proposal()) is None
    once = Cooldown(timedelta(minutes=5), last=last_action, retry=False, clock=lambda: 1000.0)
    refused = await once.check(proposal())
    assert refused is not None and refused.retry_after is None


async def test_ownership_skips_undoing_what_nodeward_did_not_do() -> None:
    marks = {"gpu-1": "service/cordon", "gpu-2": "kubectl"}

    async def owner_of(p: Proposal) -> str | None:
        return marks.get(p.target.name)

    guard = Ownership("service/cordon", owner_of)
    release = proposal(action="release", protective=False)
    assert await guard.check(release) is None
    for name, by in (("gpu-2", "by kubectl"), ("gpu-3", "by no one nodeward knows of")):
        target = ObjectRef(kind="Node", name=name, api_version="v1")
        verdict = await guard.check(replace(release, target=target))
        assert verdict is not None
        assert (verdict.guard, verdict.outcome) == ("not_ours", Outcome.SKIPPED)
        assert by in verdict.reason
    # a protective action is not an undo: not this guard's to judge
    gpu2 = ObjectRef(kind="Node", name="gpu-2", api_version="v1")
    assert await guard.check(proposal(target=gpu2)) is None


def test_dedup_record_reads_the_falco_services_records() -> None:
    old = '{"event_id": "ev-1", "stream_sequence": 7, "first_seen": 1.0, "last_seen": 2.0, "repeats": 3}'
    record = DedupRecord.model_validate_json(old)
    assert (record.first, record.repeats, record.content) == ("ev-1", 3, None)
    again = DedupRecord.model_validate_json(record.model_dump_json())
    assert again == record
