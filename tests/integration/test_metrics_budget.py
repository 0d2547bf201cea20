"""The cardinality budget against real daemons: the simulated GPU and energy agents of the
seed's largest node shapes (MIG, AMD, H100 with workloads), on a real nats-server, scraped
over HTTP after an XID, and a daemon's /metrics in both formats without `_created`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx

from launch.observability.budget import count, load, violations
from launch.sim_agents.energy import build_sim_energy_agent
from launch.sim_agents.gpu import build_sim_gpu_agents
from nodeward.bus import Bus
from nodeward.config import BusSettings, DaemonSettings, Settings
from nodeward.daemon import Daemon
from sim.cluster.seed import load_seed
from sim.inject import InjectRequest, request_injection
from tests.conftest import wait_for

NODES = ("gpu-h100-01", "gpu-a100-mig-01", "gpu-mi300x-01")
"""A busy H100 node, the MIG node (the most GPU units) and an AMD one."""


@asynccontextmanager
async def agents(bus_settings: BusSettings) -> AsyncIterator[dict[str, Daemon]]:
    """The GPU and energy agents of NODES, started, by daemon name."""
    seed = load_seed()
    nodes = [n for n in seed.nodes if n.name in NODES]
    settings = Settings(
        bus=bus_settings,
        daemon={"shutdown_timeout": "4s"},
        agents={
            "gpu": {"heartbeat_interval": "0.5s", "telemetry_interval": "0.5s"},
            "energy": {"interval": "1s", "sample_every": "0.2s", "read_timeout": "0.5s"},
        },
    )
    await (await Bus.connect(bus_settings, source="test/budget")).close()  # the streams
    daemons = await build_sim_gpu_agents(settings, nodes, seed.pods)
    for node in nodes:
        daemon, _, _ = await build_sim_energy_agent(settings, node, seed.pods)
        daemons.append(daemon)
    async with AsyncExitStack() as stack:
        for daemon in daemons:
            await daemon.start()
            stack.push_async_callback(daemon.stop)
        yield {d.name: d for d in daemons}


async def scrape(http: httpx.AsyncClient, daemons: dict[str, Daemon]) -> dict[str, str]:
    replies = await asyncio.gather(*(http.get(f"{d.url}/metrics") for d in daemons.values()))
    return {name: r.text for name, r in zip(daemons, replies, strict=True)}


async def test_the_agents_of_the_largest_node_shapes_stay_within_the_budget(
    bus_settings: BusSettings,
) -> None:
    budget = load()
    async with agents(bus_settings) as daemons, httpx.AsyncClient() as http:
        bus = await Bus.connect(bus_settings, source="test/budget")
        try:
            reply = await request_injection(bus.nc, "gpu-a100-mig-01", InjectRequest(gpu=0, xid=79))
            assert reply.ok, reply.error
        finally:
            await bus.close()

        async def settled() -> dict[str, str] | None:
            texts = await scrape(http, daemons)
            counts = count(texts)
            telemetry = counts.families.get("nodeward_gpu_power_watts", {}).get("agent-gpu")
            pods = counts.families.get("nodeward_pod_energy_joules_total", {}).get("agent-energy")
            xids = counts.families.get("nodeward_gpu_xid_events_total", {}).get("agent-gpu")
            done = (
                telemetry is not None
                and telemetry.series == 8 * len(NODES)
                and pods is not None
                and pods.series > 0
                and xids is not None
                and xids.series > 0
            )
            return texts if done else None

        texts = await wait_for(settled, timeout=60, interval=0.5, what="telemetry, pods, an XID")
    counts = count(texts)
    assert counts.daemons == {"agent-energy": 3, "agent-gpu": 3}
    assert violations(budget, counts, nodes=len(NODES)) == []
    assert counts.created_served() == 0
    # The MIG node: each GPU and MIG instance has its own health series, within 64.
    health = counts.families["nodeward_gpu_health_state"]["agent-gpu"]
    assert 8 < health.largest <= 64


async def test_a_daemon_serves_no_created_series_in_either_format() -> None:
    async with (
        Daemon("cordon", DaemonSettings(port=0)) as daemon,
        httpx.AsyncClient(base_url=daemon.url) as http,
    ):
        daemon.metrics.published.labels("gpu.health.v1").inc()
        daemon.metrics.handled.labels("cordon", "gpu.health.v1", "ok").inc()
        daemon.metrics.handler_seconds.labels("cordon").observe(0.01)
        text = (await http.get("/metrics")).text
        om = (
            await http.get(
                "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
            )
        ).text
    assert 'nodeward_events_published_total{type="gpu.health.v1"} 1.0' in text
    assert "nodeward_handler_seconds_count" in text and "# EOF" in om
    assert "_created" not in text and "_created" not in om
    plain, open_metrics = count({"cordon": text}), count({"cordon": om})
    assert plain.series() == open_metrics.series()
    # what each would have had: one per counter series, one per histogram
    assert plain.series(created=True) - plain.series() == 4
    assert violations(load(), plain, nodes=1) == []
