"""`nodeward sim fleet`: many nodes' agents from one process, against a real nats-server:
the subjects and rates a real node publishes, and injections answered per node."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.errors import NoRespondersError

from launch.access import AGENT_GRANTS
from launch.sim_agents.fleet import Fleet, fleet_daemon
from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, Settings
from nodeward.daemon import Daemon
from nodeward.nats_auth import (
    NatsUser,
    admin,
    node_agent_nkey,
    render_authorization,
    write_agent_seed,
)
from schemas.tokens import token
from sim.cluster.seed import Gpu, Mig, NodeSeed, PodSeed
from sim.inject import InjectRequest, request_injection
from tests.conftest import wait_for

FAST = {
    "gpu": {"heartbeat_interval": "0.5s", "telemetry_interval": "0.5s"},
    "energy": {"interval": "0.5s", "sample_every": "0.5s"},
    "idle": {"interval": "0.5s"},
}


@dataclass
class Rig:
    nodes: list[str]
    fleet: Fleet
    daemon: Daemon
    bus: Bus
    seen: list[tuple[str, str, dict[str, Any]]]

    def subjects(self, prefix: str) -> Counter[str]:
        return Counter(s for s, _, _ in self.seen if s.startswith(prefix))

    def bodies(self, subject: str) -> list[dict[str, Any]]:
        return [b for s, _, b in self.seen if s == subject]

    async def last(self, subject: str, **match: Any) -> dict[str, Any]:
        """The newest body on `subject` once it has `match`'s values."""

        def found() -> dict[str, Any] | None:
            bodies = self.bodies(subject)
            ok = bodies and all(bodies[-1].get(k) == v for k, v in match.items())
            return bodies[-1] if ok else None

        return await wait_for(found, what=f"{subject} with {match}")  # type: ignore[no-any-return]


@pytest.fixture
async def rig(bus_settings: BusSettings, bus: Bus) -> AsyncIterator[Rig]:
    prefix = f"fleet-{uuid.uuid4().hex[:6]}"
    nodes = [NodeSeed(name=f"{prefix}-{i}", gpu=Gpu(count=2)) for i in range(3)]
    pods = [PodSeed(name="nb-0", namespace="ml", node=nodes[0].name, gpus=1, role="notebook")]
    seen: list[tuple[str, str, dict[str, Any]]] = []

    async def collect(msg: Any) -> None:
        source = (msg.headers or {}).get("ce-source", "")
        seen.append((msg.subject, source, json.loads(msg.data)))

    subs = [
        await bus.nc.subscribe(f"{kind}.>", cb=collect) for kind in ("gpu", "energy", "session")
    ]
    settings = Settings(bus=bus_settings, agents=FAST)
    daemon, fleet = await fleet_daemon(settings, nodes, pods)
    await daemon.start()
    try:
        await wait_for(fleet.ready.is_set, timeout=10, what="fleet ready")
        yield Rig([n.name for n in nodes], fleet, daemon, bus, seen)
    finally:
        await daemon.stop()
        for sub in subs:
            await sub.unsubscribe()


async def test_each_node_publishes_its_agents_subjects_as_itself(rig: Rig) -> None:
    def steady() -> bool:
        return all(
            rig.subjects(f"gpu.heartbeat.{n}")[f"gpu.heartbeat.{n}"] >= 2
            and rig.subjects(f"gpu.telemetry.{n}")[f"gpu.telemetry.{n}"] >= 2
            and rig.subjects(f"energy.node.{n}")[f"energy.node.{n}"] >= 2
            for n in rig.nodes
        )

    await wait_for(steady, timeout=10, what="two rounds of every periodic subject")
    for node in rig.nodes:
        # Each GPU's state once at start, as an agent's boot publishes it.
        assert rig.subjects(f"gpu.health.{node}.") == {
            f"gpu.health.{node}.0": 1,
            f"gpu.health.{node}.1": 1,
        }
        beat = rig.bodies(f"gpu.heartbeat.{node}")[-1]
        assert [g["state"] for g in beat["gpus"]] == ["healthy", "healthy"]
    for subject, source, body in rig.seen:
        node = body.get("node")
        assert node in rig.nodes and subject.split(".")[2] == node
        kind = {"gpu": "gpu", "energy": "energy", "session": "idle"}[subject.split(".")[0]]
        assert source == f"agent/{kind}/{node}"
    notebook = f"session.activity.{rig.nodes[0]}.ml.nb-0"
    await wait_for(lambda: rig.bodies(notebook), what="the notebook's activity")
    assert rig.subjects("session.") == {notebook: len(rig.bodies(notebook))}
    assert rig.subjects("energy.pod.") and all(
        s.startswith(f"energy.pod.{rig.nodes[0]}.ml.nb-0") for s in rig.subjects("energy.pod.")
    )


