"""The GPU agent's second detector, the kernel log, on simulated NVML and a fake kmsg fed with
the driver's lines, against a real nats-server (and the sim cluster with the cordon service):
an XID seen only in the kernel log fails the GPU and quarantines its node, also while NVML
hangs; the same XID from both detectors is one incident."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from agents.gpu.agent import GpuAgent
from agents.gpu.settings import GpuAgentSettings
from nodeward.bus import Bus
from nodeward.kube.nodes import taints_of
from schemas.remediation import Outcome
from schemas.state.cordon import TAINT_KEY
from sim.inject import InjectRequest, request_injection, serve_injections
from sim.kmsg import SimKmsg
from sim.nvml import SimNvml
from tests.conftest import wait_for
from tests.helpers.agents import agent_running
from tests.helpers.sim_cli import sim_inject
from tests.integration.cordon_fixtures import EnvFactory, audits, read_stream


def _settings(kmsg: Path) -> GpuAgentSettings:
    return GpuAgentSettings(
        heartbeat_interval="0.2s",
        telemetry_interval="1s",
        poll_interval="0.1s",
        call_timeout="0.3s",
        kernel_log="kmsg",
        kmsg_path=kmsg,
        kernel_log_interval="0.05s",
        confirm_wait="2s",
    )


class Node:
    """One node's simulated GPUs and kernel log, its agent, and what it published."""

    def __init__(self, name: str, sim: SimNvml, kmsg: SimKmsg, agent: GpuAgent) -> None:
        self.name, self.sim, self.kmsg, self.agent = name, sim, kmsg, agent
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def health(self, gpu: int) -> list[dict[str, Any]]:
        return [b for s, b in self.messages if s == f"gpu.health.{self.name}.{gpu}"]

    def xids(self) -> list[dict[str, Any]]:
        return [b for s, b in self.messages if s.startswith(f"gpu.xid.{self.name}.")]

    def heartbeat_reasons(self, gpu: int) -> list[dict[str, Any]]:
        beats = [b for s, b in self.messages if s == f"gpu.heartbeat.{self.name}"]
        for beat in reversed(beats):
            for g in beat["gpus"]:
                if g["gpu_index"] == gpu:
                    return list(g["reasons"])
        return []

    async def state(self, gpu: int, state: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            changes = self.health(gpu)
            return changes[-1] if changes and changes[-1]["state"] == state else None

        return await wait_for(check, timeout=20, what=f"gpu {gpu} {state}")  # type: ignore[no-any-return]


@asynccontextmanager
async def running_agent(bus: Bus, name: str, tmp_path: Path) -> AsyncIterator[Node]:
    sim = SimNvml.build(name, product="NVIDIA-H100-80GB-HBM3", count=2)
    kmsg = SimKmsg(tmp_path / f"kmsg-{name}", sim)
    agent = GpuAgent(sim, bus, _settings(kmsg.path), node=name)
    node = Node(name, sim, kmsg, agent)

    async def collect(msg: Any) -> None:
        node.messages.append((msg.subject, json.loads(msg.data)))

    subs = [
        await bus.nc.subscribe(f"gpu.*.{name}.>", cb=collect),
        await bus.nc.subscribe(f"gpu.*.{name}", cb=collect),
        await serve_injections(bus.nc, sim, kmsg),
    ]
    async with agent_running(agent, sim, subs):
        await wait_for(
            lambda: agent.ready and agent._kernel_log is not None, timeout=20, what="ready"
        )
        await node.state(0, "healthy")
        yield node


def _xid_reasons(reasons: list[dict[str, Any]], xid: int) -> list[dict[str, Any]]:
    return [r for r in reasons if r["code"] == "xid" and r["xid"] == xid]


async def test_an_xid_only_in_the_kernel_log_fails_the_gpu(
    bus: Bus, node: str, tmp_path: Path
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        line = n.kmsg.xid(1, 79, style="r535", pid=None)
        failed = await n.state(1, "failed")
        assert failed["recommended_action"] == "reboot_node"
        (reason,) = _xid_reasons(failed["reasons"], 79)
        assert reason["detectors"] == ["kmsg"]
        assert reason["evidence"]["driver_message"] == line
        xids = await wait_for(n.xids, timeout=20, what="gpu.xid")
        assert len(xids) == 1
        assert xids[0]["gpu_index"] == 1 and xids[0]["xid"] == 79
        assert xids[0]["gpu_uuid"] == n.sim.gpus[1].uuid
        assert xids[0]["detectors"] == ["kmsg"]
        assert xids[0]["driver_message"] == line
        assert n.health(0)[-1]["state"] == "healthy"


async def test_nvml_and_the_kernel_log_reporting_one_xid_make_one_incident(
    bus: Bus, node: str, tmp_path: Path
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        reply = await request_injection(
            bus.nc, node, InjectRequest(gpu=0, xid=48, via="both", driver="r470")
        )
        assert reply.ok and reply.applied == "XID 48 via both"
        failed = await n.state(0, "failed")
        xids = await wait_for(n.xids, timeout=20, what="gpu.xid")
        assert len(xids) == 1
        assert sorted(xids[0]["detectors"]) == ["kmsg", "nvml"]
        assert xids[0]["driver_message"].startswith("NVRM: Xid (PCI:0000:18:00): 48, pid=4242")

        def confirmed() -> list[dict[str, Any]] | None:
            found = _xid_reasons(n.heartbeat_reasons(0), 48)
            return found if found and len(found[0]["detectors"]) == 2 else None

        found = await wait_for(confirmed, timeout=20, what="the heartbeat names both detectors")
        # Whichever came first, the reason carries NVML's event data and the driver's line.
        assert found[0]["evidence"]["event_data"] == 48
        assert found[0]["evidence"]["driver_message"] == xids[0]["driver_message"]
        # One incident: one change to failed, one gpu.xid, whichever detector came first.
        assert [h["state"] for h in n.health(0)].count("failed") == 1
        assert len(_xid_reasons(failed["reasons"], 48)) == 1
        assert len(n.xids()) == 1


async def test_an_xid_repeated_in_the_kernel_log_is_two_incidents(
    bus: Bus, node: str, tmp_path: Path
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        n.kmsg.xid(0, 13)
        n.kmsg.xid(0, 13)
        xids = await wait_for(lambda: len(n.xids()) == 2 and n.xids(), timeout=20, what="2 xids")
        assert all(x["detectors"] == ["kmsg"] and x["application"] for x in xids)
        assert n.health(0)[-1]["state"] == "healthy"  # an application XID fails nothing


async def test_with_nvml_hung_the_kernel_log_still_fails_the_gpu(
    bus: Bus, node: str, tmp_path: Path
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        n.sim.inject_fault(0, "hang")
        hung = await n.state(0, "degraded")
        assert any(r["code"] == "nvml_hang" for r in hung["reasons"])
        n.kmsg.xid(0, 79)
        failed = await n.state(0, "failed")
        assert _xid_reasons(failed["reasons"], 79)[0]["detectors"] == ["kmsg"]
        assert any(r["code"] == "nvml_hang" for r in failed["reasons"])
        xids = await wait_for(n.xids, timeout=20, what="gpu.xid")
        assert xids[0]["processes"] == []  # NVML hung: not asked


async def test_with_nvml_hung_the_recovery_action_in_the_kernel_log_is_followed(
    bus: Bus, node: str, tmp_path: Path
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        n.sim.inject_fault(1, "hang")
        await n.state(1, "degraded")
        n.kmsg.xid(1, 154)  # "... changed from 0x0 (None) to 0x1 (GPU Reset Required)"
        failed = await n.state(1, "failed")
        assert failed["recommended_action"] == "reset_gpu"
        (reason,) = [r for r in failed["reasons"] if r["code"] == "recovery_action"]
        assert reason["evidence"]["nvidia_action"] == "GPU Reset Required"
        n.kmsg.write(
            "NVRM: Xid (PCI:0000:28:00): 154, GPU recovery action changed from 0x1 "
            "(GPU Reset Required) to 0x0 (None)"
        )
        back = await n.state(1, "degraded")  # still hung, no longer asked for a reset
        assert not [r for r in back["reasons"] if r["code"] == "recovery_action"]


async def test_cli_injects_through_the_kernel_log(
    bus: Bus, node: str, tmp_path: Path, nats_url: str
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        xid_79 = ("--gpu", "0", "--xid", "79")
        code, out, err = await sim_inject(
            nats_url, "--node", node, *xid_79, "--via", "kmsg", "--driver", "r470"
        )
        assert code == 0, err
        assert out.strip() == f"{node} gpu 0: XID 79 via kmsg injected"
        failed = await n.state(0, "failed")
        assert _xid_reasons(failed["reasons"], 79)[0]["detectors"] == ["kmsg"]
        assert n.sim.gpus[0].lost is False
        code, _, err = await sim_inject(
            nats_url, "--node", node, "--fault", "thermal", "--via", "kmsg"
        )
        assert code == 2 and err.count("\n") == 1  # a usage error
        assert "--via and --driver go with --xid only" in err


async def test_a_driver_line_for_an_unknown_gpu_is_counted_not_attributed(
    bus: Bus, node: str, tmp_path: Path
) -> None:
    async with running_agent(bus, node, tmp_path) as n:
        n.kmsg.write("NVRM: Xid (PCI:0000:ff:00): 79, pid=1, GPU has fallen off the bus.")
        n.kmsg.xid(1, 94)  # a known GPU after it: the unknown one did not stop the reader
        await wait_for(n.xids, timeout=20, what="gpu.xid")
        assert [x["gpu_index"] for x in n.xids()] == [1]
        assert n.agent.metrics.unattributed._value.get() == 1


# -- with the cordon service and the sim cluster ---------------------------------------


def _quarantined(node: dict[str, Any]) -> bool:
    return any(t["key"] == TAINT_KEY for t in taints_of(node)) and bool(
        node["spec"].get("unschedulable")
    )


async def _applied(env: Any, name: str) -> list[Any]:
    return [
        r
        for r in await audits(env.bus, name, "quarantine")
        if r.outcome == Outcome.APPLIED and r.guard is None
    ]


@asynccontextmanager
async def quarantined_by(
    cordon_env: EnvFactory, tmp_path: Path, gpu: int, via: Literal["kmsg", "both"]
) -> AsyncIterator[tuple[Any, str, Node, list[Any]]]:
    """The cordon env and one node's agent once an XID 79 on `gpu` `via` its detector(s) has
    tainted and cordoned the node in the API and its `applied` audit is published."""
    env = await cordon_env()
    await env.start()
    name = env.nodes[0]
    async with running_agent(env.bus, name, tmp_path) as n:
        reply = await request_injection(env.bus.nc, name, InjectRequest(gpu=gpu, xid=79, via=via))
        assert reply.ok, reply.error

        async def quarantined() -> bool:
            return _quarantined(await env.node(name))

        await wait_for(quarantined, timeout=20, what="taint and cordon in the API")
        applied = await wait_for(lambda: _applied(env, name), timeout=20, what="audit")
        yield env, name, n, applied


async def test_an_xid_seen_only_in_kmsg_quarantines_the_node(
    cordon_env: EnvFactory, tmp_path: Path
) -> None:
    async with quarantined_by(cordon_env, tmp_path, gpu=1, via="kmsg") as (_, _, n, applied):
        assert n.sim.gpus[1].lost is False  # NVML never said anything
        assert len(applied) == 1


async def test_kmsg_and_nvml_for_one_xid_quarantine_once_with_one_gpu_xid(
    cordon_env: EnvFactory, tmp_path: Path
) -> None:
    async with quarantined_by(cordon_env, tmp_path, gpu=0, via="both") as (env, name, n, _):

        async def xid_events() -> list[Any]:
            return await read_stream(env.bus, "GPU", f"gpu.xid.{name}.>")

        events = await wait_for(xid_events, timeout=20, what="gpu.xid in the stream")
        confirmed: Callable[[], bool] = lambda: bool(  # noqa: E731
            _xid_reasons(n.heartbeat_reasons(0), 79)
            and len(_xid_reasons(n.heartbeat_reasons(0), 79)[0]["detectors"]) == 2
        )
        await wait_for(confirmed, timeout=20, what="confirmed by both")
        events = await xid_events()
        assert len(events) == 1
        assert sorted(events[0].data.detectors) == ["kmsg", "nvml"]
        assert len(await _applied(env, name)) == 1
        assert [h["state"] for h in n.health(0)].count("failed") == 1
