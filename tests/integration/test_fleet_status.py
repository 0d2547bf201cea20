"""`gather_status` against a real JetStream: KV records, last events, DLQ counts, audit trail."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest_asyncio

from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.bus.server import EmbeddedNats
from nodeward.cli.common import bucket_name
from nodeward.config import BusSettings
from nodeward.fleet_status import gather_status
from nodeward.kube.nodes import taints_of
from schemas import example_event, make_event
from schemas.common import ObjectRef
from schemas.gpu import GpuHealth, HealthState
from schemas.remediation import Outcome, Remediation
from schemas.state.breaker import BreakerState
from schemas.state.cordon import NODES, TAINT_KEY, NodeRecord, Quarantine
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import EnvFactory, failed


@pytest_asyncio.fixture
async def own_bus(own_nats: EmbeddedNats) -> AsyncIterator[Bus]:
    """A bus on a server of its own: the `cordon` bucket and streams hold only this test's data."""
    b = await Bus.connect(BusSettings(url=own_nats.url), source="test/status")
    yield b
    await b.close(grace=2)


def _health(node: str, index: int, state: HealthState, heartbeat: bool = False) -> GpuHealth:
    return GpuHealth(
        node=node,
        gpu_index=index,
        gpu_uuid=f"GPU-{node}-{index}",
        state=state,
        heartbeat=heartbeat,
        observed_at=datetime.now(UTC),
    )


async def test_status_reads_kv_streams_dlq_and_audit(own_bus: Bus, own_nats: EmbeddedNats) -> None:
    kv = await own_bus.kv(NODES.name)
    now = datetime.now(UTC)
    await TypedKV(kv, NODES.record).put(
        NODES.key("gpu-a"),
        NodeRecord(
            quarantine=Quarantine(
                incident="inc-1",
                rule="xid-node-action",
                reason="GPU 1 failed: XID 79",
                gpus=["1"],
                started_at=now - timedelta(seconds=30),
                phase="applied",
                cordoned=True,
                taints=["NoSchedule"],
            )
        ),
    )
    breaker = await own_bus.kv("breaker")  # shared by every service that removes nodes
    await TypedKV(breaker, BreakerState).put("breaker", BreakerState(admitted={"Node/gpu-a": 1.0}))
    for event_data in (
        _health("gpu-a", 0, HealthState.HEALTHY),
        _health("gpu-a", 1, HealthState.HEALTHY),
        _health("gpu-a", 1, HealthState.FAILED),  # the newest on its subject wins
        _health("gpu-b", 0, HealthState.HEALTHY, heartbeat=True),
    ):
        await own_bus.publish(make_event(event_data, source="test/status"))
    for i in range(3):
        await own_bus.publish(
            make_event(
                Remediation(
                    action="quarantine",
                    target=ObjectRef(kind="Node", name=f"gpu-{i}"),
                    outcome=Outcome.APPLIED,
                    reason=f"action {i}",
                    actor="service/cordon",
                ),
                source="service/cordon",
            )
        )
    for _ in range(2):
        await own_bus.publish(example_event("dlq.v1"))  # dlq.GPU.cordon

    fleet = await gather_status(own_bus.nc, nats_url=own_nats.url, actions=2)

    nodes = {n.name: n for n in fleet.nodes}
    assert set(nodes) == {"gpu-a", "gpu-b"}
    assert nodes["gpu-a"].gpus == {"0": "healthy", "1": "failed"}
    assert nodes["gpu-a"].health == "failed" and nodes["gpu-a"].agent_live
    q = nodes["gpu-a"].quarantine
    assert q is not None and q.reason == "GPU 1 failed: XID 79" and 29 <= q.age_s < 60
    assert nodes["gpu-b"].quarantine is None and nodes["gpu-b"].health == "healthy"
    assert fleet.breaker.admitted == 1 and not fleet.breaker.open
    assert fleet.dlq == {"dlq.GPU.cordon": 2}
    assert [a.reason for a in fleet.recent_actions] == ["action 2", "action 1"]  # newest first
    assert fleet.missing == []


async def test_status_shows_the_quarantine_the_cordon_service_wrote(
    cordon_env: EnvFactory, nats_url: str
) -> None:
    """The real service quarantines a node; status, reading the bucket the service is
    configured with through the same declaration, shows what the service recorded and
    what the node carries."""
    env = await cordon_env()
    await env.start()
    name = env.nodes[0]
    await env.publish(failed(name))
    bucket = bucket_name(env.settings, "cordon", NODES)
    assert bucket == env.settings.services["cordon"]["bucket"] != NODES.name
    kv = await env.bus.kv(bucket)

    async def applied() -> NodeRecord | None:
        found = await TypedKV(kv, NODES.record).get(NODES.key(name))
        q = found.value.quarantine if found else None
        return found.value if q is not None and q.phase == "applied" else None

    written = await wait_for(applied, timeout=10, what="the service's quarantine record")
    assert written.quarantine is not None
    breaker = env.settings.services["cordon"]["breaker"]["bucket"]  # this test's own window
    fleet = await gather_status(
        env.bus.nc, nats_url=nats_url, bucket=bucket, breaker_bucket=breaker
    )
    shown = next(n for n in fleet.nodes if n.name == name)
    q = shown.quarantine
    assert q is not None
    assert (q.reason, q.rule, q.gpus, q.phase, q.cordoned, q.taints) == (
        written.quarantine.reason,
        written.quarantine.rule,
        written.quarantine.gpus,
        "applied",
        True,
        ["NoSchedule"],
    )
    node = await env.node(name)
    assert node["spec"].get("unschedulable") is True
    assert [t["effect"] for t in taints_of(node) if t["key"] == TAINT_KEY] == q.taints
    assert shown.health == "failed" and fleet.breaker.admitted == 1
