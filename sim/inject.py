"""Fault injection into a node's simulated GPUs over core NATS request/reply.

The sim backend of a node's GPU agent answers requests on `sim.inject.<node>` (not a
JetStream subject): `{"gpu": 0, "xid": 79}`, `{"gpu": 0, "fault": "thermal"}`,
`{"gpu": 0, "recover": true}`, `{"gpu": 0, "load": 90}` (utilisation %, which power follows). The reply says what was applied, or the error.

An XID goes through NVML's event by default; `"via": "kmsg"` writes the driver's line to
the node's fake kernel log only (`sim.kmsg`), `"via": "both"` does both, as a real driver
does; `"driver"` picks the driver generation whose line format is written.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nodeward.nats_auth import AgentGrants
from schemas.tokens import subject
from sim.amdsmi import FAULTS as AMD_FAULTS
from sim.amdsmi import SimAmdSmi
from sim.kmsg import STYLES, SimKmsg
from sim.nvml import FAULTS, SimNvml

RECOVERY_XID = 154
GPU_RESET = 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET, as the sim's XID 154 line says

KNOWN_FAULTS = {**FAULTS, **AMD_FAULTS}
"""NVIDIA's faults (sim.nvml) and AMD's (sim.amdsmi); each node's sim takes its vendor's."""

PREFIX = "sim.inject"

GRANTS = AgentGrants(subscribe=(f"{PREFIX}.{{node}}",), allow_responses=True)
"""What answering the injections takes of a node's NATS user: the simulated driver answers on
its node's GPU agent's connection (`nodeward up`'s agents and the fleet's), so the
composition root grants it with the node agents' declarations (`launch.access`)."""


def inject_subject(node: str) -> str:
    return subject(PREFIX, node)


class InjectRequest(BaseModel):
    """Exactly one of `xid`, `fault`, `recover`, `recovery_action`, `load` for one GPU."""

    model_config = ConfigDict(extra="forbid")

    gpu: int = Field(ge=0)
    xid: int | None = Field(default=None, ge=1)
    fault: str | None = None
    recover: bool = False
    recovery_action: int | None = Field(
        default=None, ge=0, description="NVML_GPU_RECOVERY_ACTION_*"
    )
    load: float | None = Field(
        default=None, ge=0, le=100, description="utilisation %; board power follows it"
    )
    via: Literal["nvml", "kmsg", "both"] = Field(
        default="nvml", description="for an XID: NVML's event, the kernel log, or both"
    )
    driver: str = Field(default="r550", description="for an XID via kmsg: the line's format")

    @model_validator(mode="after")
    def _one(self) -> Self:
        given = [
            self.xid is not None,
            self.fault is not None,
            self.recover,
            self.recovery_action is not None,
            self.load is not None,
        ]
        if sum(given) != 1:
            raise ValueError("give exactly one of xid, fault, recover, recovery_action, load")
        if self.xid is None and (self.via != "nvml" or self.driver != "r550"):
            raise ValueError("via and driver apply to an xid only")
        if self.driver not in STYLES:
            raise ValueError(f"unknown driver {self.driver!r}; known: {', '.join(STYLES)}")
        if self.fault is not None and self.fault not in KNOWN_FAULTS:
            raise ValueError(
                f"unknown fault {self.fault!r}; known: {', '.join(sorted(KNOWN_FAULTS))}"
            )
        return self

    def describe(self) -> str:
        if self.xid is not None:
            return f"XID {self.xid}" + ("" if self.via == "nvml" else f" via {self.via}")
        if self.fault is not None:
            return f"fault {self.fault}"
        if self.recovery_action is not None:
            return f"recovery action {self.recovery_action}"
        if self.load is not None:
            return f"load {self.load:g}%"
        return "recovery"


class InjectReply(BaseModel):
    ok: bool
    node: str
    gpu: int | None = None
    applied: str | None = None
    error: str | None = None
    stored: list[int] | None = Field(
        default=None,
        description="the fleet: stream sequences of the events the injection published,"
        " once acknowledged",
    )


def apply(sim: SimNvml | SimAmdSmi, raw: bytes, kmsg: SimKmsg | None = None) -> InjectReply:
    """Decode and apply one request to `sim` (and its kernel log `kmsg`); errors become a
    reply, never an exception."""
    try:
        req = InjectRequest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        return InjectReply(ok=False, node=sim.node, error=f"bad request: {first['msg']}")
    if req.xid is not None and req.via != "nvml" and kmsg is None:
        return InjectReply(
            ok=False, node=sim.node, gpu=req.gpu, error="this node has no simulated kernel log"
        )
    try:
        if req.xid == RECOVERY_XID and isinstance(sim, SimNvml):
            # The driver's state behind an XID 154: NVML reads the action its line announces
            # (the sim's kernel-log line says GPU Reset Required), through either path.
            if req.via in ("kmsg", "both") and kmsg is not None:
                kmsg.xid(req.gpu, req.xid, style=req.driver)
            sim.set_recovery_action(req.gpu, GPU_RESET, emit=req.via != "kmsg")
        elif req.xid is not None:
            if req.via in ("kmsg", "both") and kmsg is not None:
                kmsg.xid(req.gpu, req.xid, style=req.driver)
            if req.via in ("nvml", "both"):
                sim.inject_xid(req.gpu, req.xid)
        elif req.fault is not None:
            sim.inject_fault(req.gpu, req.fault)
        elif req.recovery_action is not None:
            sim.set_recovery_action(req.gpu, req.recovery_action)
        elif req.load is not None:
            sim.set_load(req.gpu, req.load)
        else:
            sim.recover(req.gpu)
    except ValueError as exc:
        return InjectReply(ok=False, node=sim.node, gpu=req.gpu, error=str(exc))
    return InjectReply(ok=True, node=sim.node, gpu=req.gpu, applied=req.describe())


async def serve_injections(nc: Any, sim: SimNvml | SimAmdSmi, kmsg: SimKmsg | None = None) -> Any:
    """Answer injection requests for `sim`'s node on `nc`; returns the subscription."""

    async def handle(msg: Any) -> None:
        reply = apply(sim, msg.data, kmsg)
        if msg.reply:
            await msg.respond(reply.model_dump_json(exclude_none=True).encode())

    return await nc.subscribe(inject_subject(sim.node), cb=handle)


async def request_injection(
    nc: Any, node: str, request: InjectRequest, timeout: float = 2.0
) -> InjectReply:
    """Send one request to `node`'s sim GPUs and return the reply (nats errors propagate)."""
    msg = await nc.request(
        inject_subject(node), request.model_dump_json(exclude_none=True).encode(), timeout=timeout
    )
    return InjectReply.model_validate_json(msg.data)
