"""BMC-run nodes in `nodeward up`: a node whose "machine" a simulated BMC powers, so that a
hung node can be recovered the way a real one is, through its BMC.

For each such node (`gpu-h100-04` by default, `up --bmc-node`) `up` starts OpenIPMI's
`ipmi_sim` on loopback (`sim.ipmi_sim`, in `<state>/bmc/<node>`) whose chassis power runs
the node's machine, `python -m launch.sim_node` (its kubelet's side: a new bootID and
`Ready=True` at each boot, the node Lease renewed every second), linked to the BMC's VM
serial interface. The node is annotated `sim.nodeward.io/kubelet: external` (the sim
cluster's kubelet no longer heartbeats it: the machine does) and `nodeward.io/bmc-address`
(`127.0.0.1:<port>`), and the Secret `nodeward/nodeward-bmc` holds the BMCs' credentials
(`<node>.username`, `<node>.password`), as services.recovery reads them.

The platform daemon answers `sim.hang.<node>` (`nodeward sim inject --node N --hang`): the
machine is stopped (SIGSTOP: its lease goes stale, it hears neither a reboot request nor an
ACPI shutdown; only a hard power off ends it) and the node's simulated agents with it (the
supervisor suspends their units: no GPU heartbeat, no answer on `agent.gpu.*.<node>`). A
watch (`watch`) keeps the agents to the machine: suspended while it is hung or off, built
again (fresh simulated GPUs, as after a real reboot) once it has booted again (a new boot
ID) or runs on. The simulated reboot operator reboots such a node through its BMC (a power
cycle) while its machine runs, and does nothing while it is hung (`sim.reboot.Machines`).

Without `ipmi_sim`, `sdrcomp` and `ipmitool` nothing of this runs: `up` says so in one line,
and `sim.hang.*` answers why.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from pydantic import SecretStr, ValidationError

from nodeward.bmc import BMC_ADDRESS_ANNOTATION, Bmc, BmcError, BmcTarget
from nodeward.config import ClusterSettings
from nodeward.daemon import Daemon
from nodeward.kube.base import core
from nodeward.kube.client import MERGE_PATCH, KubeClient
from nodeward.kube.errors import AlreadyExists, KubeError
from nodeward.supervisor import Supervisor
from schemas.tokens import token
from sim.cluster.kubelet import EXTERNAL, KUBELET
from sim.hang import PREFIX, HangReply, HangRequest
from sim.ipmi_sim import IpmiSim, IpmiSimUnavailable, Machine, MachineState, missing_tool

DEFAULT_NODES = ("gpu-h100-04",)
"""The nodes a BMC runs in `up` unless `--bmc-node` says otherwise (those in the seed)."""
SECRET = "nodeward-bmc"  # noqa: S105 - a Secret's name (services.recovery's hang.bmc_secret)
NAMESPACE = "nodeward"  # where the Secret is (hang.bmc_namespace)
USER = "nodeward"
WATCH_S = 0.2
"""How often the machines are looked at."""
RENEW_S = 1.0
"""How often a machine renews its node's Lease."""


@dataclass
class BmcNode:
    """A node whose machine a BMC runs, and whether its simulated agents run."""

    name: str
    bmc: IpmiSim
    units: list[str] = field(default_factory=list)
    """the supervisor's units of its simulated agents"""
    agents_on: bool = True
    down_boot: str | None = None
    """its machine's boot when its agents were suspended"""
    down_pid: int | None = None
    """its machine's process then"""
    seen_pid: int | None = None
    """the machine's process at the last look while its agents ran"""
    seen_boot: str | None = None
    """and its boot"""

    @property
    def boot_file(self) -> Path:
        return self.bmc.workdir / "boot-id"

    def boot(self) -> str | None:
        """The boot the machine last posted (None before its first)."""
        try:
            return self.boot_file.read_text().strip() or None
        except OSError:
            return None


def _machine(node: str, kubeconfig: Path, boot_file: Path) -> Machine:
    """`launch.sim_node` for `node`, linked to its BMC, gone with it."""
    root = str(Path(__file__).resolve().parents[1])  # where `launch` is, installed or not
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable, "-m", "launch.sim_node", "--node", node, "--kubeconfig", str(kubeconfig),
        "--renew-s", f"{RENEW_S:g}", "--status-s", "2", "--boot-id-file", str(boot_file),
        "--vm", "{vm}", "--log-level", "warning",
    ]  # fmt: skip
    return Machine(argv, env={"PYTHONPATH": path}, dies_with_bmc=True)


