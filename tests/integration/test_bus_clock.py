"""A node agent reads its own newest message back for the bus's store time and says how far
its clock is off: at its first reading, in a gauge, and again only when that changes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from launch.access import AGENT_GRANTS
from nodeward.bus import Bus
from nodeward.bus.clock import ClockProbe, reading
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from nodeward.nats_auth import node_agent
from schemas import make_event
from schemas.base import utcnow
from schemas.gpu import GpuHeartbeat
from schemas.streams import stream_spec
from tests.helpers.node_a import admin_bus, agent_a, auth_conf


def beat(node: str, *, ahead: timedelta = timedelta(0)) -> object:
    data = GpuHeartbeat.example().model_copy(update={"node": node})
    return make_event(data, source=f"agent/gpu/{node}", time=utcnow() + ahead)


async def test_an_agent_reads_back_only_its_own_heartbeat_and_says_its_clock_is_ahead(
    tmp_path: Path,
) -> None:
    conf = auth_conf(tmp_path, node_agent("gpu-node-b", "b", AGENT_GRANTS))
    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        operator = await admin_bus(server)
        agent = await Bus.connect(agent_a(server.url), source="agent/gpu/gpu-node-a")
        try:
            probe = ClockProbe(agent, "gpu.heartbeat.gpu-node-a")
            assert await probe.read() is None  # nothing of ours stored yet
            await agent.publish(beat("gpu-node-a", ahead=timedelta(hours=1)))  # type: ignore[arg-type]
            got = await probe.read()
            assert got is not None and 3599 < got.offset_s < 3601, got
            with capture_logs() as logs:
                probe.judge(got, first=True)
                probe.last = got
                probe.judge(got, first=False)  # still off: not said again
            [said] = [e for e in logs if e["event"].startswith("clock.")]
            assert said["event"] == "clock.off" and said["log_level"] == "warning"
            assert "1h" not in said["problem"] and "ahead of the bus" in said["problem"]
            assert "refused as from the future" in said["problem"]
            gauge = agent.metrics.registry.get_sample_value(
                "nodeward_clock_offset_seconds", {"subject": "gpu.heartbeat.gpu-node-a"}
            )
            assert gauge is not None and gauge > 3599

            # NTP fixed it: said once, as ok.
            await agent.publish(beat("gpu-node-a"))  # type: ignore[arg-type]
            fixed = await probe.read()
            assert fixed is not None and abs(fixed.offset_s) < 2
            with capture_logs() as logs:
                probe.judge(fixed, first=False)
            assert [e["event"] for e in logs] == ["clock.ok"]

            # Another node's heartbeat is not its to read: the server drops the request.
            await operator.publish(beat("gpu-node-b"))  # type: ignore[arg-type]
            theirs = ClockProbe(agent, "gpu.heartbeat.gpu-node-b")
            assert await theirs.read() is None
            assert await ClockProbe(operator, "gpu.heartbeat.gpu-node-b").read() is not None
        finally:
            await agent.close(grace=1)
            await operator.close(grace=1)


async def test_with_partitions_the_probe_reads_the_partitioned_subject(
    tmp_path: Path,
) -> None:
    async with EmbeddedNats(tmp_path / "nats") as server:
        settings = BusSettings(url=server.url, partitions=4)
        async with await Bus.connect(settings, source="agent/gpu/gpu-node-p") as bus:
            await bus.publish(beat("gpu-node-p"))  # type: ignore[arg-type]
            probe = ClockProbe(bus, "gpu.heartbeat.gpu-node-p")
            spec = stream_spec("HEARTBEATS").partitioning
            assert spec is not None and probe.api.endswith(
                f"gpu.heartbeat.gpu-node-p.{spec.index(('gpu-node-p',), 4)}"
            )
            got = await probe.read()
            assert got is not None and abs(got.offset_s) < 2


def test_a_probe_needs_a_stream_with_direct_get_and_headers_that_say_both_times() -> None:
    class FakeBus:
        settings = BusSettings()

    with pytest.raises(ValueError, match="direct get"):
        ClockProbe(FakeBus(), "gpu.health.n1.0")  # type: ignore[arg-type]
    assert reading("s", None) is None
    assert reading("s", {"ce-time": "2026-12-02T06:00:00Z"}) is None
    got = reading(
        "s",
        {"ce-time": "2026-12-02T06:00:05Z", "Nats-Time-Stamp": "2026-12-02T06:00:00.123456789Z"},
    )
    assert got is not None and round(got.offset_s, 3) == 4.877
