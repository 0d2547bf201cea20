"""A device taint and its release survive a SIGKILL at each step: the cordon service runs as
its own process, `NODEWARD_FAILPOINT` kills it there, it is restarted without it. The end:
exactly one DeviceTaintRule (none after the release), one `applied` audit each, the node
never quarantined."""

from __future__ import annotations

from typing import Any

import pytest

from nodeward.kube.devices import GROUP
from schemas.gpu import HealthState
from schemas.remediation import Outcome
from tests.conftest import wait_for
from tests.integration import test_cordon_crash as crash
from tests.integration.cordon_fixtures import CordonEnv, audits, failed, health
from tests.integration.test_cordon import tainted
from tests.integration.test_cordon_crash import ProcFactory, bound, count, record, settled
from tests.integration.test_cordon_devices import DRA, on_gpu

pytestmark = pytest.mark.timeout(120)
cordon_process = crash.cordon_process  # the fixture: the service as its own process

RULES = f"/apis/{GROUP}/v1/devicetaintrules"


async def rules(env: CordonEnv) -> list[dict[str, Any]]:
    reply = await env.admin.client.request("GET", RULES)
    return list(reply.get("items") or [])


@pytest.mark.parametrize(
    "point", ["cordon.device.pending", "cordon.device.created", "cordon.device.applied"]
)
async def test_device_taint_killed_at_each_step_is_finished_after_restart(
    cordon_process: ProcFactory, point: str
) -> None:
    env, proc = await cordon_process(count=1, nodes={0: DRA})
    name = env.nodes[0]
    proc.start(failpoint=point)
    await wait_for(lambda: bound(env), timeout=30, what="the consumer")
    await env.publish(on_gpu(failed(name, gpu=2)))
    assert await proc.exited() == -9, proc.tail()
    proc.start()

    async def done() -> bool:
        rec = await record(env, name)
        ex = rec.devices.get("2") if rec else None
        return bool(ex and ex.phase == "applied" and ex.uid) and await settled(env)

    await wait_for(done, timeout=20, what="the exclusion recorded applied, the event acked")
    found = await rules(env)
    assert [r["spec"]["deviceSelector"]["device"] for r in found] == ["gpu-2"]
    rec = await record(env, name)
    assert rec is not None and rec.devices["2"].uid == found[0]["metadata"]["uid"]
    records = await wait_for(
        lambda: audits(env.bus, name, "device_taint"), timeout=5, what="the audit"
    )
    assert count(records, "device_taint", Outcome.APPLIED) == 1, [r.outcome for r in records]
    assert not tainted(await env.node(name))
    proc.stop()


async def test_device_release_killed_before_the_record_clears_is_finished(
    cordon_process: ProcFactory,
) -> None:
    env, proc = await cordon_process(count=1, nodes={0: DRA})
    name = env.nodes[0]
    proc.start(failpoint="cordon.device.released")
    await wait_for(lambda: bound(env), timeout=30, what="the consumer")
    await env.publish(on_gpu(failed(name, gpu=5, seq=1)))
    await wait_for(lambda: rules(env), timeout=20, what="the rule")
    await env.publish(on_gpu(health(name, HealthState.HEALTHY, gpu=5, seq=2)))
    assert await proc.exited() == -9, proc.tail()
    assert await rules(env) == []
    proc.start()

    async def cleared() -> bool:
        rec = await record(env, name)
        return rec is not None and not rec.devices

    await wait_for(cleared, timeout=20, what="the record cleared after the restart")
    records = await wait_for(
        lambda: audits(env.bus, name, "device_untaint"), timeout=5, what="the audit"
    )
    assert count(records, "device_untaint", Outcome.APPLIED) == 1
    proc.stop()
