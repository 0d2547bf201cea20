"""The energy agent while its BMC (a real `ipmi_sim`) goes away and comes back: no energy
invented across the gap, unknown (not zero) while it is away, the real reason, logged once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agents.energy.account import StaticCarbon
from agents.energy.agent import EnergyAgent
from agents.energy.settings import EnergySettings
from agents.sources.ipmi import IpmiReader, IpmiSettings
from nodeward.bus import Bus
from nodeward.config import BusSettings
from tests.conftest import wait_for
from tests.ipmi_sim import IpmiSim, need_ipmi_sim

pytestmark = [pytest.mark.peer("ipmi_sim"), pytest.mark.xdist_group("ipmi_sim")]

NODE = "gpu-bmc-gap"


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[IpmiSim]:
    need_ipmi_sim()
    sim = IpmiSim(tmp_path / "bmc", sensors={"SysPower": 550.0})
    sim.workdir.mkdir()
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


async def test_a_bmc_that_goes_away_leaves_a_gap_not_a_spike(
    bmc: IpmiSim, bus_settings: BusSettings, tmp_path: Path
) -> None:
    config = EnergySettings.model_validate(
        {
            "node": NODE,
            "interval": "2s",
            "sample_every": "0.5s",
            "read_timeout": "1s",
            "cgroup_root": str(tmp_path / "cg"),
        }
    )
    ipmi = IpmiSettings.model_validate(
        {
            "host": bmc.host,
            "port": bmc.port,
            "user": bmc.user,
            "password": bmc.password,
            "timeout": "2s",
        }
    )
    bus = await Bus.connect(bus_settings, source=f"agent/energy/{NODE}")
    intervals: list[dict[str, Any]] = []

    async def collect(msg: Any) -> None:
        intervals.append(json.loads(msg.data))

    sub = await bus.nc.subscribe(f"energy.node.{NODE}", cb=collect)
    agent = EnergyAgent(bus, config, [IpmiReader(ipmi)], StaticCarbon(50.0), node=NODE)
    with capture_logs() as logs:
        task = asyncio.create_task(agent.run())
        try:
            await wait_for(lambda: len(intervals) >= 2, timeout=30, what="intervals with the BMC")
            bmc.kill()
            seen = len(intervals)
            await wait_for(
                lambda: sum(1 for i in intervals[seen:] if i.get("energy_j") is None) >= 2,
                timeout=60,
                what="intervals while the BMC is away",
            )
            bmc.start(same_port=True)
            back = len(intervals)
            await wait_for(
                lambda: sum(1 for i in intervals[back:] if i.get("energy_j") is not None) >= 2,
                timeout=60,
                what="intervals after the BMC came back",
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await sub.unsubscribe()
            await bus.close(grace=1)

    away = [i for i in intervals if i.get("energy_j") is None]
    measured = [i for i in intervals if i.get("energy_j") is not None]
    assert away and measured
    for i in away:
        # Unknown, not zero, and not the last value before the outage restated.
        assert (i.get("avg_power_w"), i.get("min_power_w"), i.get("max_power_w")) == (
            None,
            None,
            None,
        )
        assert i.get("degraded"), i
        assert all(line.startswith("ipmi: ") for line in i["degraded"]), i["degraded"]
        assert not any("hung" in line for line in i["degraded"]), i["degraded"]
    # The BMC's own error, not "hung": no answer, or no session.
    said = [line for i in away for line in i["degraded"]]
    assert any(f"BMC 127.0.0.1:{bmc.port}" in line for line in said), said
    for i in measured:
        # Never integrated across the gap: the mean power lies within the interval's own range
        # (the BMC serves 550 W throughout; 10 W is its resolution).
        mean = i["energy_j"] / i["covered_s"]
        assert i["min_power_w"] - 10 <= mean <= i["max_power_w"] + 10, i
        assert i["covered_s"] <= 2.0 + 0.5 + 1e-6, i
    last = intervals[-1]
    assert last["uncovered_total_s"] >= sum(2.0 - i.get("covered_s", 0) for i in away) - 1.0
    failed = [e for e in logs if e["event"] == "energy source failed"]
    recovered = [e for e in logs if e["event"] == "energy source recovered"]
    assert len(recovered) == 1 and recovered[0]["source"] == "ipmi"
    # One line per state change (a new reason), not one per read or per interval.
    assert 1 <= len(failed) <= 3, failed
