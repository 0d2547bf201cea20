"""A node agent's NATS user can publish its own node's GPU health, and not another node's."""

from __future__ import annotations

from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from nodeward.bus import Bus, PublishError
from nodeward.bus.server import EmbeddedNats
from schemas import make_event
from schemas.gpu import GpuHealth
from schemas.session import SessionIdle
from tests.helpers.node_a import admin_bus, agent_a, auth_conf


async def test_agent_may_publish_only_its_own_node(tmp_path: Path) -> None:
    async with EmbeddedNats(tmp_path / "nats", config_file=auth_conf(tmp_path)) as server:
        operator = await admin_bus(server)  # provisions streams
        agent_settings = agent_a(server.url, publish_timeout="500ms", publish_retries=0)
        agent = await Bus.connect(agent_settings, source="agent/gpu/gpu-node-a")
        try:
            own = make_event(
                GpuHealth.example().model_copy(update={"node": "gpu-node-a"}),
                source="agent/gpu/gpu-node-a",
            )
            ack = await agent.publish(own)
            assert ack.stream == "GPU"

            forged = make_event(
                GpuHealth.example().model_copy(update={"node": "gpu-node-b"}),
                source="agent/gpu/gpu-node-a",
            )
            with pytest.raises(PublishError):
                await agent.publish(forged)
            info = await operator.js.stream_info("GPU", subjects_filter="gpu.health.>")
            assert set(info.state.subjects or {}) == {own.nats_subject}

            # Its idleness agent: its own node's sessions, no other node's.
            session = SessionIdle.example().model_copy(update={"node": "gpu-node-a"})
            mine = make_event(session, source="agent/idle/gpu-node-a")
            assert (await agent.publish(mine)).stream == "SESSIONS"
            other = make_event(
                session.model_copy(update={"node": "gpu-node-b"}), source="agent/idle/gpu-node-a"
            )
            with pytest.raises(PublishError):
                await agent.publish(other)

            # No JetStream API either: creating a stream is refused (the request times out).
            with pytest.raises(TimeoutError):
                await agent.js.add_stream(name="EVIL", subjects=["evil.>"])
            with pytest.raises(NotFoundError):
                await operator.js.stream_info("EVIL")
        finally:
            await agent.close(grace=1)
            await operator.close(grace=1)


async def test_agent_reads_and_writes_only_its_own_energy_totals(tmp_path: Path) -> None:
    """The energy agent keeps its totals in KV `energy`, key `node.<node>`: its NATS user may
    put and get that key (direct get) and no other node's, and may not create the bucket."""
    async with EmbeddedNats(tmp_path / "nats", config_file=auth_conf(tmp_path)) as server:
        operator = await admin_bus(server)  # + the bucket
        agent = await Bus.connect(
            agent_a(server.url, publish_timeout="500ms"), source="agent/energy/gpu-node-a"
        )
        try:
            kv = await agent.kv("energy")  # bound, not created: the operator provisioned it
            await kv.put("node.gpu-node-a", b'{"energy_j": 1.0}')
            entry = await kv.get("node.gpu-node-a")
            assert entry.value == b'{"energy_j": 1.0}'

            theirs = await operator.kv("energy")
            await theirs.put("node.gpu-node-b", b'{"energy_j": 2.0}')
            with pytest.raises(TimeoutError):  # the server drops the refused request
                await kv.get("node.gpu-node-b")
            with pytest.raises(TimeoutError):
                await kv.put("node.gpu-node-b", b'{"energy_j": 0.0}')
            assert (await theirs.get("node.gpu-node-b")).value == b'{"energy_j": 2.0}'
            with pytest.raises(TimeoutError):  # no bucket of its own making either
                await agent.kv("evil")
        finally:
            await agent.close(grace=1)
            await operator.close(grace=1)
