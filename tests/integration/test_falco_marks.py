"""The Falco cordon through NodeMarks: behind the shared circuit breaker, and crash-safe.

Node-level alerts on 6 of 8 nodes within a second cordon at most the breaker's limit, each
refusal audited; the Falco service run as its own process and killed at each KV and API
write of the cordon finishes it after a restart, with one `applied` audit.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from nodeward.kube.nodes import taints_of
from schemas.remediation import Outcome, Remediation
from services.falco.actions.cordon import DEFAULT_TAINT, NODE_ANNOTATION
from services.kernel.breaker import BreakerSettings, limit_for
from services.kernel.marks import entries
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.crash_fixtures import ServiceProcess
from tests.integration.falco_fixtures import EnvFactory, FalcoEnv

HOST_RULES = [{"name": "host", "match": {"pod": False}, "actions": [{"action": "cordon"}]}]


def host_alert(env: FalcoEnv, node: str) -> dict[str, Any]:
    """A node-level alert (no pod: a host event) from `node`."""
    alert = env.alert(
        "Clear Log Activities",
        **{"k8s.ns.name": None, "k8s.pod.name": None, "container.id": "host"},
    )
    alert["hostname"] = node
    return alert


async def cordon_audits(env: FalcoEnv, nodes: list[str]) -> list[Remediation]:
    events = await read_stream(env.bus, "AUDIT", "remediation.cordon.>")
    return [e.data for e in events if e.data.target.name in nodes]


def cordoned(node: dict[str, Any]) -> bool:
    return bool(node["spec"].get("unschedulable")) and any(
        t["key"] == DEFAULT_TAINT for t in taints_of(node)
    )


async def test_node_alerts_on_6_of_8_nodes_cordon_at_most_the_breaker_limit(
    falco_env: EnvFactory,
) -> None:
    names = [f"gpu-{uuid.uuid4().hex[:6]}-{i}" for i in range(7)]
    breaker = {"max_percent": 25, "max_nodes": 5, "node_selector": None, "calm_period": None}
    env = await falco_env(rules=HOST_RULES, extra_nodes=tuple(names), breaker=breaker)
    await env.start()
    population = len(await env.admin.nodes.list())
    assert population == 8
    limit = limit_for(BreakerSettings.model_validate(breaker), population)
    assert limit == 2
    alerted = names[:6]
    for node in alerted:  # within a second
        await env.publish_raw(host_alert(env, node))

    async def decided() -> list[Remediation] | None:
        found = await cordon_audits(env, alerted)
        return found if len(found) == len(alerted) else None

    records = await wait_for(decided, timeout=15, what="a decision per alerted node")
    applied = [r for r in records if r.outcome == Outcome.APPLIED]
    refused = [r for r in records if r.outcome == Outcome.REFUSED]
    assert len(applied) == limit, [(r.target.name, r.outcome, r.guard) for r in records]
    assert len(refused) == len(alerted) - limit
    assert all(r.guard == "circuit_breaker" for r in refused)
    out = [n for n in alerted if cordoned(await env.admin.nodes.get(n))]
    assert sorted(out) == sorted(r.target.name for r in applied)
    await wait_for(env.settled, timeout=10, what="every alert acked")


async def test_a_falco_cordon_records_prior_state_and_keeps_an_operator_cordon(
    falco_env: EnvFactory,
) -> None:
    names = [f"gpu-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    env = await falco_env(
        rules=HOST_RULES,
        extra_nodes=tuple(names),
        breaker={"node_selector": None, "max_percent": 100},
    )
    await env.admin.nodes.set_unschedulable(names[1], True)  # an operator's cordon
    await env.start()
    for node in names:
        await env.publish_raw(host_alert(env, node))
    await wait_for(lambda: _count(cordon_audits(env, names), 2), timeout=10, what="both cordons")
    records = await cordon_audits(env, names)
    assert {(r.target.name, r.outcome) for r in records} == {(n, Outcome.APPLIED) for n in names}
    fresh, operators = [await env.admin.nodes.get(n) for n in names]
    assert entries(fresh)["falco"].prior_unschedulable is False
    assert entries(operators)["falco"].prior_unschedulable is True
    assert NODE_ANNOTATION in fresh["metadata"]["annotations"]


async def _count(records: Any, n: int) -> bool:
    return len(await records) >= n


@pytest.mark.parametrize("point", ["marks.apply.intent", "marks.apply.patched", "marks.apply.done"])
async def test_falco_cordon_killed_at_each_step_is_finished_after_restart(
    falco_env: EnvFactory, nats_url: str, tmp_path: Path, point: str
) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    env = await falco_env(
        rules=HOST_RULES,
        extra_nodes=(node,),
        ack_wait="1s",
        breaker={"node_selector": None, "max_percent": 100},
    )
    proc = ServiceProcess.of("falco", env.settings, tmp_path, nats_url)
    try:
        proc.start(failpoint=point)

        async def bound() -> bool:
            try:
                for name in env.consumers():
                    await env.bus.js.consumer_info("SECURITY", name)
            except Exception:  # noqa: BLE001 - not created yet
                return False
            return True

        await wait_for(bound, timeout=30, what="the falco consumer")
        await env.publish_raw(host_alert(env, node))
        assert await proc.exited() == -9, proc.tail()
        proc.start()

        async def done() -> bool:
            found = await env.admin.nodes.get(node)
            return cordoned(found) and "falco" in entries(found)

        await wait_for(done, timeout=30, what="the cordon finished after the restart")
        await wait_for(env.settled, timeout=20, what="the alert acked")
        records = await cordon_audits(env, [node])
        assert [r.outcome for r in records] == [Outcome.APPLIED], records
        held = entries(await env.admin.nodes.get(node))["falco"]
        assert held.prior_unschedulable is False and held.taints == [f"{DEFAULT_TAINT}:NoSchedule"]
    finally:
        proc.kill()
