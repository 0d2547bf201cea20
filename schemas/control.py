"""Operator controls: a request on `control.<service>.<verb>` and the owning service's reply.

Core NATS request/reply, never stored: the audit record of what the request did is the
`remediation.v1` the service publishes through the remediation kernel. The runtime side
(serving and sending) is `nodeward.bus.control`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, Field, field_validator

from schemas.base import utcnow
from schemas.ids import new_id
from schemas.tokens import token

PREFIX = "control"


def control_subject(service: str, verb: str) -> str:
    """`control.<service>.<verb>`, each a single token."""
    return f"{PREFIX}.{token(service)}.{token(verb)}"


def _one_line(value: str) -> str:
    return " ".join(value.split())


class ControlRequest(BaseModel):
    """What an operator asks a service to do, as whom and why."""

    id: str = Field(default_factory=new_id, description="unique; the audit record's trigger")
    time: datetime = Field(default_factory=utcnow)
    service: str = Field(min_length=1, max_length=63)
    verb: str = Field(min_length=1, max_length=63)
    operator: str = Field(min_length=1, max_length=253, description="who asks (--operator)")
    reason: str = Field(default="", max_length=1024, description="why (--reason)")
    target: str | None = Field(default=None, max_length=317, description="node, or ns/pod")
    options: dict[str, str] = Field(
        default_factory=dict,
        max_length=8,
        description="the verb's own options, e.g. `to` of `maintenance restore`",
    )

    @field_validator("operator", "reason")
    @classmethod
    def _single_line(cls, value: str) -> str:
        return _one_line(value)

    @field_validator("options")
    @classmethod
    def _short_lines(cls, value: dict[str, str]) -> dict[str, str]:
        if any(len(k) > 63 or len(v) > 317 for k, v in value.items()):
            raise ValueError("an option's name is at most 63 characters, its value 317")
        return {k: _one_line(v) for k, v in value.items()}

    @property
    def subject(self) -> str:
        return control_subject(self.service, self.verb)


class ControlStatus(StrEnum):
    OK = "ok"
    REFUSED = "refused"
    ERROR = "error"


class ControlReply(BaseModel):
    """The service's answer: one line, what was done or why not, and details."""

    status: ControlStatus
    message: str = Field(description="one line")
    service: str = ""
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("message")
    @classmethod
    def _single_line(cls, value: str) -> str:
        return _one_line(value)

    @classmethod
    def ok(cls, message: str, **details: Any) -> Self:
        return cls(status=ControlStatus.OK, message=message, details=details)

    @classmethod
    def refused(cls, message: str, **details: Any) -> Self:
        return cls(status=ControlStatus.REFUSED, message=message, details=details)

    @classmethod
    def error(cls, message: str, **details: Any) -> Self:
        return cls(status=ControlStatus.ERROR, message=message, details=details)