async def test_injections_are_answered_per_node_and_published_as_changes(rig: Rig) -> None:
    node = rig.nodes[1]
    nc = rig.bus.nc
    reply = await request_injection(nc, node, InjectRequest(gpu=1, xid=79))
    assert reply.ok and reply.applied == "XID 79"
    # Answered once stored: the XID and the health change, at the sequences it names.
    assert reply.stored is not None and len(reply.stored) == 2
    stored = [await rig.bus.js.get_msg("GPU", seq) for seq in reply.stored]
    assert [str(m.subject).split(".")[:4] for m in stored] == [
        ["gpu", "xid", node, "1"],
        ["gpu", "health", node, "1"],
    ]
    failed = await rig.last(f"gpu.health.{node}.1", state="failed")
    assert failed["previous_state"] == "healthy"
    assert failed["recommended_action"] == "reboot_node" and failed["sequence"] == 2
    assert any(r["xid"] == 79 for r in failed["reasons"])
    xid = await rig.last(f"gpu.xid.{node}.1")
    assert xid["xid"] == 79 and xid["detectors"] == ["nvml"]
    assert next(r for r in failed["reasons"] if r["xid"] == 79)["detectors"] == ["nvml"]
    await wait_for(
        lambda: any(b["gpus"][1]["state"] == "failed" for b in rig.bodies(f"gpu.heartbeat.{node}")),
        what="the heartbeat restating the failure",
    )
    reply = await request_injection(nc, node, InjectRequest(gpu=1, recover=True))
    assert reply.ok
    healed = await rig.last(f"gpu.health.{node}.1", state="healthy")
    assert healed["previous_state"] == "failed"
    reply = await request_injection(nc, node, InjectRequest(gpu=0, xid=48, via="both"))
    assert reply.ok and reply.applied == "XID 48 via both"
    both = await rig.last(f"gpu.xid.{node}.0")
    assert both["xid"] == 48 and both["detectors"] == ["nvml", "kmsg"]
    # What the fleet does not simulate is said, not pretended.
    reply = await request_injection(nc, node, InjectRequest(gpu=0, fault="thermal"))
    assert not reply.ok and "not simulated" in (reply.error or "")
    with pytest.raises(NoRespondersError):
        await request_injection(nc, "no-such-node", InjectRequest(gpu=0, xid=79))


async def test_an_injection_not_stored_is_not_answered_ok(tmp_path: Path) -> None:
    """No stream takes the fault (none provisioned): the reply says so, not ok."""
    async with EmbeddedNats(tmp_path / "nats") as server:
        settings = BusSettings(url=server.url, provision=False, publish_timeout="0.2s")
        bus = await Bus.connect(settings, source="test/fleet")
        node = NodeSeed(name=f"lonely-{uuid.uuid4().hex[:6]}", gpu=Gpu(count=1))
        fleet = Fleet(bus, [node], inject_within=0.5)
        running = asyncio.create_task(fleet.run())
        try:
            await wait_for(fleet.ready.is_set, timeout=10, what="fleet ready")
            request = InjectRequest(gpu=0, xid=79)
            reply = await request_injection(bus.nc, node.name, request, timeout=10)
            assert not reply.ok and reply.stored is None
            assert (reply.error or "").startswith("not acknowledged within 0.5 s")
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await bus.close(grace=1)


