"""A simulated reboot operator for `nodeward up`: what Kured does on a real cluster when its
`--reboot-sentinel-command` finds the node labelled `nodeward.io/reboot-required=true`.

Each pass lists the nodes so labelled; a node whose request (annotation
`nodeward.io/reboot-request`) it has not served yet is "rebooted": its
`status.nodeInfo.bootID` changes (through the status subresource, as the kubelet reports
a new boot), and every GPU of its simulated driver is reset over `sim.inject.<node>` (a
reboot clears the injected faults; the agent's XID history goes with the driver's
recovery action). Like Kured it leaves the label to whoever set it: services.recovery
takes its request back once it sees the new bootID.

A node whose machine a simulated BMC runs (`Machines`: `nodeward up`'s BMC-run nodes) is
rebooted through its machine instead: while the machine runs, its BMC power-cycles it (the
machine posts the new bootID as it boots, and the node's simulated agents start afresh with
it); while it is hung or off nothing is done, as Kured on a hung host runs nothing, and
the request is looked at again on the next pass.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Protocol

import structlog

from nodeward.kube.base import core
from nodeward.kube.client import MERGE_PATCH, KubeClient
from sim.controllers import SimController
from sim.inject import InjectRequest, request_injection

REBOOT_LABEL = "nodeward.io/reboot-required"
REBOOT_ANNOTATION = "nodeward.io/reboot-request"
GPU_RESOURCE = "nvidia.com/gpu"


class Machines(Protocol):
    """The nodes whose machine a simulated BMC runs."""

    def runs(self, node: str) -> bool:
        """Whether a BMC runs `node`'s machine."""
        ...

    async def reboot(self, node: str) -> str | None:
        """Reboot `node`'s machine if it runs (its BMC's power cycle); None when done, else
        why nothing was done (hung, off)."""
        ...


class SimRebootOperator(SimController):
    """Reboots (in simulation) the nodes that ask for it; remembers what it served."""

    def __init__(
        self,
        client: KubeClient,
        nc: Any,
        *,
        interval: float = 1.0,
        machines: Machines | None = None,
    ) -> None:
        self.client = client
        self.nc = nc
        self.interval = interval
        self.machines = machines
        self.served: dict[str, str] = {}  # node -> the request it rebooted for
        self.skipped: dict[str, str] = {}  # node -> why its request waits (logged once)
        self.log = structlog.get_logger().bind(component="sim-reboot")

    async def pass_once(self) -> list[str]:
        """Reboot every node that asks and was not rebooted for this request; their names."""
        listing = await self.client.request(
            "GET", core("nodes"), query={"labelSelector": f"{REBOOT_LABEL}=true"}
        )
        done = []
        for node in listing.get("items") or []:
            meta = node.get("metadata") or {}
            name = str(meta.get("name"))
            request = (meta.get("annotations") or {}).get(REBOOT_ANNOTATION, "")
            if self.served.get(name) == request:
                continue
            if self.machines is not None and self.machines.runs(name):
                why = await self.machines.reboot(name)
                if why is not None:
                    if self.skipped.get(name) != why:
                        self.log.info("sim_reboot.not_rebooted", node=name, why=why)
                    self.skipped[name] = why
                    continue
                self.skipped.pop(name, None)
                self.log.info("sim_reboot.power_cycled", node=name)
            else:
                await self.reboot(node)
            self.served[name] = request
            done.append(name)
        return done

    async def reboot(self, node: dict[str, Any]) -> str:
        """A new bootID, and every GPU reset; returns the new bootID."""
        name = str(node["metadata"]["name"])
        info = (node.get("status") or {}).get("nodeInfo") or {}
        old = str(info.get("bootID", ""))
        new = hashlib.sha256(f"{name}/{old}/reboot".encode()).hexdigest()[:32]
        new = f"{new[:8]}-{new[8:12]}-{new[12:16]}-{new[16:20]}-{new[20:32]}"
        await self.client.request(
            "PATCH",
            core("nodes", name, sub="status"),
            body={"status": {"nodeInfo": {"bootID": new}}},
            content_type=MERGE_PATCH,
        )
        gpus = int(((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, 0) or 0)
        for index in range(gpus):
            with contextlib.suppress(Exception):  # a node without a sim agent has no driver
                await request_injection(self.nc, name, InjectRequest(gpu=index, recover=True))
        self.log.info("sim_reboot.rebooted", node=name, boot_id=new, gpus=gpus)
        return new
