"""Building the dead-letter event for a message a consumer could not process."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from nats.aio.msg import Msg

from schemas.base import Event, make_event
from schemas.dlq import DeadLetter, DeadLetterReason
from schemas.ids import stable_id


def one_line(error: BaseException | str, limit: int = 2000) -> str:
    text = str(error) if not isinstance(error, str) else error
    text = " ".join(text.split()) or (
        type(error).__name__ if not isinstance(error, str) else "error"
    )
    return text[:limit]


def dead_letter_event(
    msg: Msg,
    *,
    stream: str,
    consumer: str,
    reason: DeadLetterReason,
    error: BaseException | str,
    source: str,
    extra_key: tuple[str, ...] = (),
) -> Event[DeadLetter]:
    """The DLQ event for `msg`. Its id is derived from (stream, consumer, sequence), so a
    retried dead-lettering of the same message is stored once. `extra_key` tells apart
    several dead letters of one message (the notifier's, one per failed channel)."""
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
        payload_b64=base64.b64encode(msg.data or b"").decode(),
        failed_at=datetime.now(UTC),
    )
    key = (stream, consumer, str(seq)) if seq is not None else (stream, consumer, data.payload_b64)
    return make_event(data, source=source, id=stable_id(stored_at, *key, *extra_key))
