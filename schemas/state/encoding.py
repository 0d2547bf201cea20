"""How a KV record is stored: its JSON, gzip-compressed once it is large.

NATS refuses a message over the server's `max_payload` (1 MiB by default), and a record
that covers the fleet (the capacity snapshot: every node's GPUs) passes that at a few
thousand nodes. JSON that size compresses about twentyfold. A stored value starting with
gzip's magic bytes is compressed (JSON never starts so); anything else is plain JSON, so
small records and records written before stay as they are, and
`nats kv get ... | gunzip` reads a large one.
"""

from __future__ import annotations

import gzip
import zlib
from typing import TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

GZIP_MAGIC = b"\x1f\x8b"
COMPRESS_ABOVE = 64 * 1024  # bytes of JSON
MAX_RECORD = 64 * 1024 * 1024  # bytes of JSON a compressed value may expand to


def dump_record(record: BaseModel) -> bytes:
    """`record` as stored: its JSON, gzip-compressed above `COMPRESS_ABOVE` bytes."""
    data = record.model_dump_json().encode()
    if len(data) <= COMPRESS_ABOVE:
        return data
    return gzip.compress(data, compresslevel=6, mtime=0)


def load_record(model: type[M], data: bytes | str) -> M:
    """A stored value as `model`, decompressed if it was stored compressed (raises
    pydantic's `ValidationError`, or `ValueError` for a value that expands past
    `MAX_RECORD` or is not valid gzip)."""
    if isinstance(data, bytes | bytearray) and data[:2] == GZIP_MAGIC:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            plain = inflater.decompress(bytes(data), MAX_RECORD)
        except zlib.error as exc:
            raise ValueError(f"a compressed KV value that does not decompress: {exc}") from exc
        if inflater.unconsumed_tail:
            raise ValueError(f"a compressed KV value larger than {MAX_RECORD} bytes")
        data = plain
    return model.model_validate_json(data)


__all__ = ["COMPRESS_ABOVE", "dump_record", "load_record"]
