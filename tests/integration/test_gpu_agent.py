"""The GPU agent on simulated NVML against a real nats-server: health changes, heartbeats,
telemetry, hangs, correlation, subjects, injection round trips."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from agents.gpu.agent import GpuAgent
from agents.gpu.settings import GpuAgentSettings
from launch.sim_agents.gpu import build_sim_gpu_agents
from nodeward.bus import Bus
from nodeward.config import BusSettings, Settings
from sim.cluster.seed import Gpu, Mig, NodeSeed, PodSeed
from sim.inject import InjectRequest, request_injection, serve_injections
from sim.nvml import SimNvml
from tests.conftest import wait_for
from tests.helpers.agents import agent_running
from tests.helpers.sim_cli import sim_inject

FAST = GpuAgentSettings(
    heartbeat_interval="0.2s",  # type: ignore[arg-type]
    telemetry_interval="0.2s",  # type: ignore[arg-type]
    poll_interval="0.1s",  # type: ignore[arg-type]
    call_timeout="0.3s",  # type: ignore[arg-type]
    xid_window="5s",  # type: ignore[arg-type]
    kernel_log="off",  # not the host's kernel log: tests/integration/test_gpu_kernel_log.py
)


@dataclass
class Seen:
    """Every message the agent's node published, in arrival order."""

    messages: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)

    def health(self, gpu: int | str, *, heartbeat: bool | None = False) -> list[dict[str, Any]]:
        """GPU `gpu`'s changes (`gpu.health`), or as the node's heartbeats restate it."""
        out = []
        for subj, _, body in self.messages:
            if subj.startswith("gpu.health.") and heartbeat is not True:
                if subj.rsplit(".", 1)[1] == str(gpu):
                    assert body["heartbeat"] is False
                    out.append(body)
            elif subj.startswith("gpu.heartbeat.") and heartbeat is not False:
                out += [g for g in body["gpus"] if str(g["gpu_index"]) == str(gpu)]
        return out

    def last(self, gpu: int | str) -> dict[str, Any] | None:
        changes = self.health(gpu)
        return changes[-1] if changes else None

    def telemetry(self) -> list[dict[str, Any]]:
        return [b for s, _, b in self.messages if s.startswith("gpu.telemetry.")]


@dataclass
class Rig:
    node: str
    sim: SimNvml
    agent: GpuAgent
    seen: Seen
    bus: Bus
    registry: CollectorRegistry

    async def state(self, gpu: int | str, state: str, **match: Any) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            last = self.seen.last(gpu)
            if last and last["state"] == state and all(last.get(k) == v for k, v in match.items()):
                return last
            return None

        return await wait_for(check, timeout=5, what=f"gpu {gpu} {state} {match}")  # type: ignore[no-any-return]


@pytest_asyncio.fixture
async def rig(bus_settings: BusSettings, node: str) -> AsyncIterator[Rig]:
    sim = SimNvml.build(node, product="NVIDIA-H100-80GB-HBM3", count=2)
    bus = await Bus.connect(bus_settings, source=f"agent/gpu/{node}")
    seen = Seen()

    async def collect(msg: Any) -> None:
        seen.messages.append((msg.subject, dict(msg.headers or {}), json.loads(msg.data)))

    sub = await bus.nc.subscribe(f"gpu.*.{node}.>", cb=collect)
    sub2 = await bus.nc.subscribe(f"gpu.*.{node}", cb=collect)  # telemetry, heartbeats
    registry = CollectorRegistry()
    agent = GpuAgent(sim, bus, FAST, node=node, registry=registry)
    injections = await serve_injections(bus.nc, sim)
    r = Rig(node, sim, agent, seen, bus, registry)
    try:
        async with agent_running(agent, sim, (sub, sub2, injections)):
            await wait_for(lambda: agent.ready, timeout=20, what="agent ready")
            await r.state(0, "healthy")
            await r.state(1, "healthy")
            yield r
    finally:
        await bus.close(grace=1)


