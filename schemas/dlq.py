"""A message a consumer could not process, kept with its error instead of being lost."""

from __future__ import annotations

import base64
from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import EventData
from schemas.examples import example
from schemas.tokens import subject


class DeadLetterReason(StrEnum):
    INVALID = "invalid"  # failed decoding or validation
    PERMANENT = "permanent"  # the handler said retrying cannot help
    EXHAUSTED = "exhausted"  # max deliveries reached
    IDENTITY_MISMATCH = "identity_mismatch"  # the data names another node/pod than its subject
    FUTURE = "future"  # its time is further ahead of when the bus stored it than clocks drift


class DeadLetter(EventData):
    """The original message (headers and payload, base64) and why it failed."""

    TYPE: ClassVar[str] = "dlq.v1"
    STREAM: ClassVar[str] = "DLQ"
    SUBJECT_PATTERN: ClassVar[str] = "dlq.<stream>.<consumer>"
    EXAMPLE_SOURCE: ClassVar[str] = "service/cordon"

    stream: str
    consumer: str
    original_subject: str
    stream_sequence: int | None = Field(default=None, ge=0)
    deliveries: int = Field(ge=0)
    reason: DeadLetterReason
    error: str = Field(description="one line: what was wrong")
    error_type: str | None = None
    original_headers: dict[str, str] = Field(default_factory=dict)
    payload_b64: str = Field(description="the original body (its first bytes if truncated), base64")
    failed_at: datetime
    payload_size: int | None = Field(
        default=None, ge=0, description="bytes of the original body (absent before sizes were kept)"
    )
    payload_sha256: str | None = Field(
        default=None, description="hex sha256 of the whole original body"
    )
    truncated: bool = Field(
        default=False,
        description="the payload (or long header values) were cut so that the dead letter fits "
        "the server's max_payload; size and sha256 describe the whole body",
    )

    model_config = example(
        {
            "stream": "GPU",
            "consumer": "cordon",
            "original_subject": "gpu.health.gpu-node-07.3",
            "stream_sequence": 1042,
            "deliveries": 1,
            "reason": "invalid",
            "error": "gpu.health.v1: state: Input should be 'healthy', 'degraded', 'failed' or 'unknown'",
            "error_type": "DecodeError",
            "original_headers": {"ce-type": "gpu.health.v1", "ce-id": "x"},
            "payload_b64": "eyJzdGF0ZSI6ICJvbi1maXJlIn0=",
            "failed_at": "2026-08-20T14:02:12Z",
            "payload_size": 20,
            "payload_sha256": "9ee9f5d63be255bcf1e174129c1e9bdffb55f8cb35999ce55d8d24cfdb6f2f53",
            "truncated": False,
        }
    )

    @property
    def payload(self) -> bytes:
        return base64.b64decode(self.payload_b64)

    def nats_subject(self) -> str:
        return subject("dlq", self.stream, self.consumer)

    def about(self) -> str:
        return f"consumer/{self.stream}/{self.consumer}"

    def concern(self) -> str:
        return "warning"
