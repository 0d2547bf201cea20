"""The energy agent's cpufreq check on a fake sysfs tree, on a real NATS: a `node.finding.v1`
once per change, and the accounting service's one notice to on-call per change, across an
agent restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.energy.settings import EnergySettings
from nodeward.bus import Bus
from nodeward.config import BusSettings
from schemas.notify import Severity
from tests.conftest import wait_for
from tests.integration.accounting_fixtures import AccountingEnv, EnvFactory
from tests.integration.cordon_fixtures import read_stream
from tests.integration.test_energy_agent import FAST, Watts, running
from tests.unit.test_energy_tuning import fake_cpus

pytestmark = pytest.mark.xdist_group("accounting")


async def findings(bus: Bus, node: str) -> list[Any]:
    return [e.data for e in await read_stream(bus, "NODES", f"node.finding.{node}.>")]


async def stored(bus: Bus, node: str, n: int) -> list[str]:
    """The states published so far, once there are `n`."""

    async def enough() -> list[str] | None:
        states = [f.state.value for f in await findings(bus, node)]
        return states if len(states) >= n else None

    got: list[str] = await wait_for(enough, timeout=10, what=f"{n} findings stored")
    return got


async def notices(bus: Bus, node: str) -> list[Any]:
    events = await read_stream(bus, "NOTIFY", "notify.*.node-tuning")
    return [e.data for e in events if any(t.name == node for t in e.data.targets)]


async def test_a_governor_change_is_published_once_and_told_to_oncall_once(
    accounting_env: EnvFactory, bus_settings: BusSettings, bus: Bus, tmp_path: Path
) -> None:
    env: AccountingEnv = await accounting_env()
    node = env.h100
    sysfs = tmp_path / "sys" / "devices" / "system" / "cpu"
    fake_cpus(sysfs, ["performance"] * 4, [3_000_000] * 4)
    # The loop is off: the test runs each check itself, so it knows how many ran.
    cpufreq = {"root": str(sysfs), "samples": 1, "enabled": False}
    config = EnergySettings.model_validate(
        {**FAST, "cgroup_root": str(tmp_path / "cg"), "cpufreq": cpufreq}
    )
    await env.start()

    async def told(n: int) -> list[Any]:
        await wait_for(env.settled, timeout=15, what="findings handled")
        got = await notices(bus, node)
        assert len(got) == n, [x.title for x in got]
        return got

    async with running(bus_settings, node, config, [Watts("ipmi")]) as agent:
        for _ in range(3):
            await agent.check_tuning()
        assert await stored(bus, node, 1) == ["ok"]
        await told(0)  # a node that starts clear says nothing to on-call

        fake_cpus(sysfs, ["performance", "powersave", "powersave", "performance"], [3_000_000] * 4)
        for _ in range(3):
            await agent.check_tuning()
        assert await stored(bus, node, 2) == ["ok", "finding"]
        [notice] = await told(1)
        assert notice.audience == "oncall"
        assert notice.severity == Severity.WARNING
        assert notice.body == f"{node}: 2 of 4 CPUs use governor powersave, not performance"

    # A restarted agent states its result again; it is not news to on-call.
    async with running(bus_settings, node, config, [Watts("ipmi")]) as agent:
        await agent.check_tuning()
        assert await stored(bus, node, 3) == ["ok", "finding", "finding"]
        await told(1)

        fake_cpus(sysfs, ["performance"] * 4, [3_000_000] * 4)
        await agent.check_tuning()
        await agent.check_tuning()
        assert await stored(bus, node, 4) == ["ok", "finding", "finding", "ok"]
        cleared = (await told(2))[1]
        assert cleared.severity == Severity.INFO
        assert cleared.resolves is True
    # Checks that found nothing new published nothing.
    assert [f.state.value for f in await findings(bus, node)] == ["ok", "finding", "finding", "ok"]