async def test_with_nkeys_each_node_publishes_as_itself(tmp_path: Path) -> None:
    """Where NATS authorizes, each fleet node signs in with its own node's nkey: the fleet's
    own user may publish nothing, yet every node's subjects are stored."""
    nodes = [NodeSeed(name=f"nk-node-{i}", gpu=Gpu(count=2)) for i in range(2)]
    keys = tmp_path / "keys"
    users = [admin("admin-pw"), NatsUser("fleet", "fleet-pw", ("nothing.here",), ("_INBOX.>",))]
    users += [
        node_agent_nkey(n.name, write_agent_seed(keys / f"{token(n.name)}.nk"), AGENT_GRANTS)
        for n in nodes
    ]
    conf = tmp_path / "auth.conf"
    conf.write_text(render_authorization(users))
    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        admin_url = server.url.replace("nats://", "nats://nodeward-admin:admin-pw@")
        operator = await Bus.connect(BusSettings(url=admin_url), source="test/admin")
        fleet_url = server.url.replace("nats://", "nats://fleet:fleet-pw@")
        settings = Settings(bus={"url": fleet_url, "provision": False}, agents=FAST)
        daemon, fleet = await fleet_daemon(settings, nodes, nkeys=keys)
        await daemon.start()
        try:
            await wait_for(fleet.ready.is_set, timeout=10, what="fleet ready")

            async def stored() -> bool:
                beats = await operator.js.stream_info("HEARTBEATS", subjects_filter=">")
                totals = await operator.js.stream_info("KV_energy", subjects_filter=">")
                return {f"gpu.heartbeat.{n.name}" for n in nodes} <= set(
                    beats.state.subjects or {}
                ) and {f"$KV.energy.node.{n.name}" for n in nodes} <= set(
                    totals.state.subjects or {}
                )

            await wait_for(stored, timeout=10, what="each node's heartbeats and energy totals")
            health = await operator.js.stream_info("GPU", subjects_filter="gpu.health.>")
            assert set(health.state.subjects or {}) == {
                f"gpu.health.{n.name}.{g}" for n in nodes for g in (0, 1)
            }
            # An injection reaches the node's own subscription, on its own connection.
            reply = await request_injection(
                operator.nc, nodes[1].name, InjectRequest(gpu=0, xid=79)
            )
            assert reply.ok
        finally:
            await daemon.stop()
            await operator.close(grace=1)


async def test_faults_at_a_rate_fail_gpus_with_xid_79(bus_settings: BusSettings, bus: Bus) -> None:
    prefix = f"storm-{uuid.uuid4().hex[:6]}"
    nodes = [NodeSeed(name=f"{prefix}-{i}", gpu=Gpu(count=2)) for i in range(2)]
    failures: list[str] = []

    async def collect(msg: Any) -> None:
        if (
            msg.subject.split(".")[2].startswith(prefix)
            and json.loads(msg.data)["state"] == "failed"
        ):
            failures.append(msg.subject)

    sub = await bus.nc.subscribe("gpu.health.*.*", cb=collect)
    # 3,600 XID 79s per node-hour: about two a second over the two nodes.
    settings = Settings(bus=bus_settings, agents=FAST)
    daemon, _ = await fleet_daemon(settings, nodes, faults_per_hour=3600)
    await daemon.start()
    try:
        await wait_for(lambda: len(failures) >= 2, timeout=10, what="two GPUs failed at random")
    finally:
        await daemon.stop()
        await sub.unsubscribe()
    assert all(s.startswith(f"gpu.health.{prefix}-") for s in failures)


