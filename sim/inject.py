"""Fault injection into a node's simulated GPUs over core NATS request/reply.

The sim backend of a node's GPU agent answers requests on `sim.inject.<node>` (not a
JetStream subject): `{"gpu": 0, "xid": 79}`, `{"gpu": 0, "fault": "thermal"}`,
`{"gpu": 0, "recover": true}`, `{"gpu": 0, "load": 90}` (utilisation %, which power follows). The reply says what was applied, or the error.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.tokens import subject
from sim.nvml import FAULTS, SimNvml

PREFIX = "sim.inject"


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
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(sorted(FAULTS))}")
        return self

    def describe(self) -> str:
        if self.xid is not None:
            return f"XID {self.xid}"
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


def apply(sim: SimNvml, raw: bytes) -> InjectReply:
    """Decode and apply one request to `sim`; errors become a reply, never an exception."""
    try:
        req = InjectRequest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        return InjectReply(ok=False, node=sim.node, error=f"bad request: {first['msg']}")
    try:
        if req.xid is not None:
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


async def serve_injections(nc: Any, sim: SimNvml) -> Any:
    """Answer injection requests for `sim`'s node on `nc`; returns the subscription."""

    async def handle(msg: Any) -> None:
        reply = apply(sim, msg.data)
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
