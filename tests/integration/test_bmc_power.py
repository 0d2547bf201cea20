"""nodeward's BMC power port (`nodeward.bmc`) against a real BMC: `ipmi_sim` whose chassis
power runs a process (the "machine"), over RMCP+; and a simulated node (`launch.sim_node`)
whose boot the sim cluster sees after a power on."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from nodeward.bmc import Bmc, BmcError, BmcTarget, PowerState
from nodeward.config import ClusterSettings
from nodeward.kube.base import core, group_path
from nodeward.kube.client import MERGE_PATCH, KubeClient
from sim.cluster import SimCluster
from tests import ipmi_sim as peer
from tests.ipmi_sim import IpmiSim, Machine, dummy_machine, free_udp_port, wait_boot

pytestmark = [pytest.mark.peer("ipmi_sim"), pytest.mark.xdist_group("ipmi_sim")]

PowerBmc = Callable[..., IpmiSim]
power_bmc = peer.power_bmc  # the fixture: power_bmc(machine) -> a started IpmiSim


def target(sim: IpmiSim, **over: Any) -> BmcTarget:
    values: dict[str, Any] = {
        "host": sim.host,
        "port": sim.port,
        "username": sim.user,
        "password": SecretStr(sim.password),
    }
    return BmcTarget(**(values | over))


def bmc_of(sim: IpmiSim, **over: Any) -> Bmc:
    return Bmc(target(sim, **over), timeout=5, try_timeout=2)


async def test_power_state_follows_the_machine(power_bmc: PowerBmc, tmp_path: Path) -> None:
    sim = power_bmc(dummy_machine(tmp_path / "boot", link=False))
    wait_boot(tmp_path / "boot")
    bmc = bmc_of(sim)
    assert await bmc.power_state() == PowerState.ON
    assert sim.power_status() == "on"

    await bmc.power_off(graceful=False)
    sim.wait_machine(running=False)  # gone; the BMC says off once it has reaped it
    assert await bmc.wait_power_state(PowerState.OFF, timeout=10, interval=0.1) == "off"
    assert sim.power_status() == "off"


async def test_graceful_off_then_on_boots_a_new_machine(
    power_bmc: PowerBmc, tmp_path: Path
) -> None:
    boot_file = tmp_path / "boot"
    sim = power_bmc(dummy_machine(boot_file))
    first = wait_boot(boot_file)  # up and linked to the BMC: it can hear a soft shutdown
    bmc = bmc_of(sim)

    await bmc.power_off(graceful=True)
    assert await bmc.wait_power_state(PowerState.OFF, timeout=10, interval=0.1) == "off"
    assert sim.machine_pid() is None

    await bmc.power_on()
    second = wait_boot(boot_file, other_than=first)
    assert second[0] != first[0]
    assert sim.machine_pid() == second[0]
    assert await bmc.power_state() == PowerState.ON


async def test_a_hung_machine_ignores_graceful_off_but_not_a_hard_one(
    power_bmc: PowerBmc, tmp_path: Path
) -> None:
    boot_file = tmp_path / "boot"
    sim = power_bmc(dummy_machine(boot_file, hung=True))
    first = wait_boot(boot_file)
    bmc = bmc_of(sim)

    await bmc.power_off(graceful=True)  # the BMC takes it; the OS never acts on it
    assert await bmc.wait_power_state(PowerState.OFF, timeout=3, interval=0.2) == "on"
    assert sim.machine_pid() == first[0]

    await bmc.power_off(graceful=False)
    assert await bmc.wait_power_state(PowerState.OFF, timeout=10, interval=0.1) == "off"
    assert sim.machine_pid() is None

    await bmc.power_on()
    assert wait_boot(boot_file, other_than=first)[0] != first[0]
    assert await bmc.power_state() == PowerState.ON


async def test_cycle_restarts_the_machine(power_bmc: PowerBmc, tmp_path: Path) -> None:
    boot_file = tmp_path / "boot"
    sim = power_bmc(dummy_machine(boot_file))
    first = wait_boot(boot_file)
    bmc = bmc_of(sim)

    await bmc.power_cycle()
    second = wait_boot(boot_file, other_than=first)
    assert second[0] != first[0]
    assert await bmc.power_state() == PowerState.ON


async def test_graceful_off_of_an_unlinked_machine_is_refused_with_its_code(
    power_bmc: PowerBmc, tmp_path: Path
) -> None:
    sim = power_bmc(dummy_machine(tmp_path / "boot", link=False))
    first = wait_boot(tmp_path / "boot")

    with pytest.raises(BmcError) as caught:
        await bmc_of(sim).power_off(graceful=True)

    err = caught.value
    assert err.kind == "refused"
    assert str(err) == (
        f"BMC 127.0.0.1:{sim.port}: graceful power off: refused by the BMC:"
        " completion code 0xcc (Invalid data field in Request)"
    )
    assert sim.machine_pid() == first[0]


async def test_wrong_password_is_a_credentials_error_without_the_password(
    power_bmc: PowerBmc,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    sim = power_bmc(dummy_machine(tmp_path / "boot", link=False))
    caplog.set_level(logging.DEBUG)  # python-ipmi's own debug lines included
    wrong = "not-the-pw-9"

    with pytest.raises(BmcError) as caught:
        await bmc_of(sim, password=SecretStr(wrong)).power_off(graceful=False)

    err = caught.value
    assert err.kind == "credentials"
    assert str(err).startswith(f"BMC 127.0.0.1:{sim.port}: power off: wrong credentials: user")
    assert "\n" not in str(err)
    for secret in (wrong, sim.password):
        assert secret not in str(err)
        assert secret not in repr(err)
        assert secret not in caplog.text
    assert sim.machine_pid() is not None  # nothing was done

    with pytest.raises(BmcError) as caught:
        await bmc_of(sim, username="nobody").power_state()
    assert caught.value.kind == "credentials"
    assert sim.password not in str(caught.value)
    assert any(r.name.startswith("pyipmi") for r in caplog.records)  # its debug was on
    assert sim.password not in caplog.text
    assert sim.password not in repr(bmc_of(sim))
    await bmc_of(sim).power_off(graceful=False)  # the right one: logged, without it
    printed = "".join(capfd.readouterr())
    assert "bmc.power" in printed
    for secret in (wrong, sim.password):
        assert secret not in printed
        assert secret not in caplog.text


async def test_no_bmc_on_the_port_is_unreachable_at_once() -> None:
    port = free_udp_port()
    bmc = Bmc(
        BmcTarget(host="127.0.0.1", port=port, username="u", password=SecretStr("p")),
        timeout=10,
        try_timeout=5,
    )
    started = time.monotonic()

    with pytest.raises(BmcError) as caught:
        await bmc.power_state()

    assert time.monotonic() - started < 3  # no waiting: refused at once (ms, unloaded)
    assert caught.value.kind == "unreachable"
    assert str(caught.value) == (
        f"BMC 127.0.0.1:{port}: power state: unreachable:"
        " connection refused (nothing answers on that UDP port)"
    )


async def test_a_bmc_that_never_answers_is_unreachable_within_the_timeout(
    power_bmc: PowerBmc, tmp_path: Path
) -> None:
    sim = power_bmc(dummy_machine(tmp_path / "boot", link=False))
    assert sim.pid is not None
    os.kill(sim.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(BmcError) as caught:
            await Bmc(target(sim), timeout=10, try_timeout=0.5).power_off(graceful=False)
        took = time.monotonic() - started
    finally:
        os.kill(sim.pid, signal.SIGCONT)

    assert took < 5  # the ping's 0.5 s, not the call's 10 s
    assert caught.value.kind == "unreachable"
    assert "no answer to the RMCP ping within 0.5s" in str(caught.value)
    assert await bmc_of(sim).power_state() == PowerState.ON  # it was not powered off


# -- a simulated node the BMC powers, seen by the sim cluster ---------------------------------


async def _node_and_lease(client: KubeClient, node: str) -> tuple[dict[str, Any], Any]:
    obj = await client.request("GET", core("nodes", node))
    lease = await client.request(
        "GET", group_path("coordination.k8s.io", "v1", "leases", node, "kube-node-lease")
    )
    return obj, lease


def _ready(node: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


async def _boot_in_api(
    client: KubeClient, node: str, boot_file: Path, *, other_than: str | None, timeout: float = 20
) -> str:
    """Wait until the machine wrote a boot ID (not `other_than`) and the API shows it."""
    deadline = time.monotonic() + timeout
    while True:
        text = boot_file.read_text().strip() if boot_file.exists() else ""
        if text and text != other_than:
            obj = await client.request("GET", core("nodes", node))
            if obj["status"]["nodeInfo"]["bootID"] == text:
                return text
        if time.monotonic() > deadline:
            raise AssertionError(f"no new boot of {node} in the API within {timeout:g}s")
        await asyncio.sleep(0.05)


@pytest.fixture
async def admin_client(sim: SimCluster, tmp_path: Path) -> Any:
    client = KubeClient.from_settings(
        ClusterSettings(kubeconfig=sim.write_kubeconfig(tmp_path / "kubeconfig-test"))
    )
    yield client
    await client.close()


async def _external_node(client: KubeClient) -> str:
    """The seed's first node, annotated as heartbeated by an outside process."""
    listing = await client.request("GET", core("nodes"))
    node = str(listing["items"][0]["metadata"]["name"])
    await client.request(
        "PATCH",
        core("nodes", node),
        body={"metadata": {"annotations": {"sim.nodeward.io/kubelet": "external"}}},
        content_type=MERGE_PATCH,
    )
    return node


