"""CloudEvents 1.0 over NATS: binary content mode on the wire, structured JSON for people.

Binary mode (NATS protocol binding, 1.0.3): every attribute is a `ce-` header whose value
is percent-encoded; the body is `data`. `Nats-Msg-Id` carries the event id so JetStream
drops duplicates inside the stream's window. Reading also accepts a plain `content-type`
for the data content type (as sdk-go writes it), structured mode
(`content-type: application/cloudevents+json`), and native Falco JSON without headers.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from pydantic import ValidationError

from schemas.base import Event
from schemas.falco import FalcoAlert
from schemas.registry import REGISTRY, EventType, lookup, native_type_for_subject

SPECVERSION = "1.0"
JSON = "application/json"
STRUCTURED = "application/cloudevents+json"
MSG_ID = "Nats-Msg-Id"

# The attributes a binary-mode message carries, in the order they are written.
_ATTRS = ("specversion", "id", "source", "type", "subject", "time", "datacontenttype")
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"%')


@dataclass(frozen=True, slots=True)
class WireMessage:
    subject: str
    headers: dict[str, str]
    body: bytes


class DecodeError(ValueError):
    """Why a message is not a valid nodeward event. `str()` is one line."""

    def __init__(self, reason: str, message: str, *, event_type: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.event_type = event_type
        self.message = message

    def __str__(self) -> str:
        prefix = f"{self.event_type}: " if self.event_type else ""
        return f"{prefix}{self.message}".replace("\n", " ")


def _enc(value: str) -> str:
    # Printable ASCII except space, '"' and '%' passes as is (string methods, no regex).
    if (
        value.isascii()
        and value.isprintable()
        and " " not in value
        and '"' not in value
        and "%" not in value
    ):
        return value
    return quote(value, safe=_SAFE)


def _dec(value: str) -> str:
    if "%" not in value and '"' not in value:
        return value
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        value = value[1:-1]
    return unquote(value, errors="strict")


def encode_headers(event: Event[Any]) -> dict[str, str]:
    ident = _enc(event.id)
    return {
        "ce-specversion": SPECVERSION,
        "ce-id": ident,
        "ce-source": _enc(event.source),
        "ce-type": event.type,
        "ce-subject": _enc(event.subject),
        "ce-time": event.time.isoformat().replace("+00:00", "Z"),
        "ce-datacontenttype": JSON,
        MSG_ID: ident,
    }


def encode(event: Event[Any]) -> WireMessage:
    """The NATS subject, headers and body of an event (binary content mode)."""
    return WireMessage(
        subject=event.data.nats_subject(),
        headers=encode_headers(event),
        body=event.data.model_dump_json(exclude_none=True).encode(),
    )


def to_structured(event: Event[Any]) -> dict[str, Any]:
    """The CloudEvents structured JSON form (what `tail --json` and `schemas example` print)."""
    return event.model_dump(mode="json", exclude_none=True)


def one_line(exc: ValidationError, *, limit: int = 3) -> str:
    """A pydantic error as one readable line: `loc: msg; loc: msg (+N more)`."""
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:limit]:
        # Keys come from the input: show odd ones quoted, so the line stays one line.
        loc = ".".join(str(p) if str(p).isprintable() else repr(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {' '.join(str(err['msg']).split())}")
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return "; ".join(parts) + more


def from_structured(
    obj: Any, *, type_name: str | None = None, forbid_extra: bool = False
) -> Event[Any]:
    """An event from its structured JSON form; `type_name` is required if `obj` lacks `type`."""
    if not isinstance(obj, Mapping):
        raise DecodeError(
            "invalid_data", "a CloudEvent must be a JSON object", event_type=type_name
        )
    name = obj.get("type", type_name)
    if not isinstance(name, str):
        raise DecodeError("missing_type", "the event has no 'type'")
    if type_name is not None and name != type_name:
        raise DecodeError("type_mismatch", f"event type is {name!r}, expected {type_name!r}")
    et = _lookup(name)
    ctx = {"forbid_extra": forbid_extra}
    try:
        return et.envelope.model_validate({**obj, "type": name}, context=ctx)
    except ValidationError as exc:
        raise DecodeError("invalid_data", one_line(exc), event_type=name) from None


def _lookup(name: str) -> EventType:
    try:
        return lookup(name)
    except KeyError:
        raise DecodeError("unknown_type", f"unknown event type {name!r}") from None


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError("invalid_json", f"body is not JSON: {exc}") from None


def _invalid_body(exc: ValidationError, type_name: str) -> DecodeError:
    """`invalid_json` when the body does not parse, `invalid_data` when the data is wrong."""
    if any(e["type"] == "json_invalid" for e in exc.errors(include_url=False)):
        return DecodeError(
            "invalid_json", f"body is not JSON: {one_line(exc)}", event_type=type_name
        )
    return DecodeError("invalid_data", one_line(exc), event_type=type_name)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == JSON or media.endswith("+json") or media == "text/json"


def decode(
    subject: str,
    headers: Mapping[str, str] | None,
    body: bytes,
    *,
    expected_types: Collection[str] | None = None,
) -> Event[Any]:
    """The typed event in a NATS message, or `DecodeError` saying what was wrong."""
    try:
        event = _decode(subject, headers, body)
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is still a bad message, never a crash
        raise DecodeError("malformed", f"{type(exc).__name__}: {exc}") from None
    if expected_types is not None and event.type not in expected_types:
        raise DecodeError(
            "unexpected_type",
            f"type {event.type!r} is not one this consumer handles",
            event_type=event.type,
        )
    return event


def _decode(subject: str, headers: Mapping[str, str] | None, body: bytes) -> Event[Any]:
    h: Mapping[str, str] = headers or {}
    if "ce-specversion" not in h:  # header names are case-insensitive; we write lower-case
        h = {k.lower(): v for k, v in h.items()}
    content_type = h.get("content-type", "")
    if "ce-specversion" not in h:
        if content_type.split(";", 1)[0].strip().lower() == STRUCTURED:
            return from_structured(_parse_json(body))
        native = native_type_for_subject(subject)
        if native is not None:
            return _decode_native(native, body)
        raise DecodeError(
            "missing_headers",
            "no CloudEvents headers (ce-specversion) and not a known native subject",
        )
    try:
        attrs = {a: _dec(h[f"ce-{a}"]) for a in _ATTRS if f"ce-{a}" in h}
    except UnicodeDecodeError:
        raise DecodeError("bad_header", "a ce- header is not valid percent-encoded UTF-8") from None
    if attrs.get("specversion") != SPECVERSION:
        raise DecodeError("bad_header", f"unsupported specversion {attrs.get('specversion')!r}")
    missing = [a for a in ("id", "source", "type") if not attrs.get(a)]
    if missing:
        raise DecodeError(
            "bad_header", f"missing header(s): {', '.join('ce-' + m for m in missing)}"
        )
    et = _lookup(attrs["type"])
    dct = attrs.pop("datacontenttype", None) or content_type or JSON
    if not _is_json(dct):
        raise DecodeError(
            "bad_content_type", f"data content type {dct!r} is not JSON", event_type=et.name
        )
    try:
        data = et.model.model_validate_json(body)
    except ValidationError as exc:
        raise _invalid_body(exc, et.name) from None
    attrs.setdefault("subject", data.about())
    try:
        return et.envelope(**attrs, data=data)
    except ValidationError as exc:
        raise DecodeError("bad_header", one_line(exc), event_type=et.name) from None


def _decode_native(et: EventType, body: bytes) -> Event[Any]:
    if et.model is not FalcoAlert:  # pragma: no cover - only Falco is native today
        raise DecodeError("missing_headers", f"no native decoder for {et.name}")
    try:
        alert = FalcoAlert.parse(body)
    except ValidationError as exc:
        raise _invalid_body(exc, et.name) from None
    except ValueError as exc:
        raise DecodeError("invalid_json", f"body is not JSON: {exc}", event_type=et.name) from None
    if alert.time.tzinfo is None:
        raise DecodeError(
            "invalid_data", "time: Falco alert time has no timezone", event_type=et.name
        )
    try:
        event: Event[Any] = Event[FalcoAlert](
            id=alert.stable_id(),
            time=alert.time,
            source=f"falco/{alert.hostname or 'unknown'}",
            type=et.name,
            subject=alert.about(),
            data=alert,
        )
    except ValidationError as exc:
        raise DecodeError("invalid_data", one_line(exc), event_type=et.name) from None
    return event


__all__ = [
    "REGISTRY",
    "DecodeError",
    "WireMessage",
    "decode",
    "encode",
    "encode_headers",
    "from_structured",
    "one_line",
    "to_structured",
]
