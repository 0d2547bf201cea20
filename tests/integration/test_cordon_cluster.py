"""services.cordon on a three-server NATS cluster (R3 streams and buckets, as the chart
runs it): SIGKILL the GPU stream's leader mid-storm and no acknowledged event is lost, no
quarantine applied twice."""

from __future__ import annotations

from typing import Any

import pytest
from nats.errors import Error as NatsError

from nodeward.bus.errors import PublishError
from nodeward.config import BusSettings
from schemas.streams import STREAMS
from tests.conftest import wait_for
from tests.helpers.nats_cluster import NatsCluster
from tests.integration.cordon_fixtures import EnvFactory, audits, failed
from tests.integration.test_cordon import outcomes, tainted

pytestmark = pytest.mark.timeout(180)

R3 = {"stream_replicas": 3, "publish_timeout": "5s"}


@pytest.fixture
def nats_url(nats_cluster: NatsCluster) -> str:
    """This module's NATS is the three-server cluster."""
    return nats_cluster.url


@pytest.fixture
def bus_settings(nats_url: str) -> BusSettings:
    return BusSettings(url=nats_url, **R3)  # type: ignore[arg-type]


async def test_cordon_survives_sigkill_of_the_gpu_streams_leader(
    cordon_env: EnvFactory, nats_cluster: NatsCluster
) -> None:
    env = await cordon_env(
        bus_extra=R3, breaker={"max_percent": 100, "max_nodes": 100, "calm_period": None}
    )
    daemon = await env.start()

    async def bound() -> bool:
        return (await daemon.readiness()).ready

    await wait_for(bound, timeout=30, what="the cordon service's consumers bound")
    for spec in STREAMS:
        info = await env.bus.js.stream_info(spec.name)
        assert info.config.num_replicas == 3 and info.cluster is not None
        assert len(info.cluster.replicas or []) == 2, spec.name
    first, rest = env.nodes[:5], env.nodes[5:]
    acks = await env.bus.publish_many([failed(n) for n in first])
    leader = (await env.bus.js.stream_info("GPU")).cluster.leader  # type: ignore[union-attr]
    assert leader is not None
    await nats_cluster.named(leader).kill()
    # Published while a new leader is elected, sent again until acknowledged (stored on two
    # of three), as an agent's outbox does: `Bus.publish` alone gives up after its retries.
    later = [failed(n) for n in rest]

    async def stored() -> bool:
        try:
            acks.extend(await env.bus.publish_many(later))
        except PublishError:
            return False
        return True

    await wait_for(stored, timeout=60, interval=0.5, what="the rest acknowledged")
    assert len(acks) == 10

    async def all_quarantined() -> bool:
        return all([tainted(await env.node(n)) for n in env.nodes])

    await wait_for(all_quarantined, timeout=60, interval=0.2, what="every node quarantined")
    for node in env.nodes:

        async def decided(n: str = node) -> list[Any]:
            try:  # the AUDIT stream may still be electing its leader
                return await audits(env.bus, n, "quarantine")
            except NatsError:
                return []

        found = await wait_for(decided, timeout=30, interval=0.5, what=f"{node}'s audit")
        assert outcomes(found) == [("applied", None)], node
    info = await env.bus.js.stream_info("GPU", subjects_filter="gpu.health.>")
    assert sum(info.state.subjects.get(f"gpu.health.{n}.0", 0) for n in env.nodes) == 10
