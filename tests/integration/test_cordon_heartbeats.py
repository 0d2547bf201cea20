"""services.cordon's two paths: changes (`gpu.health.>`) never wait behind heartbeats
(`gpu.heartbeat.>`), which are settled without Kubernetes and act only on what the record
does not account for."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.js.errors import NotFoundError

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.config import section
from schemas.cloudevents import encode
from schemas.gpu import HealthState
from schemas.state.cordon import NodeRecord, node_key
from services.cordon.service import CordonSettings, reset_breaker
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import (
    CordonEnv,
    EnvFactory,
    audits,
    failed,
    health,
    heartbeat,
    read_stream,
    settled,
)
from tests.integration.test_cordon import tainted


def _config(env: CordonEnv) -> CordonSettings:
    return section(env.settings, "services", "cordon", CordonSettings)


async def _changes_done(env: CordonEnv) -> None:
    """Wait until the change consumer has acknowledged every change published."""
    consumer = _config(env).consumer
    await wait_for(lambda: settled(env.bus, "GPU", consumer), timeout=10, what="every change acked")


async def _heartbeats_done(env: CordonEnv, count: int) -> None:
    """Wait until the heartbeat consumer has acknowledged `count` heartbeats."""
    config = _config(env)

    async def done() -> bool:
        try:
            info = await env.bus.js.consumer_info("HEARTBEATS", f"{config.consumer}-heartbeats")
        except NotFoundError:
            return False  # the service has not created its consumer yet
        return bool(
            info.ack_floor is not None
            and (info.ack_floor.consumer_seq or 0) >= count
            and not info.num_pending
            and not info.num_ack_pending
        )

    await wait_for(done, timeout=20, what=f"{count} heartbeats acknowledged")


async def _revision(bus: Bus, config: CordonSettings, node: str) -> int:
    entry = await TypedKV(await bus.kv(config.bucket), NodeRecord).get(node_key(node))
    assert entry is not None
    return int(entry.revision)


def _cordon_requests(env: CordonEnv) -> list[tuple[str, str, str, int]]:
    return [r for r in env.sim.requests if "cordon" in r[0]]


async def test_a_fault_is_quarantined_within_2s_behind_5000_heartbeats(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env()
    names = env.nodes
    await env.publish(*(health(n, HealthState.HEALTHY) for n in names))
    # A backlog of routine heartbeats, then the fault: the service starts on all of it.
    beats = [heartbeat(names[i % len(names)], {0: HealthState.HEALTHY}) for i in range(5000)]
    for i in range(0, len(beats), 500):
        await env.publish(*beats[i : i + 500])
    sick = names[3]
    await env.publish(failed(sick, seq=2))
    began = time.monotonic()
    await env.start()

    async def quarantined() -> bool:
        return tainted(await env.node(sick))

    await wait_for(quarantined, timeout=20, what="the fault quarantined ahead of the heartbeats")
    print(f"quarantined {time.monotonic() - began:.2f}s after the start, 5000 heartbeats queued")
    await _heartbeats_done(env, 5000)


async def test_heartbeats_settle_without_kubernetes_or_kv_writes(cordon_env: EnvFactory) -> None:
    env = await cordon_env(reconcile_interval="1h")  # its reads of the node are not counted
    await env.start()
    name = env.nodes[0]
    await env.publish(failed(name), health(name, HealthState.HEALTHY, gpu=1))
    await wait_for(lambda: audits(env.bus, name, "quarantine"), timeout=5, what="quarantined")
    config = _config(env)
    await _changes_done(env)  # the record is written after the audit, before the ack
    revision = await _revision(env.bus, config, name)
    before = len(_cordon_requests(env))
    states = {0: HealthState.FAILED, 1: HealthState.HEALTHY}
    await env.publish(*(heartbeat(name, states) for _ in range(50)))
    await _heartbeats_done(env, 50)
    assert await _revision(env.bus, config, name) == revision
    assert _cordon_requests(env)[before:] == []


async def _quarantined_node(env: CordonEnv, name: str) -> bool:
    return tainted(await env.node(name))


async def test_a_change_never_handled_is_taken_from_a_heartbeat(cordon_env: EnvFactory) -> None:
    env = await cordon_env(heartbeat_grace="2s")
    await env.start()
    lost, queued = env.nodes[0], env.nodes[1]
    # `queued`'s failure is recent: its change is on its way, the heartbeat leaves it be.
    await env.publish(heartbeat(queued, {0: HealthState.FAILED}, seq=2))
    await _heartbeats_done(env, 1)
    assert not tainted(await env.node(queued))
    await env.publish(failed(queued, seq=2))
    await wait_for(lambda: _quarantined_node(env, queued), timeout=5, what="change quarantines")
    # `lost`'s failure happened a minute ago and no change ever came: the heartbeat acts.
    ago = datetime.now(UTC) - timedelta(minutes=1)
    await env.publish(heartbeat(lost, {0: HealthState.FAILED}, seq=2, changed_at=ago))
    await wait_for(lambda: _quarantined_node(env, lost), timeout=5, what="heartbeat quarantines")


async def test_a_change_its_heartbeat_restated_first_is_not_audited_as_stale(
    cordon_env: EnvFactory,
) -> None:
    """A fleet's start queues its changes; a heartbeat past the grace restates one first.
    The change, when it comes, says the same state: nothing to ignore, nothing to audit."""
    env = await cordon_env(heartbeat_grace="2s")
    await env.start()
    name = env.nodes[2]
    ago = datetime.now(UTC) - timedelta(minutes=1)
    await env.publish(heartbeat(name, {0: HealthState.HEALTHY}, seq=1, changed_at=ago))
    await _heartbeats_done(env, 1)
    config = _config(env)
    revision = await _revision(env.bus, config, name)  # the restatement recorded
    # The late change, then a failure behind it (in order per node: once the failure is
    # quarantined, the change was handled).
    await env.publish(health(name, HealthState.HEALTHY, seq=1, at=ago), failed(name, seq=2))
    await wait_for(lambda: audits(env.bus, name, "quarantine"), timeout=5, what="the barrier")
    await _changes_done(env)
    found = await audits(env.bus, name)
    assert [(a.action, a.guard) for a in found] == [("quarantine", None)]
    assert await _revision(env.bus, config, name) > revision


async def test_a_refused_failure_is_tried_again_by_its_heartbeat(cordon_env: EnvFactory) -> None:
    env = await cordon_env()
    await env.start()
    sick = env.nodes[:4]
    await env.publish(*(failed(n) for n in sick))

    async def all_tainted_but_one() -> list[str]:
        nodes = [await env.node(n) for n in sick]
        refused = [n["metadata"]["name"] for n in nodes if not tainted(n)]
        return refused if sum(tainted(n) for n in nodes) == 3 else []

    refused: Any = await wait_for(all_tainted_but_one, timeout=5, what="3 quarantined, 1 refused")
    await reset_breaker(env.bus, _config(env))
    # No new change: the next heartbeat restating the failure passes the guards again.
    await env.publish(heartbeat(refused[0], {0: HealthState.FAILED}))
    await wait_for(lambda: _quarantined_node(env, refused[0]), timeout=5, what="retried")


async def test_a_node_cannot_speak_for_another_in_a_heartbeat(cordon_env: EnvFactory) -> None:
    """Node 01's heartbeat, on its own subject, says node 02's GPU failed long ago: refused
    (dead-lettered as identity_mismatch), node 02 untouched."""
    env = await cordon_env(heartbeat_grace="1s")
    await env.start()
    publisher, victim = env.nodes[0], env.nodes[1]
    ago = datetime.now(UTC) - timedelta(minutes=1)
    wire = encode(heartbeat(victim, {0: HealthState.FAILED}, changed_at=ago))
    await env.bus.js.publish(f"gpu.heartbeat.{publisher}", wire.body, headers=wire.headers)
    consumer = f"{_config(env).consumer}-heartbeats"

    async def dead() -> list[Any]:
        return await read_stream(env.bus, "DLQ", f"dlq.HEARTBEATS.{consumer}")

    letters = [e.data for e in await wait_for(dead, timeout=5, what="the dead letter")]
    assert [d.reason for d in letters] == ["identity_mismatch"]
    assert f"data.node '{victim}'" in letters[0].error
    assert not tainted(await env.node(victim))
