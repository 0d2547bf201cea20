"""Event ids: UUIDv7 strings, unique and ordered by creation time.

RFC 9562 method 3: the 12 bits after the millisecond timestamp hold the sub-millisecond
fraction, so ids from one process sort by creation time to ~250 ns without shared state.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from datetime import datetime

_VERSION = 0x7 << 76
_VARIANT = 0b10 << 62


def _uuid7(ns: int, rand: bytes) -> str:
    ms, sub_ns = divmod(ns, 1_000_000)
    frac = (sub_ns << 12) // 1_000_000  # 12-bit fraction of the millisecond
    rand_b = int.from_bytes(rand[:8], "big") & ((1 << 62) - 1)
    value = ((ms & ((1 << 48) - 1)) << 80) | _VERSION | (frac << 64) | _VARIANT | rand_b
    return str(uuid.UUID(int=value))


def new_id() -> str:
    """A fresh, time-ordered, unique event id."""
    return _uuid7(time.time_ns(), os.urandom(8))


def stable_id(at: datetime, *key: str) -> str:
    """A deterministic time-ordered id for an event that arrives without one.

    The same (time, key) always gives the same id, so a re-sent alert is de-duplicated by
    JetStream instead of being stored twice.
    """
    ns = int(at.timestamp()) * 1_000_000_000 + at.microsecond * 1000
    digest = hashlib.sha256("\x1f".join(key).encode()).digest()
    return _uuid7(ns, digest)


def id_time_ms(event_id: str) -> int:
    """Milliseconds since the epoch encoded in a UUIDv7 id."""
    return uuid.UUID(event_id).int >> 80
