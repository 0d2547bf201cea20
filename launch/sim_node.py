"""A simulated node's "machine": the process a BMC (`ipmi_sim`'s `startcmd`) powers.

    python -m launch.sim_node --node N --kubeconfig K [--renew-s 1] [--boot-id-file F]
                              [--vm HOST:PORT] [--hung] [--nats URL [--gpus 8]]

With `--nats`, a boot first resets the node's simulated GPUs (`sim.inject.<N>` recover,
answered by the node's simulated GPU agent wherever it runs), as a power cycle resets a real
node's GPUs before its kubelet reports Ready. While it runs the node is up, as its kubelet
would report: at start it renews the Lease
`kube-node-lease/<N>` (created if missing, owned by the node), then posts a new boot
(`status.nodeInfo.bootID`, a fresh uuid4) and `Ready=True` (reason `KubeletReady`) through
the status subresource, with a strategic merge patch keyed on the condition `type`, so the
node's other conditions stay; `lastTransitionTime` is now unless Ready was already True.
Then it renews the Lease every `--renew-s`, and every `--status-s` puts `Ready=True` back if
something else changed it (as a kubelet's status sync would).
Its boot ID goes to `--boot-id-file` (written once the API has it). The sim cluster's node
lifecycle controller turns a node whose lease goes stale `Ready=Unknown`: that is what
power off looks like from the API (annotate the node `sim.nodeward.io/kubelet: external`
so only this process heartbeats it).

It stops, exiting 0, on SIGTERM or SIGINT (ipmi_sim's hard power off sends SIGTERM), and
on the requests of ipmi_sim's VM serial interface (`--vm`, the lan.conf's
`serial 15 HOST PORT codec VM`): a power off (VM command 0x03) always, a graceful shutdown
(0x09, what chassis control "soft" sends; ipmi_sim answers it only to a connected machine
that claims the capability) unless `--hung`: a hung node's OS never acts on ACPI, so only
a hard power off stops it. Nothing is written to the API on the way down: a machine that
loses power says nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats

from nodeward.config import ClusterSettings
from nodeward.kube.base import Obj, core, group_path
from nodeward.kube.client import MERGE_PATCH, STRATEGIC_PATCH, KubeClient
from nodeward.kube.errors import AlreadyExists, KubeError, NotFound
from nodeward.logs import configure_logging, get_logger
from sim.inject import InjectRequest, request_injection

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
READY_REASON = "KubeletReady"
READY_MESSAGE = "kubelet is posting ready status"
EXTERNAL_KUBELET_ANNOTATION = "sim.nodeward.io/kubelet"  # value "external": heartbeated here

# ipmi_sim's VM serial codec (OpenIPMI lanserv/README.vm): 0xA0 ends an IPMI message,
# 0xA1 a control command; 0xAA escapes the next byte (its bit 4 set on the wire).
VM_MSG_END = 0xA0
VM_CMD_END = 0xA1
VM_ESCAPE = 0xAA
VM_CMD_POWER_OFF = 0x03
VM_CMD_CAPABILITIES = 0x08
VM_CMD_GRACEFUL_SHUTDOWN = 0x09
VM_CAN_POWER = 0x01
VM_CAN_GRACEFUL_SHUTDOWN = 0x20
POWER_OFF = "power-off"
GRACEFUL_SHUTDOWN = "graceful-shutdown"


def micro_time(at: datetime) -> str:
    """RFC 3339 with microseconds, as a Lease's renewTime (MicroTime)."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def whole_time(at: datetime) -> str:
    """RFC 3339 in whole seconds, as a condition's times (metav1.Time)."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(node: Obj, now: datetime) -> Obj:
    """The Ready=True condition to post; its transition time is kept if already True."""
    conditions = (node.get("status") or {}).get("conditions") or []
    old = next((c for c in conditions if c.get("type") == "Ready"), None)
    since = (
        old.get("lastTransitionTime")
        if old and old.get("status") == "True" and old.get("lastTransitionTime")
        else whole_time(now)
    )
    return {
        "type": "Ready",
        "status": "True",
        "reason": READY_REASON,
        "message": READY_MESSAGE,
        "lastHeartbeatTime": whole_time(now),
        "lastTransitionTime": since,
    }


def is_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def lease_manifest(node: str, node_uid: str | None, now: datetime) -> Obj:
    meta: Obj = {"name": node, "namespace": LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": micro_time(now),
        },
    }


# -- ipmi_sim's VM serial interface ----------------------------------------------------------


class VmDecoder:
    """Splits the VM codec's byte stream into control commands (IPMI messages are dropped)."""

    def __init__(self) -> None:
        self._frame = bytearray()
        self._escaped = False

    def feed(self, data: bytes) -> list[bytes]:
        """The control commands completed by `data`, unescaped, in order."""
        commands = []
        for byte in data:
            if byte in (VM_MSG_END, VM_CMD_END):
                if byte == VM_CMD_END and self._frame and not self._escaped:
                    commands.append(bytes(self._frame))
                self._frame.clear()
                self._escaped = False
            elif byte == VM_ESCAPE:
                self._escaped = True
            else:
                self._frame.append(byte & ~0x10 if self._escaped else byte)
                self._escaped = False
        return commands