class BmcNodes:
    """The BMC-run nodes of one `nodeward up` (none, with `unavailable` saying why)."""

    def __init__(self, nodes: Iterable[BmcNode] = (), unavailable: str | None = None) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.unavailable = unavailable
        self.supervisor: Supervisor | None = None
        self.log = structlog.get_logger().bind(component="sim-bmc")

    @property
    def addresses(self) -> dict[str, str]:
        """node -> its BMC's `host:port`."""
        return {name: n.bmc.address for name, n in self.nodes.items()}

    def runs(self, node: str) -> bool:
        return node in self.nodes

    async def reboot(self, node: str) -> str | None:
        """`sim.reboot.Machines`: a power cycle through the node's BMC while its machine
        runs; else why not."""
        n = self.nodes[node]
        state = n.bmc.machine_state()
        if state != MachineState.RUNNING:
            return f"its machine is {state.value}: nothing on it carries out a reboot"
        bmc = Bmc(_target(n.bmc), timeout=5.0)
        try:
            await bmc.power_cycle()
        except BmcError as exc:
            return f"its BMC did not power-cycle it: {exc}"
        return None

    async def hang(self, node: str) -> HangReply:
        """Hang `node`'s machine (SIGSTOP) and silence its simulated agents."""
        n = self.nodes.get(node) or next(
            (x for x in self.nodes.values() if token(x.name) == node), None
        )
        if n is None:
            return HangReply(ok=False, node=node, error=self._no_bmc(node))
        state = n.bmc.machine_state()
        if state != MachineState.RUNNING:
            return HangReply(ok=False, node=n.name, error=f"its machine is {state.value} already")
        try:
            pid = await asyncio.to_thread(n.bmc.hang)
        except ProcessLookupError:
            return HangReply(ok=False, node=n.name, error="its machine is off already")
        self.log.info("sim_bmc.hung", node=n.name, pid=pid)
        await self._agents(n, on=False)
        return HangReply(
            ok=True,
            node=n.name,
            applied=f"machine hung (SIGSTOP pid {pid}): its kubelet's lease and its simulated "
            f"agents stop; only its BMC ({n.bmc.address}) can end it, by a hard power off",
        )

    def _no_bmc(self, node: str) -> str:
        if self.unavailable is not None:
            return f"no BMC runs its machine: {self.unavailable}"
        shown = ", ".join(self.nodes) or "none"
        return (
            f"no BMC runs its machine in this nodeward up (BMC-run nodes: {shown}; "
            "up --bmc-node chooses them)"
        )

    async def watch(self) -> None:
        """Keep each node's simulated agents to its machine, until cancelled."""
        while True:
            for n in self.nodes.values():
                try:
                    await self._follow(n)
                except Exception:  # a sim helper must not stop `up`: the next tick
                    self.log.exception("sim_bmc.watch_failed", node=n.name)
            await asyncio.sleep(WATCH_S)

    async def _follow(self, n: BmcNode) -> None:
        """Agents off when the machine is hung, off, or another machine than the last seen
        runs (a power cycle between two looks); on again once it has booted (or runs on)."""
        pid, state = n.bmc.machine_pid(), n.bmc.machine_state()
        if n.agents_on:
            other = n.seen_pid is not None and pid != n.seen_pid
            restarted = state == MachineState.RUNNING and other
            if state != MachineState.RUNNING or restarted:
                self.log.info("sim_bmc.machine_down", node=n.name, state=state.value)
                await self._agents(n, on=False)
            else:
                n.seen_pid, n.seen_boot = pid, n.boot()
        elif state == MachineState.RUNNING:
            booted = n.boot() not in (None, n.down_boot)
            if booted or pid == n.down_pid:  # a new boot, or it ran on
                self.log.info("sim_bmc.machine_up", node=n.name, boot=n.boot(), booted=booted)
                await self._agents(n, on=True)
                n.seen_pid, n.seen_boot = pid, n.boot()

    async def _agents(self, n: BmcNode, *, on: bool) -> None:
        """Resume (built afresh: new simulated GPUs) or suspend the node's agents."""
        if n.agents_on == on:
            return
        if not on:
            n.down_boot, n.down_pid = n.seen_boot or n.boot(), n.seen_pid or n.bmc.machine_pid()
        n.agents_on = on
        if self.supervisor is None:
            return
        for unit in n.units:
            if on:
                try:
                    await self.supervisor.resume(unit)
                except Exception as exc:  # noqa: BLE001 - tried again on the next tick
                    n.agents_on = False
                    self.log.warning("sim_bmc.resume_failed", unit=unit, error=str(exc))
                    return
            else:
                await self.supervisor.suspend(unit)

    def attach(self, daemon: Daemon, nc: Any, supervisor: Supervisor) -> None:
        """Tasks of the platform daemon: `sim.hang.*` answered (also without a BMC: why
        not), and the machines watched; `supervisor` runs the nodes' agents' units."""
        self.supervisor = supervisor

        async def serve() -> None:
            async def handle(msg: Any) -> None:
                node = msg.subject.removeprefix(f"{PREFIX}.")
                try:
                    HangRequest.model_validate_json(msg.data or b"{}")
                    reply = await self.hang(node)
                except ValidationError as exc:
                    reply = HangReply(
                        ok=False, node=node, error=f"bad request: {exc.errors()[0]['msg']}"
                    )
                except Exception as exc:  # noqa: BLE001 - answered, never raised
                    reply = HangReply(ok=False, node=node, error=f"{type(exc).__name__}: {exc}")
                if msg.reply:
                    await msg.respond(reply.model_dump_json(exclude_none=True).encode())

            sub = await nc.subscribe(f"{PREFIX}.*", cb=handle)
            try:
                await asyncio.Future()  # until cancelled
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

        daemon.add_task(serve, name="sim-hang")
        if self.nodes:
            daemon.add_task(self.watch, name="sim-bmc")


