"""Building the dead-letter event for a message a consumer could not process."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from typing import Any

from nats.aio.msg import Msg

from schemas.base import Event, make_event
from schemas.cloudevents import encode
from schemas.dlq import DeadLetter, DeadLetterReason
from schemas.ids import stable_id

# Room kept free under max_payload for what encoding may add beyond the measured size.
_SLACK = 1024
_HEADER_VALUE_LIMIT = 256
_HEADERS_KEPT = 64


def one_line(error: BaseException | str, limit: int = 2000) -> str:
    text = str(error) if not isinstance(error, str) else error
    text = " ".join(text.split()) or (
        type(error).__name__ if not isinstance(error, str) else "error"
    )
    return text[:limit]


def _wire_size(event: Event[DeadLetter]) -> int:
    wire = encode(event)
    return sum(len(k) + len(v) + 4 for k, v in wire.headers.items()) + 12 + len(wire.body)


def dead_letter_event(
    msg: Msg,
    *,
    stream: str,
    consumer: str,
    reason: DeadLetterReason,
    error: BaseException | str,
    source: str,
    extra_key: tuple[str, ...] = (),
    max_bytes: int | None = None,
) -> Event[DeadLetter]:
    """The DLQ event for `msg`. Its id is derived from (stream, consumer, sequence), so a
    retried dead-lettering of the same message is stored once. `extra_key` tells apart
    several dead letters of one message (the notifier's, one per failed channel).

    The body's size and sha256 are always kept. With `max_bytes` (the server's
    max_payload) a dead letter that would not fit keeps the body's first bytes and
    shortened header values instead, marked `truncated`, so it can always be written."""
    seq: int | None = None
    deliveries = 1
    stored_at = datetime.now(UTC)
    try:
        md = msg.metadata
        seq = md.sequence.stream
        deliveries = md.num_delivered or 1
        if md.timestamp:
            stored_at = md.timestamp
    except Exception:  # noqa: BLE001, S110 - not a JetStream message: keep the defaults
        pass
    body = msg.data or b""
    headers: dict[str, Any] = dict(msg.headers or {})
    data = DeadLetter(
        stream=stream,
        consumer=consumer,
        original_subject=msg.subject,
        stream_sequence=seq,
        deliveries=deliveries,
        reason=reason,
        error=one_line(error),
        error_type=None if isinstance(error, str) else type(error).__name__,
        original_headers={str(k): str(v) for k, v in headers.items()},
        payload_b64=base64.b64encode(body).decode(),
        failed_at=datetime.now(UTC),
        payload_size=len(body),
        payload_sha256=hashlib.sha256(body).hexdigest(),
    )
    digest = data.payload_sha256 or ""
    key = (stream, consumer, str(seq)) if seq is not None else (stream, consumer, digest)
    event_id = stable_id(stored_at, *key, *extra_key)
    event = make_event(data, source=source, id=event_id)
    if max_bytes is None or _wire_size(event) + _SLACK <= max_bytes:
        return event
    return make_event(_fit(data, body, max_bytes, source), source=source, id=event_id)


def _fit(data: DeadLetter, body: bytes, max_bytes: int, source: str) -> DeadLetter:
    """`data` cut to fit `max_bytes`: long header values shortened, then the body's first
    bytes only (as many as fit once base64-encoded)."""
    headers = dict(list(data.original_headers.items())[:_HEADERS_KEPT])
    short = {
        k: v if len(v) <= _HEADER_VALUE_LIMIT else v[:_HEADER_VALUE_LIMIT] + "…"
        for k, v in headers.items()
    }
    bare = data.model_copy(update={"original_headers": short, "payload_b64": "", "truncated": True})
    room = max_bytes - _SLACK - _wire_size(make_event(bare, source=source))
    keep = max(room, 0) // 4 * 3  # raw bytes whose base64 fits in `room`
    return bare.model_copy(update={"payload_b64": base64.b64encode(body[:keep]).decode()})