async def test_xid_79_fails_the_gpu_within_a_second(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    rig.sim.inject_xid(0, 79)
    event = await rig.state(0, "failed", recommended_action="reboot_node")
    assert loop.time() - began < 1.0
    assert event["previous_state"] == "healthy"
    assert any(r["code"] == "xid" and r["xid"] == 79 for r in event["reasons"])
    assert event["agent_boot_id"] == rig.agent.boot_id
    assert rig.seen.last(1)["state"] == "healthy"  # type: ignore[index]


async def test_application_xids_change_nothing(rig: Rig) -> None:
    rig.sim.inject_xid(0, 13)
    rig.sim.inject_xid(0, 43)
    rig.sim.inject_xid(0, 31)
    rig.sim.inject_xid(1, 79)  # a marker: events are handled in order
    await rig.state(1, "failed")
    assert [e["state"] for e in rig.seen.health(0)] == ["healthy"]
    assert (
        rig.registry.get_sample_value("nodeward_gpu_xid_events_total", {"gpu": "0", "xid": "13"})
        == 1
    )


async def test_every_xid_is_published_with_its_class_and_what_ran_on_the_gpu(rig: Rig) -> None:
    """An application XID changes no health, but it is recorded: `gpu.xid.v1` on the node's
    own subject, with the catalog's class and the processes NVML lists on the GPU."""
    rig.sim.set_processes(0, [(41233, 8192)])
    rig.sim.inject_xid(0, 13)
    rig.sim.inject_xid(1, 79)

    def xids() -> list[tuple[str, dict[str, Any]]]:
        return [(s, b) for s, _, b in rig.seen.messages if s.startswith("gpu.xid.")]

    got = await wait_for(lambda: len(xids()) >= 2 and xids(), timeout=5, what="two xid events")
    (subj13, x13), (subj79, x79) = got[:2]
    assert subj13 == f"gpu.xid.{rig.node}.0" and subj79 == f"gpu.xid.{rig.node}.1"
    assert (x13["xid"], x13["category"], x13["application"]) == (13, "application", True)
    assert x13["catalog_action"] == "restart_app"
    assert x13["processes"] == [{"pid": 41233, "used_memory_bytes": 8192 * 1024 * 1024}]
    assert (x79["xid"], x79["application"]) == (79, False)
    assert [e["state"] for e in rig.seen.health(0)] == ["healthy"]


async def test_xid_48_with_63_is_drain_and_reset(rig: Rig) -> None:
    rig.sim.inject_xid(0, 48)
    rig.sim.inject_xid(0, 63)

    def correlated() -> dict[str, Any] | None:
        last = rig.seen.last(0)
        if last is None:
            return None
        for r in last["reasons"]:
            if r.get("xid") == 48 and r["evidence"].get("correlated_xids") == [63]:
                return last
        return None

    event = await wait_for(correlated, timeout=5)
    assert event["state"] == "failed"
    assert event["recommended_action"] == "drain_and_reset"
    reason = next(r for r in event["reasons"] if r.get("xid") == 48)
    assert reason["evidence"]["nvidia_action"] == "DRAIN_AND_RESET"


async def test_ecc_double_bit_burst_fails(rig: Rig) -> None:
    rig.sim.inject_fault(1, "ecc-dbe-burst")
    event = await rig.state(1, "failed")
    codes = {r["code"] for r in event["reasons"]}
    assert "xid" in codes or "ecc_uncorrected" in codes
    await wait_for(
        lambda: any(r["code"] == "ecc_uncorrected" for r in rig.seen.last(1)["reasons"]),  # type: ignore[index]
        what="ecc finding",
    )


async def test_thermal_degrades_and_recovery_heals(rig: Rig) -> None:
    rig.sim.inject_fault(0, "thermal")
    event = await rig.state(0, "degraded")
    assert {"thermal_slowdown", "clocks_throttled"} <= {r["code"] for r in event["reasons"]}
    rig.sim.recover(0)
    healed = await rig.state(0, "healthy", previous_state="degraded")
    assert healed["reasons"] == []


async def test_fallen_off_the_bus_then_recovery(rig: Rig) -> None:
    rig.sim.inject_fault(1, "fallen-off-bus")
    event = await rig.state(1, "failed", recommended_action="reboot_node")
    await wait_for(lambda: any(r["code"] == "gpu_lost" for r in rig.seen.last(1)["reasons"]))  # type: ignore[index]
    assert event["previous_state"] == "healthy"
    rig.sim.recover(1)
    await rig.state(1, "healthy", previous_state="failed")
    sequences = [e["sequence"] for e in rig.seen.health(1)]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)


async def test_heartbeats_and_telemetry_keep_coming(rig: Rig) -> None:
    await wait_for(lambda: len(rig.seen.health(1, heartbeat=True)) >= 3, what="heartbeats")
    await wait_for(lambda: len(rig.seen.telemetry()) >= 2, what="telemetry")
    sample = rig.seen.telemetry()[-1]["samples"][0]
    assert sample["memory_total_bytes"] > sample["memory_used_bytes"] > 0
    assert sample["power_w"] == 250.0
    assert rig.registry.get_sample_value("nodeward_gpu_power_watts", {"gpu": "0"}) == 250.0