def _target(bmc: IpmiSim) -> BmcTarget:
    return BmcTarget(
        host=bmc.host, port=bmc.port, username=bmc.user, password=SecretStr(bmc.password)
    )


def chosen(asked: Sequence[str] | None, gpu_nodes: Sequence[str]) -> list[str]:
    """The BMC-run nodes: `asked` (`--bmc-node`; `none` for none), else `DEFAULT_NODES` that
    are GPU nodes of the fleet. Raises `ValueError` for an asked node that is not one."""
    if asked is None:
        return [n for n in DEFAULT_NODES if n in gpu_nodes]
    names = [n for n in asked if n != "none"]
    unknown = [n for n in names if n not in gpu_nodes]
    if unknown:
        raise ValueError(
            f"--bmc-node {unknown[0]}: not a GPU node of the sim cluster "
            f"({', '.join(gpu_nodes) or 'none'})"
        )
    return list(dict.fromkeys(names))


async def _prepare(client: KubeClient, bmcs: Sequence[IpmiSim], names: Sequence[str]) -> None:
    """The nodes annotated (external kubelet, BMC address) and the credentials' Secret."""
    for name, bmc in zip(names, bmcs, strict=True):
        annotations = {KUBELET: EXTERNAL, BMC_ADDRESS_ANNOTATION: bmc.address}
        await client.request(
            "PATCH",
            core("nodes", name),
            body={"metadata": {"annotations": annotations}},
            content_type=MERGE_PATCH,
        )
    data: dict[str, str] = {}
    for name, bmc in zip(names, bmcs, strict=True):
        data[f"{name}.username"] = base64.b64encode(bmc.user.encode()).decode()
        data[f"{name}.password"] = base64.b64encode(bmc.password.encode()).decode()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": data,
    }
    try:
        await client.request("POST", core("secrets", namespace=NAMESPACE), body=secret)
    except AlreadyExists:  # a seed's: the BMCs' credentials added to it
        await client.request(
            "PATCH",
            core("secrets", SECRET, namespace=NAMESPACE),
            body={"data": data},
            content_type=MERGE_PATCH,
        )


async def _start(state_dir: Path, admin: ClusterSettings, names: Sequence[str]) -> BmcNodes:
    """A BMC (and so a machine) for each node of `names`, the cluster prepared; none, with
    why, where a program is missing or a BMC does not start."""
    missing = missing_tool()
    if missing is not None:
        return BmcNodes(unavailable=missing)
    assert admin.kubeconfig is not None
    started: list[IpmiSim] = []
    try:
        for name in names:
            workdir = state_dir / "bmc" / name
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "boot-id").unlink(missing_ok=True)
            bmc = IpmiSim(
                workdir,
                user=USER,
                password=secrets.token_urlsafe(12),
                machine=_machine(name, admin.kubeconfig, workdir / "boot-id"),
                dies_with_parent=True,
            )
            started.append(bmc)
            await asyncio.to_thread(bmc.start)
        client = KubeClient.from_settings(admin, user_agent="sim-bmc")
        try:
            await _prepare(client, started, names)
        finally:
            await client.close()
    except (IpmiSimUnavailable, RuntimeError, OSError, KubeError) as exc:
        await asyncio.gather(*(asyncio.to_thread(b.stop) for b in started))
        return BmcNodes(unavailable=f"its BMC did not start: {' '.join(str(exc).split())[:300]}")
    return BmcNodes(BmcNode(name, bmc) for name, bmc in zip(names, started, strict=True))


@contextlib.asynccontextmanager
async def bmc_nodes(
    state_dir: Path, admin: ClusterSettings, names: Sequence[str]
) -> AsyncIterator[BmcNodes]:
    """The BMC-run nodes `names` (`_start`), their BMCs and machines stopped on exit."""
    nodes = await _start(state_dir, admin, names) if names else BmcNodes()
    try:
        yield nodes
    finally:
        await asyncio.gather(*(asyncio.to_thread(n.bmc.stop) for n in nodes.nodes.values()))