class VmLink:
    """The machine's end of ipmi_sim's VM serial interface (a TCP connection): it claims
    power off and graceful shutdown, and hears the BMC ask for them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, host: str, port: int) -> VmLink:
        reader, writer = await asyncio.open_connection(host, port)
        caps = VM_CAN_POWER | VM_CAN_GRACEFUL_SHUTDOWN
        writer.write(bytes([VM_CMD_CAPABILITIES, caps, VM_CMD_END]))
        await writer.drain()
        return cls(reader, writer)

    async def requests(self) -> AsyncIterator[str]:
        """`POWER_OFF` or `GRACEFUL_SHUTDOWN` as the BMC asks, until it closes the link."""
        decoder = VmDecoder()
        while data := await self._reader.read(256):
            for command in decoder.feed(data):
                if command[0] == VM_CMD_POWER_OFF:
                    yield POWER_OFF
                elif command[0] == VM_CMD_GRACEFUL_SHUTDOWN:
                    yield GRACEFUL_SHUTDOWN

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


async def obey_bmc(link: VmLink, stop: asyncio.Event, *, hung: bool, log: Any) -> None:
    """Set `stop` when the BMC cuts the power, or asks for a shutdown (unless `hung`)."""
    async for request in link.requests():
        if request == POWER_OFF:
            log.info("sim_node.power_off", by="bmc")
            stop.set()
            return
        if hung:
            log.info("sim_node.graceful_shutdown_ignored", why="hung")
            continue
        log.info("sim_node.graceful_shutdown", by="bmc")
        stop.set()
        return
    log.info("sim_node.bmc_link_closed")


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


# -- the node, as its kubelet reports it ------------------------------------------------------


class SimNode:
    """One node's kubelet-side reports: a boot, then lease renewals and Ready kept True."""

    def __init__(self, client: KubeClient, node: str, *, log: Any) -> None:
        self.client = client
        self.node = node
        self.boot_id = str(uuid.uuid4())
        self.uid: str | None = None
        self.log = log

    async def _get_node(self) -> Obj:
        node: Obj = await self.client.request("GET", core("nodes", self.node))
        self.uid = (node.get("metadata") or {}).get("uid") or self.uid
        return node

    async def _post_ready(self, node: Obj, *, boot: bool) -> None:
        status: Obj = {"conditions": [ready_condition(node, datetime.now(UTC))]}
        if boot:
            status["nodeInfo"] = {"bootID": self.boot_id}
        await self.client.request(
            "PATCH",
            core("nodes", self.node, sub="status"),
            body={"status": status},
            content_type=STRATEGIC_PATCH,
        )

    async def boot(self) -> None:
        """Renew the Lease, then post the new boot ID and Ready=True: whoever sees the
        node change sees a kubelet that is up."""
        node = await self._get_node()
        await self.renew_lease()
        await self._post_ready(node, boot=True)
        self.log.info("sim_node.booted", boot_id=self.boot_id)

    async def keep_ready(self) -> None:
        """Put Ready=True back if something else changed it (as a kubelet's status sync)."""
        node = await self._get_node()
        if not is_ready(node):
            await self._post_ready(node, boot=False)
            self.log.info("sim_node.ready_again")

    async def renew_lease(self) -> None:
        """Renew the node's Lease now (create it if it is missing)."""
        now = datetime.now(UTC)
        path = group_path("coordination.k8s.io", "v1", "leases", self.node, LEASE_NAMESPACE)
        spec = lease_manifest(self.node, None, now)["spec"]
        try:
            await self.client.request("PATCH", path, body={"spec": spec}, content_type=MERGE_PATCH)
        except NotFound:
            with contextlib.suppress(AlreadyExists):  # someone made it meanwhile: next tick
                await self.client.request(
                    "POST",
                    group_path("coordination.k8s.io", "v1", "leases", namespace=LEASE_NAMESPACE),
                    body=lease_manifest(self.node, self.uid, now),
                )


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def reset_gpus(nats_url: str, node: str, gpus: int, log: Any) -> None:
    """A boot resets the node's GPUs: each of its simulated GPUs (answered by the node's
    simulated GPU agent on `sim.inject.<node>`) recovers, before the boot is posted."""
    try:
        nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=0)
    except Exception as e:  # noqa: BLE001 - no bus: the boot goes on
        log.warning("sim_node.no_bus", error=str(e))
        return
    try:
        for index in range(gpus):
            with contextlib.suppress(Exception):  # no agent (yet): nothing to reset
                await request_injection(nc, node, InjectRequest(gpu=index, recover=True))
    finally:
        await nc.close()