async def test_power_on_boots_the_sim_node_anew_in_the_api(
    sim: SimCluster, admin_client: KubeClient, power_bmc: PowerBmc, tmp_path: Path
) -> None:
    node = await _external_node(admin_client)
    seeded_boot = (await admin_client.request("GET", core("nodes", node)))["status"]["nodeInfo"][
        "bootID"
    ]
    boot_file = tmp_path / "boot-id"
    machine = Machine(
        [
            sys.executable,
            "-m",
            "launch.sim_node",
            "--node",
            node,
            "--kubeconfig",
            str(sim.write_kubeconfig(tmp_path / "kubeconfig-node")),
            "--renew-s",
            "0.2",
            "--boot-id-file",
            str(boot_file),
            "--vm",
            "{vm}",
        ]
    )
    bmc_sim = await asyncio.to_thread(power_bmc, machine)
    first = await _boot_in_api(admin_client, node, boot_file, other_than=seeded_boot)
    obj, lease = await _node_and_lease(admin_client, node)
    assert _ready(obj)["status"] == "True"
    assert _ready(obj)["reason"] == "KubeletReady"
    assert {c["type"] for c in obj["status"]["conditions"]} >= {"MemoryPressure", "Ready"}
    assert lease["spec"]["holderIdentity"] == node
    assert lease["spec"]["leaseDurationSeconds"] == 40
    renewed = lease["spec"]["renewTime"]
    deadline = time.monotonic() + 10
    while (await _node_and_lease(admin_client, node))[1]["spec"]["renewTime"] == renewed:
        assert time.monotonic() < deadline, "the lease is not renewed"
        await asyncio.sleep(0.05)

    bmc = bmc_of(bmc_sim)
    await bmc.power_off(graceful=True)
    assert await bmc.wait_power_state(PowerState.OFF, timeout=10, interval=0.1) == "off"
    await bmc.power_on()

    second = await _boot_in_api(admin_client, node, boot_file, other_than=first)
    assert second != first
    obj, _ = await _node_and_lease(admin_client, node)
    assert _ready(obj)["status"] == "True"
    assert await bmc.power_state() == PowerState.ON


async def test_sim_node_exits_0_promptly_on_sigterm(
    sim: SimCluster, admin_client: KubeClient, tmp_path: Path
) -> None:
    node = await _external_node(admin_client)
    boot_file = tmp_path / "boot-id"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "launch.sim_node",
        "--node",
        node,
        "--kubeconfig",
        str(sim.write_kubeconfig(tmp_path / "kubeconfig-node")),
        "--boot-id-file",
        str(boot_file),
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await _boot_in_api(admin_client, node, boot_file, other_than=None)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert time.monotonic() - started < 5
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
