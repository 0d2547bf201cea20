"""The GPU agent on AMD GPUs (the AMD SMI backend over a SimAmdSmi), with a real NATS, the
sim cluster and the cordon service: an AMD RAS error ends as it does on NVIDIA."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents.gpu.agent import GpuAgent
from agents.gpu.backends import AmdSmiBackend
from agents.gpu.validate import Validator
from agents.sources.pods import StaticPods
from launch.sim_agents.gpu import build_sim_gpu_agent
from nodeward.bus import Bus
from nodeward.config import BusSettings, Settings
from nodeward.kube.nodes import condition_of
from schemas.common import PodRef
from schemas.recovery import CheckStatus, ValidateRequest
from schemas.remediation import Outcome
from sim.amdsmi import SimAmdSmi
from sim.cluster.seed import Gpu, PodSeed, load_seed
from sim.inject import InjectRequest, request_injection, serve_injections
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import EnvFactory, audits
from tests.integration.test_cordon import tainted
from tests.integration.test_gpu_agent import FAST

MI300X = Gpu(
    vendor="amd",
    product="AMD_Instinct_MI300X_OAM",
    count=8,
    memory_mib=196608,
    family="AI",
    driver="6.10.5",
)


async def test_amd_uncorrectable_ecc_on_a_mi300x_node_quarantines_it(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env(count=4, nodes={0: {"gpu": MI300X}})
    await env.start()
    name = env.nodes[0]
    node = await env.node(name)
    assert node["status"]["allocatable"]["amd.com/gpu"] == "8"
    assert node["metadata"]["labels"]["amd.com/gpu.product-name"] == "AMD_Instinct_MI300X_OAM"

    smi = SimAmdSmi.build(name, product="AMD_Instinct_MI300X_OAM", count=8)
    # AMD's device plugin names GPUs by PCI bus ID in the kubelet's pod resources.
    holder = PodRef(namespace="ml", name="llm-0", container="vllm")
    pods = StaticPods({smi.gpus[3].bdf: [holder]})
    agent = GpuAgent(AmdSmiBackend(smi, FAST.amd_limits()), env.bus, FAST, node=name, pods=pods)
    said: list[dict[str, Any]] = []

    async def collect(msg: Any) -> None:
        said.append(json.loads(msg.data))

    sub = await env.bus.nc.subscribe(f"gpu.health.{name}.3", cb=collect)
    injections = await serve_injections(env.bus.nc, smi)
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.ready, timeout=20, what="agent ready on AMD SMI")
        assert {w.ident.name for w in agent.watches if w.ident} == {"AMD Instinct MI300X"}
        # nodeward_gpu_info's model is the node label's, so the dashboards join by model.
        models = {s.labels["model"] for m in agent.metrics.info.collect() for s in m.samples}
        assert models == {node["metadata"]["labels"]["amd.com/gpu.product-name"]}
        # Healthy GPUs leave the node in service.
        await wait_for(
            lambda: all(u.state and u.state.value == "healthy" for u in agent.watches[3].units),
            timeout=5,
            what="gpu 3 healthy",
        )
        assert not tainted(await env.node(name))

        reply = await request_injection(
            env.bus.nc, name, InjectRequest(gpu=3, fault="ecc-uncorrectable")
        )
        assert reply.ok, reply.error

        async def quarantined() -> dict[str, Any] | None:
            got = await env.node(name)
            cond = condition_of(got, "GPUHealthy")
            done = tainted(got) and got["spec"].get("unschedulable") and cond is not None
            return got if done else None

        got = await wait_for(quarantined, timeout=5, what="taint, cordon and condition in the API")
        cond = condition_of(got, "GPUHealthy")
        assert cond is not None and cond["status"] == "False"
        assert "uncorrectable ECC" in cond["message"]

        async def applied() -> list[Any]:
            return [
                r for r in await audits(env.bus, name, "quarantine") if r.outcome == Outcome.APPLIED
            ]

        records = await wait_for(applied, timeout=5, what="quarantine audit")
        failed = [e for e in said if e["state"] == "failed"]
        assert failed and failed[-1]["pods"] == [
            {"namespace": "ml", "name": "llm-0", "container": "vllm"}
        ]
        assert failed[-1]["pci_bus_id"] == "0000:65:00.0"
        assert records[0].policy in ("xid-node-action", "failed-gpu")
        # The other nodes (NVIDIA by default) are untouched.
        assert not tainted(await env.node(env.nodes[1]))
        # XIDs are NVIDIA's: the AMD node's sim refuses one with a clear line.
        refused = await request_injection(env.bus.nc, name, InjectRequest(gpu=0, xid=79))
        assert not refused.ok and refused.error and "AMD" in refused.error
    finally:
        smi.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await injections.unsubscribe()
        await sub.unsubscribe()


async def test_amd_ring_hang_fails_the_gpu_until_the_reset_completes(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env(count=2, nodes={0: {"gpu": MI300X}})
    name = env.nodes[0]
    smi = SimAmdSmi.build(name, count=2)
    agent = GpuAgent(AmdSmiBackend(smi), env.bus, FAST, node=name)
    task = asyncio.create_task(agent.run())

    def state(gpu: int) -> str | None:
        unit = agent.watches[gpu].units[0] if agent.watches[gpu].units else None
        return unit.state.value if unit and unit.state else None

    try:
        await wait_for(lambda: agent.ready and state(1) == "healthy", timeout=20, what="ready")
        smi.inject_fault(1, "ring-hang")
        await wait_for(lambda: state(1) == "failed", timeout=5, what="ring hang fails gpu 1")
        codes = agent.watches[1].units[0].codes
        assert any(c.startswith("ring_hang") for c in codes), codes
        assert state(0) == "healthy"
        # Recovery's validation reads AMD GPUs through the backend: it fails this node now.
        validator = Validator(agent, dcgmi="")
        ask = ValidateRequest(node=name, request_id="r1", expected_gpus=2)
        report = await validator.validate(ask)
        assert not report.passed and report.gpus_found == 2
        failing = {(c.name, c.gpu) for c in report.checks if c.status == CheckStatus.FAIL}
        assert failing == {("not failed", 1)}, report.checks
        smi.recover(1)  # the driver's reset completes: GPU_POST_RESET
        await wait_for(lambda: state(1) == "healthy", timeout=5, what="healthy after reset")
        report = await validator.validate(ask)
        assert report.passed, report.checks
        assert {c.name for c in report.checks} >= {"gpus present", "answers amdsmi", "not failed"}
    finally:
        smi.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_sim_agent_of_the_seeds_mi300x_node_runs_amd_smi(
    bus_settings: BusSettings, node: str
) -> None:
    """`nodeward up`'s sim agent for the default seed's MI300X node, and `sim inject`."""
    seeded = next(n for n in load_seed().nodes if n.name == "gpu-mi300x-01")
    amd_node = seeded.model_copy(update={"name": f"{node}-mi300x"})
    settings = Settings(
        bus=bus_settings, agents={"gpu": {"heartbeat_interval": "0.2s", "poll_interval": "0.1s"}}
    )
    pods = [
        PodSeed(
            name="llm-0", namespace="ml", node=amd_node.name, gpus=2, gpu_resource="amd.com/gpu"
        )
    ]
    bus = await Bus.connect(bus_settings, source="test/watch")  # provisions the streams
    daemon, agent, sim = await build_sim_gpu_agent(settings, amd_node, pods)
    assert isinstance(sim, SimAmdSmi) and agent.backend.name == "amdsmi"
    seen: dict[str, dict[str, Any]] = {}

    async def collect(msg: Any) -> None:
        seen[msg.subject] = json.loads(msg.data)

    sub = await bus.nc.subscribe(f"gpu.health.{amd_node.name}.>", cb=collect)
    try:
        await daemon.start()
        want = {f"gpu.health.{amd_node.name}.{i}" for i in range(8)}
        await wait_for(lambda: want <= set(seen), what=f"{want - set(seen)}")
        first = seen[f"gpu.health.{amd_node.name}.0"]
        assert first["state"] == "healthy" and first["model"] == "AMD Instinct MI300X"
        assert first["pods"] == [{"namespace": "ml", "name": "llm-0"}]
        reply = await request_injection(
            bus.nc, amd_node.name, InjectRequest(gpu=5, fault="ecc-uncorrectable")
        )
        assert reply.ok, reply.error

        def failed() -> dict[str, Any] | None:
            got = seen[f"gpu.health.{amd_node.name}.5"]
            return got if got["state"] == "failed" else None

        event = await wait_for(failed, what="gpu 5 failed")
        assert event["recommended_action"] == "reset_gpu"
        assert event["reasons"][0]["code"] == "ecc_uncorrected"
        assert event["reasons"][0]["evidence"]["blocks"]["UMC"]["uncorrectable"] == 1
        assert seen[f"gpu.health.{amd_node.name}.4"]["state"] == "healthy"
    finally:
        await sub.unsubscribe()
        await bus.close(grace=1)
        await daemon.stop()
