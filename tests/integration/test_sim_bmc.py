"""`nodeward up`'s BMC-run nodes (`launch.sim_bmc`) against a real `ipmi_sim`: a hang stops
the machine and the node's agents; the agents come back only once the machine has booted
again; the simulated reboot operator's reboot is a BMC power cycle while the machine runs,
and nothing while it is hung."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from launch.sim_bmc import BmcNode, BmcNodes
from sim.ipmi_sim import MachineState
from tests import ipmi_sim as peer
from tests.ipmi_sim import IpmiSim, dummy_machine

pytestmark = [
    pytest.mark.peer("ipmi_sim"),
    pytest.mark.xdist_group("ipmi_sim"),
    pytest.mark.timeout(90),
]

power_bmc = peer.power_bmc  # the fixture: power_bmc(machine) -> a started IpmiSim


class Units:
    """The supervisor as the BMC nodes use it: which units are suspended."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.down: set[str] = set()

    async def suspend(self, name: str) -> bool:
        self.calls.append(f"suspend {name}")
        self.down.add(name)
        return True

    async def resume(self, name: str) -> bool:
        self.calls.append(f"resume {name}")
        self.down.discard(name)
        return True


async def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.05)
    assert cond(), what


async def node_of(power_bmc: Callable[..., IpmiSim], tmp_path: Path) -> tuple[BmcNodes, IpmiSim]:
    bmc = power_bmc(dummy_machine(tmp_path / "bmc-0" / "boot-id"))  # its workdir's boot-id
    nodes = BmcNodes([BmcNode("gpu-a", bmc, units=["agent-gpu-gpu-a", "agent-idle-gpu-a"])])
    nodes.supervisor = Units()  # type: ignore[assignment]
    await wait_for(lambda: nodes.nodes["gpu-a"].boot() is not None, "the first boot")
    return nodes, bmc


async def test_a_hung_node_s_agents_wait_for_its_next_boot(
    power_bmc: Callable[..., IpmiSim], tmp_path: Path
) -> None:
    nodes, bmc = await node_of(power_bmc, tmp_path)
    units: Units = nodes.supervisor  # type: ignore[assignment]
    with capture_logs():
        watching = asyncio.create_task(nodes.watch())
        try:
            reply = await nodes.hang("gpu-a")
            assert reply.ok and "SIGSTOP" in (reply.applied or ""), reply
            assert bmc.machine_state() == MachineState.HUNG
            assert units.down == {"agent-gpu-gpu-a", "agent-idle-gpu-a"}
            again = await nodes.hang("gpu-a")
            assert not again.ok and again.error == "its machine is hung already"
            why = await nodes.reboot("gpu-a")  # Kured on a hung host: nothing
            assert why is not None and "hung" in why
            await asyncio.sleep(1)
            assert units.down  # hung: still silent
            first = nodes.nodes["gpu-a"].boot()
            done = await asyncio.to_thread(bmc.ipmitool, "chassis", "power", "cycle")
            assert done.returncode == 0, done.stderr
            await wait_for(lambda: not units.down, "the agents back after the power cycle")
            assert nodes.nodes["gpu-a"].boot() != first  # only once it had booted again
            assert bmc.machine_state() == MachineState.RUNNING
        finally:
            watching.cancel()


async def test_a_reboot_of_a_running_node_is_a_bmc_power_cycle_and_its_agents_restart(
    power_bmc: Callable[..., IpmiSim], tmp_path: Path
) -> None:
    nodes, bmc = await node_of(power_bmc, tmp_path)
    units: Units = nodes.supervisor  # type: ignore[assignment]
    pid = bmc.machine_pid()
    with capture_logs():
        watching = asyncio.create_task(nodes.watch())
        try:
            await asyncio.sleep(0.5)  # looked at once, running
            assert await nodes.reboot("gpu-a") is None
            await wait_for(
                lambda: bmc.machine_pid() not in (None, pid) and not units.down and units.calls,
                "a new machine, its agents restarted",
            )
            assert units.calls == [
                "suspend agent-gpu-gpu-a",
                "suspend agent-idle-gpu-a",
                "resume agent-gpu-gpu-a",
                "resume agent-idle-gpu-a",
            ]
        finally:
            watching.cancel()
