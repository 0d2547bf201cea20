"""The protobuf wire format, by hand, for the few small messages nodeward reads or writes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class WireError(ValueError):
    """Bytes that are not a protobuf message this reader understands."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(buf) or shift > 63:
            raise WireError("truncated varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of each field: ints for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            length, i = _varint(buf, i)
            if i + length > len(buf):
                raise WireError("truncated field")
            value, i = buf[i : i + length], i + length
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise WireError(f"unsupported wire type {wire}")
        yield number, value


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number: int, value: bytes | str) -> bytes:
    """A length-delimited field (string, bytes or an encoded message)."""
    raw = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(raw)) + raw
