"""The energy agent against a real nats-server: events on ENERGY, totals in KV across a
restart, degraded sources, pods, power caps on NOTIFY."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry

from agents.energy.account import StaticCarbon
from agents.energy.agent import EnergyAgent
from agents.energy.pods import StaticPodList
from agents.energy.settings import EnergySettings, PowerCap, PowerCapSettings
from agents.energy.wiring import build_energy_agent, gpu_device_ids
from agents.sources.pods import StaticPods
from agents.sources.power import PowerReader, PowerSample, SourceError
from launch.sim_agents.energy import SimNodePower, follow_gpu_telemetry
from nodeward.bus import Bus
from nodeward.config import BusSettings, Settings
from nodeward.logs import configure_logging
from schemas.base import make_event
from schemas.common import PodRef
from schemas.energy import PowerSource
from schemas.gpu import GpuSample, GpuTelemetry
from sim.nvml import SimNvml
from tests.conftest import wait_for

FAST = {"interval": "0.4s", "sample_every": "0.1s", "read_timeout": "0.2s"}


def settings(tmp_path: Path, **more: Any) -> EnergySettings:
    return EnergySettings.model_validate({**FAST, "cgroup_root": str(tmp_path / "cg"), **more})


class Watts:
    """A source whose power the test sets; it can fail, hang or answer garbage."""

    def __init__(self, name: str, watts: float = 420.0, component: str = "system") -> None:
        self.name = name
        self.watts = watts
        self.component = component
        self.mode = "ok"
        self.release = threading.Event()

    def describe(self) -> str:
        return f"test source {self.name}"

    def read(self) -> Any:
        if self.mode == "error":
            raise SourceError(f"{self.name}: BMC answered garbage (completion code 0xff)")
        if self.mode == "hang":
            self.release.wait()
        if self.mode == "garbage":
            return {"watts": "lots"}
        if self.mode == "crash":
            raise ZeroDivisionError("division by zero")
        return [
            PowerSample(PowerSource.IPMI_SDR, self.component, time.monotonic(), watts=self.watts)
        ]

    def close(self) -> None:
        self.release.set()


@asynccontextmanager
async def running(
    bus_settings: BusSettings,
    node: str,
    config: EnergySettings,
    sources: Sequence[PowerReader],
    **kwargs: Any,
) -> AsyncIterator[EnergyAgent]:
    bus = await Bus.connect(bus_settings, source=f"agent/energy/{node}")
    agent = EnergyAgent(bus, config, sources, StaticCarbon(50.0), node=node, **kwargs)
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: agent.ready, timeout=20, what="energy agent ready")
        yield agent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close(grace=1)


async def stored(bus: Bus, subject: str, after: int = 0) -> dict[str, Any] | None:
    """The last message on `subject` in its stream (after stream sequence `after`), as data."""
    try:
        msg = await bus.js.get_last_msg("ENERGY", subject)
    except NotFoundError:
        return None
    if msg.seq <= after:
        return None
    data: dict[str, Any] = json.loads(msg.data or b"{}")
    data["_seq"] = msg.seq
    data["_subject"] = msg.subject
    return data


async def next_stored(bus: Bus, subject: str, after: int = 0, timeout: float = 5) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        return await stored(bus, subject, after)

    got: dict[str, Any] = await wait_for(check, timeout=timeout, what=f"event on {subject}")
    return got


async def test_node_energy_lands_on_energy_with_hand_computed_co2e(
    bus_settings: BusSettings, bus: Bus, node: str, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    async with running(bus_settings, node, settings(tmp_path), [Watts("ipmi")], registry=registry):
        first = await next_stored(bus, f"energy.node.{node}")
        event = await next_stored(bus, f"energy.node.{node}", after=first["_seq"])
    assert event["_subject"] == f"energy.node.{node}"
    assert event["node"] == node
    assert event["avg_power_w"] == pytest.approx(420.0)
    assert event["min_power_w"] == event["max_power_w"] == 420.0
    assert event["energy_j"] == pytest.approx(420.0 * 0.4, rel=0.3)
    assert event["co2e_g"] == pytest.approx(event["energy_j"] / 3.6e6 * 50.0, rel=1e-9)
    assert event["carbon"]["g_per_kwh"] == 50.0 and event["carbon"]["provider"] == "static"
    assert event["readings"] == [
        {
            "source": "ipmi_sdr",
            "component": "system",
            "energy_j": pytest.approx(event["energy_j"]),
            "avg_power_w": pytest.approx(420.0),
        }
    ]
    assert event["degraded"] == []
    assert event["energy_total_j"] == pytest.approx(first["energy_j"] + event["energy_j"])
    assert registry.get_sample_value("nodeward_node_power_watts") == pytest.approx(420.0)
    assert registry.get_sample_value(
        "nodeward_energy_joules_total", {"source": "node"}
    ) == pytest.approx(event["energy_total_j"], rel=0.5)
    assert registry.get_sample_value("nodeward_co2e_grams_total") > 0  # type: ignore[operator]


async def test_totals_survive_an_agent_restart(
    bus_settings: BusSettings, bus: Bus, node: str, tmp_path: Path
) -> None:
    config = settings(tmp_path)
    subj = f"energy.node.{node}"
    async with running(bus_settings, node, config, [Watts("ipmi")]):
        first = await next_stored(bus, subj)
        second = await next_stored(bus, subj, after=first["_seq"])
    kept = second["energy_total_j"]
    assert kept == pytest.approx(first["energy_j"] + second["energy_j"])
    async with running(bus_settings, node, config, [Watts("ipmi")]) as agent:
        assert agent.totals is not None and agent.totals.energy_j == pytest.approx(kept)
        after = await next_stored(bus, subj, after=second["_seq"])
    assert after["energy_total_j"] == pytest.approx(kept + after["energy_j"])
    assert after["co2e_total_g"] == pytest.approx(
        second["co2e_total_g"] + after["co2e_g"], rel=1e-9
    )
    kv = await bus.js.key_value("energy")
    entry = await kv.get(f"node.{node}")
    assert json.loads(entry.value or b"{}")["energy_j"] == pytest.approx(after["energy_total_j"])


@pytest.mark.parametrize("mode", ["error", "hang", "garbage", "crash"])
async def test_a_failing_or_hung_source_is_degraded_and_the_loop_goes_on(
    bus_settings: BusSettings, bus: Bus, node: str, tmp_path: Path, mode: str
) -> None:
    good, bad = Watts("rapl", 300.0, component="package-0"), Watts("ipmi")
    bad.mode = mode
    subj = f"energy.node.{node}"
    registry = CollectorRegistry()
    try:
        async with running(bus_settings, node, settings(tmp_path), [good, bad], registry=registry):
            first = await next_stored(bus, subj)
            second = await next_stored(bus, subj, after=first["_seq"])
            third = await next_stored(bus, subj, after=second["_seq"])
    finally:
        bad.release.set()
    for event in (second, third):  # intervals keep coming, each saying what is wrong
        [line] = event["degraded"]
        assert line.startswith("ipmi: ")
        assert event["avg_power_w"] == pytest.approx(300.0)  # the good source still counts
    expected = {
        "error": "BMC answered garbage",
        "hang": "hung",
        "garbage": "not power samples",
        "crash": "ZeroDivisionError",
    }[mode]
    assert expected in third["degraded"][0]
    assert third["interval"]["end"] > second["interval"]["end"]
    failures = "nodeward_energy_source_failures_total"
    assert registry.get_sample_value(failures, {"source": "rapl"}) == 0.0  # there, at 0
    assert (registry.get_sample_value(failures, {"source": "ipmi"}) or 0.0) >= 2


async def test_pods_get_their_gpus_energy_and_a_cpu_time_share(
    bus_settings: BusSettings, bus: Bus, node: str, tmp_path: Path
) -> None:
    uid = "5e1f0000-0000-4000-8000-000000000001"
    alice = PodRef(namespace="user-alice", name="train-a", uid=uid)
    pod_dir = tmp_path / "cg" / "kubepods.slice" / f"kubepods-pod{uid.replace('-', '_')}.slice"
    pod_dir.mkdir(parents=True)

    def cpu(node_us: int, pod_us: int) -> None:
        (tmp_path / "cg" / "cpu.stat").write_text(f"usage_usec {node_us}\n")
        (pod_dir / "cpu.stat").write_text(f"usage_usec {pod_us}\n")

    cpu(1_000_000, 100_000)
    sim = SimNvml.build(node, count=2)  # 250 W per GPU
    devices = gpu_device_ids(sim)
    registry = CollectorRegistry()
    async with running(
        bus_settings,
        node,
        settings(tmp_path),
        [SimNodePower(sim, base_w=500.0)],
        gpu_pods=StaticPods({sim.gpus[0].uuid: [alice]}),
        node_pods=StaticPodList([alice]),
        gpu_devices=devices,
        registry=registry,
    ) as agent:
        cpu(2_000_000, 350_000)  # a quarter of the node's CPU time from now on
        subj = f"energy.pod.{node}.user-alice.train-a"
        first = await next_stored(bus, subj)
        cpu(3_000_000, 600_000)
        event = await next_stored(bus, subj, after=first["_seq"])
        node_event = await stored(bus, f"energy.node.{node}")
        series = {"namespace": "user-alice", "pod": "train-a"}
        assert (registry.get_sample_value("nodeward_pod_energy_joules_total", series) or 0) > 0
        agent.gpu_pods, agent.node_pods = StaticPods(), StaticPodList()  # the pod has gone
        await wait_for(
            lambda: registry.get_sample_value("nodeward_pod_energy_joules_total", series) is None,
            timeout=3,
            what="the gone pod's series dropped",
        )
    assert event["_subject"] == subj
    assert event["node"] == node and event["namespace"] == "user-alice"
    gpu0 = next(r for r in node_event["readings"] if r["component"] == "gpu-0")  # type: ignore[index]
    assert gpu0["avg_power_w"] == pytest.approx(250.0)
    assert event["gpu_energy_j"] > 0 and event["cpu_energy_j"] > 0
    assert "gpu-exclusive" in event["attribution"] and "estimate" in event["attribution"]
    assert event["co2e_g"] == pytest.approx(event["energy_j"] / 3.6e6 * 50.0, rel=1e-9)


async def test_power_cap_notices_cross_once_and_clear_below_the_band(
    bus_settings: BusSettings, bus: Bus, node: str, tmp_path: Path
) -> None:
    source = Watts("ipmi", 900.0)
    config = settings(tmp_path, caps=PowerCapSettings(node=PowerCap(watts=1000, hysteresis=0.1)))
    notices: list[tuple[str, dict[str, Any]]] = []

    async def collect(msg: Any) -> None:
        body = json.loads(msg.data)
        if body["targets"][0]["name"] == node:
            notices.append((msg.subject, body))

    sub = await bus.nc.subscribe("notify.*.power-limit", cb=collect)
    subj = f"energy.node.{node}"

    async def intervals_at(watts: float, n: int) -> None:
        source.watts = watts
        last = await next_stored(bus, subj)
        for _ in range(n):  # n whole intervals at this power
            last = await next_stored(bus, subj, after=last["_seq"])
        assert last["avg_power_w"] == pytest.approx(watts)

    def subjects() -> list[str]:
        return [s for s, _ in notices]

    try:
        async with running(bus_settings, node, config, [source]):
            await intervals_at(1200.0, 2)
            await wait_for(lambda: len(notices) == 1, timeout=3, what="the crossing notice")
            await intervals_at(950.0, 2)  # under the cap, above 900: flapping, not cleared
            await intervals_at(1100.0, 2)
            assert subjects() == ["notify.warning.power-limit"]
            await intervals_at(800.0, 2)
            await wait_for(lambda: len(notices) == 2, timeout=3, what="the clearing notice")
    finally:
        await sub.unsubscribe()
    assert subjects() == ["notify.warning.power-limit", "notify.info.power-limit"]
    crossed = notices[0][1]
    assert crossed["audience"] == "oncall" and crossed["topic"] == "power-limit"
    assert "1000 W" in crossed["title"]


async def test_sim_node_power_follows_the_gpu_agents_telemetry(
    bus_settings: BusSettings, bus: Bus, node: str, tmp_path: Path
) -> None:
    sim = SimNvml.build(node, count=2)  # 250 W per GPU until telemetry says otherwise
    follower = await follow_gpu_telemetry(bus.nc, node, sim)
    subj = f"energy.node.{node}"
    try:
        async with running(
            bus_settings, node, settings(tmp_path), [SimNodePower(sim, base_w=500.0)]
        ):
            before = await next_stored(bus, subj)
            assert before["avg_power_w"] == pytest.approx(500.0 + 2 * 250.0)
            telemetry = GpuTelemetry(
                node=node,
                interval_s=1.0,
                samples=[
                    GpuSample(
                        gpu_index=0,
                        gpu_uuid=sim.gpus[0].uuid,
                        utilization_gpu_pct=100.0,
                        utilization_memory_pct=80.0,
                        memory_used_bytes=1,
                        memory_total_bytes=2,
                        power_w=650.0,
                    )
                ],
            )
            await bus.publish(make_event(telemetry, source=f"agent/gpu/{node}"))

            async def at_full_load() -> dict[str, Any] | None:
                got = await stored(bus, subj)
                return got if got and got["max_power_w"] == pytest.approx(1400.0) else None

            loaded = await wait_for(at_full_load, timeout=5, what="power following the load")
    finally:
        await follower.unsubscribe()
    gpu0 = next(r for r in loaded["readings"] if r["component"] == "gpu-0")
    assert gpu0["avg_power_w"] > 250.0


async def test_standalone_daemon_publishes_with_static_carbon_and_never_logs_the_password(
    bus_settings: BusSettings,
    bus: Bus,
    node: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "json")  # other tests (the CLI's) may have set warning
    energy = {
        **FAST,
        "node": node,
        "cgroup_root": str(tmp_path / "cg"),
        "ipmi": {"host": "127.0.0.1", "user": "admin", "password": "hunter2-secret"},
        "carbon": {"provider": "static", "static_g_per_kwh": 50},
    }
    config = Settings(bus=bus_settings, agents={"energy": energy})
    daemon = await build_energy_agent(config, sources=[Watts("ipmi")])
    async with daemon:
        event = await next_stored(bus, f"energy.node.{node}")
        assert (await daemon.readiness()).ready
        async with httpx.AsyncClient() as http:
            scraped = (await http.get(f"{daemon.url}/metrics")).text
    # Nothing failed, and what could is there at 0: its source's reads, each type it
    # publishes (its node's grants).
    assert 'nodeward_energy_source_failures_total{source="ipmi"} 0.0' in scraped
    published = ("energy.node.v1", "energy.pod.v1", "node.finding.v1", "notify.v1")
    failures = re.findall(r'nodeward_publish_failures_total\{type="([^"]+)"\} 0.0', scraped)
    assert failures == list(published)
    assert daemon.name == f"agent-energy-{node}"
    assert event["avg_power_w"] == pytest.approx(420.0)
    assert event["co2e_g"] == pytest.approx(event["energy_j"] / 3.6e6 * 50.0, rel=1e-9)
    out, err = capfd.readouterr()
    assert "energy agent started" in out + err  # it did log
    assert "hunter2-secret" not in out + err
