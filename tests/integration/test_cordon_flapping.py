"""Flap damping: a GPU that keeps turning failed is one incident, quarantined until an
operator releases it; nothing automatic puts it back in service."""

from __future__ import annotations

from typing import Any

from schemas.gpu import HealthState
from schemas.remediation import Outcome
from schemas.state.cordon import TAINT_KEY
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import EnvFactory, audits, failed, health, notifications


def tainted(node: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT_KEY for t in (node.get("spec") or {}).get("taints") or [])


async def decisions(env: Any, name: str, action: str) -> list[tuple[str, str | None]]:
    return [(r.outcome.value, r.guard) for r in await audits(env.bus, name, action)]


async def test_a_gpu_released_twice_is_held_at_its_third_failure(cordon_env: EnvFactory) -> None:
    env = await cordon_env(flap_threshold=3, flap_window="1h")
    await env.start()
    name = env.nodes[2]
    seq = 0
    for turn in (1, 2):
        seq += 1
        await env.publish(failed(name, seq=seq))

        async def applied(n: int = turn) -> bool:
            return (await decisions(env, name, "quarantine")).count(("applied", None)) == n

        await wait_for(applied, timeout=20, what=f"quarantine {turn}")
        seq += 1
        await env.publish(health(name, HealthState.HEALTHY, seq=seq))

        async def released(n: int = turn) -> bool:
            return (await decisions(env, name, "release")).count(("applied", None)) == n

        await wait_for(released, timeout=20, what=f"release {turn}")
    # The third turn to failed within the window: quarantined, and it says why.
    seq += 1
    await env.publish(failed(name, seq=seq))

    async def third() -> Any:
        found = [
            r
            for r in await audits(env.bus, name, "quarantine")
            if r.outcome is Outcome.APPLIED and r.details.get("flapping")
        ]
        return found[0] if found else None

    applied = await wait_for(third, timeout=20, what="the flapping quarantine")
    assert "turned failed 3 times within 1:00:00" in applied.details["flapping"]
    seq += 1
    await env.publish(health(name, HealthState.HEALTHY, seq=seq))

    async def refused() -> bool:
        return ("refused", "flapping") in await decisions(env, name, "release")

    # The healthy period (0.5 s) passes, the reconcile loop (0.1 s) proposes the release
    # again and again: refused, audited once; the node stays out of service.
    await wait_for(refused, timeout=20, what="the automatic release refused")
    node = await env.node(name)
    assert tainted(node) and node["spec"].get("unschedulable")
    releases = await decisions(env, name, "release")
    assert releases.count(("refused", "flapping")) == 1
    assert releases.count(("applied", None)) == 2


async def test_flaps_within_one_quarantine_are_one_incident_held(cordon_env: EnvFactory) -> None:
    env = await cordon_env(flap_threshold=3, flap_window="1h", healthy_period="3s")
    await env.start()
    name = env.nodes[4]
    flaps = []
    for i in range(5):
        flaps.append(failed(name, seq=2 * i + 1))
        flaps.append(health(name, HealthState.HEALTHY, seq=2 * i + 2))
    await env.publish(*flaps)

    async def damped() -> list[Any]:
        return [r for r in await audits(env.bus, name, "quarantine") if r.guard == "flapping"]

    [damp] = await wait_for(damped, timeout=20, what="the flapping GPU damped")
    assert damp.outcome is Outcome.SKIPPED and "one incident" in damp.reason

    async def refused() -> bool:
        return ("refused", "flapping") in await decisions(env, name, "release")

    await wait_for(refused, timeout=20, what="the automatic release refused")
    quarantines = await decisions(env, name, "quarantine")
    assert quarantines.count(("applied", None)) == 1  # one incident
    assert quarantines.count(("skipped", "flapping")) == 1  # damped once
    assert tainted(await env.node(name))
    assert ("applied", None) not in await decisions(env, name, "release")


async def test_a_flap_storm_audits_by_decision_not_by_event(cordon_env: EnvFactory) -> None:
    """1,000 flaps and 500 replays of one GPU (the chaos run's 5,000 flaps left 4,735 audit
    records, each with a notice): a handful of records, the restatements counted."""
    env = await cordon_env(flap_threshold=3, flap_window="1h", healthy_period="1h")
    daemon = await env.start()
    name = env.nodes[5]
    flaps = []
    for i in range(500):
        flaps.append(failed(name, seq=2 * i + 1))
        flaps.append(health(name, HealthState.HEALTHY, seq=2 * i + 2))
    replays = [failed(name, seq=2 * i + 1) for i in range(500)]  # older than the newest
    for start in range(0, len(flaps), 100):
        await env.publish(*flaps[start : start + 100])
    for start in range(0, len(replays), 100):
        await env.publish(*replays[start : start + 100])

    async def handled() -> bool:
        metric = daemon.metrics.registry.get_sample_value
        counted = metric(
            "nodeward_remediations_tallied_total",
            {"action": "ignore", "outcome": "skipped", "guard": "stale"},
        )
        return (counted or 0) >= 499

    await wait_for(handled, timeout=120, what="the replays counted")
    await daemon.stop()  # the open windows' counts are audited
    records = await audits(env.bus, name)
    summary = [
        (r.action, r.outcome.value, r.guard, (r.details.get("tally") or {}).get("counted"))
        for r in records
    ]
    assert ("quarantine", "applied", None, None) in summary
    assert ("ignore", "skipped", "stale", None) in summary
    assert ("ignore", "skipped", "stale", 499) in summary
    print(f"{len(records)} audit records for 1,500 events: {summary}")
    assert len(records) <= 8, summary
    assert len(await notifications(env.bus, name)) <= 5
    assert tainted(await env.node(name))


async def test_a_grown_fault_is_audited_in_full_while_its_restatements_are_counted(
    cordon_env: EnvFactory,
) -> None:
    """services.recovery reads `already_quarantined` for the fault: the same fault again is
    counted, another one (XID 48 after XID 79) is audited however soon it comes."""
    env = await cordon_env(healthy_period="1h")
    daemon = await env.start()
    name = env.nodes[6]
    await env.publish(failed(name, seq=1))
    await env.publish(*[failed(name, seq=s) for s in (2, 3, 4)])
    await env.publish(health(name, HealthState.FAILED, seq=5, xid=48))

    async def grown() -> list[Any]:
        found = [r for r in await audits(env.bus, name, "quarantine") if r.guard]
        return found if any(r.details.get("xids") == [48] for r in found) else []

    await wait_for(grown, timeout=20, what="the grown fault's audit")
    await daemon.stop()
    said = [
        (
            r.outcome.value,
            r.guard,
            r.details.get("xids"),
            (r.details.get("tally") or {}).get("counted"),
        )
        for r in await audits(env.bus, name, "quarantine")
    ]
    assert said == [
        ("applied", None, [79], None),
        ("skipped", "already_quarantined", [79], None),
        ("skipped", "already_quarantined", [48], None),
        ("skipped", "already_quarantined", [79], 2),
    ], said
