"""A node run by a real BMC for the recovery's tests and bench: OpenIPMI's `ipmi_sim`,
whose chassis power runs the node's "machine" (`launch.sim_node`: its kubelet's lease and
boot), on the platform of `recovery_fixtures.recovery_platform`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from nodeward.config import ClusterSettings
from nodeward.kube.client import KubeClient
from services.recovery.hang import OUT_OF_SERVICE
from sim.cluster import SimCluster
from tests.integration.recovery_fixtures import RecoveryEnv, wait_for
from tests.ipmi_sim import IpmiSim, Machine, need_ipmi_sim

SIM = {  # the node lifecycle controller's timings, short
    "lease_renew_s": 0.3,
    "node_monitor_period_s": 0.3,
    "node_monitor_grace_s": 2.0,
    "node_eviction_qps": 100.0,
}


def ladder(*steps: tuple[str, str]) -> dict[str, Any]:
    return {
        "name": "gpu",
        "min_healthy": 1,
        "steps": [{"action": a, "timeout": t} for a, t in steps],
    }


def hang_settings(ladder: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "check_interval": "0.2s",
        "not_ready_after": "1s",
        "silent_after": "1h",  # the test's GPU agent runs in-process: not the machine's
        "power_off_timeout": "15s",  # SIGTERM ignored, SIGKILL after kill_wait
        "fence_wait": "3s",
        "bmc_timeout": "3s",
        "ladders": [ladder],
    } | more


class Node:
    """The BMC-run node of a test: its BMC, and what a watcher saw of it in the API."""

    def __init__(self) -> None:
        self.bmc: IpmiSim | None = None
        self.boots: list[str] = []
        self.hung_pid: int | None = None  # the machine hung
        self.taint_seen_running: bool | None = None
        """whether the hung machine still ran when the out-of-service taint first showed"""

    def hang(self) -> None:
        assert self.bmc is not None
        pid = self.bmc.machine_pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        self.hung_pid = pid


async def bmc_node(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],
    *,
    ladder: dict[str, Any],
    nats_url: str,
    password: str | None = None,
    hang: dict[str, Any] | None = None,
    **recovery: Any,
) -> tuple[RecoveryEnv, Node]:
    """A platform (`recovery_platform`'s `make`) whose node is run by a real BMC, started
    by `power_bmc(machine)`; the Secret holds its credentials (`password` instead of the
    right one, when given); the node's machine has booted (`Node.boots[0]`)."""
    need_ipmi_sim()
    node = Node()

    async def boot(sim: SimCluster, kubeconfig: Path, name: str) -> None:
        admin = KubeClient.from_settings(ClusterSettings(kubeconfig=kubeconfig))
        seeded = (await admin.request("GET", f"/api/v1/nodes/{name}"))["status"]["nodeInfo"]
        machine = Machine(
            [sys.executable, "-m", "launch.sim_node", "--node", name, "--kubeconfig",
             str(kubeconfig), "--renew-s", "0.3", "--status-s", "1", "--vm", "{vm}",
             "--nats", nats_url],
        )  # fmt: skip
        bmc = power_bmc(machine)
        node.bmc = bmc
        try:
            await admin.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                body={"metadata": {"annotations": {"nodeward.io/bmc-address": f"127.0.0.1:{bmc.port}"}}},
                content_type="application/merge-patch+json",
            )  # fmt: skip
            secret = {"username": bmc.user, "password": password or bmc.password}
            await admin.request(
                "POST",
                "/api/v1/namespaces/nodeward/secrets",
                body={
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "nodeward-bmc", "namespace": "nodeward"},
                    "data": {k: base64.b64encode(v.encode()).decode() for k, v in secret.items()},
                },
            )
            booted = await wait_for(
                lambda: _booted(admin, name, other_than=seeded["bootID"]),
                f"{name}'s machine booted",
            )
            node.boots.append(booted)
        finally:
            await admin.close()

    env = await platform(
        reboot_operator=False,  # a hung node's reboot operator never runs
        node_annotations={"sim.nodeward.io/kubelet": "external"},
        sim_options=SIM,
        on_cluster=boot,
        hang=hang_settings(ladder, **(hang or {})),
        reboot_timeout="3s",
        **recovery,
    )
    env.tasks.append(asyncio.create_task(_watch(env, node)))
    return env, node


async def _booted(admin: KubeClient, name: str, *, other_than: str) -> str | None:
    """The node's bootID once its machine posted one (other than `other_than`) and Ready."""
    got = await admin.request("GET", f"/api/v1/nodes/{name}")
    ready = [c for c in got["status"].get("conditions", []) if c["type"] == "Ready"]
    boot = got["status"].get("nodeInfo", {}).get("bootID")
    if ready and ready[0]["status"] == "True" and boot and boot != other_than:
        return str(boot)
    return None


def running(pid: int) -> bool:
    """The process exists and is no zombie (ipmi_sim's power is on exactly while its
    machine's process exists)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def _watch(env: RecoveryEnv, node: Node) -> None:
    """Each new boot of the node (the machine resets its simulated GPUs first: `--nats`),
    and whether the hung machine still ran the moment the out-of-service taint showed."""
    while True:
        with contextlib.suppress(Exception):
            got = await env.node_obj()
            boot = got["status"].get("nodeInfo", {}).get("bootID")
            if boot and (not node.boots or node.boots[-1] != boot):
                node.boots.append(boot)
            tainted = any(t["key"] == OUT_OF_SERVICE for t in got["spec"].get("taints", []))
            if tainted and node.taint_seen_running is None and node.hung_pid is not None:
                # read after the taint was seen: a process gone now was gone then
                node.taint_seen_running = running(node.hung_pid)
        await asyncio.sleep(0.05)