async def live(sim: SimNode, args: argparse.Namespace) -> None:
    """Boot (the GPUs reset first, with `--nats`; retried until the API takes it), then
    heartbeat until cancelled."""
    if args.nats is not None:
        await reset_gpus(args.nats, args.node, args.gpus, sim.log)
    while True:
        try:
            await sim.boot()
            break
        except KubeError as e:
            sim.log.warning("sim_node.boot_failed", error=str(e))
            await asyncio.sleep(args.renew_s)
    if args.boot_id_file is not None:
        write_atomically(args.boot_id_file, sim.boot_id + "\n")
    loop = asyncio.get_running_loop()
    next_status = loop.time() + args.status_s
    while True:
        try:
            await sim.renew_lease()
            if loop.time() >= next_status:
                next_status = loop.time() + args.status_s
                await sim.keep_ready()
        except KubeError as e:
            sim.log.warning("sim_node.heartbeat_failed", error=str(e))
        await asyncio.sleep(args.renew_s)


async def run(args: argparse.Namespace) -> int:
    log = get_logger(component="sim-node", node=args.node)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task[None]] = []
    link: VmLink | None = None
    if args.vm is not None:
        try:
            link = await VmLink.connect(*args.vm)
            tasks.append(asyncio.create_task(obey_bmc(link, stop, hung=args.hung, log=log)))
        except OSError as e:
            log.warning("sim_node.no_bmc_link", vm=f"{args.vm[0]}:{args.vm[1]}", error=str(e))
    settings = ClusterSettings(
        kubeconfig=args.kubeconfig, context=args.context, request_timeout=args.request_timeout_s
    )
    try:
        client = KubeClient.from_settings(settings, user_agent=f"sim-node/{args.node}")
    except KubeError as e:
        log.error("sim_node.no_cluster", error=str(e))
        return 2
    sim = SimNode(client, args.node, log=log)
    living = asyncio.create_task(live(sim, args))
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([living, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*tasks, living, stopped):
            task.cancel()
        await asyncio.gather(*tasks, living, stopped, return_exceptions=True)
        if link is not None:
            await link.close()
        await client.close()
    if not living.cancelled() and (error := living.exception()) is not None:
        log.error("sim_node.crashed", error=f"{type(error).__name__}: {error}")
        return 1
    log.info("sim_node.stopped", boot_id=sim.boot_id)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launch.sim_node", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--node", required=True, help="the Node this machine is")
    p.add_argument("--kubeconfig", required=True, type=Path)
    p.add_argument("--context", default=None)
    p.add_argument("--renew-s", type=float, default=1.0, help="seconds between lease renewals")
    p.add_argument("--status-s", type=float, default=10.0, help="seconds between Ready checks")
    p.add_argument("--request-timeout-s", type=float, default=5.0)
    p.add_argument("--boot-id-file", type=Path, default=None)
    p.add_argument("--vm", type=parse_hostport, default=None, help="ipmi_sim's VM serial interface")
    p.add_argument("--hung", action="store_true", help="ignore graceful shutdown requests")
    p.add_argument("--nats", default=None, help="reset the node's simulated GPUs at boot here")
    p.add_argument("--gpus", type=int, default=8, help="how many (with --nats)")
    p.add_argument("--log-level", default="info")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.renew_s <= 0 or args.status_s <= 0:
        print("sim_node: --renew-s and --status-s must be positive", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
