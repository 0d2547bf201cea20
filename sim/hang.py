"""Hanging a simulated node, over core NATS request/reply on `sim.hang.<node>`.

A hung host runs nothing: its kubelet stops renewing its Lease, its node agents fall silent,
it ignores a reboot request and an ACPI shutdown; only a hard power off ends it. In
`nodeward up` the platform daemon answers (it owns the nodes' simulated BMCs:
`launch.sim_bmc`): the node's machine (the process its BMC powers) is stopped with SIGSTOP
and its simulated agents with it, until the machine boots again. A node whose machine no
BMC runs answers `ok: false` with why.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from schemas.tokens import subject

PREFIX = "sim.hang"


def hang_subject(node: str) -> str:
    return subject(PREFIX, node)


class HangRequest(BaseModel):
    """Hang the node's machine (nothing to choose: a hung host is hung)."""

    model_config = ConfigDict(extra="forbid")


class HangReply(BaseModel):
    ok: bool
    node: str
    applied: str | None = None
    error: str | None = None


async def request_hang(nc: Any, node: str, timeout: float = 5.0) -> HangReply:
    """Ask `nodeward up` to hang `node`'s machine; the reply (nats errors propagate)."""
    msg = await nc.request(
        hang_subject(node), HangRequest().model_dump_json().encode(), timeout=timeout
    )
    return HangReply.model_validate_json(msg.data)