async def test_mig_instances_and_idle_sessions_are_published_as_their_agents_would(
    bus_settings: BusSettings, bus: Bus
) -> None:
    """A MIG node: every MIG instance its own health unit (at start, in each heartbeat, and
    on a change). Its notebook on a MIG instance, without load, busy kernel or CPU, is
    idle: `session.idle` with the idleness agent's evidence, until a load on its GPU makes
    it active again. A busy SSH session on the other node is never reported idle."""
    prefix = f"mig-{uuid.uuid4().hex[:6]}"
    mig_node = NodeSeed(
        name=f"{prefix}-0",
        gpu=Gpu(product="NVIDIA-A100-SXM4-80GB", count=2, family="ampere"),
        mig=Mig(devices={"1g.10gb": 14}),
    )
    plain = NodeSeed(name=f"{prefix}-1", gpu=Gpu(count=1))

    def one_gpu(name: str, node: str, role: str, **more: Any) -> PodSeed:
        return PodSeed(name=name, namespace="ml", node=node, gpus=1, role=role, **more)

    pods = [
        one_gpu("nb-0", mig_node.name, "notebook", gpu_resource="nvidia.com/mig-1g.10gb"),
        one_gpu("ssh-0", plain.name, "ssh", annotations={"sim.nodeward.io/cpu": "2"}),
    ]
    seen: list[tuple[str, dict[str, Any]]] = []

    async def collect(msg: Any) -> None:
        if msg.subject.split(".")[2].startswith(prefix):
            seen.append((msg.subject, json.loads(msg.data)))

    subs = [
        await bus.nc.subscribe(f"{kind}.>", cb=collect)
        for kind in ("gpu.health", "gpu.heartbeat", "session")
    ]
    agents = FAST | {"idle": {"interval": "0.3s", "idle_after": "0.5s"}}
    daemon, fleet = await fleet_daemon(
        Settings(bus=bus_settings, agents=agents), [mig_node, plain], pods
    )
    await daemon.start()

    def bodies(subject: str) -> list[dict[str, Any]]:
        return [b for s, b in seen if s == subject]

    try:
        await wait_for(fleet.ready.is_set, timeout=10, what="fleet ready")
        node = mig_node.name
        units = {s.split(".", 3)[3] for s, _ in seen if s.startswith(f"gpu.health.{node}.")}
        assert {"0", "1"} <= units and len(units) == 2 + 14
        assert all(u in {"0", "1"} or "-mig" in u for u in units)
        beat = await wait_for(lambda: bodies(f"gpu.heartbeat.{node}"), what="a heartbeat")
        assert (
            len(beat[-1]["gpus"]) == 16 and sum(1 for g in beat[-1]["gpus"] if g.get("mig")) == 14
        )

        idle_subject = f"session.idle.{node}.ml.nb-0"
        idle = (await wait_for(lambda: bodies(idle_subject), what="the notebook idle"))[-1]
        assert {e["signal"] for e in idle["evidence"]} == {"gpu", "cpu", "kernel"}
        assert idle["gpus_held"] == 1 and idle["idle_for_s"] >= 0.5
        activity = bodies(f"session.activity.{node}.ml.nb-0")[-1]
        assert activity["state"] == "idle" and len(activity["gpu_uuids"]) == 1
        mig_uuids = {g["mig"]["uuid"] for g in beat[-1]["gpus"] if g.get("mig")}
        assert activity["gpu_uuids"][0] in mig_uuids

        held = next(
            g
            for g in beat[-1]["gpus"]
            if g.get("mig") and g["mig"]["uuid"] in activity["gpu_uuids"]
        )
        reply = await request_injection(bus.nc, node, InjectRequest(gpu=held["gpu_index"], load=80))
        assert reply.ok
        await wait_for(
            lambda: bodies(f"session.activity.{node}.ml.nb-0")[-1]["state"] == "active",
            what="the notebook active again",
        )
        # A change on a MIG GPU is published for the GPU and each of its instances.
        before = len(seen)
        reply = await request_injection(bus.nc, node, InjectRequest(gpu=0, xid=79))
        assert reply.ok
        await wait_for(
            lambda: (
                sum(
                    1
                    for s, b in seen[before:]
                    if s.startswith(f"gpu.health.{node}.0") and b["state"] == "failed"
                )
                == 8
            ),
            what="GPU 0 and its 7 instances failed",
        )
        assert not bodies(f"session.idle.{plain.name}.ml.ssh-0")
        assert bodies(f"session.activity.{plain.name}.ml.ssh-0")[-1]["state"] == "active"
    finally:
        await daemon.stop()
        for sub in subs:
            await sub.unsubscribe()