async def test_hung_nvml_call_is_a_finding_and_other_gpus_carry_on(rig: Rig) -> None:
    rig.sim.inject_fault(0, "hang")
    event = await rig.state(0, "degraded")
    hang = next(r for r in event["reasons"] if r["code"] == "nvml_hang")
    assert hang["evidence"]["call"].startswith("nvmlDevice")
    before = len(rig.seen.health(1, heartbeat=True))
    await wait_for(
        lambda: len(rig.seen.health(1, heartbeat=True)) >= before + 3, what="gpu 1 beats"
    )
    assert rig.seen.last(1)["state"] == "healthy"  # type: ignore[index]
    # the hung GPU keeps its heartbeat too (restating the finding)
    await wait_for(lambda: rig.seen.health(0, heartbeat=True)[-1]["state"] == "degraded")
    rig.sim.recover(0)
    await rig.state(0, "healthy", previous_state="degraded")


async def test_recovery_action_is_followed(rig: Rig) -> None:
    import pynvml

    rig.sim.set_recovery_action(0, pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    event = await rig.state(0, "failed", recommended_action="reboot_node")
    assert any(r["code"] == "recovery_action" for r in event["reasons"])
    rig.sim.recover(0)
    await rig.state(0, "healthy")


async def test_publishes_only_its_own_node_subjects(rig: Rig, nats_url: str) -> None:
    import nats

    nc = await nats.connect(nats_url)
    mine: list[str] = []

    async def collect(msg: Any) -> None:
        if (msg.headers or {}).get("ce-source") == f"agent/gpu/{rig.node}":
            mine.append(msg.subject)

    sub = await nc.subscribe(">", cb=collect)
    try:
        rig.sim.inject_xid(0, 79)
        await wait_for(lambda: len(mine) >= 6, what="messages")
    finally:
        await sub.unsubscribe()
        await nc.close()
    for subj in mine:
        assert subj.startswith((f"gpu.health.{rig.node}.", f"gpu.xid.{rig.node}.")) or subj in (
            f"gpu.telemetry.{rig.node}",
            f"gpu.heartbeat.{rig.node}",
        )
    assert f"gpu.heartbeat.{rig.node}" in mine
    with pytest.raises(ValueError, match="refuses"):
        from schemas.base import make_event
        from schemas.gpu import GpuTelemetry

        rig.agent._enqueue(
            make_event(GpuTelemetry(node="other-node", interval_s=1, samples=[]), source="x")
        )


async def test_inject_request_round_trip(rig: Rig) -> None:
    reply = await request_injection(rig.bus.nc, rig.node, InjectRequest(gpu=1, fault="thermal"))
    assert reply.ok and reply.applied == "fault thermal"
    await rig.state(1, "degraded")
    bad = await request_injection(rig.bus.nc, rig.node, InjectRequest(gpu=7, xid=79))
    assert not bad.ok and "no GPU 7" in (bad.error or "")


async def test_a_load_injection_drives_power_into_telemetry(rig: Rig) -> None:
    """`{"gpu": 1, "load": 100}`: the GPU's power goes to its limit, and the agent's
    telemetry (which the demo's energy agents follow) reports it."""
    reply = await request_injection(rig.bus.nc, rig.node, InjectRequest(gpu=1, load=100))
    assert reply.ok and reply.applied == "load 100%"
    limit_w = rig.sim.gpus[1].model.power_limit_w

    def at_limit() -> bool:
        for subj, _, data in rig.seen.messages:
            if subj == f"gpu.telemetry.{rig.node}":
                power = {s["gpu_index"]: s.get("power_w") for s in data["samples"]}
                if power.get(1) == limit_w:
                    return True
        return False

    await wait_for(at_limit, timeout=5, what="telemetry at the power limit")
    # The agent's side validates too: a load over 100% is refused in one line.
    from sim.inject import InjectReply, inject_subject

    raw = await rig.bus.nc.request(inject_subject(rig.node), b'{"gpu": 1, "load": 150}', timeout=2)
    bad = InjectReply.model_validate_json(raw.data)
    assert not bad.ok and "bad request" in (bad.error or "")


async def test_cli_inject_round_trip(rig: Rig, nats_url: str) -> None:
    async def cli(*args: str) -> tuple[int, str, str]:
        return await sim_inject(nats_url, *args)

    code, out, err = await cli("--node", rig.node, "--gpu", "0", "--xid", "79")
    assert code == 0, err
    assert out.strip() == f"{rig.node} gpu 0: XID 79 injected"
    await rig.state(0, "failed")
    code, out, err = await cli("--node", rig.node, "--gpu", "0", "--recover")
    assert code == 0, err
    await rig.state(0, "healthy", previous_state="failed")
    code, _, err = await cli("--node", "no-such-node", "--gpu", "0", "--fault", "thermal")
    assert code != 0 and err.count("\n") == 1 and "no-such-node" in err
    code, _, err = await cli("--node", rig.node, "--gpu", "0", "--fault", "melt")
    assert code != 0 and "unknown fault" in err and err.count("\n") == 1


async def test_sim_agents_for_seed_nodes(bus_settings: BusSettings, node: str) -> None:
    settings = Settings(
        bus=bus_settings, agents={"gpu": {"heartbeat_interval": "0.2s", "poll_interval": "0.1s"}}
    )
    nodes = [
        NodeSeed(name=f"{node}-h", gpu=Gpu(count=2)),
        NodeSeed(
            name=f"{node}-m",
            gpu=Gpu(product="NVIDIA-A100-SXM4-80GB", count=1),
            mig=Mig(devices={"1g.10gb": 2}),
        ),
        NodeSeed(name=f"{node}-cpu", gpu=None),
    ]
    pods = [
        PodSeed(name="train-0", namespace="ml", node=f"{node}-h", gpus=1),
        PodSeed(
            name="nb-0",
            namespace="ml",
            node=f"{node}-m",
            gpus=1,
            gpuResource="nvidia.com/mig-1g.10gb",
        ),
    ]
    bus = await Bus.connect(bus_settings, source="test/watch")  # provisions the streams
    daemons = await build_sim_gpu_agents(settings, nodes, pods)
    assert len(daemons) == 2
    seen: dict[str, dict[str, Any]] = {}

    async def collect(msg: Any) -> None:
        if msg.subject.startswith(f"gpu.health.{node}-"):
            seen[msg.subject] = json.loads(msg.data)

    sub = await bus.nc.subscribe("gpu.health.>", cb=collect)
    await bus.nc.flush()  # the server has the subscription before the first event
    try:
        for d in daemons:
            await d.start()
        want = {
            f"gpu.health.{node}-h.0",
            f"gpu.health.{node}-h.1",
            f"gpu.health.{node}-m.0",
            f"gpu.health.{node}-m.0-mig1-0",
            f"gpu.health.{node}-m.0-mig2-0",
        }
        await wait_for(lambda: want <= set(seen), what=f"{want - set(seen)}")
        assert seen[f"gpu.health.{node}-h.0"]["pods"] == [{"namespace": "ml", "name": "train-0"}]
        # Every pod holding any part of the physical GPU: its MIG instances' pods too, on
        # the GPU's event and each instance's.
        nb = [{"namespace": "ml", "name": "nb-0"}]
        assert seen[f"gpu.health.{node}-m.0"]["pods"] == []
        assert seen[f"gpu.health.{node}-m.0"]["holders"] == nb
        assert seen[f"gpu.health.{node}-m.0-mig2-0"]["holders"] == nb
        assert seen[f"gpu.health.{node}-h.1"]["holders"] == []  # known: held by none
        assert seen[f"gpu.health.{node}-m.0-mig1-0"]["mig"]["profile"] == "1g.10gb"
        reply = await request_injection(bus.nc, f"{node}-m", InjectRequest(gpu=0, xid=79))
        assert reply.ok
        await wait_for(lambda: seen[f"gpu.health.{node}-m.0-mig2-0"]["state"] == "failed")
        assert seen[f"gpu.health.{node}-h.0"]["state"] == "healthy"
    finally:
        await sub.unsubscribe()
        await bus.close(grace=1)
        await asyncio.gather(*(d.stop() for d in daemons))


async def test_agent_daemon_serves_gpu_metrics_and_readiness(
    bus_settings: BusSettings, node: str
) -> None:
    import httpx

    from agents.gpu.wiring import build_gpu_agent

    settings = Settings(
        bus=bus_settings, agents={"gpu": {"node": node, "telemetry_interval": "0.1s"}}
    )
    daemon = await build_gpu_agent(settings, nvml=SimNvml.build(node, count=1))
    async with daemon:
        assert daemon.name == f"agent-gpu-{node}"

        async def ready() -> bool:
            return (await daemon.readiness()).ready

        await wait_for(ready, what="ready")

        async def scraped() -> bool:
            async with httpx.AsyncClient() as client:
                text = (await client.get(f"{daemon.url}/metrics")).text
            return (
                'nodeward_gpu_health_state{gpu="0"' in text and "nodeward_gpu_power_watts" in text
            )

        await wait_for(scraped, what="gpu metrics")


async def test_gpu_hung_from_the_start_is_reported_then_identified(
    bus_settings: BusSettings, node: str
) -> None:
    sim = SimNvml.build(node, count=2)
    sim.inject_fault(0, "hang")
    bus = await Bus.connect(bus_settings, source=f"agent/gpu/{node}")
    seen = Seen()

    async def collect(msg: Any) -> None:
        seen.messages.append((msg.subject, {}, json.loads(msg.data)))

    sub = await bus.nc.subscribe(f"gpu.health.{node}.*", cb=collect)
    agent = GpuAgent(sim, bus, FAST, node=node)
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.ready, what="ready")
        first = await wait_for(lambda: seen.last(0), what="gpu 0 reported")
        assert first["state"] == "degraded" and first["gpu_uuid"].startswith("unknown-")
        assert first["reasons"][0]["code"] == "nvml_hang"
        await wait_for(lambda: (seen.last(1) or {}).get("state") == "healthy")
        sim.recover(0)

        def healthy() -> dict[str, Any] | None:
            last = seen.last(0)
            return last if last and last["state"] == "healthy" else None

        healed = await wait_for(healthy, what="gpu 0 healthy")
        assert healed["gpu_uuid"] == sim.gpus[0].uuid and healed["previous_state"] == "degraded"
        # One health series per GPU: the placeholder's went when the GPU was identified.
        states = {
            s.labels["uuid"]: s.value
            for m in agent.metrics.state.collect()
            for s in m.samples
            if s.labels["gpu"] == "0"
        }
        assert states == {sim.gpus[0].uuid: 0}
        sequences = [e["sequence"] for e in seen.health(0)]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    finally:
        sim.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub.unsubscribe()
        await bus.close(grace=1)


