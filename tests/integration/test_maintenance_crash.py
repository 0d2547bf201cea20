"""The maintenance cordon survives a SIGKILL at every write (KV and API) of its NodeMarks.

The checkpoint service runs as its own process, killed at one step boundary by
`NODEWARD_FAILPOINT`, and restarted without it: the maintenance ends `done` with the node
cordoned by nodeward (its prior state recorded), exactly one `cordon applied` audit.
A tripped shared circuit breaker refuses a service's maintenance, never an operator's.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus.kv import TypedKV
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Outcome
from services.kernel.breaker import BreakerState
from services.kernel.marks import entries
from services.maintenance.service import CORDON_ANNOTATION
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import audits
from tests.integration.crash_fixtures import ServiceProcess, processes_of
from tests.integration.maintenance_fixtures import EnvFactory, MaintenanceEnv

POINTS = [
    "marks.apply.intent",
    "marks.apply.patched",
    "marks.apply.event",
    "marks.apply.done",
    "maintenance.cordon.advanced",
]

ProcFactory = Callable[..., Awaitable[tuple[MaintenanceEnv, ServiceProcess]]]


@pytest.fixture
async def checkpoint_process(
    maintenance_env: EnvFactory, nats_url: str, tmp_path: Path
) -> AsyncIterator[ProcFactory]:
    def make_env(**service: Any) -> Awaitable[MaintenanceEnv]:
        return maintenance_env(pods=lambda node: [], lease_ttl="1s", **service)

    async with processes_of("checkpoint", make_env, tmp_path, nats_url) as make:
        yield make


@pytest.mark.parametrize("point", POINTS)
async def test_maintenance_cordon_killed_at_each_step_ends_done_and_cordoned_once(
    checkpoint_process: ProcFactory, point: str
) -> None:
    env, proc = await checkpoint_process()
    proc.start(failpoint=point)
    await env.bus.publish(env.request(deadline_s=1.0))
    assert await proc.exited() == -9, proc.tail()
    proc.start()
    await wait_for(
        lambda: env.phase_is(MaintenancePhase.DONE), timeout=30, what="the maintenance done"
    )
    node = await env.admin.nodes.get(env.node)
    assert node["spec"].get("unschedulable") is True
    held = entries(node)["maintenance"]
    assert held.cordon and held.prior_unschedulable is False
    assert CORDON_ANNOTATION in node["metadata"]["annotations"]
    state = await env.state()
    assert state is not None and state.cordoned
    records = await audits(env.bus, env.node, "cordon")
    assert [r.outcome for r in records] == [Outcome.APPLIED], [
        (r.outcome, r.guard) for r in records
    ]
    proc.stop()


@pytest.mark.parametrize(
    "point",
    [
        "maintenance.notified",
        "maintenance.checkpointing",  # cordoned, no checkpoint yet
        "maintenance.checkpointing.item",  # the first pod's checkpoints recorded, done
        "maintenance.checkpointed",
        "maintenance.draining",
    ],
)
async def test_a_maintenance_killed_at_each_workflow_step_checkpoints_each_container_once(
    maintenance_env: EnvFactory, nats_url: str, tmp_path: Path, point: str
) -> None:
    # The engine's failpoints: right after each move of the workflow and after each pod.
    env = await maintenance_env(lease_ttl="1s", parallelism=1)
    proc = ServiceProcess.of("checkpoint", env.settings, tmp_path, nats_url)
    try:
        proc.start(failpoint=point)
        await env.bus.publish(env.request(deadline_s=5.0))
        assert await proc.exited() == -9, proc.tail()
        proc.start()
        done = await wait_for(
            lambda: env.phase_is(MaintenancePhase.DONE), timeout=40, what="the maintenance done"
        )
        calls = env.checkpoint_calls()
        assert len(calls) == len(set(calls)) == 4, calls  # every container once
        assert sorted((c.pod.name, c.pod.container) for c in done.checkpoints()) == sorted(calls)
        records = await audits(env.bus, env.node, "cordon")
        assert [r.outcome for r in records] == [Outcome.APPLIED]
        phases = [e.phase for e in await env.phases()]
        assert phases.count(MaintenancePhase.DRAINING) == 1, phases  # re-published ids: once
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("requested_by", "refused"), [("service/cordon", True), ("operator/jdoe", False)]
)
async def test_a_tripped_breaker_refuses_a_service_maintenance_not_an_operators(
    maintenance_env: EnvFactory, requested_by: str, refused: bool
) -> None:
    env = await maintenance_env(pods=lambda node: [])
    bucket = env.settings.services["checkpoint"]["breaker"]["bucket"]
    tripped = BreakerState(tripped_at=time.time(), trip_reason="3 of 8 nodes quarantined")
    await TypedKV(await env.bus.kv(bucket), BreakerState).put("breaker", tripped)
    await env.start()
    request = env.request(deadline_s=1.0)
    await env.bus.publish(
        request.model_copy(
            update={"data": request.data.model_copy(update={"requested_by": requested_by})}
        )
    )
    phase = MaintenancePhase.FAILED if refused else MaintenancePhase.DONE
    await wait_for(lambda: env.phase_is(phase), timeout=20, what=f"maintenance {phase.value}")
    node = await env.admin.nodes.get(env.node)
    assert bool(node["spec"].get("unschedulable")) is not refused
    records = await audits(env.bus, env.node, "cordon")
    expected = (Outcome.REFUSED, "circuit_breaker") if refused else (Outcome.APPLIED, None)
    assert [(r.outcome, r.guard) for r in records] == [expected]