async def test_cli_plays_a_scenario(rig: Rig, nats_url: str, tmp_path: Any) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(
        f"- {{after: 0s, node: {rig.node}, gpu: 1, fault: thermal}}\n"
        f"- {{after: 0.2s, node: {rig.node}, gpu: 1, recover: true}}\n"
        f"- {{after: 0.2s, node: nobody-{rig.node}, gpu: 0, xid: 79}}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "launch", "sim", "inject", "--nats", nats_url,
        "--scenario", str(path), "--timeout", "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 1
    assert "gpu 1: fault thermal" in out.decode() and "gpu 1: recovery" in out.decode()
    assert err.decode().count("\n") == 1 and "1 of 3 steps failed" in err.decode()
    await wait_for(lambda: any(e["state"] == "degraded" for e in rig.seen.health(1)))
    await rig.state(1, "healthy", previous_state="degraded")


async def test_state_change_survives_the_stream_being_unavailable(own_nats: Any, node: str) -> None:
    """A GPU fails while JetStream cannot store it: the change is kept and stored later."""
    settings = BusSettings(url=own_nats.url, publish_timeout="200ms", publish_retries=0)  # type: ignore[arg-type]
    bus = await Bus.connect(settings, source=f"agent/gpu/{node}")
    sim = SimNvml.build(node, product="NVIDIA-H100-80GB-HBM3", count=1)
    agent = GpuAgent(sim, bus, FAST, node=node, registry=CollectorRegistry())
    task = asyncio.create_task(agent.run())
    failures = bus.metrics.registry.get_sample_value
    try:
        await wait_for(lambda: agent.ready, timeout=20, what="agent ready")
        await bus.js.delete_stream("GPU")  # JetStream answers nothing for gpu.health.* now
        sim.inject_xid(0, 79)
        await wait_for(
            lambda: (
                (failures("nodeward_publish_failures_total", {"type": "gpu.health.v1"}) or 0) > 0
            ),
            what="a failed publish",
        )
        await bus.provision()  # the stream is back

        async def stored_failures() -> list[dict[str, Any]]:
            info = await bus.js.stream_info("GPU", subjects_filter=f"gpu.health.{node}.0")
            if not info.state.subjects:
                return []
            psub = await bus.js.pull_subscribe(f"gpu.health.{node}.0", stream="GPU")
            try:
                msgs = await psub.fetch(info.state.messages, timeout=2)
            finally:
                await psub.unsubscribe()
            bodies = [json.loads(m.data) for m in msgs]
            return [b for b in bodies if b["state"] == "failed"]

        failed = await wait_for(
            stored_failures, timeout=20, interval=0.2, what="the failure stored later"
        )
        assert len(failed) == 1
        assert failed[0]["previous_state"] == "healthy"
    finally:
        sim.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close(grace=1)
